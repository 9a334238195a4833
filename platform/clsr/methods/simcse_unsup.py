"""Unsupervised SimCSE (Gao, Yao & Chen, EMNLP 2021), methods.md §2.1.

Each sentence is encoded twice in one forward pass; the two dropout masks make the two views
``h_i`` and ``h_i^+``. Loss, paper Eq. 4:

    ℓ = (1/N) Σ_i  -log [ exp(sim(h_i, h_i^+)/τ) / Σ_{j=1..N} exp(sim(h_i, h_j^+)/τ) ]

Negatives are the second views of the other sentences of the (global) batch; first views are not
candidates, and the loss is not symmetrised.

``same_dropout_mask: true`` is Table 3's "Fixed 0.1": dropout stays on (p = ``model.dropout``) but both
copies get the same mask. Identical masks give identical outputs, so each sentence is encoded once and
its embedding serves as both ``h_i`` and ``h_i^+`` (the gradient is the same as for two copies).

Input: rows with a ``text`` column (e.g. ``wiki1m``). Pooling: ``cls`` with the MLP in training only.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field

from clsr.methods.base import Method, MethodConfig
from clsr.methods.losses import cos_sim, in_batch_cross_entropy


class SimCSEUnsupConfig(MethodConfig):
    name: str = "simcse_unsup"
    temperature: float = Field(0.05, gt=0, description="τ of Eq. 4 (paper)")
    same_dropout_mask: bool = Field(
        False, description="one dropout mask for both views: Table 3's 'Fixed 0.1' (paper); false: Eq. 4"
    )


def simcse_unsup_loss(views: torch.Tensor, temperature: float) -> torch.Tensor:
    """``views``: (N, 2, d) — the two dropout views of each sentence."""
    logits = cos_sim(views[:, 0], views[:, 1]) / temperature
    return in_batch_cross_entropy(logits)


class SimCSEUnsup(Method):
    name = "simcse_unsup"
    Config = SimCSEUnsupConfig
    paper = "SimCSE (Gao et al., 2021), unsupervised; Eq. 4"
    paper_defaults: ClassVar = {
        "model": {
            "name": "bert-base-uncased",
            "pooling": "cls",
            "mlp_only_train": True,
            "max_seq_length": 32,
        },
        "data": {"train": "wiki1m"},
        "trainer": {"batch_size": 64, "lr": 3e-5, "epochs": 1, "eval_steps": 125, "weight_decay": 0.0},
    }

    def views(self) -> tuple[str, ...]:
        return ("text",) if self.cfg.same_dropout_mask else ("text", "text")

    def loss_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        if self.cfg.same_dropout_mask:  # one pass, one mask: the embedding is both views
            embeddings = embeddings.expand(-1, 2, -1)
        return simcse_unsup_loss(embeddings, self.cfg.temperature)
