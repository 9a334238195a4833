"""Ray Train entry point: what every worker of a trial runs."""

from __future__ import annotations

from typing import Any

from clsr.train.config import TrialConfig
from clsr.train.loop import fit
from clsr.train.session import RayTrainSession, TuneTrialSession


def train_loop_per_worker(config: dict[str, Any]) -> None:
    trial = TrialConfig.model_validate(config["trial"])
    shared = None
    if config.get("shared") is not None:  # built once per study by the runner, fetched from the object store
        import ray

        shared = ray.get(config["shared"][0])
    session = TuneTrialSession() if config.get("in_process") else RayTrainSession()
    session.gpu_share = min(1.0, config.get("gpus_per_worker") or 1.0)
    fit(trial, session, tracking=config.get("tracking"), shared=shared)
