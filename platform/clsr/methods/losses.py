"""Small pieces shared by the contrastive losses."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def cos_sim(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``[i, j] = cos(a_i, b_j)``."""
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


def in_batch_cross_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Row ``i``'s positive is column ``i``; mean over rows (PyTorch's default reduction)."""
    targets = torch.arange(logits.size(0), device=logits.device)
    return F.cross_entropy(logits, targets)
