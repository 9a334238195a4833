"""The random states a trial saves and restores: the CPU generator and the trial's own accelerator only.

Dropout draws its masks from them, so a resumed trial (and GradCache's replayed chunks) continues with
the masks it would have drawn. Only the current device's CUDA state is kept: saving every visible GPU's
(``get_rng_state_all``) ties the checkpoint to the placement, and a trial resumed where fewer GPUs are
visible fails with "invalid device ordinal" when it restores them.
"""

from __future__ import annotations

import warnings
from typing import Any

import torch


def rng_state(device: torch.device) -> dict[str, torch.Tensor]:
    """``{"cpu": …}`` plus ``"cuda"``: the state of ``device`` when it is a GPU."""
    state = {"cpu": torch.get_rng_state()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict[str, Any], device: torch.device) -> None:
    """Restore ``state`` on ``device``; a GPU state restores only on a GPU. Checkpoints written before
    this format hold a list with every visible GPU's state: the one at ``device``'s index is used when
    it exists (the trial's own GPU then), otherwise the GPU keeps its seeded state, with a warning."""
    torch.set_rng_state(state["cpu"])
    cuda = state.get("cuda")
    if device.type != "cuda" or cuda is None:
        return
    if isinstance(cuda, list | tuple):  # the old format: every visible GPU's state
        index = device.index or 0
        if index >= len(cuda):
            warnings.warn(
                f"the checkpoint holds CUDA random states of {len(cuda)} GPU(s), none for {device}: "
                f"dropout masks continue from the trial's seed instead",
                stacklevel=2,
            )
            return
        cuda = cuda[index]
    torch.cuda.set_rng_state(cuda, device)
