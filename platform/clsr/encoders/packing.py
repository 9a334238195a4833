"""Padding-free encoding: a forward pass's sentences packed into one row of real tokens.

``TransformerEncoder.encode_packed`` hands the backbone one row of every sentence's tokens, position
ids that restart at each sentence, and the cumulative lengths (``cu_seq_lens``) that bound them:
transformers' padding-free path. Every layer but attention then runs on real tokens only. Attention
needs a kernel that keeps each sentence to itself:

* ``flash_attention_2``: flash-attn's variable-length kernel (CUDA GPUs with the package);
* ``sdpa_packed`` (this module, registered with transformers as ``clsr_sdpa_packed``): the packed
  queries, keys and values are gathered into a padded ``(sentences, heads, longest, head_dim)`` view,
  PyTorch's ``scaled_dot_product_attention`` runs on it with the padding masked, and the real positions
  are gathered back. Any device; attention is a small share of a short sentence's cost (its
  projections and feed-forward layers, which run unpadded, are the rest).

Why by hand: transformers' padding-free path ships kernels for flash-attn only, and PyTorch's own
variable-length attention runs on CUDA only.
"""

from __future__ import annotations

import torch
from torch import nn

SDPA_PACKED = "clsr_sdpa_packed"  # the name transformers knows the kernel by


def padded_view(cu_seq_lens: torch.Tensor, longest: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sentences, longest)`` indices into the packed row (padding points at the sentence's first
    token) and the mask of real positions."""
    starts, lengths = cu_seq_lens[:-1].long(), cu_seq_lens.diff().long()
    offsets = torch.arange(longest, device=cu_seq_lens.device)
    real = offsets[None, :] < lengths[:, None]
    return starts[:, None] + offsets[None, :] * real, real


def packed_positions(cu_seq_lens: torch.Tensor, longest: int, tokens: int) -> torch.Tensor:
    """Each packed token's place in the flattened ``(sentences, longest)`` padded view, in packed
    order; computed without reading anything back to the host."""
    starts, lengths = cu_seq_lens[:-1].long(), cu_seq_lens.diff().long()
    sentence = torch.repeat_interleave(
        torch.arange(lengths.numel(), device=cu_seq_lens.device), lengths, output_size=tokens
    )
    offset = torch.arange(tokens, device=cu_seq_lens.device) - starts[sentence]
    return sentence * longest + offset


def sdpa_packed(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    cu_seq_lens_q: torch.Tensor | None = None,
    max_length_q: int | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Attention within each sentence of a packed ``(1, heads, tokens, head_dim)`` row; returns
    ``(1, tokens, heads, head_dim)`` as transformers' attention functions do.

    Both gathers are ``index_select`` on whole token rows (``heads × head_dim`` values each): their
    gradients are ``index_add_`` over those rows. Advanced indexing (``states[:, index]``,
    ``out[real]``) computes the same but its gradient, an accumulating ``index_put_``, is several
    times slower on a CPU (8 % of a MiniLM step, measured)."""
    if cu_seq_lens_q is None or max_length_q is None or query.size(0) != 1:
        raise ValueError(
            "model.attention sdpa_packed runs packed rows only (TransformerEncoder.encode_packed)"
        )
    longest, (_, heads, tokens, head_dim) = int(max_length_q), query.shape
    index, real = padded_view(cu_seq_lens_q, longest)
    sentences = index.size(0)
    flat_index = index.reshape(-1)

    def padded(states: torch.Tensor) -> torch.Tensor:  # (1, H, T, D) -> (N, H, L, D)
        rows = states[0].transpose(0, 1)  # (T, H, D): transformers' own layout before its transpose
        return rows.index_select(0, flat_index).view(sentences, longest, heads, head_dim).transpose(1, 2)

    out = nn.functional.scaled_dot_product_attention(
        padded(query),
        padded(key),
        padded(value),
        attn_mask=real[:, None, None, :],  # keys: the sentence's own tokens
        dropout_p=dropout,
        scale=scaling,
    )
    flat_out = out.transpose(1, 2).reshape(sentences * longest, heads, head_dim)
    positions = packed_positions(cu_seq_lens_q, longest, tokens)
    return flat_out.index_select(0, positions).unsqueeze(0), None  # real positions, in packed order


def register_sdpa_packed() -> str:
    """Make the kernel known to transformers (before a model is loaded with it); returns its name.
    Not at import: importing transformers' model code costs seconds that validating a study need not pay."""
    from transformers import AttentionInterface

    AttentionInterface.register(SDPA_PACKED, sdpa_packed)
    return SDPA_PACKED
