"""Small pieces shared by the contrastive losses."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def full_precision(tensor: torch.Tensor) -> torch.autocast:
    """Autocast off on ``tensor``'s device: a loss computed inside it runs its similarity matmuls in
    float32 even within the loop's bf16/fp16 autocast (which would otherwise recast a ``.float()``
    input). SimCSE's code keeps its similarities in float32: in bf16 a cosine is off by up to ~2e-3,
    a logit by ~0.05 at τ = 0.05."""
    return torch.autocast(tensor.device.type, enabled=False)


def cos_sim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[i, j] = cos(a_i, b_j)``."""
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


def in_batch_cross_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Row ``i``'s positive is column ``i``; mean over rows (PyTorch's default reduction)."""
    targets = torch.arange(logits.size(0), device=logits.device)
    return F.cross_entropy(logits, targets)
