"""``trainer.deterministic``: what PyTorch needs for bitwise-reproducible training on one machine, and
the per-step seeding that makes a resumed trial draw what an uninterrupted one draws.

``use_deterministic_algorithms`` makes every op take a deterministic kernel, or raise naming the op where
it has none (CUDA only, e.g. some scatter and pooling backwards); cuBLAS needs its workspace variable set
before its first call in the process (``configure`` runs before the trial touches the GPU); cuDNN is
kept from autotuning; FlashAttention-2 and Inductor take their deterministic modes. Reseeding torch's,
NumPy's and Python's global generators from ``(seed, rank, step)`` before every step makes dropout and
any other draw a function of the step alone: no random state has to survive a checkpoint, on any rank.
Settings that cannot be deterministic are refused with the configuration (``clsr.config.determinism``).
"""

from __future__ import annotations

import os
import random

import numpy as np
import torch

CUBLAS_WORKSPACE = ":4096:8"  # one of the two values cuBLAS is deterministic with (":16:8": slower)
CUBLAS_DETERMINISTIC = (CUBLAS_WORKSPACE, ":16:8")
ENV = {"FLASH_ATTENTION_DETERMINISTIC": "1", "TORCHINDUCTOR_DETERMINISTIC": "1"}


def configure(deterministic: bool) -> None:
    """Switch this process's deterministic settings on or off (a process may run several trials)."""
    if deterministic:
        if os.environ.get("CUBLAS_WORKSPACE_CONFIG") not in CUBLAS_DETERMINISTIC:
            os.environ["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE
        os.environ.update(ENV)
        torch.backends.cudnn.benchmark = False
    else:
        for key in ENV:
            os.environ.pop(key, None)
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.deterministic = deterministic
    _inductor_deterministic(deterministic)


def _inductor_deterministic(on: bool) -> None:
    """Inductor's mode without timed kernel choices, when torch.compile is in use (importing Inductor
    only for it costs a trial that does not compile a second)."""
    import sys

    inductor = sys.modules.get("torch._inductor.config")
    if inductor is not None or on:
        import torch._inductor.config as inductor

        inductor.deterministic = on


def seed_step(seed: int, rank: int, step: int) -> None:
    """Seed torch's (CPU and every GPU), NumPy's and Python's global generators for ``step`` of ``rank``."""
    state = np.random.SeedSequence([seed, rank, step]).generate_state(2, np.uint32)
    torch.manual_seed(int(state[0]) << 32 | int(state[1]))
    np.random.seed(int(state[0]))
    random.seed(int(state[1]))
