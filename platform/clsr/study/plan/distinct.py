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
from collections.abc import Sequence
from dataclasses import replace

from clsr.study.plan.fingerprint import trial_key
from clsr.study.plan.resolve import config_identity, trial_identity
from clsr.study.plan.study_plan import TrialSpec
from clsr.study.spec.schema import Outputs, Study
from clsr.tracking.record_reader import tag_int
from clsr.tracking.tags import ALSO_TAG, TRIAL_TAG, run_labels


def merge_identical(study: Study, trials: list[TrialSpec], outputs: Outputs | None = None) -> list[TrialSpec]:
    """One trial per distinct grid trial, in order; one standing for several points lists the others in
    its ``also``. Staged trials compare with their upstream outputs filled in, so two that read the same
    checkpoint are one trial too. A trial's ``config`` when it has one (the plan's), else resolved here."""
    first: dict[str, int] = {}  # identity -> its index in merged
    merged: list[TrialSpec] = []
    for trial in trials:
        identity = (
            config_identity(trial.config)
            if trial.config is not None
            else trial_identity(study, trial.ablation, trial.overrides, trial.seed, outputs)
        )
        if identity not in first:
            first[identity] = len(merged)
            merged.append(replace(trial, also=()))
        else:
            kept = merged[first[identity]]
            merged[first[identity]] = replace(kept, also=(*kept.also, (trial.ablation, trial.label)))
    return merged


def also_keys(trial: TrialSpec) -> list[str]:
    """The trial keys a trial stands for besides its own."""
    return [trial_key(ablation, label, trial.seed) for ablation, label in trial.also]


def also_tag(also: Sequence[Sequence[str]]) -> dict[str, str]:
    """The run's ``clsr.also`` tag, or none when it stands for one point."""
    return {ALSO_TAG: json.dumps([list(pair) for pair in also], ensure_ascii=False)} if also else {}


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
