"""The method plug-in contract. A method is one file under ``clsr/methods/`` that declares:

* ``Config``: its hyperparameters (pydantic, paper defaults written once);
* ``paper_defaults``: the paper's values for the other sections (model, data, trainer, eval);
* ``views``: which data columns each row contributes to the forward pass, in order;
* ``loss_from_embeddings``: its loss on the pooled embeddings ``(rows, views, dim)``.

The trainer never branches on the method: it asks the method for a model, a batch order, and a
loss. Methods whose model is not a transformer encoder (GCLSR) override ``build_model``,
``prepare_rows`` and ``training_loss``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from clsr.data.batching import TextViewBatcher, shuffled_batches
from clsr.encoders.transformer import ModelConfig, TransformerEncoder
from clsr.train.distributed import gather_with_grad


class MethodConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str


class Method(ABC):
    name: ClassVar[str]
    Config: ClassVar[type[MethodConfig]]
    paper_defaults: ClassVar[dict[str, dict[str, Any]]] = {}
    paper: ClassVar[str] = ""

    def __init__(self, cfg: MethodConfig):
        self.cfg = cfg

    # --- data -----------------------------------------------------------------------------------
    @abstractmethod
    def views(self) -> tuple[str, ...]:
        """Column names encoded for each row, in order (a column may repeat)."""

    def required_columns(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(self.views()))

    def prepare_rows(self, rows: list[dict[str, str]], tokenizer: Any, max_length: int) -> TextViewBatcher:
        """Tokenise once; the returned object turns row indices into a padded batch."""
        missing = [c for c in self.required_columns() if rows and c not in rows[0]]
        if missing:
            raise ValueError(
                f"method {self.name!r} needs columns {self.required_columns()} but the training data "
                f"has {tuple(rows[0])}; choose a data.train set with those columns"
            )
        return TextViewBatcher(rows, self.views(), tokenizer, max_length)

    def batch_order(
        self, rows: Sequence[dict[str, str]], batch_size: int, epoch: int, seed: int
    ) -> list[list[int]]:
        """Global batches of row indices for one epoch (the same list on every worker)."""
        return shuffled_batches(len(rows), batch_size, epoch, seed)

    # --- model and loss --------------------------------------------------------------------------
    def build_model(self, model_cfg: ModelConfig) -> nn.Module:
        return TransformerEncoder(model_cfg)

    def param_group_lrs(self) -> dict[str, float]:
        """Absolute learning rates for parameter-name prefixes (empty: one LR for everything)."""
        return {}

    def training_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Encode all views of all rows in one forward pass, gather across workers, apply the loss."""
        pooled = model(batch["input_ids"], batch["attention_mask"])
        local = pooled.view(batch["num_rows"], len(self.views()), -1)
        return self.loss_from_embeddings(gather_with_grad(local).float())

    @abstractmethod
    def loss_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Loss on ``(rows, views, dim)`` embeddings of the global batch."""

    # --- evaluation ------------------------------------------------------------------------------
    def make_embedder(
        self, model: nn.Module, tokenizer: Any, batch_size: int = 128
    ) -> Callable[[list[str]], np.ndarray]:
        from clsr.eval.embed import transformer_embedder

        return transformer_embedder(model, tokenizer, batch_size=batch_size)
