"""The Pareto front of a study on several objectives (a search's configurations, a grid's points): those
no other one beats on every objective at once. Computed by Optuna itself (``Study.best_trials`` of an
in-memory study holding each configuration's mean over seeds), so the report's front is the one Optuna's
sampler works with.

Means over a few seeds rank noisily, so the configurations *near* the front are marked too: off the
front, but with a 95% CI (Student's t over the seeds) that overlaps a front configuration's CI on every
objective, so the seeds do not tell them apart from it (``near_front``). A configuration with one seed
has no CI and is never near.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

DIRECTIONS = {"max": "maximize", "min": "minimize"}


@dataclass(frozen=True)
class ParetoFront:
    """A sampled ablation's configurations on several objectives, and which of them form the front."""

    objectives: list[tuple[str, str]]  # (metric, mode)
    values: dict[str, list[float]]  # configuration label -> its mean over seeds of each objective
    seeds: dict[str, int]  # configuration label -> finished seeds behind the means
    front: list[str]  # the non-dominated labels, in the order of ``values``
    near: list[str] = field(default_factory=list)  # off the front, CIs overlapping a front one's (near_front)


def pareto_front(points: Mapping[str, Sequence[float]], modes: Sequence[str]) -> list[str]:
    """Labels of the non-dominated ``points`` ({label: one value per objective}), in the given order;
    points with a missing (nan) value take no part."""
    import math

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.create_study(directions=[DIRECTIONS[m] for m in modes])
    labels = [label for label, values in points.items() if not any(math.isnan(v) for v in values)]
    study.add_trials(
        [
            optuna.trial.create_trial(values=list(points[label]), user_attrs={"label": label})
            for label in labels
        ]
    )
    front = {t.user_attrs["label"] for t in study.best_trials}
    return [label for label in labels if label in front]


Interval = tuple[float, float]  # a CI's (low, high); nan: none


def _overlap(a: Interval, b: Interval) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]  # False with a nan end: no CI, no overlap


def near_front(intervals: Mapping[str, Sequence[Interval]], front: Sequence[str]) -> list[str]:
    """Labels off ``front`` whose CI overlaps some front label's CI on every objective, in the given order
    (``intervals``: {label: one CI per objective})."""
    on = set(front)
    return [
        label
        for label, cis in intervals.items()
        if label not in on
        and any(all(_overlap(a, b) for a, b in zip(cis, intervals[f], strict=True)) for f in front)
    ]
