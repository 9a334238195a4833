"""One Tune experiment of a study: its param space (grids through Tune's variant generator, spaces as
Tune distributions), searcher, scheduler and trial resources, new or restored, quiet or not.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from clsr.study.control.console import Console
from clsr.study.plan.point import GridPoint
from clsr.study.plan.resolve import grid_points, trial_document
from clsr.study.plan.study_plan import TrialSpec
from clsr.study.record.extension import ExtensionRound, WarmStart
from clsr.study.run.trial import StudyContext, key_of, run_trial
from clsr.study.run.tune_point import point_of, sampled_point, spec_of
from clsr.study.run.tune_state import repair_before_restore
from clsr.study.spec.schema import Study

# Tune's driver function only waits on the Train workers: it holds no CPU, and it runs on the head node
# (Ray's built-in head resource; a token share of it), with Train's controller beside it: a lost worker
# machine takes Train workers with it, which Train restarts from the last checkpoint, never a trial's driver.
DRIVER_SHARE = 0.001


def expand_trials(study: Study, points: list[GridPoint]) -> list[TrialSpec]:
    """Every point (tied to its ablation) with each of its ablation's seeds: one trial each, resolved
    later (``config`` None)."""
    return [
        TrialSpec(p.ablation, p.label, p.overrides, p.paper, seed)
        for p in points
        for seed in study.seeds_of(p.ablation)
    ]


def param_space(study: Study, ablation: str | None, trials: list[TrialSpec] | None = None) -> dict[str, Any]:
    """Grids go through Tune's own variant generator (one entry per point and seed); spaces become
    Tune distributions."""
    from ray import tune

    if ablation is None:  # grid: the given trials, or every point of every ablation × its seeds
        if trials is None:
            points = [p.of(name) for name, a in study.ablations.items() for p in grid_points(a)]
            trials = expand_trials(study, points)
        return {"point": tune.grid_search([point_of(t) for t in trials])}
    from clsr.study.run.search import seed_space

    space = {key: _distribution(d) for key, d in study.ablations[ablation].space.items()}
    # the seed: random, a grid over the seeds; optuna, SeedRepeater's
    return {"point": sampled_point(ablation, space, seed_space(study, ablation))}


def _distribution(dist) -> Any:
    from ray import tune

    if dist.uniform:
        return tune.uniform(*dist.uniform)
    if dist.loguniform:
        return tune.loguniform(*dist.loguniform)
    if dist.randint:
        return tune.randint(dist.randint[0], dist.randint[1] + 1)  # inclusive upper bound in study files
    return tune.choice(dist.choice)


def _search_alg(
    study: Study,
    ablation: str | None = None,
    extension: ExtensionRound | None = None,
    warm: WarmStart | None = None,
):
    from clsr.study.run.search import search_alg

    return search_alg(study, ablation, extension, warm)


def _scheduler(study: Study, ablation: str | None, trials: list[TrialSpec] | None = None):
    from clsr.study.run.search import scheduler

    if study.scheduler.type == "fifo" or confirming(study, trials):  # a confirmation runs every seed out
        return None
    s = study.scheduler
    return scheduler(study, s.max_t or max(resolved_max_steps(study, ablation), s.grace_period))


def confirming(study: Study, trials: list[TrialSpec] | None) -> bool:
    """Whether an experiment's trials are all a confirm ablation's."""
    return bool(trials) and all(study.ablations[t.ablation].confirm is not None for t in trials)


def resolved_max_steps(study: Study, ablation: str | None) -> int:
    """ASHA's horizon: the trainer's max_steps, else a bound no trial reaches (epochs end it first)."""
    doc = trial_document(study, ablation, {}, study.seeds[0])
    return int(doc.get("trainer", {}).get("max_steps") or 10**9)


def build_tuner(
    study: Study,
    ctx: StudyContext,
    ablation: str | None,
    restore: bool,
    name: str | None = None,
    console: Console | None = None,
    extension: ExtensionRound | None = None,
    warm: WarmStart | None = None,
):
    """The experiment's Tuner, restored when it can be; ``extension``: a ``study extend`` round's (its
    configurations, its sampler given ``warm``), when it is new."""
    tuner = _build_tuner(study, ctx, ablation, restore, name, extension, warm)
    if console is not None and console.quiet is not None:
        quiet_tuner(tuner, study, name or ablation or "grid")
    return tuner


def quiet_tuner(tuner, study: Study, experiment: str) -> None:
    """No Tune tables on the terminal: the platform's progress table instead. A restored Tuner takes
    its run config from the experiment's saved state, so it is set here, for new and restored alike."""
    from clsr.study.run.progress import Progress
    from clsr.study.run.tune_compat import tuner_run_config

    run_config = tuner_run_config(tuner)
    if run_config is None:  # Ray client: Tune's own output stays
        return
    run_config.verbose = 0
    run_config.progress_reporter = None
    run_config.callbacks = [
        *[c for c in run_config.callbacks or [] if not isinstance(c, Progress)],
        Progress(experiment, study.metric, max_steps(study)),
    ]


