"""Helpers for in-batch negatives across Ray Train workers (SimCSE's DDP all-gather, methods.md §1.3)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def gather_with_grad(local: torch.Tensor) -> torch.Tensor:
    """Concatenate every worker's tensor along dim 0, rank order; only the local slice keeps its graph.

    Each worker then computes the loss of the whole global batch. The trainer multiplies that loss by
    the world size before ``backward`` so that DDP's gradient *average* equals the gradient of the
    global loss: a 2-worker run takes exactly the step of a 1-worker run with the same global batch.
    """
    if world_size() == 1:
        return local
    parts = [torch.empty_like(local) for _ in range(world_size())]
    dist.all_gather(parts, local.detach().contiguous())
    parts[rank()] = local
    return torch.cat(parts, dim=0)
