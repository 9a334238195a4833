"""Run a study on Ray Tune: each Tune trial drives one Ray Train run of the generic trainer.

Ray 2.60 (Train V2): Tune runs a plain driver function per trial; it builds a ``TorchTrainer`` and
calls ``fit()``; ``TuneReportCallback`` forwards rank 0's reports to Tune. The Train run is named after
the Tune trial, so a retried or restored trial finds its own checkpoint and resumes.
"""

from __future__ import annotations

import os
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from mlflow.tracking import MlflowClient

from clsr.study.fingerprint import compare, digest, fingerprint, overall, trial_key
from clsr.study.interrupt import Interrupted, Interrupts
from clsr.study.lease import Lease, LeaseHeld, current_holder
from clsr.study.schema import (
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
from clsr.tracking.secrets import mask_uri
from clsr.tracking.spool import replay_pending
from clsr.tracking.study_runs import (
    CHECKPOINT_TAG,
    FINGERPRINT_TAG,
    STORAGE_TAG,
    SUPERSEDED_TAG,
    TIMED_OUT_ATTEMPT_TAG,
    TRIAL_TAG,
    check_reachable,
    children,
    close_run,
    find_parent_run,
    finish_child,
    finished_outputs,
    open_child_run,
    open_children,
    parent_runs,
    patiently,
    record_skipped,
    resolve_tracking_uri,
    start_parent_run,
    trial_run,
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


class StudyChanged(RuntimeError):
    """``platform study resume`` of a file whose resolved trials differ from the recorded ones."""


class UnclosedRun(RuntimeError):
    """``platform study run`` of a study whose last driver was killed: resume it."""


class TrialTimedOut(RuntimeError):
    """A retry of a trial that already ran past ``trial_timeout_s`` in this run of the study."""


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
    attempt: int = 1  # the lease generation: 1 for `run`, +1 for each resume
    skip: frozenset[str] = frozenset()  # trial keys this experiment must not run (an edited resume)


@dataclass
class StudyOutcome:
    """What a study run ended with: one row per trial, and why it stopped if it did not finish."""

    rows: list[dict[str, Any]]
    stopped_by: str | None = None  # SIGINT, SIGTERM, study_timeout
    exit_code: int = 0
    pending_records: int = 0  # trials whose MLflow writes wait in storage (the server stayed down)


def _study(ctx: StudyContext) -> Study:
    return Study.model_validate(ctx.study)


def key_of(point: dict[str, Any], trial_id: str | None = None) -> str:
    """A trial's key: its point and seed (a sampled trial: its Tune trial id)."""
    label = point["label"] or (f"sample {trial_id}" if trial_id else point_label(point["overrides"]))
    return trial_key(point["ablation"], label, point["seed"])


def run_trial(config: dict[str, Any], ctx: StudyContext) -> None:
    """The Tune trainable: resolve the trial's config, open its MLflow run, run Ray Train."""
    import ray.tune

    from clsr.study.schema import resolve_trial
    from clsr.train.loop import build_method

    study = _study(ctx)
    point = config["point"]
    seed = point["seed"]
    trial_id = ray.tune.get_context().get_trial_id()
    key = key_of(point, trial_id)
    if key in ctx.skip:  # an edited resume runs this trial's new version in a later experiment
        return
    trial = resolve_trial(study, point["ablation"], point["overrides"], seed, ctx.outputs)
    shared = ctx.shared.get(build_method(trial).shared_key(trial) or "")
    label = point["label"] or point_label(point["overrides"])
    tags = {
        "clsr.method": trial.method["name"],
        "clsr.ablation": point["ablation"],
        "clsr.point": label,
        "clsr.seed": seed,
        **{f"clsr.paper.{k}": v for k, v in point.get("paper", {}).items()},
    }
    _refuse_timed_out_retry(ctx, key)
    run_id = open_child_run(
        ctx.tracking_uri,
        ctx.parent_run_id,
        key,
        f"{point['ablation']}/{label}/seed={seed}",
        tags,
        # study.* params: what the MLflow compare view and parallel-coordinates plot group and sort by
        trial.model_dump() | {"study": {"ablation": point["ablation"], "point": label, "seed": seed}},
    )
    loop_config = {
        "trial": trial.model_dump(),
        "tracking": {
            "uri": ctx.tracking_uri,
            "run_id": run_id,
            "system_metrics_interval_s": study.system_metrics_interval_s,
            "pending_root": ctx.storage,
        },
        "shared": shared,
        "in_process": study.resources.workers_per_trial == 0,
        "gpus_per_worker": study.resources.gpus_per_worker,
    }
    watchdog = _watchdog(study.trial_timeout_s, ctx, run_id, key)
    try:
        checkpoint, failure = _train(study, ctx, key, loop_config)
    except Exception as err:  # a crash Ray's retries did not cure (SystemExit: Tune stopped the trial)
        finish_child(
            ctx.tracking_uri, run_id, "failed", ctx.storage, "".join(traceback.format_exception(err))
        )
        raise
    finally:
        if watchdog is not None:
            watchdog.cancel()
    if failure is not None:  # deterministic (a NaN loss, a bad value): recorded once, never retried
        finish_child(ctx.tracking_uri, run_id, "failed", ctx.storage, failure)
        return
    # the last checkpoint is what later stages of a staged study load (needs: ... output: checkpoint)
    tags = {CHECKPOINT_TAG: checkpoint_uri(checkpoint)} if checkpoint is not None else {}
    finish_child(ctx.tracking_uri, run_id, "finished", ctx.storage, tags=tags)


def _train(study: Study, ctx: StudyContext, key: str, loop_config: dict[str, Any]) -> tuple[Any, str | None]:
    """Run the trial's loop: in this process, or on a Ray Train worker group. Returns (last
    checkpoint, the deterministic failure's message or None)."""
    import ray.train
    import ray.tune
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from clsr.train.worker import NON_RETRYABLE, train_loop_per_worker

    if loop_config["in_process"]:  # the loop in the Tune trial's own process (Tune retries it)
        try:
            train_loop_per_worker(loop_config)
        except NON_RETRYABLE as err:
            return None, failure_text(err)
        return ray.tune.get_checkpoint(), None
    res = study.resources
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config,
        scaling_config=ray.train.ScalingConfig(
            num_workers=res.workers_per_trial,
            use_gpu=res.gpus_per_worker > 0,
            resources_per_worker={"CPU": res.cpus_per_worker, "GPU": res.gpus_per_worker}
            if res.gpus_per_worker > 0
            else {"CPU": res.cpus_per_worker},
        ),
        run_config=ray.train.RunConfig(
            # named after the trial's key: a retried or resumed trial finds its own checkpoint
            name=f"train-{digest([key, loop_config['trial']])[:16]}",
            storage_path=ctx.storage,
            callbacks=[TuneReportCallback()],
            checkpoint_config=ray.train.CheckpointConfig(num_to_keep=1),
            # lost workers are retried from the last checkpoint (a deterministic failure never gets
            # here: the workers report it and end); a bounded controller limit stops endless restarts
            failure_config=ray.train.FailureConfig(
                max_failures=study.max_failures, controller_failure_limit=3
            ),
        ),
    )
    result = trainer.fit()
    returned = result.return_value or {}  # rank 0's: a deterministic failure, or nothing
    return result.checkpoint, returned.get("clsr_error") if returned.get("clsr_failed") else None


def failure_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"


def _refuse_timed_out_retry(ctx: StudyContext, key: str) -> None:
    """Tune retries an in-process trial whose process ended; one that ran out of time stays ended
    (until the study is resumed: a new lease generation)."""
    earlier = patiently(
        lambda: trial_run(MlflowClient(ctx.tracking_uri), ctx.parent_run_id, key), "reading a trial's run"
    )
    if earlier is not None and earlier.data.tags.get(TIMED_OUT_ATTEMPT_TAG) == str(ctx.attempt):
        raise TrialTimedOut(f"{key} ran past trial_timeout_s in this run of the study; resume to continue it")


def _watchdog(limit_s: float | None, ctx: StudyContext, run_id: str, key: str):
    """After ``limit_s``: record the trial timed_out and end its process (its workers end with it)."""
    if not limit_s:
        return None

    def time_up() -> None:
        print(f"{key}: trial_timeout_s={limit_s:g} reached; stopping the trial", flush=True)
        finish_child(
            ctx.tracking_uri,
            run_id,
            "timed_out",
            ctx.storage,
            f"the trial ran past trial_timeout_s={limit_s:g} s; raise it, or resume to continue from the "
            f"last checkpoint",
            tags={TIMED_OUT_ATTEMPT_TAG: ctx.attempt},
        )
        os._exit(1)  # the Tune actor, and with it the trial's Train controller and workers

    timer = threading.Timer(limit_s, time_up)
    timer.daemon = True
    timer.start()
    return timer


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
    study: Study,
    ctx: StudyContext,
    ablation: str | None,
    restore: bool,
    name: str | None = None,
    time_budget_s: float | None = None,
):
    from ray import tune

    # a failed trial's report carries no metric, and test metrics come only with a trial's last result:
    # the study's metric is validated against the known metric names instead
    os.environ["TUNE_DISABLE_STRICT_METRIC_CHECKING"] = "1"
    trainable = tune.with_resources(tune.with_parameters(run_trial, ctx=ctx), trial_resources(study))
    name = name or ablation or "grid"
    path = f"{ctx.storage.rstrip('/')}/{name}"
    if restore and tune.Tuner.can_restore(path):
        # interrupted trials continue from their checkpoints; errored ones (crashes past their retries,
        # trials that ran out of time) are tried again from theirs
        return tune.Tuner.restore(path, trainable=trainable, resume_unfinished=True, resume_errored=True)
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
    """Join ``RAY_ADDRESS`` when set (a cluster), else start a local Ray.

    A local Ray keeps its dashboard process: it serves the state API through which Ray Train removes
    the resources of a trial that was stopped (by ASHA, a time limit or Ctrl-C); without it later trials
    wait for those CPUs and GPUs forever. But the dashboard's job API runs any code it is sent, so it
    listens on 127.0.0.1 only and Ray's token authentication is on, with the token readable by this
    user alone (Ray writes it world-readable): another user of a shared machine cannot submit code.
    """
    import ray

    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    local = {}
    if not address:  # Ray 2.60 turns token authentication on for a new local cluster unless told not to
        if os.environ.get("RAY_AUTH_MODE", "token").lower() == "token":
            private_token()
        local = {"include_dashboard": True, "dashboard_host": "127.0.0.1"}
    ray.init(
        address=address,
        runtime_env={"env_vars": QUIET_ENV | _forwarded_env()},
        log_to_driver=True,
        **local,
    )


