"""Supervised SimCSE (Gao, Yao & Chen, EMNLP 2021), methods.md §2.2.

Rows are NLI triplets (premise ``x_i``, entailment ``x_i^+``, contradiction ``x_i^-``). Loss, paper
Eq. 5 with the hard-negative weight α of §6.3 (``s = sim/τ``):

    ℓ_i = -log [ e^{s(h_i,h_i^+)} / Σ_{j=1..N} ( e^{s(h_i,h_j^+)} + α^{1[i=j]} e^{s(h_i,h_j^-)} ) ]

mean over i. Candidates are every entailment and every hard negative of the (global) batch; other
premises are not candidates. ``α`` enters as ``log α`` added to the logit of the row's own hard
negative. Our ``hard_negative_alpha`` holds α itself; the official script's ``hard_negative_weight``
holds log α (its default 0 is α = 1).

Variants of the paper's ablations:

* ``hard_negatives: false``: (premise, entailment) pairs, Eq. 5 without the second sum (Table 7 "N/A").
* ``hard_negative: contradiction+neutral`` (Table 7 "Contra.+Neutral"): the premise's neutral
  hypothesis is a second hard-negative column, so the second sum runs over both columns, each row's
  own two getting α. ``neutral`` uses the neutral hypothesis alone (not in the paper).
* ``similarity: dot``: ``s(u, v) = uᵀv / τ``, no normalisation. Table D.1's "N/A (dot product)" row
  has no temperature, i.e. ``temperature: 1``.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

import torch
from pydantic import Field, model_validator

from clsr.methods.base import Method, MethodConfig
from clsr.methods.losses import cos_sim, in_batch_cross_entropy

# hard_negative -> the data columns that hold the hard negatives (nli_triplets_neutral has both)
HARD_NEGATIVE_COLUMNS = {
    "contradiction": ("negative",),
    "neutral": ("neutral",),
    "contradiction+neutral": ("negative", "neutral"),
}


class SimCSESupConfig(MethodConfig):
    name: str = "simcse_sup"
    temperature: float = Field(0.05, gt=0, description="τ of Eq. 5 (paper)")
    similarity: Literal["cosine", "dot"] = Field(
        "cosine",
        description="sim of Eq. 5: cosine (paper) or the dot product uᵀv (Table D.1 'N/A', run with τ = 1)",
    )
    hard_negatives: bool = Field(True, description="use hard negatives at all (paper; false: Table 7 'N/A')")
    hard_negative: Literal["contradiction", "neutral", "contradiction+neutral"] = Field(
        "contradiction",
        description="which hypotheses are hard negatives: contradiction (paper), contradiction+neutral "
        "(Table 7; data.train: nli_triplets_neutral), neutral (our addition)",
    )
    hard_negative_alpha: float = Field(
        1.0,
        gt=0,
        description="α of §6.3 / Table 7 (paper default 1), the weight itself: SimCSE's train.py "
        "argument hard_negative_weight holds log α instead (its 0 is our 1.0)",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed_weight(cls, data: Any) -> Any:
        if isinstance(data, dict) and "hard_negative_weight" in data:
            raise ValueError(
                "method.hard_negative_weight: renamed to method.hard_negative_alpha; it holds α, not "
                f"SimCSE's log α (given: {data['hard_negative_weight']!r})"
            )
        return data


def similarities(a: torch.Tensor, b: torch.Tensor, similarity: str, temperature: float) -> torch.Tensor:
    """``[i, j] = s(a_i, b_j) = sim(a_i, b_j) / τ`` with sim the cosine or the dot product."""
    return (a @ b.T if similarity == "dot" else cos_sim(a, b)) / temperature


def simcse_sup_loss(
    views: torch.Tensor, temperature: float, alpha: float = 1.0, similarity: str = "cosine"
) -> torch.Tensor:
    """``views``: (N, 2 + K, d): anchor, positive, then K ≥ 0 hard-negative columns."""
    anchors = views[:, 0]
    logits = [similarities(anchors, views[:, 1], similarity, temperature)]
    own = math.log(alpha) * torch.eye(len(anchors), device=views.device, dtype=views.dtype)
    for k in range(2, views.size(1)):
        logits.append(similarities(anchors, views[:, k], similarity, temperature) + own)
    return in_batch_cross_entropy(torch.cat(logits, dim=1))


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
        negatives = HARD_NEGATIVE_COLUMNS[self.cfg.hard_negative] if self.cfg.hard_negatives else ()
        return ("anchor", "positive", *negatives)

    def loss_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        cfg = self.cfg
        return simcse_sup_loss(embeddings, cfg.temperature, cfg.hard_negative_alpha, cfg.similarity)
