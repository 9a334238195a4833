"""One trial, as Ray Tune runs it: resolve its configuration, open (or reopen) its MLflow run, train on
a Ray Train worker group or in this process, and record how it ended.

Ray 2.60 (Train V2): Tune runs this plain driver function per trial; it builds a ``TorchTrainer`` and
calls ``fit()``; ``TuneReportCallback`` forwards rank 0's reports to Tune. The Train run is named after
the trial's key and configuration, so a retried or resumed trial finds its own checkpoint.
"""

from __future__ import annotations

import os
import threading
import traceback
from dataclasses import dataclass, field
from typing import Any

from mlflow.tracking import MlflowClient

from clsr.config.loop import LoopConfig
from clsr.config.methods import method_source
from clsr.study.plan.distinct import also_tag
from clsr.study.plan.fingerprint import digest, trial_key, with_method
from clsr.study.plan.resolve import point_label, resolve_trial
from clsr.study.plan.study_plan import TrialSpec
from clsr.study.run.tune_point import spec_of
from clsr.study.run.tune_state import storage_uri
from clsr.study.spec.schema import Outputs, Study
from clsr.tracking.retry import call_with_retry
from clsr.tracking.run_logger import TrackingTarget
from clsr.tracking.study_runs import (
    CHECKPOINT_TAG,
    TIMED_OUT_ATTEMPT_TAG,
    finish_child,
    open_child_run,
    trial_run,
    trial_run_name,
)


@dataclass(frozen=True)
class StudyContext:
    """What every trial driver needs, shipped to the Tune actors with ``tune.with_parameters``."""

    study: Study
    tracking_uri: str
    parent_run_id: str
    storage: str
    trials: list[TrialSpec] | None = None  # grid trials (point + seed) of this experiment
    shared: dict[str, Any] = field(default_factory=dict)  # shared_key -> [ObjectRef] built once
    outputs: Outputs = field(default_factory=dict)  # upstream trials' checkpoints, for needs
    attempt: int = 1  # the lease generation: 1 for `run`, +1 for each resume
    skip: frozenset[str] = frozenset()  # trial keys this experiment must not run (an edited resume)


class TrialHeld(RuntimeError):
    """The study's budget allows no further trial, or ``platform study stop`` asked for this trial's
    ablation (or the study) to stop: the trial does not start; Tune records it errored, so a resume runs it."""


class TrialTimedOut(RuntimeError):
    """A retry of a trial that already ran past ``trial_timeout_s`` in this run of the study."""


def key_of(trial: TrialSpec, trial_id: str | None = None) -> str:
    """A trial's key: its point and seed (a sampled trial: its Tune trial id)."""
    label = trial.label or (f"sample {trial_id}" if trial_id else point_label(trial.overrides))
    return trial_key(trial.ablation, label, trial.seed)


def run_trial(config: dict[str, Any], ctx: StudyContext) -> None:
    """The Tune trainable: resolve the trial's config, open its MLflow run, run Ray Train."""
    import ray.tune

    from clsr.methods import build_method

    study = ctx.study
    if "point" not in config:  # Tune started a restored experiment over: it could not read its state
        raise RuntimeError(
            "Tune gave this trial no study point: it could not restore the experiment's saved state and "
            "started the experiment over without the study's trials (see 'Failed to restore the run state' "
            "above); the trials it held are not run"
        )
    point = spec_of(config["point"])
    seed = point.seed
    trial_id = ray.tune.get_context().get_trial_id()
    key = key_of(point, trial_id)
    if key in ctx.skip:  # an edited resume runs this trial's new version in a later experiment
        return
    _refuse_held(ctx, point.ablation)
    trial = resolve_trial(study, point.ablation, point.overrides, seed, ctx.outputs)
    shared = ctx.shared.get(build_method(trial).shared_key(trial) or "")
    label = point.label or point_label(point.overrides)
    tags = {
        "clsr.method": trial.method["name"],
        "clsr.ablation": point.ablation,
        "clsr.point": label,
        "clsr.seed": seed,
        **{f"clsr.paper.{k}": v for k, v in point.paper.items()},
        # identical trials of other points (an edited resume may have split one off: it runs on its own)
        **also_tag([pair for pair in point.also if trial_key(*pair, seed) not in ctx.skip]),
    }
    _refuse_timed_out_retry(ctx, key)
    run_id = open_child_run(
        ctx.tracking_uri,
        ctx.parent_run_id,
        key,
        trial_run_name(point.ablation, label, seed),
        tags,
        # study.* params: what the MLflow compare view and parallel-coordinates plot group and sort by
        trial_params(trial) | {"study": {"ablation": point.ablation, "point": label, "seed": seed}},
    )
    log_method_file(ctx.tracking_uri, run_id, trial)
    loop_config = LoopConfig(
        trial,
        TrackingTarget(
            ctx.tracking_uri,
            run_id,
            study.system_metrics_interval_s,
            ctx.storage,
            # an early-stopping scheduler (asha, hyperband, median) ends a trial for good at an evaluation
            # that may write no checkpoint: its points go out at every log window, as they are logged (a
            # resumed trial may repeat a few steps)
            commit_at_checkpoints=study.scheduler.type == "fifo",
        ),
        shared,
        in_process=study.resources.workers_per_trial == 0,
        gpus_per_worker=study.resources.gpus_per_worker,
    )
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