def private_token() -> Path:
    """Ray's token file (``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``), created if missing, and
    readable by this user only."""
    import secrets

    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as token:
            token.write(secrets.token_hex(32))
    os.chmod(path, 0o600)
    return path


def _forwarded_env() -> dict[str, str]:
    keys = ("CLSR_DATA_DIR", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME")
    return {k: os.environ[k] for k in keys if k in os.environ}


def storage_root(study: Study) -> str:
    if "://" in study.storage_path:
        return study.storage_path
    return str(Path(study.storage_path).resolve())


def new_storage(study: Study) -> str:
    """A fresh storage folder per run: time for people, a random suffix so two runs never share one."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    return f"{storage_root(study).rstrip('/')}/{study.name}-{stamp}-{uuid.uuid4().hex[:6]}"


def run_study(
    study: Study, study_text: str, resume: bool = False, allow_changes: bool = False
) -> StudyOutcome:
    """Run (or resume) a study: one driver holds the study's lease; SIGINT/SIGTERM stop it with a
    truthful record (``StudyOutcome.stopped_by``)."""
    uri = resolve_tracking_uri(study.tracking_uri)
    check_reachable(uri)
    points = runnable_points(study)  # refuse points that cannot run before anything is recorded
    client = MlflowClient(uri)
    current = fingerprint(study)
    with Interrupts(study.study_timeout_s) as interrupts:
        if resume:
            parent_run_id, storage, lease, skip = _take_over(
                client, uri, study, study_text, current, allow_changes
            )
        else:
            parent_run_id, storage, lease = _start_new(client, uri, study, study_text, current)
            skip = frozenset()
        lease.start()
        try:
            return _run_waves(study, points, uri, parent_run_id, storage, lease, skip, interrupts)
        finally:
            lease.release()


def _start_new(client, uri: str, study: Study, study_text: str, current: dict[str, str]):
    """A new parent run holding the study's lease; refused while another driver runs the study, or
    while an earlier run was killed without closing (resume it)."""
    for run in parent_runs(client, study.name, running=True):
        holder = current_holder(client, run.info.run_id)
        if holder is not None and holder.fresh:
            raise LeaseHeld(Lease(uri, run.info.run_id, study.name)._held_message(holder))
        raise UnclosedRun(
            f"an earlier run of study {study.name!r} (MLflow run {run.info.run_id}) stopped without "
            f"closing (its driver was killed); `platform study resume` continues it and closes what it "
            f"left RUNNING"
        )
    storage = new_storage(study)
    parent_run_id = start_parent_run(client, study.name, storage, study.description)
    client.set_tag(parent_run_id, FINGERPRINT_TAG, overall(current))
    lease = Lease(uri, parent_run_id, study.name)
    lease.acquire()
    rivals = [
        r
        for r in parent_runs(client, study.name, running=True)
        if r.info.run_id != parent_run_id
        and (holder := current_holder(client, r.info.run_id))
        and holder.fresh
    ]
    first = min([*rivals, client.get_run(parent_run_id)], key=lambda r: (r.info.start_time, r.info.run_id))
    if first.info.run_id != parent_run_id:  # a driver started the same study at the same moment: it goes on
        client.delete_run(parent_run_id)
        raise LeaseHeld(lease._held_message(current_holder(client, first.info.run_id)))
    client.log_text(parent_run_id, mask_uri(study_text), "study.yaml")
    summary = yaml.safe_dump(resolved_summary(study), sort_keys=False)
    client.log_text(parent_run_id, mask_uri(summary), "resolved.yaml")
    client.log_dict(parent_run_id, current, "fingerprint.json")
    return parent_run_id, storage, lease


def _take_over(client, uri: str, study: Study, study_text: str, current: dict[str, str], allow_changes: bool):
    """The study's latest parent run, its lease taken (a killed driver's stale one too), and the trial
    keys old experiments must not run (an edited resume: their new versions run in a new wave)."""
    parent = find_parent_run(client, study.name)
    if parent is None:
        raise NoEarlierRun(
            f"no earlier run of study {study.name!r} in MLflow at {mask_uri(uri)}; use `platform study run`"
        )
    parent_run_id, storage = parent.info.run_id, parent.data.tags[STORAGE_TAG]
    changes = compare(recorded_fingerprint(client, parent_run_id), current)
    if changes and not allow_changes:
        raise StudyChanged(
            f"study {study.name!r} changed since it was started; its trials would mix two versions:\n  "
            + "\n  ".join(changes.describe())
            + "\neither revert the file to the recorded study.yaml (MLflow run "
            f"{parent_run_id}, artifact study.yaml), or resume with --allow-changes: finished trials that "
            f"did not change are kept, changed and added ones run as a new wave, changed and removed "
            f"ones are marked superseded"
        )
    lease = Lease(uri, parent_run_id, study.name)
    attempt = lease.acquire()
    client.update_run(parent_run_id, status="RUNNING")
    client.set_tag(parent_run_id, "clsr.status", "running")
    replay(uri, storage)
    closed = [r.info.run_id for r in open_children(client, parent_run_id)]
    for run_id in closed:  # left RUNNING by a driver that was killed: they resume from checkpoints
        close_run(uri, run_id, "interrupted", "the study's driver stopped without closing this run")
    if closed:
        print(f"closed {len(closed)} run(s) a stopped driver had left RUNNING; their trials resume")
    skip: frozenset[str] = frozenset()
    if changes:
        skip = frozenset(changes.changed + changes.removed)
        supersede(client, parent_run_id, skip, attempt)
        client.set_tag(parent_run_id, FINGERPRINT_TAG, overall(current))
        client.log_dict(parent_run_id, current, f"fingerprint-v{attempt}.json")
        client.log_text(parent_run_id, mask_uri(study_text), f"study-v{attempt}.yaml")
        print("resuming an edited study:\n  " + "\n  ".join(changes.describe()))
    return parent_run_id, storage, lease, skip


def recorded_fingerprint(client, parent_run_id: str) -> dict[str, str]:
    """The latest fingerprint a study's parent run recorded (``fingerprint[-vN].json``)."""
    names = [a.path for a in client.list_artifacts(parent_run_id) if a.path.startswith("fingerprint")]
    if not names:
        return {}
    latest = max(names, key=lambda n: int(n.removesuffix(".json").partition("-v")[2] or 1))
    return mlflow_artifacts_json(client, parent_run_id, latest)


