"""A study's ``search`` and ``scheduler`` sections as Ray Tune objects: the searcher (Tune's random
variants, or Optuna through ``OptunaSearch``), repeated over the ablation's seeds, and the trial
scheduler. Only the mapping is written here; sampling, averaging over repeats and stopping are Tune's
and Optuna's own (``BasicVariantGenerator``, ``Repeater``, ``OptunaSearch``, the schedulers).

Seeds: a sampled configuration runs once per seed. Optuna learns from results, so its trials go through
Tune's ``Repeater``: Optuna suggests a configuration once, Tune runs it once per seed, and Optuna is told
the mean over the seeds of the study's metric (``numpy.nanmean``, as Repeater does). Random search
learns nothing: each sampled configuration is simply run with every seed (Tune's own random variants,
the seed a grid over the sampled values, ``constant_grid_search``).

``search.prune_seeds``: the seeds of a configuration run in turn and a paired test may stop it between
them (``clsr.study.control.seed_pruning``); random search then samples with Optuna's ``RandomSampler``,
so that both algorithms go through one searcher that is told each configuration's outcome.
"""

from __future__ import annotations

import os
import tempfile
from typing import Any

import numpy as np
from ray.tune.search import Repeater
from ray.tune.search.optuna import OptunaSearch
from ray.tune.search.repeater import TRIAL_INDEX

from clsr import runtime_dir
from clsr.study.record.extension import ExtensionRound, WarmStart
from clsr.study.spec.schema import Study


class SeedRepeater(Repeater):
    """Tune's ``Repeater`` whose repeat index picks the trial's seed: repeat ``i`` of a configuration
    runs ``seeds[i]`` (in ``config["point"]["seed"]``, which names the trial's MLflow run and key).

    Tune's ``SearchGenerator`` saves it with the experiment and walks past it to the base searcher: its
    state (``get_state``: the trial groups, hence each configuration's seeds) goes into Tune's own
    ``search_gen_state`` file, Optuna's into the base searcher's (``SignedOptunaSearch``)."""

    def __init__(self, searcher, seeds: list[int]):
        super().__init__(searcher, repeat=len(seeds), set_index=True)
        self.seeds = list(seeds)

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        config = super().suggest(trial_id)
        if not isinstance(config, dict):  # None (wait) or Searcher.FINISHED
            return config
        point = dict(config.get("point", {}))
        point["seed"] = self.seeds[config[TRIAL_INDEX]]
        return {**config, "point": point}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, **kwargs) -> None:
        from clsr.study.run.tune_compat import repeats_trial, report_repeat

        if not repeats_trial(self, trial_id):  # Repeater raises KeyError for a trial it never gave
            return
        metric = self.searcher.metric
        if isinstance(metric, str):
            super().on_trial_complete(trial_id, result, **kwargs)
            return
        # several objectives: Repeater averages one metric; each objective's mean over the seeds here
        done = report_repeat(self, trial_id, [(result or {}).get(m, np.nan) for m in metric])
        if done is not None:
            primary_trial_id, scores = done
            means = np.nanmean(np.asarray(scores, dtype=float), axis=0)
            self.searcher.on_trial_complete(
                primary_trial_id, result=dict(zip(metric, means.tolist(), strict=True)), **kwargs
            )


class SignedOptunaSearch(OptunaSearch):
    """Tune's ``OptunaSearch`` whose saved state, Tune's own pickle of it (``searcher-state-*.pkl`` in the
    study's storage, where another writer can reach), is signed with this user's key and unpickled on
    resume only when the signature verifies (rule 2): a planted pickle is refused unread."""

    def save(self, checkpoint_path: str) -> None:
        super().save(checkpoint_path)  # a temporary name in Tune's staging folder, renamed into place
        with open(checkpoint_path, "rb") as f:
            state = f.read()
        with open(checkpoint_path, "wb") as f:
            f.write(runtime_dir.sign(state))

    def restore(self, checkpoint_path: str) -> None:
        with open(checkpoint_path, "rb") as f:
            state = runtime_dir.verified(f.read())
        with tempfile.TemporaryDirectory() as folder:  # 0700: Optuna's restore reads a file
            inner = os.path.join(folder, "searcher.pkl")
            with open(inner, "wb") as f:
                f.write(state)
            super().restore(inner)

    def add_evaluated_point(self, parameters: dict, value, **kwargs) -> None:
        """A finished configuration told to Optuna as a completed trial (an extension's warm start);
        several objectives: their values (Tune's passes one value on)."""
        if isinstance(value, list):
            from clsr.study.run.tune_compat import add_completed_trial

            add_completed_trial(self, parameters, value)
            return
        super().add_evaluated_point(parameters, value, **kwargs)


def sampled_points(study: Study, ablation: str) -> list[dict[str, Any]]:
    """``search.points_to_evaluate`` as configs of the ablation's param space (``point.overrides``)."""
    return [{"point": {"overrides": dict(p)}} for p in study.search.points_to_evaluate]


def optuna_sampler(study: Study, seed: int):
    import optuna

    s = study.search
    startup = {} if s.n_startup_trials is None else {"n_startup_trials": s.n_startup_trials}
    kind = s.sampler or "tpe"
    if kind == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if kind == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, **startup)
    if kind == "gp":
        return optuna.samplers.GPSampler(seed=seed, **startup)
    if kind == "nsga2":  # a genetic algorithm: its first generation is its random start
        from clsr.study.run.tune_compat import PicklableNSGAIISampler

        return PicklableNSGAIISampler(seed=seed)
    return optuna.samplers.TPESampler(seed=seed, **startup)


