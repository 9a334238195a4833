"""The report drawn: the terminal text, Markdown, a self-contained HTML page (inline CSS, the PNGs
embedded), the CSV rows (one per ablation x point x metric) and the JSON document (``--format json``,
versioned by ``JSON_VERSION``). The Markdown, HTML and CSV tables are written by pandas
(``to_markdown``, ``Styler.to_html``, ``to_csv``); only the terminal table is drawn here
(``text_table``), because pandas' ``to_string`` cannot hold a cell of several lines and tabulate's plain
layouts do not rule between multi-line rows.
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from clsr.study.analyse.rows import AblationReport, Cost, Row, StudyReport
from clsr.study.analyse.tables import (
    Table,
    ablation_notes,
    cost_table,
    detail_tables,
    effects_note,
    effects_table,
    fidelity_lines,
    pareto_table,
    problems,
    summary_table,
)
from clsr.study.stats.seeds import ALPHA, CONFIDENCE, CORRECTION, TEST_NAME
from clsr.tracking import escape


def text_table(table: Table) -> str:
    """Columns padded to their widest line; a rule between rows when cells span several lines; a
    control character in a cell shown as its escape (it would start a terminal sequence, or break a row)."""
    header = [escape.visible(h) for h in table.header]
    table = Table(table.title, header, [[[escape.visible(s) for s in c] for c in r] for r in table.rows])
    widths = [
        max([len(h), *(len(line) for r in table.rows for line in r[i])]) for i, h in enumerate(table.header)
    ]
    multi = any(len(cell) > 1 for r in table.rows for cell in r)

    def line(cells: Sequence[str]) -> str:
        padded = [c.ljust(w) for c, w in zip(cells, widths, strict=True)]
        while len(padded) > 1 and not padded[-1].strip():  # no dangling separators after the last value
            padded.pop()
        return " | ".join(padded).rstrip()

    out = [line(table.header), "-+-".join("-" * w for w in widths)]
    for i, row in enumerate(table.rows):
        if multi and i:
            out.append("-+-".join("-" * w for w in widths))
        height = max(len(c) for c in row)
        out += [line([c[k] if k < len(c) else "" for c in row]) for k in range(height)]
    return "\n".join(out)


def render_text(report: StudyReport) -> str:
    """What the terminal shows: per ablation the summary and the detail tables, then cost."""
    out = [
        f"study {report.study.name!r}: parent run {report.parent_run_id} at {report.tracking_uri}",
        *([report.partial.line] if report.partial else []),
        *report.notes,
    ]
    for ab in report.ablations:
        out += ["", f"== {ab.name} ==", *ablation_notes(ab), "", text_table(summary_table(ab))]
        for table in detail_tables(ab):
            out += ["", table.title, text_table(table)]
        if note := effects_note(ab):
            out += ["", note]
        if table := effects_table(ab):
            out += [table.title, text_table(table)]
        if table := pareto_table(ab):
            out += ["", table.title, text_table(table)]
        if lines := problems(ab):
            out += ["", "not averaged:", *(f"  {p}" for p in lines)]
    out += ["", "== cost ==", text_table(cost_table(report))]
    return escape.terminal("\n".join(out))


md_escape = escape.markdown  # a record value in Markdown: no pipe, line break or HTML of its own


def frame(table: Table, sep: str, each: Callable[[str], str] = escape.visible) -> pd.DataFrame:
    """The table as a DataFrame of strings, each line of a cell escaped by ``each`` and joined by ``sep``."""
    rows = [[sep.join(each(line) for line in cell) for cell in row] for row in table.rows]
    return pd.DataFrame(rows, columns=table.header)


def markdown_table(table: Table) -> str:
    """GitHub Markdown through pandas (tabulate's pipe format); cells stay text (no number parsing)."""
    cells = frame(table, "<br>", md_escape)
    cells.columns = [md_escape(h) for h in table.header]
    return cells.to_markdown(index=False, disable_numparse=True)


def render_markdown(report: StudyReport, images: dict[str, list[Path]]) -> str:
    partial = report.partial
    out = [
        f"# Study report{f' ({partial.mark})' if partial else ''}: {report.study.name}",
        "",
        *([f"**{partial.mark}** {md_escape(partial.detail)}", ""] if partial else []),
        f"Parent run `{report.parent_run_id}` at `{report.tracking_uri}`; built {report.created}.",
        *(md_escape(n) for n in report.notes),
    ]
    for ab in report.ablations:
        out += [
            "",
            f"## {ab.name}",
            "",
            *(f"{md_escape(n)}  " for n in ablation_notes(ab)),
            "",
            markdown_table(summary_table(ab)),
        ]
        for table in detail_tables(ab):
            out += ["", f"### {table.title}", "", markdown_table(table)]
        if note := effects_note(ab):
            out += ["", f"### {ab.name}: effects", "", md_escape(note)]
        if table := effects_table(ab):
            out += ["", markdown_table(table)]
        if table := pareto_table(ab):
            out += ["", f"### {md_escape(table.title)}", "", markdown_table(table)]
        if lines := problems(ab):
            out += ["", "Not averaged:", "", *(f"* {md_escape(p)}" for p in lines)]
        out += ["", *(f"![{p.stem}]({p.name})" for p in images.get(ab.name, []))]
    out += ["", "## Cost", "", markdown_table(cost_table(report)), ""]
    return "\n".join(out)


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;color:#222;max-width:1600px}
table{border-collapse:collapse;margin:.6em 0 1.4em;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right;vertical-align:top;white-space:pre}
th{background:#f0f0f0} td.col0,th.col0{text-align:left}
td.paper-choice{background:#fff8dc} td.reference.col0{font-weight:bold}
td.significant{color:#a00000} td.incomplete.col2{background:#fde2e2}
td.total{font-weight:bold} .notes{color:#555;font-size:13px} img{max-width:100%;margin:.5em 0}
.wide{max-width:100%;overflow-x:auto} .wide table{margin-top:0}
.partial{background:#fff3cd;border:1px solid #e0c060;padding:.5em .8em}
"""  # .wide: a table wider than the window scrolls inside its box, not the page


def html_table(table: Table) -> str:
    """An HTML table through pandas' Styler: cells escaped, each row's classes on its cells (CSS above);
    a cell's lines break at its newlines only (``white-space: pre``)."""
    cells = frame(table, "\n")
    cells.columns = [escape.visible(h) for h in table.header]
    classes = [table.classes[i] if i < len(table.classes) else "" for i in range(len(cells))]
    per_cell = pd.DataFrame([[c] * len(cells.columns) for c in classes], columns=cells.columns)
    styled = cells.style.hide(axis="index").format(escape="html").format_index(escape="html", axis=1)
    styled = styled.set_td_classes(per_cell)
    return f'<div class="wide">{styled.to_html()}</div>'


def render_html(report: StudyReport, images: dict[str, list[Path]]) -> str:
    """One page, no outside files: inline CSS, PNGs embedded as base64. Each ablation opens on its table
    (after the one line naming the paper table), its statistics and notes under a heading below."""
    esc = escape.html_text
    mark = f" ({report.partial.mark})" if report.partial else ""
    parts = [
        f"<h1>Study report{esc(mark)}: {esc(report.study.name)}</h1>",
        *([f'<p class="partial">{esc(report.partial.line)}</p>'] if report.partial else []),
        f'<p class="notes">Parent run <code>{esc(report.parent_run_id)}</code> at '
        f"<code>{esc(report.tracking_uri)}</code>; built {esc(report.created)}.</p>",
        *(f'<p class="notes">{esc(n)}</p>' for n in report.notes),
    ]
    for ab in report.ablations:
        lead, *reading = ablation_notes(ab)  # the paper table it is; then how to read it: below the answer
        parts += [
            f"<h2>{esc(ab.name)}</h2>",
            f'<p class="notes">{esc(lead)}</p>',
            html_table(summary_table(ab)),
        ]
        for table in detail_tables(ab):
            parts += [f"<h3>{esc(table.title)}</h3>", html_table(table)]
        if note := effects_note(ab):
            parts += [f"<h3>{esc(ab.name)}: effects</h3>", f'<p class="notes">{esc(note)}</p>']
        if table := effects_table(ab):
            parts.append(html_table(table))
        if table := pareto_table(ab):
            parts += [f"<h3>{esc(table.title)}</h3>", html_table(table)]
        if lines := problems(ab):
            parts.append("<p>Not averaged:</p><ul>" + "".join(f"<li>{esc(p)}</li>" for p in lines) + "</ul>")
        for png in images.get(ab.name, []):
            data = base64.b64encode(png.read_bytes()).decode()
            parts.append(f'<img alt="{esc(png.stem)}" src="data:image/png;base64,{data}">')
        if reading:
            parts += [f"<h3>{esc(ab.name)}: how to read the table</h3>"]
            parts += [f'<p class="notes">{esc(n)}</p>' for n in reading]
    parts += ["<h2>Cost</h2>", html_table(cost_table(report))]
    title = esc(f"Study report{mark}: {report.study.name}")
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{title}</title><style>{CSS}</style>'
        f"</head><body>\n" + "\n".join(parts) + "\n</body></html>\n"
    )


CSV_FIELDS = (
    "ablation", "table", "point", "paper_choice", "reference", "eval_only", "same_as", "trials", "metric",
    "main_metric", "mean", "std", "ci_low", "ci_high", "n", "paper", "paper_printed", "diff", "verdict", "tost_p",
    "tolerance", "seeds_needed", "p_value", "p_adjusted", "test", "correction",
)  # fmt: skip


def csv_rows(report: StudyReport) -> list[dict[str, Any]]:
    """One row per ablation x point x metric; p_value and its Holm adjustment on the main metric's rows
    (blank for the reference); a text cell a spreadsheet would take for a formula starts with a quote."""
    return [{k: escape.csv_cell(v) for k, v in row.items()} for row in _csv_rows(report)]


def _csv_rows(report: StudyReport) -> list[dict[str, Any]]:
    out = []
    for ab in report.ablations:
        for row in ab.rows:
            for metric in ab.metrics:
                s, paper = row.stats[metric], row.paper_value(metric)
                main = metric == ab.main_metric
                test = row.test if main else None
                judged = row.verdicts.get(metric)
                out.append(
                    {
                        "ablation": ab.name, "table": ab.spec.table or "", "point": row.label,
                        "paper_choice": row.paper_choice, "reference": row.reference,
                        "eval_only": row.eval_only, "same_as": "; ".join(row.same_as),
                        "trials": row.trials_text(), "metric": metric, "main_metric": main,
                        "mean": _num(s.mean), "std": _num(s.std), "ci_low": _num(s.ci_low),
                        "ci_high": _num(s.ci_high), "n": s.n, "paper": _num(paper),
                        "paper_printed": _num(printed_value(row, metric)),
                        "diff": _num(s.mean - paper) if paper is not None and s.n else "",
                        "verdict": judged.short if judged else "",
                        "tost_p": _num(judged.p_value) if judged else "",
                        "tolerance": judged.tolerance if judged else "",
                        "seeds_needed": (judged.seeds_needed or "") if judged else "",
                        "p_value": _num(test.p_value) if test else "",
                        "p_adjusted": _num(test.p_adjusted) if test else "",
                        "test": TEST_NAME if test else "", "correction": CORRECTION if test else "",
                    }
                )  # fmt: skip
    return out


def printed_value(row: Row, metric: str) -> float | None:
    """The average the paper printed where ``paper`` is its row's recomputed mean; None elsewhere."""
    printed = row.printed.get(metric) or row.printed.get(metric.removeprefix("best_"))
    return printed.printed if printed else None


def _num(value: float | None) -> float | str:
    return "" if value is None or math.isnan(value) else value


JSON_VERSION = 1  # bumped when a key changes meaning or goes away (added keys do not bump it)


def _clean(value: Any) -> Any:
    """nan and inf as null (JSON has neither), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def json_cell(row: Row, metric: str) -> dict[str, Any]:
    s, paper, judged = row.stats[metric], row.paper_value(metric), row.verdicts.get(metric)
    return {
        "mean": s.mean if s.n else None, "std": s.std, "ci_low": s.ci_low, "ci_high": s.ci_high, "n": s.n,
        "seeds": {str(k): v for k, v in row.values(metric).items()},
        "paper": paper, "paper_printed": printed_value(row, metric),
        "diff": s.mean - paper if paper is not None and s.n else None,
        "verdict": None if judged is None else {
            "kind": judged.kind, "direction": judged.direction, "text": judged.short,
            "tost_p": judged.p_value, "tolerance": judged.tolerance, "seeds_needed": judged.seeds_needed,
            "provisional": judged.provisional,
        },
    }  # fmt: skip


def json_row(row: Row, metrics: list[str]) -> dict[str, Any]:
    test = row.test
    return {
        "label": row.label, "overrides": row.overrides, "paper_choice": row.paper_choice,
        "reference": row.reference, "eval_only": row.eval_only, "in_study": row.in_study,
        "same_as": row.same_as, "trials": row.trials_text(),
        "runs": [{"seed": t.seed, "status": t.status, "run_id": t.run_id} for t in row.runs()],
        "metrics": {m: json_cell(row, m) for m in metrics},
        "test": None if test is None else {
            "name": TEST_NAME, "correction": CORRECTION, "n": test.n, "mean_diff": test.mean_diff,
            "p_value": test.p_value, "p_adjusted": test.p_adjusted, "significant": test.significant,
        },
    }  # fmt: skip


def json_effects(ab: AblationReport) -> dict[str, Any] | None:
    e = ab.effects
    if e is None:
        return None
    return {
        "kind": e.kind, "method": e.method, "reason": e.reason, "residual_df": e.residual_df,
        "metric": ab.main_metric, "importances": e.importances,
        "terms": [vars(t) for t in e.terms],
    }  # fmt: skip


def json_pareto(ab: AblationReport) -> dict[str, Any] | None:
    front = ab.pareto
    if front is None:
        return None
    return {
        "objectives": [{"metric": m, "mode": mode} for m, mode in front.objectives],
        "configurations": [
            {
                "label": label,
                "values": values,
                "seeds": front.seeds[label],
                "on_front": label in front.front,
                "near_front": label in front.near,
            }
            for label, values in front.values.items()
        ],
    }


def json_cost(c: Cost) -> dict[str, Any]:
    return {
        "runs": c.runs, "with_cost": c.measured, "wall_s": c.wall_s, "cpu_s": c.cpu_s, "gpu_s": c.gpu_s,
        "gpu_utilization": c.gpu_utilization, "devices": dict(c.devices),
    }  # fmt: skip


def json_report(report: StudyReport) -> dict[str, Any]:
    """The report's content as plain data (``--format json``): what the Markdown shows, as numbers."""
    ablations = [
        {
            "name": ab.name,
            "table": ab.spec.table,
            "description": ab.spec.description,
            "main_metric": ab.main_metric,
            "metrics": ab.metrics,
            "tolerance": ab.tolerance,
            "tolerance_source": ab.tolerance_source,
            "notes": ablation_notes(ab),
            "fidelity": fidelity_lines(ab),
            "rows": [json_row(r, ab.metrics) for r in ab.rows],
            "effects": json_effects(ab),
            "pareto": json_pareto(ab),
            "not_averaged": problems(ab),
            "cost": json_cost(ab.cost),
        }
        for ab in report.ablations
    ]
    return _clean(
        {
            "version": JSON_VERSION,
            "study": report.study.name,
            "parent_run_id": report.parent_run_id,
            "tracking_uri": report.tracking_uri,
            "created": report.created,
            "partial": None
            if report.partial is None
            else {
                "finished": report.partial.finished,
                "planned": report.partial.planned,
                "every": report.partial.every,
                "stopped_by": report.partial.stopped_by,
                "text": report.partial.mark,
            },
            "notes": report.notes,
            "confidence": CONFIDENCE,
            "alpha": ALPHA,
            "wall_s": report.wall_s,
            "ablations": ablations,
            "cost": json_cost(report.cost),
        }  # fmt: skip
    )


def render_json(report: StudyReport) -> str:
    """``json_report`` as text; values that are no JSON type (a path in an override) as strings."""
    return json.dumps(json_report(report), indent=2, default=str, allow_nan=False) + "\n"
