"""Shared inputs (word tables, tokenised corpora): each distinct one built once, as a Ray task, before a
wave's trials start; every trial fetches its own from Ray's object store by key.
"""

from __future__ import annotations

import time
from typing import Any

from clsr.config.trial import TrialConfig
from clsr.study.plan.resolve import resolve_trial
from clsr.study.plan.study_plan import TrialSpec
from clsr.study.spec.schema import Outputs, Study


def prepare_shared(study: Study, trials: list[TrialSpec], outputs: Outputs | None = None) -> dict[str, Any]:
    """Build each distinct shared input (word table, tokenised corpus) once, as a Ray task.

    The results stay in Ray's object store; every trial fetches its own by key. A failure here stops
    the study before any trial starts, with the builder's own message.
    """
    import ray

    wanted = shared_inputs(study, trials, outputs)
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
    study: Study, trials: list[TrialSpec], outputs: Outputs | None = None
) -> dict[str, TrialConfig]:
    """shared_key -> the config of the first trial that needs it: one build per distinct key. A trial's
    ``config`` when it has one (the plan's), else resolved here."""
    from clsr.methods import build_method
    from clsr.train.outcome import is_evaluation_only

    wanted: dict[str, TrialConfig] = {}
    for t in trials:  # a sampled ablation's base trial (overrides: {}) stands for its samples
        trial = (
            t.config
            if t.config is not None
            else resolve_trial(study, t.ablation, t.overrides, t.seed, outputs or {})
        )
        key = build_method(trial).shared_key(trial)
        if key is not None and not is_evaluation_only(trial):  # it trains nothing with the input
            wanted.setdefault(key, trial)
    return wanted


def _build_shared(trial: TrialConfig) -> Any:
    from clsr.methods import build_method

    return build_method(trial).prepare_shared(trial)