def search_alg(
    study: Study,
    ablation: str | None,
    extension: ExtensionRound | None = None,
    warm: WarmStart | None = None,
):
    """The Tune search algorithm of one experiment; None: Tune's default (grid studies). ``extension``:
    a round of ``study extend``, its own sampler seed, the search's ``points_to_evaluate`` not again;
    ``warm``: the record's finished configurations, told to Optuna as completed trials."""
    if ablation is None or study.search.algorithm == "grid":
        return None
    seeds = study.seeds_of(ablation)
    seed = seeds[0] if extension is None else extension.sampler_seed(seeds[0])
    given = sampled_points(study, ablation) if extension is None else []
    if study.search.prune_seeds is not None:
        return pruning_search(study, ablation, seed, given, warm, extension)
    if study.search.algorithm == "random":
        from ray.tune.search.basic_variant import BasicVariantGenerator

        return BasicVariantGenerator(
            points_to_evaluate=given or None,
            constant_grid_search=True,  # a configuration's seeds share its sampled values
            max_concurrent=study.concurrency or 0,  # Tune ignores max_concurrent_trials for a generator
            random_state=seed,
        )
    searcher = signed_optuna(study, optuna_sampler(study, seed), given, warm)
    return SeedRepeater(searcher, seeds) if len(seeds) > 1 else searcher


def signed_optuna(study: Study, sampler, given: list[dict[str, Any]], warm: WarmStart | None):
    """Tune's OptunaSearch (signed) with ``sampler``: ``given`` run first; ``warm``'s configurations told
    to Optuna as completed trials, not run again. Several objectives: Optuna's multi-objective study,
    each told to it (Tune's TuneConfig has none)."""
    points = [flat(p) for p in given]
    rewards = None
    if warm is not None and warm.configurations:
        points = [flat({"point": {"overrides": c}}) for c in warm.configurations]
        rewards = list(warm.rewards)
    several = study.objectives if len(study.objectives) > 1 else None
    objectives = {"metric": [m for m, _ in several], "mode": [d for _, d in several]} if several else {}
    return SignedOptunaSearch(
        sampler=sampler, points_to_evaluate=points or None, evaluated_rewards=rewards, **objectives
    )


def pruning_search(
    study: Study,
    ablation: str,
    seed: int,
    given: list[dict[str, Any]],
    warm: WarmStart | None,
    extension: ExtensionRound | None,
):
    """Seed-aware pruning around Optuna's searcher (random: its RandomSampler, seeded as Tune's would be;
    an extension's round: its own seed and configurations)."""
    import optuna

    from clsr.study.control.seed_pruning import SeedPruningSearcher

    sampler = (
        optuna.samplers.RandomSampler(seed=seed)
        if study.search.algorithm == "random"
        else optuna_sampler(study, seed)
    )
    configurations = extension.samples if extension is not None else study.search.num_samples
    searcher = signed_optuna(study, sampler, given, warm)
    return SeedPruningSearcher(searcher, study.seeds_of(ablation), study.search.prune_seeds, configurations)


def flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as OptunaSearch names its parameters (Tune's ``/``-joined paths)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict) and value:
            out |= flat(value, f"{prefix}{key}/")
        else:
            out[f"{prefix}{key}"] = value
    return out


def tune_samples(study: Study, ablation: str | None, configurations: int | None = None) -> int:
    """Tune's num_samples: 1 for a grid; configurations for random (each expanded over the seed grid);
    configurations × seeds for optuna (Repeater counts every repeat) and for pruned seeds (at most: a
    pruned configuration's searcher says FINISHED sooner). ``configurations``: an extension's (else the
    search's ``num_samples``)."""
    if ablation is None:
        return 1
    n = configurations or study.search.num_samples
    per_seed = study.search.algorithm == "optuna" or study.search.prune_seeds is not None
    return n * len(study.seeds_of(ablation)) if per_seed else n


def seed_space(study: Study, ablation: str) -> Any:
    """``point.seed`` of a sampled ablation's param space: a grid over its seeds for random search;
    the first seed for optuna (``SeedRepeater`` sets each repeat's)."""
    from ray import tune

    seeds = study.seeds_of(ablation)
    if study.search.algorithm == "random" and len(seeds) > 1 and study.search.prune_seeds is None:
        return tune.grid_search(seeds)
    return seeds[0]


def scheduler(study: Study, max_t: int):
    """The Tune trial scheduler; None: FIFO. Every early-stopping one reads ``step`` (the optimiser
    step the trial reports): Tune's training_iteration restarts on retries, the step does not."""
    s = study.scheduler
    if s.type == "asha":
        from ray.tune.schedulers import ASHAScheduler

        return ASHAScheduler(
            time_attr="step", max_t=max_t, grace_period=s.grace_period, reduction_factor=s.reduction_factor
        )
    if s.type == "hyperband":
        from ray.tune.schedulers import HyperBandScheduler

        return HyperBandScheduler(time_attr="step", max_t=max_t, reduction_factor=s.reduction_factor)
    if s.type == "median":
        from ray.tune.schedulers import MedianStoppingRule

        return MedianStoppingRule(
            time_attr="step", grace_period=s.grace_period, min_samples_required=s.min_samples_required
        )
    return None
