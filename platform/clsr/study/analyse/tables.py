"""The report's tables and notes, drawn nowhere yet: a ``Table`` is a title, a header and cells of
lines, which the renderers set as terminal text, Markdown, HTML. Per ablation: the summary (the main
metric beside the paper, the verdict and the test against the reference), the detail tables (every
metric column, one table per family of metrics), the effects and the Pareto front; the notes that say
what the cells and tests are and how faithful the table is, the trials that were not averaged and why;
and the study's cost table. The number formats live here too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from clsr.study.analyse.rows import FAMILIES, KNOWN_TESTS, AblationReport, Row, StudyReport
from clsr.study.stats.seeds import ALPHA, CONFIDENCE, CORRECTION, TEST_NAME, Stats
from clsr.study.stats.verdict import legend


@dataclass
class Table:
    """A rendered-anywhere table: each cell a list of lines; ``classes`` style the HTML rows."""

    title: str
    header: list[str]
    rows: list[list[list[str]]]
    classes: list[str] = field(default_factory=list)


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def fmt_p(p: float | None) -> str:
    if p is None or math.isnan(p):
        return "n/a"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def fmt_seconds(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.2f} h"


def mean_std(s: Stats | None) -> str:
    if s is None or s.n == 0:
        return "-"
    return fmt(s.mean) if s.n < 2 else f"{s.mean:.2f} ± {s.std:.2f}"


def ci_text(s: Stats | None) -> str:
    return "-" if s is None or s.n < 2 else f"[{s.ci_low:.2f}, {s.ci_high:.2f}]"


def n_text(s: Stats | None) -> str:
    """The CI and n of a detail cell: ``[lo, hi] n=3``, or ``n=1`` alone (no interval below two seeds)."""
    n = s.n if s else 0
    return f"n={n}" if s is None or n < 2 else f"{ci_text(s)} n={n}"


def row_class(row: Row) -> str:
    classes = ["paper-choice" if row.paper_choice else "", "reference" if row.reference else ""]
    if row.test is not None and row.test.significant:
        classes.append("significant")
    if any(not t.ok for t in row.trials.values()) or row.missing():
        classes.append("incomplete")
    return " ".join(c for c in classes if c)


def summary_table(ab: AblationReport) -> Table:
    """The ablation at a glance: the main metric, the paper, and the test against the reference."""
    m = ab.main_metric
    header = ["point", "row", "trials", f"{m} mean ± std", "95% CI", "n", "paper", "ours − paper", "verdict"]
    header += ["ours − ref", "p (paired t)", "p (Holm)", "sig."]
    rows = []
    for row in ab.rows:
        s, paper = row.stats.get(m), row.paper_value(m)
        diff = s.mean - paper if s is not None and s.n and paper is not None else None
        test = row.test
        cells = [row.display_label, "", row.trials_text(), mean_std(s), ci_text(s)]
        judged = row.verdicts.get(m)
        cells += [
            str(s.n if s else 0),
            paper_text(row, m),
            fmt(diff, "+.2f"),
            judged.short if judged else "-",
        ]
        if test is None:
            cells += ["(reference)" if row.reference else "-", "", "", ""]
        else:
            sig = "*" if test.significant else ""
            cells += [fmt(test.mean_diff, "+.2f"), fmt_p(test.p_value), fmt_p(test.p_adjusted), sig]
        rows.append([[c] for c in cells])
        rows[-1][1] = row.mark_lines() or [""]
    return Table(f"{ab.name}: {m}", header, rows, [row_class(r) for r in ab.rows])


def paper_text(row: Row, metric: str) -> str:
    """The paper's number a row is judged against: ``82.35 (printed 83.35)`` where the paper prints an
    average that is not its row's mean (``clsr.study.analyse.averages``)."""
    printed = row.printed.get(metric) or row.printed.get(metric.removeprefix("best_"))
    text = fmt(row.paper_value(metric))
    return f"{text} (printed {printed.printed:.2f})" if printed else text


