"""The one place a trial is a dict: Tune's param space holds each trial as ``config["point"]`` (a grid's
``tune.grid_search`` over them, a search's distributions), and hands it back to the trial so. Everything
else in the run takes the plan's ``TrialSpec``."""

from __future__ import annotations

from typing import Any

from clsr.study.plan.study_plan import TrialSpec

TunePoint = dict[str, Any]  # what Tune's param space holds as config["point"]


def point_of(trial: TrialSpec) -> TunePoint:
    """A trial as Tune's grid holds it: what names it, no configuration (the trial resolves its own)."""
    return {
        "ablation": trial.ablation,
        "label": trial.label,
        "overrides": dict(trial.overrides),  # Tune's own copies: the plan stays as planned
        "paper": dict(trial.paper),
        "seed": trial.seed,
        "also": [list(pair) for pair in trial.also],
    }


def sampled_point(ablation: str, space: dict[str, Any], seed: Any) -> TunePoint:
    """A search's point: Tune samples ``space`` (distributions) and ``seed`` into each trial's."""
    return {"ablation": ablation, "label": None, "overrides": space, "paper": {}, "seed": seed}


def spec_of(point: TunePoint) -> TrialSpec:
    """The trial Tune hands back in ``config["point"]``, typed again."""
    return TrialSpec(
        point["ablation"],
        point["label"],
        dict(point["overrides"]),
        dict(point.get("paper") or {}),
        point["seed"],
        also=tuple((a, p) for a, p in point.get("also") or ()),
    )