def mlflow_artifacts_json(client, run_id: str, path: str) -> dict[str, Any]:
    import json
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return json.loads(Path(client.download_artifacts(run_id, path, tmp)).read_text())


def supersede(client, parent_run_id: str, keys: frozenset[str], attempt: int) -> None:
    """Mark the runs of changed and removed trials superseded: kept in MLflow, left out of reports."""
    for run in children(client, parent_run_id):
        if run.data.tags.get(TRIAL_TAG) in keys and SUPERSEDED_TAG not in run.data.tags:
            client.set_tag(run.info.run_id, SUPERSEDED_TAG, f"v{attempt}")


def replay(uri: str, storage: str) -> int:
    """Send what trials could not send to MLflow (their journals in the study's storage)."""
    sent, left = replay_pending(uri, storage)
    if sent:
        print(f"sent {sent} MLflow write(s) that trials had kept while the tracking server was unreachable")
    return len(left)


def _run_waves(
    study: Study,
    points: list[dict[str, Any]],
    uri: str,
    parent_run_id: str,
    storage: str,
    lease: Lease,
    skip: frozenset[str],
    interrupts: Interrupts,
) -> StudyOutcome:
    client = MlflowClient(uri)
    interrupts.on_give_up = lambda: _give_up(client, uri, parent_run_id, interrupts.reason, lease)
    init_ray()
    interrupts.install()  # after ray.init, which replaces the SIGTERM handler
    status = "FINISHED"
    try:
        for name, ablation, wave in experiments(study):
            interrupts.check()
            staged = any(study.ablations[a].needs for a in wave)
            outputs = finished_outputs(client, parent_run_id, storage_root=storage) if staged else {}
            planned = expand_trials(study, [p for p in points if p["ablation"] in wave])
            trials, blocked = ready_trials(study, planned, outputs)
            skip_blocked(uri, parent_run_id, blocked)
            if ablation is None and not trials:
                continue  # every trial of this wave lost an upstream trial
            builds = trials if ablation is None else sampled_bases(study, ablation)
            shared = prepare_shared(study, builds, outputs)
            ctx = StudyContext(
                study.model_dump(by_alias=True), uri, parent_run_id, storage, trials, shared, outputs,
                lease.generation, skip,
            )  # fmt: skip
            _fit(study, ctx, ablation, name, interrupts)
            if ablation is None:  # an edited resume: the changed and added trials, as their own wave
                _fit_new_versions(study, ctx, name, trials, interrupts, client, parent_run_id)
            interrupts.check()
            replay(uri, storage)
    except Interrupted:
        pass
    except BaseException:
        status = "FAILED"
        raise
    finally:
        interrupts.recording = True
        status = "KILLED" if interrupts.stopped and status != "FAILED" else status
        with interrupts.closed:
            outcome = _close_study(client, uri, parent_run_id, storage, study, interrupts, status)
            interrupts.record_written = True
    return outcome


