"""Run a study on Ray Tune: each Tune trial drives one Ray Train run of the generic trainer.

Ray 2.60 (Train V2): Tune runs a plain driver function per trial; it builds a ``TorchTrainer`` and
calls ``fit()``; ``TuneReportCallback`` forwards rank 0's reports to Tune. The Train run is named after
the Tune trial, so a retried or restored trial finds its own checkpoint and resumes.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from mlflow.tracking import MlflowClient

from clsr.study.schema import (
    STEP_METRICS,
    Outputs,
    Study,
    StudyError,
    UpstreamMissing,
    grid_points,
    missing_upstream,
    point_label,
    resolve_trial,
    stages,
    trial_document,
)
from clsr.tracking.study_runs import (
    CHECKPOINT_TAG,
    STORAGE_TAG,
    check_reachable,
    close_run,
    find_parent_run,
    finished_outputs,
    open_child_run,
    open_children,
    record_skipped,
    resolve_tracking_uri,
    start_parent_run,
)

# Tune's driver function only waits on the Train workers: a token CPU share keeps it from holding a core.
DRIVER_RESOURCES = {"cpu": 0.01}
QUIET_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "TOKENIZERS_PARALLELISM": "false",
    # short in-process trials checkpoint often; Tune's "snapshotting may become a bottleneck" is noise here
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
}


class NoEarlierRun(LookupError):
    """``platform study resume`` of a study MLflow has no run of."""


@dataclass(frozen=True)
class StudyContext:
    """What every trial driver needs, shipped to the Tune actors with ``tune.with_parameters``."""

    study: dict[str, Any]
    tracking_uri: str
    parent_run_id: str
    storage: str
    trials: list[dict[str, Any]] | None = None  # grid trials (point + seed) of this experiment
    shared: dict[str, Any] = field(default_factory=dict)  # shared_key -> [ObjectRef] built once
    outputs: Outputs = field(default_factory=dict)  # upstream trials' checkpoints, for needs


def _study(ctx: StudyContext) -> Study:
    return Study.model_validate(ctx.study)


def run_trial(config: dict[str, Any], ctx: StudyContext) -> None:
    """The Tune trainable: resolve the trial's config, open its MLflow run, run Ray Train."""
    import ray.train
    import ray.tune
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from clsr.study.schema import resolve_trial
    from clsr.train.loop import build_method
    from clsr.train.worker import train_loop_per_worker

    study = _study(ctx)
    point = config["point"]
    seed = point["seed"]
    trial = resolve_trial(study, point["ablation"], point["overrides"], seed, ctx.outputs)
    shared = ctx.shared.get(build_method(trial).shared_key(trial) or "")
    trial_id = ray.tune.get_context().get_trial_id()
    label = point["label"] or point_label(point["overrides"])
    tags = {
        "clsr.method": trial.method["name"],
        "clsr.ablation": point["ablation"],
        "clsr.point": label,
        "clsr.seed": seed,
        **{f"clsr.paper.{k}": v for k, v in point.get("paper", {}).items()},
    }
    run_id = open_child_run(
        ctx.tracking_uri,
        ctx.parent_run_id,
        trial_id,
        f"{point['ablation']}/{label}/seed={seed}",
        tags,
        # study.* params: what the MLflow compare view and parallel-coordinates plot group and sort by
        trial.model_dump() | {"study": {"ablation": point["ablation"], "point": label, "seed": seed}},
    )
    res = study.resources
    in_process = res.workers_per_trial == 0
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config={
            "trial": trial.model_dump(),
            "tracking": {
                "uri": ctx.tracking_uri,
                "run_id": run_id,
                "system_metrics_interval_s": study.system_metrics_interval_s,
            },
            "shared": shared,
            "in_process": in_process,
            "gpus_per_worker": res.gpus_per_worker,
        },
        scaling_config=ray.train.ScalingConfig(
            num_workers=res.workers_per_trial,
            use_gpu=res.gpus_per_worker > 0,
            resources_per_worker={"CPU": res.cpus_per_worker, "GPU": res.gpus_per_worker}
            if res.gpus_per_worker > 0
            else {"CPU": res.cpus_per_worker},
        ),
        run_config=ray.train.RunConfig(
            name=f"train-{trial_id}",
            storage_path=ctx.storage,
            callbacks=[] if in_process else [TuneReportCallback()],
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1),
            # retried from the last checkpoint; a bounded controller limit stops endless restarts
            failure_config=ray.train.FailureConfig(
                max_failures=study.max_failures, controller_failure_limit=3
            ),
        ),
    )
    try:
        result = trainer.fit()
    except BaseException as err:
        close_run(ctx.tracking_uri, run_id, "failed", "".join(traceback.format_exception(err)))
        raise
    # the last checkpoint is what later stages of a staged study load (needs: ... output: checkpoint)
    checkpoint = ray.tune.get_checkpoint() if in_process else result.checkpoint
    if checkpoint is not None:
        MlflowClient(ctx.tracking_uri).set_tag(run_id, CHECKPOINT_TAG, checkpoint_uri(checkpoint))
    close_run(ctx.tracking_uri, run_id, "finished")


