"""Multiple Negatives Ranking Loss, the SBERT-nli-v2 recipe (sentence-transformers), methods.md §3.

Rows are columns ``(a, p, n_1, ..., n_K)``. Candidates are all positives of the batch followed by
all negatives (``B(1+K)`` columns); logits are ``scale · cos``; row ``i``'s target is column ``i``:

    ℓ = (1/B) Σ_i  -log [ e^{λ cos(a_i, p_i)} / ( Σ_j e^{λ cos(a_i, p_j)} + Σ_j Σ_k e^{λ cos(a_i, n_{j,k})} ) ]

(sentence-transformers ``MultipleNegativesRankingLoss``; no equation number in a paper; λ = 20 is
τ = 0.05, so with one negative this equals supervised SimCSE Eq. 5 with α = 1). Batches come from
``NoDuplicatesDataLoader``'s rule: no text appears twice in a batch.

Columns: K = 0 or 1 reads pairs/triplets (``anchor``, ``positive``[, ``negative``]); K ≥ 2 reads the
slot format of SupMPN's rows (``anchor``, ``positive_1``, ``negative_1..K``; ``data.train: nli_supmpn``,
K ≤ 5), the only catalogue rows with several negatives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import torch
from pydantic import Field

from clsr.data.batching import text_batches
from clsr.methods.base import Method, MethodConfig
from clsr.methods.losses import cos_sim, in_batch_cross_entropy


class MNRLConfig(MethodConfig):
    name: str = "mnrl"
    scale: float = Field(20.0, gt=0, description="λ, the similarity scale (1/τ)")
    num_negatives: int = Field(
        1,
        ge=0,
        description="K, hard-negative columns per row (SBERT-nli-v2: 1); K >= 2 needs rows with "
        "negative_1..K (nli_supmpn: up to 5)",
    )
    no_duplicates: bool = Field(True, description="NoDuplicatesDataLoader batching")


def mnrl_loss(columns: torch.Tensor, scale: float) -> torch.Tensor:
    """``columns``: (B, 1 + 1 + K, d) — anchor, positive, K negatives."""
    anchors = columns[:, 0]
    candidates = (
        columns[:, 1:].transpose(0, 1).reshape(-1, columns.size(-1))
    )  # positives first, then negatives
    return in_batch_cross_entropy(scale * cos_sim(anchors, candidates))


class MNRL(Method):
    name = "mnrl"
    Config = MNRLConfig
    paper = "sentence-transformers MultipleNegativesRankingLoss (SBERT-nli-v2)"
    paper_defaults: ClassVar = {
        "model": {"name": "bert-base-uncased", "pooling": "mean", "max_seq_length": 75},
        "data": {"train": "nli_sbert_v2"},
        "trainer": {
            "batch_size": 128,
            "lr": 2e-5,
            "epochs": 1,
            "warmup_ratio": 0.1,
            "weight_decay": 0.01,
            "eval_steps": 250,
        },
    }

    def views(self) -> tuple[str, ...]:
        k = self.cfg.num_negatives
        if k <= 1:
            return ("anchor", "positive", *("negative",) * k)
        return ("anchor", "positive_1", *(f"negative_{i}" for i in range(1, k + 1)))

    def batch_order(
        self, rows: Sequence[dict[str, str]], batch_size: int, epoch: int, seed: int
    ) -> list[list[int]]:
        return text_batches(rows, self.required_columns(), batch_size, epoch, seed, self.cfg.no_duplicates)

    def loss_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        return mnrl_loss(embeddings, self.cfg.scale)