def _give_up(client, uri: str, parent_run_id: str, reason: str | None, lease: Lease) -> None:
    """The record of a study whose driver hangs after a signal: what did not finish is interrupted."""
    close_open_children(client, uri, parent_run_id, reason)
    client.set_tag(parent_run_id, "clsr.status", "timed_out" if reason == "study_timeout" else "interrupted")
    client.set_terminated(parent_run_id, status="KILLED")
    lease.release()


def _fit(study: Study, ctx: StudyContext, ablation: str | None, name: str, interrupts: Interrupts) -> None:
    """Run one Tune experiment, or continue it (and the new-version experiments of earlier edited
    resumes) where an earlier driver left it."""
    from ray import tune

    versions = [f"{name}-v{n}" for n in range(2, ctx.attempt)]
    restorable = [v for v in versions if tune.Tuner.can_restore(f"{ctx.storage.rstrip('/')}/{v}")]
    for experiment in [name, *restorable]:
        interrupts.check()
        interrupts.in_experiment = True
        try:
            build_tuner(study, ctx, ablation, restore=True, name=experiment).fit()
        finally:
            interrupts.in_experiment = False


def _fit_new_versions(study, ctx, name, trials, interrupts, client, parent_run_id) -> None:
    """An edited resume's changed and added trials of this wave, as a new Tune experiment."""
    if ctx.attempt == 1:  # a new study: its experiments hold every trial
        return
    done = {
        r.data.tags.get(TRIAL_TAG)
        for r in children(client, parent_run_id)
        if SUPERSEDED_TAG not in r.data.tags
    }
    fresh = [t for t in trials if key_of(t) in ctx.skip or key_of(t) not in done]
    if not fresh:
        return
    new_ctx = StudyContext(**{**ctx.__dict__, "trials": fresh, "skip": frozenset()})
    interrupts.check()
    interrupts.in_experiment = True
    try:
        build_tuner(study, new_ctx, None, restore=True, name=f"{name}-v{ctx.attempt}").fit()
    finally:
        interrupts.in_experiment = False


