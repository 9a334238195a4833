"""Helpers across Ray Train workers: in-batch negatives (SimCSE's DDP all-gather, methods.md §1.3) and
the final evaluation the ranks share."""

from __future__ import annotations

import copy
import pickle
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

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


def broadcast_(tensors: Iterable[torch.Tensor], src: int = 0) -> None:
    """Overwrite every rank's tensors in place with rank ``src``'s (the same tensors in the same order)."""
    if world_size() == 1:
        return
    for tensor in tensors:
        dist.broadcast(tensor, src)


def gather_objects(value: Any, group: Any = None) -> list[Any]:
    """Every rank's ``value`` (picklable), in rank order, on every rank."""
    if world_size() == 1:
        return [value]
    parts: list[Any] = [None] * world_size()
    dist.all_gather_object(parts, value, group=group)
    return parts


@contextmanager
def patient_group(hours: float = 24) -> Iterator[Any]:
    """A gloo group over every rank whose collectives wait ``hours``: for a gather that waits on the
    slowest rank's long CPU work (the default group's timeout, 30 min under Ray Train, would end the
    workers). Every rank must enter it, in the same order; on leaving, the group is destroyed, so its
    gloo threads do not outlive it (one left to the interpreter's exit can abort the process)."""
    if world_size() == 1:
        yield None
        return
    group = dist.new_group(backend="gloo", timeout=timedelta(hours=hours))
    try:
        yield group
    finally:
        dist.destroy_process_group(group)


def gather_or_raise(compute: Any, group: Any = None) -> list[Any]:
    """Every rank's ``compute()`` result on every rank; if it raised on any rank, every rank raises the
    first error (a rank that returned alone would leave the others waiting in the collective)."""
    try:
        mine, error = compute(), None
    except Exception as err:
        mine, error = None, err if _picklable(err) else _builtin_like(err)
    parts = gather_objects((mine, error), group)
    if errors := [e for _, e in parts if e is not None]:
        raise errors[0]
    return [value for value, _ in parts]


def _builtin_like(err: Exception) -> Exception:
    """An error that does not pickle, as its nearest built-in kind (a ValueError stays one: the trial's
    retry policy tells them apart) with its message and rank."""
    kind = next(k for k in type(err).__mro__ if k.__module__ == "builtins")
    try:
        return kind(f"rank {rank()}: {type(err).__name__}: {err}")
    except Exception:
        return RuntimeError(f"rank {rank()}: {type(err).__name__}: {err}")


def _picklable(value: Any) -> bool:
    """Whether ``value`` survives the trip to rank 0: it pickles, and its reduce recipe rebuilds it
    (``copy.deepcopy`` runs the recipe unpickling would, e.g. an exception whose ``__init__`` wants other
    arguments than its ``args``) without unpickling anything."""
    try:
        pickle.dumps(value)
        copy.deepcopy(value)
    except Exception:
        return False
    return True
