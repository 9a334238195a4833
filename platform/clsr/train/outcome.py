"""What a trial is and how it ends, for those who plan and run trials without importing the loop:
evaluation-only points (``trainer.max_steps: 0``) and the failures that end a trial for good."""

from __future__ import annotations

import torch

from clsr.config.trial import TrialConfig
from clsr.data.hub.model_registry import ModelUnavailableError
from clsr.data.sources import DataUnavailableError

EVAL_ONLY_TAG = "clsr.eval_only"  # "true" on the MLflow run of a point that trained nothing
# Failures that come back on every retry from the same checkpoint (a diverging loss, a value the trial
# cannot run with, a data file or model that is not there, a batch that does not fit the device): the
# trial ends with them, never retried (``clsr.train.worker.NON_RETRYABLE``).
FINAL_FAILURES = (
    FloatingPointError, ValueError, TypeError, FileNotFoundError, DataUnavailableError,
    ModelUnavailableError, torch.OutOfMemoryError,
)  # fmt: skip


def failure_line(err: BaseException) -> str:
    """What a final failure is recorded as (the trial run's ``clsr.error``, the study's last table)."""
    text = f"{type(err).__name__}: {err}"
    if isinstance(err, torch.OutOfMemoryError):
        text = text.splitlines()[0] + (
            " -- the batch does not fit this device: set trainer.gradcache_chunk_rows (the same loss in "
            "less memory), trainer.precision: bf16, or a smaller trainer.batch_size"
        )
    return text


def is_evaluation_only(trial: TrialConfig) -> bool:
    """``trainer.max_steps: 0``: the point trains nothing and scores its starting model."""
    return trial.trainer.max_steps == 0
