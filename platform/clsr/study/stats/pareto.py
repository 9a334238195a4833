"""The Pareto front of a study searched on several objectives: the configurations no other one beats on
every objective at once. Computed by Optuna itself (``Study.best_trials`` of an in-memory study holding
each configuration's mean over seeds), so the report's front is the one Optuna's sampler works with.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

DIRECTIONS = {"max": "maximize", "min": "minimize"}


@dataclass(frozen=True)
class ParetoFront:
    """A sampled ablation's configurations on several objectives, and which of them form the front."""

    objectives: list[tuple[str, str]]  # (metric, mode)
    values: dict[str, list[float]]  # configuration label -> its mean over seeds of each objective
    seeds: dict[str, int]  # configuration label -> finished seeds behind the means
    front: list[str]  # the non-dominated labels, in the order of ``values``


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
