"""Shared inputs (word tables, tokenised corpora): each distinct one built once, as a Ray task, before a
wave's trials start; every trial fetches its own from Ray's object store by key.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from clsr.study.plan.resolve import (
    resolve_trial,
)
from clsr.study.spec.schema import Outputs, Study

if TYPE_CHECKING:
    from clsr.config.trial import TrialConfig


def prepare_shared(
    study: Study,
    trials: list[dict[str, Any]],
    outputs: Outputs | None = None,
    resolved: Callable[[dict[str, Any]], TrialConfig | None] | None = None,
) -> dict[str, Any]:
    """Build each distinct shared input (word table, tokenised corpus) once, as a Ray task.

    The results stay in Ray's object store; every trial fetches its own by key. A failure here stops
    the study before any trial starts, with the builder's own message. ``resolved``: as ``shared_inputs``.
    """
    import ray

    wanted = shared_inputs(study, trials, outputs, resolved)
    if not wanted:
        return {}
    res = study.resources
    build = ray.remote(_build_shared).options(num_cpus=res.cpus_per_worker, num_gpus=res.gpus_per_worker)
    print(f"preparing {len(wanted)} shared input set(s) once for the trials that use them ...")
    started = time.perf_counter()
    refs = {key: build.remote(trial) for key, trial in wanted.items()}
    ray.wait(list(refs.values()), num_returns=len(refs), fetch_local=False)
    for ref in refs.values():  # surface a builder's error now, not in every trial
        ray.get(ref)
    print(f"shared inputs ready in {time.perf_counter() - started:.0f} s")
    return {key: [ref] for key, ref in refs.items()}


def shared_inputs(
    study: Study,
    trials: list[dict[str, Any]],
    outputs: Outputs | None = None,
    resolved: Callable[[dict[str, Any]], TrialConfig | None] | None = None,
) -> dict[str, dict[str, Any]]:
    """shared_key -> the config of the first trial that needs it: one build per distinct key.
    ``resolved``: a trial's configuration when the study plan holds it (``StudyPlan.config_of``)."""
    from clsr.methods import build_method
    from clsr.train.outcome import is_evaluation_only

    wanted: dict[str, dict[str, Any]] = {}
    for t in trials:  # a sampled ablation's entry holds its base (overrides: {}); samples share it
        trial = resolved(t) if resolved is not None else None
        if trial is None:
            trial = resolve_trial(study, t["ablation"], t["overrides"], t["seed"], outputs or {})
        key = build_method(trial).shared_key(trial)
        if key is not None and not is_evaluation_only(trial):  # it trains nothing with the input
            wanted.setdefault(key, trial.model_dump())
    return wanted


def _build_shared(trial_doc: dict[str, Any]) -> Any:
    from clsr.config.trial import TrialConfig
    from clsr.methods import build_method

    trial = TrialConfig.model_validate(trial_doc)
    return build_method(trial).prepare_shared(trial)
