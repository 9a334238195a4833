"""What a study's record says of it: the resolved summary its parent run keeps, and one row per trial
for the terminal.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from clsr.study.plan.point import GridPoint
from clsr.study.plan.resolve import grid_points, stages, trial_document
from clsr.study.spec.schema import Study
from clsr.tracking.study_runs import (
    SUPERSEDED_TAG,
    run_labels,
)
from clsr.tracking.tags import last_error_line


def resolved_summary(study: Study) -> dict[str, Any]:
    """The base configuration every trial starts from, and each ablation's points with paper numbers."""
    return {
        "study": study.model_dump(by_alias=True, exclude_none=True),
        "base_trials": {n: trial_document(study, n, {}, study.seeds_of(n)[0]) for n in study.ablations},
        "stages": stages(study),
        "points": {
            n: [_point_document(p) for p in grid_points(a)] if not a.space else "sampled"
            for n, a in study.ablations.items()
        },
    }


def _point_document(point: GridPoint) -> dict[str, Any]:
    """A grid point as resolved.yaml has always held it: ``label``, ``overrides``, ``paper`` (a grid
    point is tied to no ablation yet and has no members). Its values as they are, not copies (``asdict``'s):
    points sharing a row's paper numbers keep sharing them, as YAML anchors."""
    return {f.name: getattr(point, f.name) for f in fields(point) if f.name not in ("ablation", "members")}


SUMMARY_AVERAGES = ("test_sts_avg", "test_sts12_15_avg", "test_transfer_avg")


def summary_rows(runs, study: Study) -> list[dict[str, Any]]:
    """One row per trial from its MLflow run (the record): status, the study metric, then the test
    averages it has (a lone STS task if no average)."""
    from clsr.data.faq import FAQ_TASKS
    from clsr.data.sts import STS_TASKS

    rows = []
    for run in sorted(runs, key=study_order(study)):
        tags, metrics = run.data.tags, run.data.metrics
        if SUPERSEDED_TAG in tags:
            continue
        tests = {k: metrics[k] for k in SUMMARY_AVERAGES if k in metrics}
        if "test_sts_avg" not in tests:
            tests = {f"test_{t}": metrics[f"test_{t}"] for t in STS_TASKS if f"test_{t}" in metrics} | tests
        tests |= {
            k: metrics[k] for t in FAQ_TASKS for k in (f"test_{t}_top1", f"test_{t}_map") if k in metrics
        }
        also = len(run_labels(tags)) - 1  # identical trials of other points (named in clsr.also)
        rows.append(
            {
                "ablation": tags.get("clsr.ablation"),
                "point": tags.get("clsr.point", "") + (f" (+{also} identical)" if also else ""),
                "seed": tags.get("clsr.seed"),
                "status": tags.get("clsr.status", "unknown"),
                study.metric: metrics.get(study.metric),
                **tests,
                **({"reason": reason} if (reason := _reason(tags)) else {}),
            }
        )
    return rows


def study_order(study: Study):
    """A sort key for trial runs in the study file's order: its ablations, each one's points as listed
    (a sampled ablation's, and a label the file no longer has, after them as they started), then seeds."""
    ablations = {name: i for i, name in enumerate(study.ablations)}
    points = {
        name: {p.label: i for i, p in enumerate(grid_points(a))} if not a.space else {}
        for name, a in study.ablations.items()
    }

    def key(run) -> tuple:
        tags = run.data.tags
        ablation, point, seed = tags.get("clsr.ablation"), tags.get("clsr.point"), tags.get("clsr.seed", "")
        order, started = points.get(ablation, {}), run.info.start_time or 0
        seed_key = int(seed) if seed.isdigit() else -1
        listed = (seed_key, started) if point in order else (started, seed_key)
        return (ablations.get(ablation, len(ablations)), order.get(point, len(order)), *listed)

    return key


def _reason(tags: dict[str, str]) -> str:
    """Why a trial did not finish, in one line: the last line of its error (the exception)."""
    if tags.get("clsr.status") == "finished":
        return ""
    return last_error_line(tags)


INLINE_REASON = 60  # longer reasons are numbered in the table and written out whole below it


def format_rows(rows: list[dict[str, Any]]) -> str:
    """The trials as a text table; a long reason (its hint is often at its end) is never cut: the
    table shows its number and the reasons follow the table, each once."""
    if not rows:
        return "(no trials)"
    notes: dict[str, int] = {}
    for row in rows:
        if len(reason := row.get("reason") or "") > INLINE_REASON:
            notes.setdefault(reason, len(notes) + 1)
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cells = [
        [_cell(r.get(k)) if k != "reason" else _reason_cell(r.get(k), notes) for k in keys] for r in rows
    ]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = " | ".join(k.ljust(w) for k, w in zip(keys, widths, strict=True))
    body = "\n".join(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells)
    footnotes = "".join(f"\n[{n}] {reason}" for reason, n in notes.items())
    return f"{line}\n{'-' * len(line)}\n{body}" + (f"\n{footnotes}" if footnotes else "")


def _reason_cell(reason: str | None, notes: dict[str, int]) -> str:
    return f"[{notes[reason]}]" if reason in notes else _cell(reason)


def _cell(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else ("-" if value is None else str(value))