def max_steps(study: Study) -> dict[str, int | None]:
    """Each ablation's trainer.max_steps (None: epochs end its trials), for the progress table."""
    steps = {}
    for name in study.ablations:
        try:
            doc = trial_document(study, name, {}, study.seeds_of(name)[0])
            steps[name] = doc.get("trainer", {}).get("max_steps")
        except Exception:  # an ablation that needs upstream outputs to resolve: no total shown
            steps[name] = None
    return steps


def _build_tuner(
    study: Study,
    ctx: StudyContext,
    ablation: str | None,
    restore: bool,
    name: str | None = None,
    extension: ExtensionRound | None = None,
    warm: WarmStart | None = None,
):
    from ray import tune

    from clsr.study.run.search import tune_samples

    # a failed trial's report carries no metric, and test metrics come only with a trial's last result:
    # the study's metric is validated against the known metric names instead
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    trainable = tune.with_resources(tune.with_parameters(run_trial, ctx=ctx), trial_resources(study))
    name = name or ablation or "grid"
    path = f"{ctx.storage.rstrip('/')}/{name}"
    if restore and tune.Tuner.can_restore(path):
        # a driver killed while Tune copied its state to storage can leave a file of it truncated, and
        # Tune's restore would then start the experiment over without its trials; or killed just after a
        # trial's new checkpoint, a state naming the one Tune deleted (clsr.study.run.tune_state)
        for line in repair_before_restore(path, grid=ablation is None):
            print(f"experiment {name}: {line}")
        # interrupted trials continue from their checkpoints; errored ones (crashes past their retries,
        # trials that ran out of time) are tried again from theirs
        tuner = tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=True)
        _point_recorders(tuner, ctx)
        return tuner
    search = _search_alg(study, ablation, extension, warm)
    return tune.Tuner(
        trainable,
        param_space=param_space(study, ablation, ctx.trials),
        tune_config=tune.TuneConfig(
            # several objectives: the searcher holds them (Tune's TuneConfig takes one)
            metric=study.metric if len(study.objectives) == 1 else None,
            mode=study.mode if len(study.objectives) == 1 else None,
            search_alg=search,
            scheduler=_scheduler(study, ablation, ctx.trials),
            # optuna: configurations × seeds (Repeater); an extension's configurations, not the search's
            num_samples=tune_samples(study, ablation, extension.samples if extension else None),
            max_concurrent_trials=study.concurrency,
            # in-process trials: the next trial runs in the finished one's process, not a fresh one that
            # imports torch, transformers and MLflow again (~8 s of a CPU each); trials keep no state
            # between them (seeds, models and MLflow runs are the trial's own)
            reuse_actors=study.resources.workers_per_trial == 0,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=ctx.storage,
            verbose=1,
            callbacks=_recorders(search, ctx),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),  # in-process trials checkpoint here
            # Train retries its workers; an in-process trial has none, so Tune retries the trial itself
            failure_config=tune.FailureConfig(
                max_failures=study.max_failures if study.resources.workers_per_trial == 0 else 0
            ),
        ),
    )


def _recorders(search, ctx: StudyContext) -> list:
    """Seed pruning's MLflow tags (a restored Tuner keeps its callbacks, searcher and all, in Tune's state)."""
    from clsr.study.control.seed_pruning import PruneRecorder, SeedPruningSearcher

    if not isinstance(search, SeedPruningSearcher):
        return []
    return [PruneRecorder(search, ctx.tracking_uri, ctx.parent_run_id)]


def _point_recorders(tuner, ctx: StudyContext) -> None:
    """A restored Tuner's pruning recorders write to this driver's record (its saved one may be older)."""
    from clsr.study.control.seed_pruning import PruneRecorder
    from clsr.study.run.tune_compat import tuner_run_config

    run_config = tuner_run_config(tuner)
    for callback in (run_config.callbacks or []) if run_config is not None else []:
        if isinstance(callback, PruneRecorder):
            callback.tracking_uri, callback.parent_run_id = ctx.tracking_uri, ctx.parent_run_id


def trial_resources(study: Study) -> dict[str, float]:
    """What a Tune trial holds: a token share when Train workers do the work, else the trial's own."""
    res = study.resources
    if res.workers_per_trial > 0:
        from clsr.study.run.tune_compat import HEAD_NODE_RESOURCE

        return {"cpu": 0, HEAD_NODE_RESOURCE: DRIVER_SHARE}
    return {"cpu": res.cpus_per_worker, "gpu": res.gpus_per_worker}


def errors_of(results) -> dict[str, str]:
    """Trial key -> Tune's error, for each trial of a Tune ResultGrid that ended in error."""
    import re

    lost = {}
    for result in results:
        if result.error is None or "point" not in (result.config or {}):
            continue
        named = re.search(r"_([0-9a-f]{5}_\d{5})", Path(result.path).name) if result.path else None
        trial_id = (result.metrics or {}).get("trial_id") or (named.group(1) if named else None)
        lost[key_of(spec_of(result.config["point"]), trial_id)] = (
            f"{type(result.error).__name__}: {result.error}"
        )
    return lost
