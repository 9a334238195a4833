"""Kim's TextCNN over frozen word vectors: the GCLSR backbone (methods.md §7.1, §7.4).

A sentence is a matrix of ``max_words`` word vectors (padding rows hold one fixed random vector, not
zeros). For each region size r there is a bank of ``filters`` convolutions of size r × dim (bias on),
followed by ReLU and max-over-time pooling; the banks are concatenated. No dropout and no FC layer
follow, so the sentence embedding has ``filters × len(region_sizes)`` dimensions.

Paper: region sizes (1,1,1,6,15,20) with 300 filters (1,800-d). Official code: (1,1,1,6,10,15) with
640 filters (3,840-d); set ``region_sizes``/``filters`` to those for the code variant.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from clsr.config.model import TextCNNConfig
from clsr.encoders.word_vectors import OOV_ID, WordTable


class TextCNNEncoder(nn.Module):
    """``embed_words(ids)`` → (B, L, dim) word vectors; ``features(vectors)`` → (B, filters·banks)."""

    def __init__(self, cfg: TextCNNConfig, table: WordTable):
        super().__init__()
        self.cfg = cfg
        self.words = nn.Embedding.from_pretrained(
            torch.tensor(table.vectors, dtype=torch.float32),
            freeze=cfg.freeze_vectors,  # copy: read-only arrays
        )
        self.oov_bound = math.sqrt(3.0 / table.dim)
        # Conv1d over (B, dim, L) with kernel r equals Kim's Conv2d with an r × dim kernel.
        self.banks = nn.ModuleList(nn.Conv1d(table.dim, cfg.filters, r) for r in cfg.region_sizes)

    @property
    def dim(self) -> int:
        return self.cfg.filters * len(self.cfg.region_sizes)

    def embed_words(self, ids: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Look words up; each OOV position gets a fresh uniform vector (the code redraws every call)."""
        vectors = self.words(ids)
        oov = ids == OOV_ID
        if oov.any():
            draws = torch.rand(
                (int(oov.sum()), vectors.shape[-1]),
                generator=generator,
                device=ids.device,
                dtype=vectors.dtype,
            )
            vectors = vectors.masked_scatter(oov.unsqueeze(-1), (draws * 2 - 1) * self.oov_bound)
        return vectors

    def features(self, vectors: torch.Tensor) -> torch.Tensor:
        channels_first = vectors.transpose(1, 2)  # (B, dim, L)
        pooled = [torch.relu(bank(channels_first)).amax(dim=-1) for bank in self.banks]
        return torch.cat(pooled, dim=-1)

    def forward(self, ids: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
        """Test-time sentence embedding: no self-attention, no mask; padding rows go through the convs."""
        return self.features(self.embed_words(ids, generator))
