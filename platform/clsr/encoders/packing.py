"""Padding-free encoding: a forward pass's sentences packed into one row of real tokens.

``TransformerEncoder.encode_packed`` hands the backbone one row of every sentence's tokens, position
ids that restart at each sentence, and the cumulative lengths (``cu_seq_lens``) that bound them:
transformers' padding-free path. Every layer but attention then runs on real tokens only. Attention
needs a kernel that keeps each sentence to itself:

* ``flash_attention_2``: flash-attn's variable-length kernel (CUDA GPUs with the package);
* ``sdpa_packed`` (this module, registered with transformers as ``clsr_sdpa_packed``): the sentences
  are sorted by length and cut into ``ATTENTION_BUCKETS`` buckets; each bucket's queries, keys and
  values are gathered into a padded ``(sentences, heads, its longest, head_dim)`` view, PyTorch's
  ``scaled_dot_product_attention`` runs on it with the padding masked, and the real positions are
  gathered back. Any device. The projections and feed-forward layers, most of a short sentence's
  cost, run unpadded; the buckets keep attention's own padding (its scores, softmax and dropout mask
  grow with the square of the width) near the sentences' own lengths instead of the batch's longest.

Why by hand: transformers' padding-free path ships kernels for flash-attn only, and PyTorch's own
variable-length attention runs on CUDA only.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import nn

SDPA_PACKED = "clsr_sdpa_packed"  # the name transformers knows the kernel by


ATTENTION_BUCKETS = 4  # per forward pass: few enough that a GPU's kernel launches stay few


class AttentionPlan(NamedTuple):
    """Where a packed row's tokens go for bucketed attention, built once per forward pass."""

    gather: torch.Tensor  # flat indices into the packed row, bucket after bucket (padding: a real token)
    buckets: list[tuple[int, int]]  # (sentences, width) of each bucket, in gather order
    masks: list[torch.Tensor]  # (sentences, width) real positions of each bucket
    scatter: torch.Tensor  # each packed token's index in the gathered layout, in packed order


def attention_plan(cu_seq_lens: torch.Tensor, buckets: int = ATTENTION_BUCKETS) -> AttentionPlan:
    """The sentences of ``cu_seq_lens`` longest first, cut into ``buckets`` of equal count, each padded
    to its own longest. Reads the lengths to the host once (small integer arrays)."""
    bounds, device = cu_seq_lens.tolist(), cu_seq_lens.device
    starts, lengths = np.array(bounds[:-1]), np.diff(bounds)
    bucket = max(-(-len(lengths) // buckets), 1)
    order = np.argsort(-lengths, kind="stable")
    gather, scatter, buckets, masks = [], np.empty(bounds[-1], dtype=np.int64), [], []
    base = 0
    for first in range(0, len(order), bucket):
        rows = order[first : first + bucket]
        width = max(int(lengths[rows].max()), 1)
        offsets = np.arange(width)
        real = offsets[None, :] < lengths[rows, None]
        gather.append((starts[rows, None] + offsets[None, :] * real).ravel())
        slots = base + np.arange(len(rows))[:, None] * width + offsets[None, :]
        scatter[(starts[rows, None] + offsets[None, :])[real]] = slots[real]
        buckets.append((len(rows), width))
        masks.append(torch.from_numpy(real).to(device, non_blocking=True))
        base += len(rows) * width
    return AttentionPlan(
        torch.from_numpy(np.concatenate(gather)).to(device, non_blocking=True),
        buckets,
        masks,
        torch.from_numpy(scatter).to(device, non_blocking=True),
    )


def sdpa_packed(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    attention_plan_: AttentionPlan | None = None,
    **kwargs,  # what else transformers passes: each bucket sizes itself (no max_length_q)
) -> tuple[torch.Tensor, None]:
    """Attention within each sentence of a packed ``(1, heads, tokens, head_dim)`` row; returns
    ``(1, tokens, heads, head_dim)`` as transformers' attention functions do.

    Both gathers are ``index_select`` on whole token rows (``heads × head_dim`` values each): their
    gradients are ``index_add_`` over those rows. Advanced indexing (``states[:, index]``,
    ``out[real]``) computes the same but its gradient, an accumulating ``index_put_``, is several
    times slower on a CPU (8 % of a MiniLM step, measured).

    ``attention_plan_``: the forward pass's plan, built once by its caller (``encode_packed``) and passed
    down through the backbone's keyword arguments to every layer, so each forward pass (and each encoder)
    holds its own; without it the plan is built here."""
    if cu_seq_lens_q is None or query.size(0) != 1:
        raise ValueError(
            "model.attention sdpa_packed runs packed rows only (TransformerEncoder.encode_packed)"
        )
    plan = attention_plan_ if attention_plan_ is not None else attention_plan(cu_seq_lens_q)
    heads, head_dim = query.size(1), query.size(3)

    def gathered(states: torch.Tensor) -> list[torch.Tensor]:  # (1, H, T, D) -> [(n, H, width, D)]
        rows = states[0].transpose(0, 1)  # (T, H, D): transformers' own layout before its transpose
        flat = rows.index_select(0, plan.gather)
        views, start = [], 0
        for sentences, width in plan.buckets:
            size = sentences * width
            views.append(flat[start : start + size].view(sentences, width, heads, head_dim).transpose(1, 2))
            start += size
        return views

    outs = [
        nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=real[:, None, None, :], dropout_p=dropout, scale=scaling
        )
        .transpose(1, 2)
        .reshape(-1, heads, head_dim)  # keys: the sentence's own tokens
        for q, k, v, real in zip(gathered(query), gathered(key), gathered(value), plan.masks, strict=True)
    ]
    flat_out = outs[0] if len(outs) == 1 else torch.cat(outs)
    return flat_out.index_select(0, plan.scatter).unsqueeze(0), None  # real positions, packed order


def register_sdpa_packed() -> str:
    """Make the kernel known to transformers (before a model is loaded with it); returns its name.
    Not at import: importing transformers' model code costs seconds that validating a study need not pay."""
    from transformers import AttentionInterface

    AttentionInterface.register(SDPA_PACKED, sdpa_packed)
    return SDPA_PACKED