def checkpoint_uri(checkpoint) -> str:
    """A Ray checkpoint's location as one string: a local path, or ``<scheme>://<path>`` on cloud storage."""
    filesystem = getattr(checkpoint, "filesystem", None)
    scheme = getattr(filesystem, "type_name", "local")
    return checkpoint.path if scheme == "local" else f"{scheme}://{checkpoint.path}"


def plan_points(study: Study) -> tuple[list[dict[str, Any]], list[str]]:
    """Every grid point, and why each point that cannot run here can't (its method says so)."""
    from clsr.train.loop import build_method

    points, unavailable = [], []
    for name, ablation in study.ablations.items():
        if ablation.space:
            continue
        for point in grid_points(ablation):
            trial = resolve_trial(study, name, point["overrides"], study.seeds_of(name)[0])
            why = build_method(trial).unavailable(trial)
            if why:
                unavailable.append(f"ablations.{name}[{point['label']}]: {why}")
            else:
                points.append({"ablation": name, **point})
    return points, unavailable


def runnable_points(study: Study) -> list[dict[str, Any]]:
    """The points to run; unavailable ones are refused (with what to do) or, if allowed, skipped."""
    points, unavailable = plan_points(study)
    if unavailable and not study.skip_unavailable:
        hint = "fix the above, or set skip_unavailable: true (--set skip_unavailable=true) to run the rest"
        raise StudyError(study.name, [*unavailable, hint])
    for line in unavailable:
        print(f"skipped (not available here): {line.splitlines()[0]}")
    return points


def expand_trials(study: Study, points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every grid point with each of its ablation's seeds: one entry per Tune trial."""
    return [{**p, "seed": seed} for p in points for seed in study.seeds_of(p["ablation"])]


def sampled_bases(study: Study, ablation: str) -> list[dict[str, Any]]:
    """A sampled ablation's base trial per seed: it stands for the samples when shared inputs are built."""
    return [{"ablation": ablation, "overrides": {}, "seed": seed} for seed in study.seeds_of(ablation)]


def ready_trials(
    study: Study, trials: list[dict[str, Any]], outputs: Outputs
) -> tuple[list[dict[str, Any]], list[tuple[dict[str, Any], str]]]:
    """The trials whose needs can be filled, and (trial, why not) for the others."""
    ready, blocked = [], []
    for trial in trials:
        if not study.ablations[trial["ablation"]].needs:
            ready.append(trial)
            continue
        try:
            resolve_trial(study, trial["ablation"], trial["overrides"], trial["seed"], outputs)
            ready.append(trial)
        except (UpstreamMissing, ValueError) as err:
            missing = missing_upstream(study, trial["ablation"], trial["seed"], outputs)
            reason = f"upstream trials without a checkpoint: {', '.join(missing)}" if missing else str(err)
            blocked.append((trial, reason))
    return ready, blocked


def prepare_shared(
    study: Study, trials: list[dict[str, Any]], outputs: Outputs | None = None
) -> dict[str, Any]:
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
    study: Study, trials: list[dict[str, Any]], outputs: Outputs | None = None
) -> dict[str, dict[str, Any]]:
    """shared_key -> the config of the first trial that needs it: one build per distinct key."""
    from clsr.train.loop import build_method

    wanted: dict[str, dict[str, Any]] = {}
    for t in trials:  # a sampled ablation's entry holds its base (overrides: {}); samples share it
        trial = resolve_trial(study, t["ablation"], t["overrides"], t["seed"], outputs or {})
        key = build_method(trial).shared_key(trial)
        if key is not None:
            wanted.setdefault(key, trial.model_dump())
    return wanted