def column_groups(ab: AblationReport) -> list[tuple[str, list[str]]]:
    """The metric columns split by family, so no terminal table is wider than one family."""
    groups = [(title, [m for m in family if m in ab.metrics]) for title, family in FAMILIES]
    other = [m for m in ab.metrics if m not in KNOWN_TESTS and m.startswith("test_")]
    selection = [m for m in ab.metrics if not m.startswith("test_") and m != ab.main_metric]
    groups = [("selection / dev", selection), *groups, ("other test metrics", other)]
    return [(title, cols) for title, cols in groups if cols]


def cell_lines(row: Row, metric: str) -> list[str]:
    """mean ± std, then CI and n, then the paper's number, ours − paper and the verdict when it has one."""
    s, paper = row.stats.get(metric), row.paper_value(metric)
    lines = [mean_std(s), n_text(s)]
    if paper is not None:
        diff = fmt(s.mean - paper, "+.2f") if s is not None and s.n else "-"
        lines += [f"paper {paper_text(row, metric)}", f"Δ {diff}"]
        if judged := row.verdicts.get(metric):
            lines.append(judged.short)
    return lines


def detail_tables(ab: AblationReport) -> list[Table]:
    """Every metric column: mean ± std, 95% CI, n, paper, ours − paper and the verdict per cell."""
    tables = []
    for title, cols in column_groups(ab):
        rows = []
        for row in ab.rows:
            label = [row.display_label] + [f"({m})" for m in row.mark_lines()]
            rows.append([label, [row.trials_text()], *(cell_lines(row, m) for m in cols)])
        tables.append(
            Table(f"{ab.name}: {title}", ["point", "trials", *cols], rows, [row_class(r) for r in ab.rows])
        )
    return tables


def effects_table(ab: AblationReport) -> Table | None:
    """The ANOVA terms (partial η² with its bootstrap CI) or the importances; None when skipped."""
    e = ab.effects
    if e is None or e.kind == "skipped":
        return None
    if e.kind == "importance":
        rows = [[[k], [f"{v:.3f}"]] for k, v in e.importances.items()]
        return Table(f"{ab.name}: effects on {ab.main_metric}", ["parameter", "importance (fANOVA)"], rows)
    header = ["term", "SS", "df", "F", "p", "partial η²", f"{CONFIDENCE:.0%} CI (bootstrap)"]
    rows = [
        [
            [t.term],
            [fmt(t.sum_sq, ".3f")],
            [fmt(t.df, ".0f")],
            [fmt(t.f)],
            [fmt_p(t.p_value)],
            [fmt(t.partial_eta_sq, ".3f")],
            ["-" if math.isnan(t.ci_low) else f"[{t.ci_low:.3f}, {t.ci_high:.3f}]"],
        ]  # fmt: skip
        for t in e.terms
    ]
    return Table(f"{ab.name}: effects on {ab.main_metric}", header, rows)


def pareto_table(ab: AblationReport) -> Table | None:
    """The configurations on the Pareto front of the study's objectives, best first on the first, then
    those near it (CIs overlapping a front configuration's on every objective), likewise."""
    front = ab.pareto
    if front is None:
        return None
    names = [f"{m} ({'higher' if mode == 'max' else 'lower'} is better)" for m, mode in front.objectives]
    first_mode = front.objectives[0][1]

    def ordered(labels: list[str]) -> list[str]:
        return sorted(labels, key=lambda label: front.values[label][0], reverse=first_mode == "max")

    rows = [
        [[label], *([fmt(v)] for v in front.values[label]), [str(front.seeds[label])], [where]]
        for labels, where in ((front.front, "on"), (front.near, "near"))
        for label in ordered(labels)
    ]
    near = (
        f", {len(front.near)} near it (95% CIs overlap a front one's on every objective)"
        if front.near
        else ""
    )
    title = (
        f"{ab.name}: Pareto front, {len(front.front)} of {len(front.values)} configurations (no other "
        f"configuration is at least as good on every objective and better on one; means over seeds){near}"
    )
    return Table(title, ["configuration", *names, "seeds", "front"], rows)