def trial_params(trial: Any) -> dict[str, Any]:
    """The trial's configuration, with ``data.source``: which of the data folder, the hub and the package's
    embedded sample serves its data (decided here as the loaders will, in the trial's environment); and
    ``model.vectors_sha256`` (and ``data.vectors.*``): which word-vector file trained the model (third-party
    files, rule 2). The rows' identities (``data.<name>.*``) are logged by the trial's process as it reads
    them (``clsr.train.data_record``)."""
    from clsr.data.embedded import served_by

    params = trial.model_dump()
    tasks = [*trial.eval.tasks, *trial.eval.dev_tasks]
    params["data"]["source"] = served_by(trial.data.data_dir, trial.data.train, tasks)
    if vectors := getattr(trial.model, "vectors", None):
        from clsr.encoders.word_vectors import vectors_sha256, vectors_where

        if sha256 := vectors_sha256(vectors, trial.data.data_dir):
            params["model"]["vectors_sha256"] = sha256
            # the file's hash, as data.vectors.* beside the rows' identities (clsr.train.data_record)
            where, revision = vectors_where(vectors, trial.data.data_dir)
            params["data"]["vectors"] = {"source": where, "revision": revision or "none", "sha256": sha256}
    recorded = method_source(trial.method["name"]).params()  # a method from outside the package
    params["method"] |= {k: v for k, v in recorded.items() if k not in params["method"]}
    return params


def log_method_file(uri: str, run_id: str, trial: Any) -> None:
    """A method's source file (not a built-in's, nor an installed distribution's) as the trial run's
    artifact ``method/<its name>``: the code that trained it, beside its hash."""
    import tempfile
    from pathlib import Path

    source = method_source(trial.method["name"])
    if source.kind not in ("file", "module") or source.file is None:
        return
    where = trial.method["name"].rpartition(":")[0]
    name = Path(where).name if source.kind == "file" else source.file.name  # a worker's copy: __init__.py
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / name
        copy.write_bytes(source.file.read_bytes())
        call_with_retry(
            lambda: MlflowClient(uri).log_artifact(run_id, str(copy), "method"),
            patience_s=None,
            what="logging the method's file",
        )


def _train(study: Study, ctx: StudyContext, key: str, loop_config: LoopConfig) -> tuple[Any, str | None]:
    """Run the trial's loop: in this process, or on a Ray Train worker group. Returns (last
    checkpoint, the deterministic failure's message or None)."""
    import ray.train
    import ray.tune
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    from clsr.train.worker import NON_RETRYABLE, train_loop_per_worker

    if loop_config.in_process:  # the loop in the Tune trial's own process (Tune retries it)
        try:
            train_loop_per_worker(loop_config.for_ray_train())
        except NON_RETRYABLE as err:
            return None, failure_text(err)
        return ray.tune.get_checkpoint(), None
    res = study.resources
    trial = loop_config.trial.model_dump()
    trainer = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=loop_config.for_ray_train(),
        scaling_config=ray.train.ScalingConfig(
            num_workers=res.workers_per_trial,
            use_gpu=res.gpus_per_worker > 0,
            resources_per_worker={"CPU": res.cpus_per_worker, "GPU": res.gpus_per_worker}
            if res.gpus_per_worker > 0
            else {"CPU": res.cpus_per_worker},
        ),
        run_config=ray.train.RunConfig(
            # named after the trial's key: a retried or resumed trial finds its own checkpoint (an edited
            # method file's trial starts afresh)
            name=f"train-{digest(with_method(trial, [key, trial]))[:16]}",
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
    from clsr.train.outcome import failure_line

    return failure_line(err)


def _refuse_timed_out_retry(ctx: StudyContext, key: str) -> None:
    """Tune retries an in-process trial whose process ended; one that ran out of time stays ended
    (until the study is resumed: a new lease generation)."""
    earlier = call_with_retry(
        lambda: trial_run(MlflowClient(ctx.tracking_uri), ctx.parent_run_id, key),
        patience_s=None,
        what="reading a trial's run",
    )
    if earlier is not None and earlier.data.tags.get(TIMED_OUT_ATTEMPT_TAG) == str(ctx.attempt):
        raise TrialTimedOut(f"{key} ran past trial_timeout_s in this run of the study; resume to continue it")


def _refuse_held(ctx: StudyContext, ablation: str) -> None:
    """Raise ``TrialHeld`` when the record says no trial of ``ablation`` may start now
    (``clsr.study.control.stop_request``): before the trial opens a run, so the record holds none for it."""
    from clsr.study.control.stop_request import held_by

    tags = call_with_retry(
        lambda: MlflowClient(ctx.tracking_uri).get_run(ctx.parent_run_id).data.tags,
        patience_s=None,
        what="reading the study's stop requests",
    )
    why = held_by(tags, ablation)
    if why is not None:
        raise TrialHeld(f"not started: {why}")


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
    return storage_uri(getattr(checkpoint, "filesystem", None), checkpoint.path)
