"""GradCache (Gao et al. 2021, "Scaling Deep Contrastive Learning Batch Size under Memory Limited Setup").

An in-batch-negative loss couples every row of the global batch, so plain gradient accumulation cannot
split it: the whole micro-batch's activations must be in memory at once. GradCache splits the encoder's
work instead, with the loss still computed on the full global batch (``trainer.gradcache_chunk_rows``):

1. each chunk of a worker's rows is encoded without a graph (``torch.no_grad``); the RNG state before
   each chunk is saved;
2. the cached embeddings become one leaf tensor; the method's loss on the global batch (gathered across
   workers, as without GradCache) is back-propagated to it, giving d loss / d embeddings;
3. each chunk is encoded again with a graph, from its saved RNG state so that dropout draws the same
   masks (unsupervised SimCSE's positives are two dropout masks), and its slice of that gradient is
   back-propagated through the encoder.

The parameters' gradients are those of the loss on the embeddings step 1 computed, so a step matches
an encoder that runs the same chunks with a graph; the memory held is one chunk's activations plus the
batch's embeddings, at the price of a second forward pass. Modules that change state in a forward pass
(BatchNorm's running statistics) would be updated twice; the transformer encoders have none.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from clsr.methods.base import Method
from clsr.methods.losses import full_precision
from clsr.runtime.distributed import gather_with_grad
from clsr.train.rng import restore_rng, rng_state


def check_gradcache(method: Method, chunk_rows: int | None) -> None:
    """Refuse GradCache for a method whose loss is not a function of ``encode_rows`` embeddings."""
    if chunk_rows is not None and not method.gradcache_supported():
        raise ValueError(
            f"trainer.gradcache_chunk_rows={chunk_rows}: method {method.name!r} does not support GradCache "
            f"(its loss has no in-batch negatives over embeddings of one encoder pass, or it overrides "
            f"training_loss); unset trainer.gradcache_chunk_rows for this method"
        )


def gradcache_backward(
    method: Method,
    model: nn.Module,
    batcher: Any,
    rows: Sequence[int],
    batch: dict[str, Any],
    chunk_rows: int,
    *,
    device: torch.device,
    scale: float,
    autocast: contextlib.AbstractContextManager | None = None,
    sync: bool = True,
    grad_scaler: torch.amp.GradScaler | None = None,
) -> torch.Tensor:
    """Accumulate into ``.grad`` the gradient of ``scale × loss`` of one micro-batch and return the loss
    (a detached tensor on the device: the loop reads it back at log steps).

    ``rows``: this worker's row indices of the micro-batch, ``batch``: ``batcher.collate(rows)`` on
    ``device`` (what ``method.embeddings_loss`` reads besides the embeddings); chunks of ``chunk_rows``
    rows (the last one may be smaller) are collated and encoded one at a time. ``scale``: the loop's
    ``world_size / grad_accum_steps``. ``sync``: let DDP all-reduce in the last chunk's backward (the
    last micro-batch of a step); every other backward runs under ``model.no_sync()``. ``grad_scaler``:
    fp16's loss scaling (the replayed chunks back-propagate the scaled embedding gradients). The loss
    runs in float32 outside autocast, as the loop's does.
    """
    autocast = autocast if autocast is not None else contextlib.nullcontext()
    chunks, states, cached = [], [], []
    for start in range(0, len(rows), chunk_rows):  # 1. embeddings without a graph
        part = batcher.collate(rows[start : start + chunk_rows])
        chunks.append({k: v.to(device) if torch.is_tensor(v) else v for k, v in part.items()})
        states.append(rng_state(device))
        with torch.no_grad(), autocast:
            cached.append(method.encode_rows(model, chunks[-1]).float())

    cache = torch.cat(cached).requires_grad_()  # 2. d loss / d embeddings on the global batch
    with full_precision(cache):
        loss = method.embeddings_loss(gather_with_grad(cache), batch)
    scaled = loss * scale
    (grad_scaler.scale(scaled) if grad_scaler is not None else scaled).backward()
    grads = cache.grad.split([len(c) for c in cached])

    for i, (chunk, state, grad) in enumerate(zip(chunks, states, grads, strict=True)):  # 3. replay
        last = sync and i == len(chunks) - 1
        no_sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
        restore_rng(state, device)  # the same dropout masks as in step 1
        with no_sync:
            with autocast:
                embeddings = method.encode_rows(model, chunk).float()
            embeddings.backward(grad)
    return loss.detach()
