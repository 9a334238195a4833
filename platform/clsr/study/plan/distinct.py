"""Identical trials run once: points of different ablations that resolve to the same configuration and
seed (SupMPN's reference = P5×Q5 = τ 0.05 = batch 256; each GCLSR ablation's paper-choice row) are one
Tune trial and one MLflow child run, which carries every (ablation, point) it stands for.

The run's ``clsr.ablation``/``clsr.point``/``clsr.trial_id`` are its first label's (study order); the
others are in ``clsr.also`` (a JSON list of ``[ablation, point]``, same seed). Reports, the outputs later
stages read, and edited resumes read a run under each of its labels
(``clsr.tracking.tags.run_labels``, ``run_keys``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from clsr.config.trial import TrialConfig
from clsr.study.plan.fingerprint import trial_key
from clsr.study.plan.resolve import config_identity, trial_identity
from clsr.study.spec.schema import Outputs, Study
from clsr.tracking.record_reader import tag_int
from clsr.tracking.tags import ALSO_TAG, TRIAL_TAG, run_labels


def merge_identical(
    study: Study,
    trials: list[dict[str, Any]],
    outputs: Outputs | None = None,
    resolved: Callable[[dict[str, Any]], TrialConfig | None] | None = None,
) -> list[dict[str, Any]]:
    """One entry per distinct grid trial, in order; an entry standing for several points lists the
    others as ``also: [[ablation, label], ...]``. Staged trials compare with their upstream outputs
    filled in, so two that read the same checkpoint are one trial too. ``resolved``: a trial's
    configuration when the study plan holds it (``StudyPlan.config_of``), else None: resolved here."""
    by_identity: dict[str, dict[str, Any]] = {}
    merged = []
    for trial in trials:
        config = resolved(trial) if resolved is not None else None
        identity = (
            config_identity(config)
            if config is not None
            else trial_identity(study, trial["ablation"], trial["overrides"], trial["seed"], outputs)
        )
        first = by_identity.get(identity)
        if first is None:
            by_identity[identity] = {**trial, "also": []}
            merged.append(by_identity[identity])
        else:
            first["also"].append([trial["ablation"], trial["label"]])
    return merged


def also_keys(entry: dict[str, Any]) -> list[str]:
    """The trial keys an entry stands for besides its own."""
    return [trial_key(ablation, label, entry["seed"]) for ablation, label in entry.get("also", [])]


def also_tag(also: list[list[str]]) -> dict[str, str]:
    """The run's ``clsr.also`` tag, or none when it stands for one point."""
    return {ALSO_TAG: json.dumps(also, ensure_ascii=False)} if also else {}


def also_of(tags: dict[str, str]) -> list[tuple[tuple[str, str], str]]:
    """The other points a child run stands for, each with its trial key (the run's seed)."""
    seed = tag_int(tags, "clsr.seed", tags.get(TRIAL_TAG, "?"))
    if seed is None:  # a run with no seed (or a malformed one) stands for its own point only
        return []
    return [((ablation, point), trial_key(ablation, point, seed)) for ablation, point in run_labels(tags)[1:]]


def run_keys(tags: dict[str, str]) -> list[str]:
    """Every trial key a child run stands for: its own, then those of ``clsr.also``."""
    own = [tags[TRIAL_TAG]] if TRIAL_TAG in tags else []
    return own + [key for _, key in also_of(tags)]
