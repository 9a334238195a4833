"""Tune, then confirm: the points of a ``confirm`` ablation, read from the finished trials of the sampled
ablation it confirms (its ``of``).

A sampled ablation's configurations are Tune's and Optuna's, known only once they ran; their MLflow
runs are the record of what each was and scored. This module ranks them (the mean over seeds of the
study's metric; ties by label) and rebuilds the ``top_k`` best as grid points, each value typed by the
ablation's own distribution from the run's logged parameter (never a tag, nor a path: a tracking
server's tags are anyone's to write). Hand-written because the ranking spans MLflow runs of several
Tune experiments and resumes, which no Tune or Optuna result object holds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from clsr.study.plan import point_label
from clsr.study.schema import Distribution, Study
from clsr.tracking.study_runs import SUPERSEDED_TAG, children


def typed_value(dist: Distribution, text: str) -> Any:
    """A parameter as MLflow logged it (``str`` of the value) back to its distribution's type: the
    ``choice`` option whose ``str()`` is the text (exactly), an int for randint, else a float.
    ValueError when it is none of them."""
    if dist.choice is not None:
        for option in dist.choice:
            if str(option) == text:
                return option
        raise ValueError(f"{text!r} is none of the choices {dist.choice}")
    return int(text) if dist.randint else float(text)


def configuration(study: Study, of: str, params: dict[str, str]) -> dict[str, Any]:
    """The typed overrides of one sampled run (its space keys); ValueError when one is missing or bad."""
    overrides = {}
    for key, dist in study.ablations[of].space.items():
        if key not in params:
            raise ValueError(f"no parameter {key!r}")
        overrides[key] = typed_value(dist, params[key])
    return overrides


def rank_configurations(study: Study, of: str, runs: list) -> tuple[list[dict[str, Any]], list[str]]:
    """The sampled ablation ``of``'s finished configurations, best first: ``{"label", "overrides",
    "mean", "seeds"}`` each (the mean over its seeds' runs of ``study.metric``, by ``study.mode``; ties
    by label), and one note per run left out. ``runs``: the study's child runs (any ablation)."""
    values: dict[str, list[float]] = defaultdict(list)
    seeds: dict[str, set[str]] = defaultdict(set)
    configs: dict[str, dict[str, Any]] = {}
    notes = []
    for run in runs:
        tags, metrics = run.data.tags, run.data.metrics
        if tags.get("clsr.ablation") != of or tags.get("clsr.status") != "finished":
            continue
        if SUPERSEDED_TAG in tags or study.metric not in metrics:
            continue
        try:
            overrides = configuration(study, of, run.data.params)
        except ValueError as err:
            notes.append(f"run {run.info.run_id} of {of}: left out ({err})")
            continue
        label = point_label(overrides)
        configs[label] = overrides
        values[label].append(metrics[study.metric])
        seeds[label].add(tags.get("clsr.seed", ""))
    sign = -1 if study.mode == "max" else 1
    ranked = sorted(configs, key=lambda label: (sign * float(np.mean(values[label])), label))
    return [
        {"label": label, "overrides": configs[label], "mean": float(np.mean(values[label])),
         "seeds": len(seeds[label])}
        for label in ranked
    ], notes  # fmt: skip


def confirm_points(study: Study, name: str, runs: list) -> tuple[list[dict[str, Any]], list[str]]:
    """The confirm ablation ``name``'s points from its upstream's best (``top<rank>: <label>``, no paper
    numbers), and the lines to print: runs left out, fewer configurations than ``top_k``."""
    confirm = study.ablations[name].confirm
    ranked, notes = rank_configurations(study, confirm.of, runs)
    best = ranked[: confirm.top_k]
    if 0 < len(best) < confirm.top_k:
        notes.append(
            f"ablations.{name}: {confirm.of} has {len(best)} finished configuration(s), fewer than "
            f"top_k {confirm.top_k}: confirming those"
        )
    points = [
        {"ablation": name, "label": f"top{rank}: {c['label']}", "overrides": c["overrides"], "paper": {}}
        for rank, c in enumerate(best, start=1)
    ]
    return points, notes


def wave_points(study: Study, client, parent_run_id: str, wave: list[str]) -> tuple[list, list, list[str]]:
    """For a wave of the runner: the dynamic points of its confirm ablations, the confirm ablations
    whose upstream has no finished configuration (their trials are skipped), and the lines to print."""
    confirming = [a for a in wave if study.ablations[a].confirm is not None]
    if not confirming:
        return [], [], []
    runs = children(client, parent_run_id)
    points, empty, lines = [], [], []
    for name in confirming:
        found, notes = confirm_points(study, name, runs)
        points += found
        lines += notes
        if not found:
            empty.append(name)
    return points, empty, lines
