"""Decoupled contrastive learning (Yeh et al., ECCV 2022) on unsupervised SimCSE, built only on the
public contract (``from clsr import ...``): an example of docs/methods/your-own.md.

DCL observes that InfoNCE's gradient carries a "negative-positive coupling" factor: the positive pair's
own term sits in the denominator, so an easy positive or a small batch shrinks every gradient. It
removes the positive from the denominator (paper Eq. 6). On SimCSE's two dropout views ``h_i`` and
``h_i^+`` of each sentence of the (global) batch of N, with SimCSE's negatives (the other sentences'
second views):

    ℓ_DCL = (1/N) Σ_i [ -sim(h_i, h_i^+)/τ + log Σ_{j=1..N, j≠i} exp(sim(h_i, h_j^+)/τ) ]

SimCSE's Eq. 4 is the same with ``j = i`` kept in the sum. ``sim`` is the cosine; the loss needs
N ≥ 2 (a batch of one has no negative). The paper's weighted variant (DCLW) is not here.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from pydantic import Field

from clsr import Method, MethodConfig, cos_sim


class DCLConfig(MethodConfig):
    name: str = "dcl"
    temperature: float = Field(0.05, gt=0, description="τ (SimCSE's, which DCL keeps)")


def dcl_loss(views: torch.Tensor, temperature: float) -> torch.Tensor:
    """``views``: (N, 2, d), each sentence's two dropout views."""
    logits = cos_sim(views[:, 0], views[:, 1]) / temperature
    positive = logits.diagonal()
    eye = torch.eye(len(logits), dtype=torch.bool, device=logits.device)
    negatives = torch.logsumexp(logits.masked_fill(eye, float("-inf")), dim=1)  # j ≠ i only
    return (negatives - positive).mean()


class DCL(Method):
    name = "dcl"
    Config = DCLConfig
    paper = "Decoupled contrastive learning (Yeh et al., ECCV 2022) on unsupervised SimCSE; Eq. 6"
    paper_defaults: ClassVar = {  # unsupervised SimCSE's, which the paper's SimCSE experiment keeps
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
        return ("text", "text")  # two dropout passes of each sentence

    def loss_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        return dcl_loss(embeddings, self.cfg.temperature)
