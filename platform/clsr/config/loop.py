"""What a trial's workers are given, typed from the trial driver to ``train_loop_per_worker``.

Ray Train's ``train_loop_config`` must be a dict: ``LoopConfig.for_ray_train`` puts the typed config in it
whole, and the worker takes it out; nothing on either side reads string keys."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from clsr.config.trial import TrialConfig
from clsr.tracking.run_logger import TrackingTarget


@dataclass(frozen=True)
class LoopConfig:
    """What a trial's workers are given: the trial, where it reports, the shared input built once for
    the study (``[ObjectRef]``, fetched from Ray's object store) and how it runs (``in_process``: in the
    Tune trial's own process; else on a Ray Train worker group, each worker's GPU share)."""

    trial: TrialConfig
    tracking: TrackingTarget | None = None
    shared: list[Any] | None = None
    in_process: bool = False
    gpus_per_worker: float = 0.0

    def for_ray_train(self) -> dict[str, LoopConfig]:
        """Ray Train's ``train_loop_config`` is a dict: the typed config rides in it whole."""
        return {"loop": self}