def _close_study(
    client, uri: str, parent_run_id: str, storage: str, study: Study, interrupts: Interrupts, status: str
) -> StudyOutcome:
    """Send what trials left, close the runs still open (interrupted, or stopped early by the
    scheduler), close the parent, and sum up. Runs under a second Ctrl-C without stopping halfway."""
    pending = wait_for_tracking(uri, storage, study.tracking_wait_s)
    if pending:  # the lease goes stale; `platform study sync` (or resume) finishes the record
        return StudyOutcome([], interrupts.reason, interrupts.exit_code or 1, pending)
    reason = interrupts.reason
    close_open_children(client, uri, parent_run_id, reason)
    rows = summary_rows(children(client, parent_run_id), study)
    state = "failed" if status == "FAILED" else {None: "finished", "study_timeout": "timed_out"}.get(reason)
    client.set_tag(parent_run_id, "clsr.trials", str(len(rows)))
    client.set_tag(parent_run_id, "clsr.status", state or "interrupted")
    client.set_terminated(parent_run_id, status=status)
    return StudyOutcome(rows, reason, interrupts.exit_code, 0)


def close_open_children(client, uri: str, parent_run_id: str, reason: str | None) -> None:
    """Runs still RUNNING once no trial runs: interrupted (or timed out with the study), or stopped
    early by the scheduler when nothing interrupted the study."""
    leftover = "timed_out" if reason == "study_timeout" else "interrupted" if reason else "stopped"
    for run in open_children(client, parent_run_id):
        close_run(uri, run.info.run_id, leftover, f"stopped by {reason}" if reason else None)


