"""How many optimiser steps a trial takes: the default epoch arithmetic every method starts from.

Below both the loop and the methods (``Method.plan_steps`` calls it), so neither imports the other for it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from clsr.config.trial import TrialConfig


def plan_steps(num_rows: int, trial: TrialConfig, world: int) -> tuple[int, int]:
    """(steps per epoch, total steps), with the batch-size checks that would otherwise fail mid-run."""
    t = trial.trainer
    if t.batch_size % (t.grad_accum_steps * world):
        raise ValueError(
            f"trainer.batch_size={t.batch_size} must be divisible by grad_accum_steps × workers "
            f"= {t.grad_accum_steps} × {world}"
        )
    steps_per_epoch = num_rows // t.batch_size
    if steps_per_epoch == 0:
        raise ValueError(
            f"data set {trial.data.train!r} has {num_rows} rows, fewer than one batch of {t.batch_size}; "
            f"lower trainer.batch_size or raise data.max_rows"
        )
    total = math.ceil(t.epochs * steps_per_epoch)
    return steps_per_epoch, total if t.max_steps is None else min(total, t.max_steps)


def eval_interval(trial: TrialConfig, steps_per_epoch: int) -> int:
    """Steps between dev evaluations (the last step always evaluates too): ``eval_epochs`` of an epoch,
    else ``eval_steps``."""
    t = trial.trainer
    return max(1, round(t.eval_epochs * steps_per_epoch)) if t.eval_epochs else t.eval_steps
