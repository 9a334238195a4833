"""Adaptive seeds: which rows of an ablation get one more seed in the next round.

A row's seeds stop once its 95 % CI is narrow enough and, when the paper gives a number, its verdict is
conclusive; else it gets the next seed of its pool, up to ``max``. The rows and their values are the
report's own (``clsr.study.analyse.rows``), so "finished" and "main metric" mean what the report shows. Tune's
searchers pick configurations, not how many repeats a configuration needs, hence these few lines over
SciPy's t quantile and the report's verdict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy import stats as sps

from clsr.study.analyse.rows import AblationReport, ablation_report
from clsr.study.plan.resolve import grid_points
from clsr.study.plan.study_plan import TrialSpec
from clsr.study.spec.ablation import AdaptiveSeeds
from clsr.study.spec.schema import Study
from clsr.study.stats.verdict import CONFIDENCE, INCONCLUSIVE, verdict


def half_width(values: Sequence[float]) -> float:
    """The Student-t 95 % CI half-width of the mean (inf below 2 values)."""
    n = len(values)
    if n < 2:
        return math.inf
    std = float(np.std(np.asarray(values, dtype=float), ddof=1))
    return float(sps.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * std / math.sqrt(n)


def needs_seed(values: Sequence[float], paper: float | None, tolerance: float, spec: AdaptiveSeeds) -> bool:
    """Whether a row of finished ``values`` gets another seed."""
    n = len(values)
    if n >= spec.max:
        return False
    if n < spec.min or half_width(values) > spec.until_ci:
        return True
    return paper is not None and verdict(values, paper, tolerance).kind == INCONCLUSIVE


def next_trials(study: Study, name: str, report: AblationReport) -> list[TrialSpec]:
    """One trial (the next seed of its pool not yet run for the row) per row that needs a seed."""
    spec = study.adaptive_of(name)
    assert spec is not None
    points = {p.label: p for p in grid_points(study.ablations[name])}
    trials = []
    for row in report.rows:
        values = list(row.values(report.main_metric).values())
        if not needs_seed(values, row.paper_value(report.main_metric), report.tolerance, spec):
            continue
        # an averaged row (average_over): the seed runs on each of its folds
        members = [r for r in row.folds or [row] if r.label in points]  # rows the file still plans
        seen = {s for r in members for s in r.trials}
        unused = [s for s in spec.pool if s not in seen]
        if members and unused:
            trials += [
                TrialSpec(name, r.label, points[r.label].overrides, points[r.label].paper, unused[0])
                for r in members
            ]
    return trials


def round_trials(study: Study, name: str, trials: list[Any]) -> list[TrialSpec]:
    """The next round's trials of adaptive ablation ``name`` from its report trials (``load_trials``)."""
    return next_trials(study, name, ablation_report(study, name, [t for t in trials if t.ablation == name]))