def sync_study(study: Study) -> int:
    """``platform study sync``: send what trials kept while MLflow was unreachable; close a study whose
    driver could not (its lease is stale). Returns the number of trial runs still pending."""
    uri = resolve_tracking_uri(study.tracking_uri)
    check_reachable(uri)
    client = MlflowClient(uri)
    parent = find_parent_run(client, study.name)
    if parent is None:
        raise NoEarlierRun(f"no run of study {study.name!r} in MLflow at {mask_uri(uri)}")
    left = replay(uri, parent.data.tags[STORAGE_TAG])
    holder = current_holder(client, parent.info.run_id)
    if not left and parent.info.status == "RUNNING" and not (holder and holder.fresh):
        close_open_children(client, uri, parent.info.run_id, "SIGKILL")
        client.set_tag(parent.info.run_id, "clsr.status", "interrupted")
        client.set_terminated(parent.info.run_id, status="KILLED")
        print(f"closed study {study.name!r}: its driver had stopped; `platform study resume` continues it")
    return left


def wait_for_tracking(uri: str, storage: str, wait_s: float) -> int:
    """Replay the trials' kept writes until MLflow takes them all or ``wait_s`` passes; returns the
    number of runs still pending."""
    deadline = time.monotonic() + wait_s
    left = replay(uri, storage)
    while left and time.monotonic() < deadline:
        print(f"waiting for MLflow at {mask_uri(uri)}: {left} trial run(s) have writes to send", flush=True)
        time.sleep(10)
        left = replay(uri, storage)
    return left


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


def summary_rows(runs, study: Study) -> list[dict[str, Any]]:
    """One row per trial from its MLflow run (the record): status, the study metric, then the test
    averages it has (a lone STS task if no average)."""
    from clsr.data.faq import FAQ_TASKS
    from clsr.data.sts import STS_TASKS

    rows = []
    for run in sorted(runs, key=lambda r: r.info.start_time):
        tags, metrics = run.data.tags, run.data.metrics
        if SUPERSEDED_TAG in tags:
            continue
        tests = {k: metrics[k] for k in SUMMARY_AVERAGES if k in metrics}
        if "test_sts_avg" not in tests:
            tests = {f"test_{t}": metrics[f"test_{t}"] for t in STS_TASKS if f"test_{t}" in metrics} | tests
        tests |= {
            k: metrics[k] for t in FAQ_TASKS for k in (f"test_{t}_top1", f"test_{t}_map") if k in metrics
        }
        rows.append(
            {
                "ablation": tags.get("clsr.ablation"),
                "point": tags.get("clsr.point"),
                "seed": tags.get("clsr.seed"),
                "status": tags.get("clsr.status", "unknown"),
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
