"""Tune, then confirm: the points of a ``confirm`` ablation, read from the finished trials of the sampled
ablation it confirms (its ``of``).

A sampled ablation's configurations are Tune's and Optuna's, known only once they ran; their MLflow
runs are the record of what each was and scored. This module ranks them (the mean over seeds of the
study's metric, or Pareto fronts over several; ties by label) and rebuilds the ``top_k`` best as grid
points, each value typed by the ablation's own distribution from the run's logged parameter (never a
tag, nor a path: a tracking server's tags are anyone's to write). Hand-written because the ranking spans MLflow runs of several
Tune experiments and resumes, which no Tune or Optuna result object holds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np

from clsr.study.plan.point import GridPoint
from clsr.study.plan.resolve import point_label
from clsr.study.spec.schema import Study
from clsr.study.spec.space import typed_value
from clsr.tracking.study_runs import SUPERSEDED_TAG, children
from clsr.tracking.tags import PRUNED_TAG


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
    "mean", "seeds"}`` each (the mean over its seeds' runs of ``study.metric``), and one note per run
    left out. ``runs``: the study's child runs (any ablation). A configuration that seed pruning
    stopped (``clsr.pruned``) is never ranked: its seeds so far were worse than the best's.

    One objective: by its mean, by ``study.mode``. Several: by Pareto front over the objectives' means
    (the front first, then the front of the rest, and so on), within a front by the first objective;
    ties by label."""
    objectives = study.objectives
    values: dict[str, list[list[float]]] = defaultdict(list)  # label -> per run, one value per objective
    seeds: dict[str, set[str]] = defaultdict(set)
    configs: dict[str, dict[str, Any]] = {}
    notes = []
    for run in runs:
        tags, metrics = run.data.tags, run.data.metrics
        if tags.get("clsr.ablation") != of or tags.get("clsr.status") != "finished":
            continue
        if SUPERSEDED_TAG in tags or PRUNED_TAG in tags:  # pruned: worse than the best on its seeds so far
            continue
        if any(metric not in metrics for metric, _ in objectives):
            continue
        try:
            overrides = configuration(study, of, run.data.params)
        except ValueError as err:
            notes.append(f"run {run.info.run_id} of {of}: left out ({err})")
            continue
        label = point_label(overrides)
        configs[label] = overrides
        values[label].append([metrics[metric] for metric, _ in objectives])
        seeds[label].add(tags.get("clsr.seed", ""))
    means = {label: [float(m) for m in np.mean(values[label], axis=0)] for label in configs}
    front_of = _front_ranks(means, [mode for _, mode in objectives])
    sign = -1 if objectives[0][1] == "max" else 1
    ranked = sorted(configs, key=lambda label: (front_of[label], sign * means[label][0], label))
    return [
        {"label": label, "overrides": configs[label], "mean": means[label][0], "seeds": len(seeds[label])}
        for label in ranked
    ], notes


def _front_ranks(means: dict[str, list[float]], modes: list[str]) -> dict[str, int]:
    """Each label's Pareto front (0: not dominated; 1: not dominated once front 0 is set aside; ...);
    every label is front 0 with one objective."""
    if len(modes) == 1:
        return dict.fromkeys(means, 0)
    from clsr.study.stats.pareto import pareto_front

    ranks: dict[str, int] = {}
    left, front = dict(means), 0
    while left:
        for label in pareto_front(left, modes) or list(left):  # only nan values left: one last front
            ranks[label] = front
            del left[label]
        front += 1
    return ranks


def confirm_points(study: Study, name: str, runs: list) -> tuple[list[GridPoint], list[str]]:
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
        GridPoint(f"top{rank}: {c['label']}", c["overrides"], {}, ablation=name)
        for rank, c in enumerate(best, start=1)
    ]
    return points, notes


def wave_points(
    study: Study, client, parent_run_id: str, wave: list[str]
) -> tuple[list[GridPoint], list[str], list[str]]:
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
