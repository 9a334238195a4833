"""A finished search extended (``platform study extend``): each extension of a sampled ablation, recorded
on the study's parent run by the driver that started it (``extend-v<attempt>.json``, never a tag), and
the finished trials of the record given to the extension's sampler as its warm start.

Tune restores a search only as it was sampled, so an extension is a Tune experiment of its own
(``<ablation>-x<round>``) whose Optuna study is seeded with the record's finished configurations
(``OptunaSearch``'s ``points_to_evaluate`` with ``evaluated_rewards``, which Optuna adds as completed
trials). Hand-written because those configurations span the MLflow runs of several experiments and
resumes, which no Tune or Optuna object holds.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from clsr.study.record.attempts import attempt_artifacts, mlflow_artifacts_json
from clsr.study.spec.schema import Study
from clsr.study.spec.space import contains, typed_value
from clsr.tracking.study_runs import SUPERSEDED_TAG
from clsr.tracking.tags import PRUNED_TAG

STEM = "extend"


@dataclass(frozen=True)
class ExtendRequest:
    """What ``platform study extend`` asks of a finished record: ``samples`` more configurations of the
    sampled ablation ``ablation``."""

    ablation: str
    samples: int


@dataclass(frozen=True)
class ExtensionRound:
    """One ``study extend``: ``samples`` more configurations of ``ablation``, its ``round``-th extension,
    started by the record's attempt ``attempt`` (the lease generation of that driver)."""

    ablation: str
    samples: int
    round: int
    attempt: int

    def experiment(self, search: str) -> str:
        """The Tune experiment of this round, beside the search's own (``search``)."""
        return f"{search}-x{self.round}"

    def sampler_seed(self, seed: int) -> int:
        """The round's sampler seed: the search's seed and the round together, so a new round draws new
        configurations (random search, a sampler's random start) instead of the first ones again."""
        return int(np.random.SeedSequence([seed, self.round]).generate_state(1)[0])


@dataclass(frozen=True)
class WarmStart:
    """The record's finished configurations of an ablation inside its space as it is now (overrides,
    with their mean over the finished seeds of each objective), and how many runs were given or not."""

    configurations: list[dict[str, Any]] = field(default_factory=list)
    rewards: list[float | list[float]] = field(default_factory=list)
    runs_inside: int = 0
    runs_outside: int = 0


def record_extension(
    client, parent_run_id: str, ablation: str, samples: int, attempt: int, edited: bool = False
) -> ExtensionRound:
    """The extension this attempt starts, recorded before any of its trials and before its edit (``edited``:
    the file changed since the record), so a resume finds it even when its driver stopped in between."""
    rounds = [r for r in extension_rounds(client, parent_run_id) if r.ablation == ablation]
    done = next((r for r in rounds if r.attempt == attempt), None)
    if done is not None:  # recorded already by this attempt
        return done
    client.log_text(
        parent_run_id,
        json.dumps({"ablation": ablation, "samples": samples, "edited": edited}),
        f"{STEM}-v{attempt}.json",
    )
    return ExtensionRound(ablation, samples, len(rounds) + 1, attempt)


def extension_rounds(client, parent_run_id: str) -> list[ExtensionRound]:
    """Every extension the record's drivers started, in order; an artifact that is not one is ignored."""
    rounds: list[ExtensionRound] = []
    for attempt, name in attempt_artifacts(client, parent_run_id, STEM, ".json").items():
        entry = mlflow_artifacts_json(client, parent_run_id, name)
        ablation, samples = (
            (entry.get("ablation"), entry.get("samples")) if isinstance(entry, dict) else (0, 0)
        )
        if isinstance(ablation, str) and type(samples) is int and samples >= 1:
            number = 1 + sum(r.ablation == ablation for r in rounds)
            rounds.append(ExtensionRound(ablation, samples, number, attempt))
    return rounds


def current_rounds(
    rounds: list[ExtensionRound] | tuple[ExtensionRound, ...], ablation: str | None, searches: dict[str, int]
) -> list[ExtensionRound]:
    """The rounds that extend ``ablation``'s current search: those started after the edited resume that
    searched it again (``searches``: ablation -> that attempt), if any."""
    return [r for r in rounds if r.ablation == ablation and r.attempt > searches.get(r.ablation, 0)]


def warm_start(study: Study, ablation: str, runs: list) -> WarmStart:
    """The finished, not superseded, not pruned runs of ``ablation`` (``runs``: the study's child runs), typed from
    their logged params by the space's distributions; a configuration's seeds averaged (as ``SeedRepeater``
    tells Optuna). Runs whose values lie outside the space (an edited one) are counted, not given."""
    space = study.ablations[ablation].space
    objectives = [metric for metric, _ in study.objectives]
    values: dict[str, list[list[float]]] = defaultdict(list)
    configurations: dict[str, dict[str, Any]] = {}
    outside = 0
    for run in runs:
        tags, metrics = run.data.tags, run.data.metrics
        if tags.get("clsr.ablation") != ablation or tags.get("clsr.status") != "finished":
            continue
        if SUPERSEDED_TAG in tags or not all(np.isfinite(metrics.get(m, np.nan)) for m in objectives):
            continue  # Optuna takes a completed trial only with its values
        if PRUNED_TAG in tags:  # seed pruning told Optuna it was pruned, not the mean of its first seeds
            continue
        overrides = typed_inside(space, run.data.params)
        if overrides is None:
            outside += 1
            continue
        label = json.dumps(overrides, sort_keys=True, default=str)
        configurations[label] = overrides
        values[label].append([float(metrics[m]) for m in objectives])
    rewards = [_mean(values[label], several=len(objectives) > 1) for label in configurations]
    inside = sum(len(v) for v in values.values())
    return WarmStart(list(configurations.values()), rewards, inside, outside)


def typed_inside(space: dict, params: dict[str, str]) -> dict[str, Any] | None:
    """A run's sampled values typed by the space (``typed_value``); None when one is missing, untyped or
    outside the space as it is now (``contains``)."""
    overrides = {}
    for key, dist in space.items():
        if key not in params:
            return None
        try:
            value = typed_value(dist, params[key])
        except ValueError:
            return None
        if not contains(dist, value):
            return None
        overrides[key] = value
    return overrides


def _mean(values: list[list[float]], several: bool) -> float | list[float]:
    means = [float(m) for m in np.nanmean(np.asarray(values, dtype=float), axis=0)]
    return means if several else means[0]
