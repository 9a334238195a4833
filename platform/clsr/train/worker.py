"""Ray Train entry point: what every worker of a trial runs."""

from __future__ import annotations

from typing import Any

from clsr.config.loop import LoopConfig
from clsr.train.determinism import configure
from clsr.train.loop import fit
from clsr.train.outcome import FINAL_FAILURES, failure_line
from clsr.train.session import RayTrainSession, TuneTrialSession, cap_gpu_memory

# Failures that happen again on every retry from the same checkpoint and random state: a diverging loss
# (FloatingPointError), a value the trial cannot run with, a missing file, a batch that does not fit.
# Retries are for lost workers and processes.
NON_RETRYABLE = FINAL_FAILURES


def train_loop_per_worker(config: dict[str, LoopConfig]) -> dict[str, Any] | None:
    """Train one trial on this worker. On a Ray Train worker group a deterministic failure is returned
    (``{"clsr_failed": 1, "clsr_error": ...}``, rank 0's return value reaches the trial driver as the
    result's ``return_value``) instead of raised: Ray Train retries every error its workers raise and
    would spend ``max_failures`` on a failure that comes back each time. In the trial's own process
    (``in_process``) the error is raised to the trial driver, which records it."""
    loop = config["loop"]
    configure(loop.trial.trainer.deterministic)  # cuBLAS reads its workspace variable once: before CUDA
    shared = None
    if loop.shared is not None:  # built once per study by the runner, fetched from the object store
        import ray

        shared = ray.get(loop.shared[0])
    upload_async = loop.trial.trainer.checkpoint_upload == "async"
    session = TuneTrialSession() if loop.in_process else RayTrainSession(upload_async)
    session.gpu_share = min(1.0, loop.gpus_per_worker or 1.0)
    cap_gpu_memory(session.gpu_share, session.device)
    try:
        fit(loop.trial, session, tracking=loop.tracking, shared=shared)
    except NON_RETRYABLE as err:
        if loop.in_process:
            raise
        return {"clsr_failed": 1, "clsr_error": failure_line(err)}
    return None