def _build_shared(trial_doc: dict[str, Any]) -> Any:
    from clsr.train.config import TrialConfig
    from clsr.train.loop import build_method

    trial = TrialConfig.model_validate(trial_doc)
    return build_method(trial).prepare_shared(trial)


def param_space(
    study: Study, ablation: str | None, trials: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Grids go through Tune's own variant generator (one entry per point and seed); spaces become
    Tune distributions."""
    from ray import tune

    if ablation is None:  # grid: the given trials, or every point of every ablation × its seeds
        if trials is None:
            points = [{"ablation": name, **p} for name, a in study.ablations.items() for p in grid_points(a)]
            trials = expand_trials(study, points)
        return {"point": tune.grid_search(trials)}
    space = {key: _distribution(d) for key, d in study.ablations[ablation].space.items()}
    return {
        "point": {
            "ablation": ablation,
            "label": None,
            "overrides": space,
            "paper": {},
            "seed": study.seeds_of(ablation)[0],
        }
    }


def _distribution(dist) -> Any:
    from ray import tune

    if dist.uniform:
        return tune.uniform(*dist.uniform)
    if dist.loguniform:
        return tune.loguniform(*dist.loguniform)
    if dist.randint:
        return tune.randint(dist.randint[0], dist.randint[1] + 1)  # inclusive upper bound in study files
    return tune.choice(dist.choice)


def _search_alg(study: Study):
    if study.search.algorithm != "optuna":
        return None
    from ray.tune.search.optuna import OptunaSearch

    return OptunaSearch(seed=study.seeds[0])


def _scheduler(study: Study, ablation: str | None):
    if study.scheduler.type != "asha":
        return None
    from ray.tune.schedulers import ASHAScheduler

    s = study.scheduler
    max_t = s.max_t or max(resolved_max_steps(study, ablation), s.grace_period)
    # Tune's training_iteration restarts on retries; the reported optimiser step does not.
    return ASHAScheduler(
        time_attr="step", max_t=max_t, grace_period=s.grace_period, reduction_factor=s.reduction_factor
    )


def resolved_max_steps(study: Study, ablation: str | None) -> int:
    """ASHA's horizon: the trainer's max_steps, else a bound no trial reaches (epochs end it first)."""
    doc = trial_document(study, ablation, {}, study.seeds[0])
    return int(doc.get("trainer", {}).get("max_steps") or 10**9)


def experiments(study: Study) -> list[tuple[str, str | None, list[str]]]:
    """(Tune experiment name, sampled ablation or None, ablations it runs), in running order.

    A grid study is one experiment per stage (``grid``, then ``grid-stage2`` ... when ablations need
    others' trials); a sampled study is one experiment per ablation.
    """
    if study.search.algorithm != "grid":
        return [(name, name, [name]) for name in study.ablations]
    return [("grid" if n == 0 else f"grid-stage{n + 1}", None, wave) for n, wave in enumerate(stages(study))]


def build_tuner(
    study: Study, ctx: StudyContext, ablation: str | None, restore: bool, name: str | None = None
):
    from ray import tune

    if study.metric not in STEP_METRICS:  # a test metric: only the last result has it (FIFO; validated)
        os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    trainable = tune.with_resources(tune.with_parameters(run_trial, ctx=ctx), trial_resources(study))
    name = name or ablation or "grid"
    path = f"{ctx.storage.rstrip('/')}/{name}"
    if restore and tune.Tuner.can_restore(path):
        return tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=False)
    return tune.Tuner(
        trainable,
        param_space=param_space(study, ablation, ctx.trials),
        tune_config=tune.TuneConfig(
            metric=study.metric,
            mode=study.mode,
            search_alg=_search_alg(study),
            scheduler=_scheduler(study, ablation),
            num_samples=study.search.num_samples if ablation else 1,
            max_concurrent_trials=study.concurrency,
        ),
        run_config=tune.RunConfig(
            name=name,
            storage_path=ctx.storage,
            verbose=1,
            checkpoint_config=tune.CheckpointConfig(num_to_keep=1),  # in-process trials checkpoint here
            # Train retries its workers; an in-process trial has none, so Tune retries the trial itself
            failure_config=tune.FailureConfig(
                max_failures=study.max_failures if study.resources.workers_per_trial == 0 else 0
            ),
        ),
    )


def trial_resources(study: Study) -> dict[str, float]:
    """What a Tune trial holds: a token share when Train workers do the work, else the trial's own."""
    res = study.resources
    if res.workers_per_trial > 0:
        return DRIVER_RESOURCES
    return {"cpu": res.cpus_per_worker, "gpu": res.gpus_per_worker}


def init_ray() -> None:
    """Join ``RAY_ADDRESS`` when set (a cluster), else start a local Ray."""
    import ray

    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if not ray.is_initialized():
        ray.init(
            address=os.environ.get("RAY_ADDRESS"),
            runtime_env={"env_vars": QUIET_ENV | _forwarded_env()},
            log_to_driver=True,
        )


def _forwarded_env() -> dict[str, str]:
    keys = ("CLSR_DATA_DIR", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME")
    return {k: os.environ[k] for k in keys if k in os.environ}


def storage_root(study: Study) -> str:
    if "://" in study.storage_path:
        return study.storage_path
    return str(Path(study.storage_path).resolve())


def run_study(study: Study, study_text: str, resume: bool = False) -> list[dict[str, Any]]:
    """Run (or resume) a study; returns one summary row per trial."""
    uri = resolve_tracking_uri(study.tracking_uri)
    check_reachable(uri)
    points = runnable_points(study)  # refuse points that cannot run before anything is recorded
    client = MlflowClient(uri)
    parent = find_parent_run(client, study.name) if resume else None
    if resume and parent is None:
        raise NoEarlierRun(
            f"no earlier run of study {study.name!r} in MLflow at {uri}; use `platform study run`"
        )
    if parent is None:
        storage = f"{storage_root(study).rstrip('/')}/{study.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        parent_run_id = start_parent_run(client, study.name, storage, study.description)
        client.log_text(parent_run_id, study_text, "study.yaml")
        client.log_text(
            parent_run_id, yaml.safe_dump(resolved_summary(study), sort_keys=False), "resolved.yaml"
        )
    else:
        parent_run_id, storage = parent.info.run_id, parent.data.tags[STORAGE_TAG]
        client.update_run(parent_run_id, status="RUNNING")
    init_ray()

    status = "FINISHED"
    rows: list[dict[str, Any]] = []
    try:
        for name, ablation, wave in experiments(study):
            staged = any(study.ablations[a].needs for a in wave)
            outputs = finished_outputs(client, parent_run_id) if staged else {}
            planned = expand_trials(study, [p for p in points if p["ablation"] in wave])
            trials, blocked = ready_trials(study, planned, outputs)
            rows += skip_blocked(uri, parent_run_id, blocked)
            if ablation is None and not trials:
                continue  # every trial of this wave lost an upstream trial
            builds = trials if ablation is None else sampled_bases(study, ablation)
            shared = prepare_shared(study, builds, outputs)
            ctx = StudyContext(
                study.model_dump(by_alias=True), uri, parent_run_id, storage, trials, shared, outputs
            )
            results = build_tuner(study, ctx, ablation, restore=resume, name=name).fit()
            rows += summary_rows(results, study)
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except Exception:
        status = "FAILED"
        raise
    finally:
        for run in open_children(client, parent_run_id):  # trials Tune stopped or that were interrupted
            close_run(uri, run.info.run_id, "interrupted" if status == "KILLED" else "stopped")
        client.set_tag(parent_run_id, "clsr.trials", str(len(rows)))
        client.set_terminated(parent_run_id, status=status)
    return rows


def skip_blocked(uri: str, parent_run_id: str, blocked: list[tuple[dict[str, Any], str]]) -> list[dict]:
    """Trials whose upstream trials failed: a child run that says why (status skipped), and a summary row."""
    rows = []
    for trial, reason in blocked:
        label = trial["label"] or point_label(trial["overrides"])
        print(f"skipped: ablations.{trial['ablation']}[{label}] seed {trial['seed']}: {reason}")
        record_skipped(uri, parent_run_id, trial["ablation"], label, trial["seed"], reason)
        rows.append(
            {"ablation": trial["ablation"], "point": label, "seed": trial["seed"], "status": "skipped"}
        )
    return rows


def resolved_summary(study: Study) -> dict[str, Any]:
    """The base configuration every trial starts from, and each ablation's points with paper numbers."""
    return {
        "study": study.model_dump(by_alias=True, exclude_none=True),
        "base_trials": {n: trial_document(study, n, {}, study.seeds_of(n)[0]) for n in study.ablations},
        "stages": stages(study),
        "points": {n: grid_points(a) if not a.space else "sampled" for n, a in study.ablations.items()},
    }


SUMMARY_AVERAGES = ("test_sts_avg", "test_sts12_15_avg", "test_transfer_avg")


def summary_rows(results, study: Study) -> list[dict[str, Any]]:
    """One row per trial: the study metric, then the test averages it has (a lone STS task if no average)."""
    from clsr.data.faq import FAQ_TASKS
    from clsr.data.sts import STS_TASKS

    rows = []
    for result in results:
        config = result.config or {}
        point = config.get("point", {})
        metrics = result.metrics or {}
        tests = {k: metrics[k] for k in SUMMARY_AVERAGES if k in metrics}
        if "test_sts_avg" not in tests:
            tests = {f"test_{t}": metrics[f"test_{t}"] for t in STS_TASKS if f"test_{t}" in metrics} | tests
        tests |= {
            k: metrics[k] for t in FAQ_TASKS for k in (f"test_{t}_top1", f"test_{t}_map") if k in metrics
        }
        rows.append(
            {
                "ablation": point.get("ablation"),
                "point": point.get("label") or point_label(point.get("overrides", {})),
                "seed": point.get("seed", config.get("seed")),
                "status": "error" if result.error else "ok",
                study.metric: metrics.get(study.metric),
                **tests,
            }
        )
    return rows


def format_rows(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "(no trials)"
    keys = list(dict.fromkeys(k for r in rows for k in r))
    cells = [[_cell(r.get(k)) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    line = " | ".join(k.ljust(w) for k, w in zip(keys, widths, strict=True))
    body = "\n".join(" | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in cells)
    return f"{line}\n{'-' * len(line)}\n{body}"


def _cell(value: Any) -> str:
    return f"{value:.2f}" if isinstance(value, float) else ("-" if value is None else str(value))
