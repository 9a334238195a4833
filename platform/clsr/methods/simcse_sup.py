"""Supervised SimCSE (Gao, Yao & Chen, EMNLP 2021), methods.md §2.2.

Rows are NLI triplets (premise ``x_i``, entailment ``x_i^+``, contradiction ``x_i^-``). Loss, paper
Eq. 5 with the hard-negative weight α of §6.3 (``s = sim/τ``):

    ℓ_i = -log [ e^{s(h_i,h_i^+)} / Σ_{j=1..N} ( e^{s(h_i,h_j^+)} + α^{1[i=j]} e^{s(h_i,h_j^-)} ) ]

mean over i. Candidates are every entailment and every contradiction of the (global) batch; other
premises are not candidates. ``α`` enters as ``log α`` added to the logit of the row's own hard
negative (the official ``hard_negative_weight``). With ``hard_negatives: false`` the rows are
(premise, entailment) pairs and the loss is Eq. 5 without the second sum.
"""

from __future__ import annotations

import math
from typing import ClassVar

import torch
from pydantic import Field

from clsr.methods.base import Method, MethodConfig
from clsr.methods.losses import cos_sim, in_batch_cross_entropy


class SimCSESupConfig(MethodConfig):
    name: str = "simcse_sup"
    temperature: float = Field(0.05, gt=0, description="τ of Eq. 5")
    hard_negatives: bool = Field(True, description="use the contradiction column as hard negatives")
    hard_negative_weight: float = Field(1.0, gt=0, description="α of §6.3 (Table 7)")


def simcse_sup_loss(
    views: torch.Tensor, temperature: float, hard_negative_weight: float = 1.0
) -> torch.Tensor:
    """``views``: (N, 2, d) pairs or (N, 3, d) triplets (anchor, positive, hard negative)."""
    anchors = views[:, 0]
    logits = cos_sim(anchors, views[:, 1]) / temperature
    if views.size(1) == 3:
        negatives = cos_sim(anchors, views[:, 2]) / temperature
        if hard_negative_weight != 1.0:
            negatives = negatives + math.log(hard_negative_weight) * torch.eye(
                len(anchors), device=views.device, dtype=negatives.dtype
            )
        logits = torch.cat([logits, negatives], dim=1)
    return in_batch_cross_entropy(logits)


class SimCSESup(Method):
    name = "simcse_sup"
    Config = SimCSESupConfig
    paper = "SimCSE (Gao et al., 2021), supervised; Eq. 5"
    paper_defaults: ClassVar = {
        "model": {
            "name": "bert-base-uncased",
            "pooling": "cls",
            "mlp_only_train": False,
            "max_seq_length": 32,
        },
        "data": {"train": "nli_for_simcse"},
        "trainer": {"batch_size": 512, "lr": 5e-5, "epochs": 3, "eval_steps": 125, "weight_decay": 0.0},
    }

    def views(self) -> tuple[str, ...]:
        return ("anchor", "positive", "negative") if self.cfg.hard_negatives else ("anchor", "positive")

    def loss_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        return simcse_sup_loss(embeddings, self.cfg.temperature, self.cfg.hard_negative_weight)
