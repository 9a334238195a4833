"""Sentence pooling over transformer hidden states (methods.md §1.1).

All averages use the tokenizer attention mask, so padding never enters them while [CLS]/[SEP] do.
"""

from __future__ import annotations

import torch
from torch import nn

from clsr.config.model import POOLINGS


def masked_mean(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean over real tokens; the denominator is clamped like sentence-transformers does."""
    weights = mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)


class Pooler(nn.Module):
    """Turns ``hidden_states`` (tuple: embeddings output, layer 1, ..., layer L) into one vector.

    ``cls`` adds SimCSE's freshly initialised dense+tanh MLP over [CLS]. With ``mlp_only_train`` the
    MLP is used in training mode only and evaluation falls back to ``cls_before_pooler``.
    """

    def __init__(self, name: str, hidden_size: int, mlp_only_train: bool = False, init_std: float = 0.02):
        super().__init__()
        if name not in POOLINGS:
            raise ValueError(f"unknown pooling {name!r}; allowed: {', '.join(POOLINGS)}")
        self.name = name
        self.mlp_only_train = mlp_only_train
        self.mlp: nn.Module | None = None
        if name == "cls":
            dense = nn.Linear(hidden_size, hidden_size)
            nn.init.normal_(dense.weight, std=init_std)
            nn.init.zeros_(dense.bias)
            self.mlp = nn.Sequential(dense, nn.Tanh())

    @property
    def needs_all_layers(self) -> bool:
        return self.name.startswith("avg_first_last") or self.name == "avg_top2"

    def forward(self, hidden_states: tuple[torch.Tensor, ...], mask: torch.Tensor) -> torch.Tensor:
        last = hidden_states[-1]
        if self.name in ("avg", "mean"):
            return masked_mean(last, mask)
        if self.name == "avg_first_last":  # layer 1 (SimCSE code since Jan 2022)
            return masked_mean((hidden_states[1] + last) / 2, mask)
        if self.name == "avg_first_last_emb":  # embedding output (the SimCSE paper-era baseline)
            return masked_mean((hidden_states[0] + last) / 2, mask)
        if self.name == "avg_top2":
            return masked_mean((hidden_states[-2] + last) / 2, mask)
        cls = last[:, 0]
        if self.mlp is None or (self.mlp_only_train and not self.training):
            return cls
        return self.mlp(cls)