def effects_note(ab: AblationReport) -> str:
    """What the effects table is, or why there is none (one line)."""
    e = ab.effects
    if e is None:
        return ""
    if e.kind == "skipped":
        return f"effects: {e.reason}"
    if e.kind == "importance":
        return f"effects: share of the main metric's variance each sampled key explains ({e.method})"
    return (
        f"effects: {e.method}; residual df {e.residual_df:.0f}; partial η² = SS_term / (SS_term + "
        f"SS_residual), the share of the variance left after the other terms that the term explains"
    )


def problems(ab: AblationReport) -> list[str]:
    """Every planned trial without a finished run, with why, so nothing disappears from the means."""
    lines = []
    for row in ab.rows:
        for part in row.folds or [row]:  # an averaged row's failures are its folds' runs
            for seed, trial in sorted(part.trials.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
                if not trial.ok:
                    why = f": {trial.error_line()}" if trial.error_line() else ""
                    lines.append(f"{part.label} seed {seed}: {trial.status}{why} (run {trial.run_id})")
            lines += [f"{part.label} seed {seed}: missing (no run)" for seed in part.missing()]
        if not row.in_study:
            lines.append(f"{row.label}: runs of a point the study file does not have")
    return lines


def cost_table(report: StudyReport) -> Table:
    """Compute per ablation and for the study, from the trials' trial_wall_s / _cpu_s / _gpu_s, and the
    GPU utilisation sampled by MLflow system metrics (weighted by GPU seconds)."""
    header = ["ablation", "runs", "with cost", "wall (sum of trials)", "CPU", "GPU", "GPU util", "devices"]
    items = [(a.name, a.cost) for a in report.ablations] + [("study", report.cost)]
    rows = []
    for name, c in items:
        devices = "; ".join(f"{d} ({n})" for d, n in sorted(c.devices.items())) or "-"
        times = [fmt_seconds(x) for x in (c.wall_s, c.cpu_s, c.gpu_s)] if c.measured else ["not logged"] * 3
        busy = "-" if c.gpu_utilization is None else f"{c.gpu_utilization:.0f} %"
        rows.append([[name], [str(c.runs)], [str(c.measured)], *([t] for t in times), [busy], [devices]])
    classes = [""] * (len(rows) - 1) + ["total"]
    if report.wall_s is not None:  # trials overlap: the study took less than their sum
        rows.append(
            [["study, start to end"], [""], [""], [fmt_seconds(report.wall_s)], ["-"], ["-"], ["-"], ["-"]]
        )
        classes.append("total")
    return Table("cost", header, rows, classes)


def ablation_notes(ab: AblationReport) -> list[str]:
    ref = ab.reference
    why = (
        "the study's reference"
        if ab.spec.reference
        else "the paper's choice"
        if ab.spec.paper_choice
        else "the first point"
    )
    lines = [f"{ab.spec.table or ab.name}" + (f" — {ab.spec.description}" if ab.spec.description else "")]
    lines.append(
        f"main metric {ab.main_metric}; reference row {ref.label!r} ({why}); cells: mean ± std over "
        f"seeds, {CONFIDENCE:.0%} CI (Student t), n seeds; rows vs reference: {TEST_NAME} on "
        f"{ab.main_metric} across the seeds both finished, n/a below 2 paired seeds; p (Holm): "
        f"{CORRECTION} ({tested(ab)} tested, family-wise error); * Holm-adjusted p < {ALPHA}"
        if ref is not None
        else "no rows: no point planned and no run found"
    )
    if any(r.verdicts.get(ab.main_metric) for r in ab.rows):
        lines.append(legend(ab.tolerance, ab.tolerance_source))
    if ab.spec.average_over:
        lines.append(
            f"each row is the mean over its {ab.spec.average_over} points ({len(ab.spec.grid[ab.spec.average_over])}) "
            f"per seed; a seed counts once all of them finished (the runs of each are in MLflow)"
        )
    lines += [f"fidelity: {line}" for line in fidelity_lines(ab)]
    return lines + ab.notes


def fidelity_lines(ab: AblationReport) -> list[str]:
    """How faithful the table is, one line each: from the study file's ``fidelity:`` where the schema
    has it (exact rows, rows on stand-in data, the paper's rows not expressible, each with why), and
    always what the paper numbers show: the rows with none on the main metric, or that no row has one
    (a stand-in metric: the description says why)."""
    lines = declared_fidelity(getattr(ab.spec, "fidelity", None), rows_read(ab))
    if ab.tolerance_source:
        lines.append(
            f"verdict tolerance: ± {ab.tolerance:g} points of the metric (this table's), from {ab.tolerance_source}"
        )
    m = ab.main_metric
    rows = [r for r in ab.rows if r.in_study]
    without = [r.label for r in rows if r.paper_value(m) is None]
    others = sorted({k for r in rows for k in r.paper} - {m, m.removeprefix("best_")})
    if rows and len(without) == len(rows):
        elsewhere = f"; the paper's numbers are on {', '.join(others)}" if others else ""
        lines.append(
            f"no published number for the main metric {m} in any row: nothing here is compared with the "
            f"paper on it{elsewhere}" + (f" ({ab.spec.description})" if ab.spec.description else "")
        )
    elif without:
        lines.append(f"rows without a published {m} (not compared with the paper): {'; '.join(without)}")
    return lines


def rows_read(ab: AblationReport) -> dict[str, list[int]]:
    """Row label -> the training rows its finished trials read (their ``data.train.rows`` params), each
    distinct count once."""
    read = {}
    for row in ab.rows:
        counts = {t.params.get("data.train.rows", "") for t in row.runs() if t.ok}
        if numbers := sorted(int(c) for c in counts if c.isdigit()):
            read[row.label] = numbers
    return read


def declared_fidelity(fidelity: Any, read: dict[str, list[int]] | None = None) -> list[str]:
    """``fidelity: {exact: [labels], stand_in: {label: why}, stand_in_setting: {label: why},
    not_expressible: {paper row: why}}``: one line per reason, naming its rows; a stand-in data line ends
    with the training rows its trials read (``read``: label -> counts), or says none finished."""
    if fidelity is None:
        return []
    lines, read = [], read or {}
    if exact := list(getattr(fidelity, "exact", None) or []):
        lines.append(f"exact reproductions: {'; '.join(exact)}")
    for why, labels in by_reason(getattr(fidelity, "stand_in", None) or {}).items():
        counts = sorted({n for label in labels for n in read.get(label, [])})
        rows = (
            f"rows read: {' or '.join(f'{n:,}' for n in counts)}"
            if counts
            else "rows read: no finished trial"
        )
        lines.append(f"stand-in data: {'; '.join(labels)}: {why} ({rows})")
    for why, labels in by_reason(getattr(fidelity, "stand_in_setting", None) or {}).items():
        lines.append(f"stand-in setting: {'; '.join(labels)}: {why}")
    for label, why in (getattr(fidelity, "not_expressible", None) or {}).items():
        lines.append(f"not expressible: {label}: {why}")
    return lines


def by_reason(labelled: dict[str, str]) -> dict[str, list[str]]:
    """Reason -> the labels that give it, in the file's order (rows sharing a YAML anchor share a line)."""
    grouped: dict[str, list[str]] = {}
    for label, why in labelled.items():
        grouped.setdefault(why, []).append(label)
    return grouped


def tested(ab: AblationReport) -> int:
    """The size of the Holm family: rows with a p-value on the main metric."""
    return sum(r.test is not None and not math.isnan(r.test.p_value) for r in ab.rows)
