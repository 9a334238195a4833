"""What the training loop carries from step to step and through a checkpoint: ``LoopState``.

A checkpoint's ``state.pt`` holds these fields beside the model, optimiser, scheduler and random states,
under the same keys as the loop's former state dict, so checkpoints written before this class resume.
Fields that are None have not happened yet (no evaluation, no checkpoint) and are left out of the file.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, fields
from typing import Any


@dataclass
class LoopState:
    step: int = 0
    best_score: float = -math.inf  # the selecting dev score of the best weights so far
    best_step: int = 0
    lowest_loss: float = math.inf  # early stopping on the training loss (``loss_stalled``)
    stalled_steps: int = 0
    evaluations: int = 0
    checkpoint_wait_s: float = 0.0  # training waiting on checkpoint copies, over every attempt
    loss_avg: float | None = None  # over the steps since the previous evaluation
    best_dev: dict[str, float] | None = None  # every dev task's score at ``best_step``
    checkpoint_s: float | None = None  # writing checkpoints, over every attempt
    checkpoint_bytes: int | None = None

    def to_checkpoint(self) -> dict[str, Any]:
        """The entries ``state.pt`` keeps (plain numbers and a dict of them: ``weights_only`` loads)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_checkpoint(cls, saved: dict[str, Any]) -> LoopState:
        """The state ``to_checkpoint`` wrote; entries of a checkpoint's other parts are not read here."""
        return cls(**{f.name: saved[f.name] for f in fields(cls) if f.name in saved})

    def loss_stalled(self, loss: float, patience: int | None) -> bool:
        """Early stopping on the training loss: True once ``patience`` steps in a row brought no new
        lowest loss (the count is state, so it survives a resume). Every rank sees the same global loss."""
        if patience is None:
            return False
        if loss < self.lowest_loss:
            self.lowest_loss, self.stalled_steps = loss, 0
        else:
            self.stalled_steps += 1
        return self.stalled_steps >= patience

    def add_checkpoint(self, seconds: float, size: int) -> None:
        """One checkpoint written: its seconds and bytes count over every attempt of the trial."""
        self.checkpoint_s = (self.checkpoint_s or 0.0) + seconds
        self.checkpoint_bytes = (self.checkpoint_bytes or 0) + size

    @contextlib.contextmanager
    def waiting_for_checkpoints(self) -> Iterator[None]:
        """Adds the block's seconds to ``checkpoint_wait_s``: training waiting on checkpoint copies."""
        began = time.perf_counter()
        try:
            yield
        finally:
            self.checkpoint_wait_s += time.perf_counter() - began
