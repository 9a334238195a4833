"""A Hugging Face transformer plus a pooler: the encoder every transformer-based method trains."""

from __future__ import annotations

from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from transformers import AutoConfig, AutoModel, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from clsr.encoders.pooling import Pooler, PoolingName
from clsr.encoders.registry import describe_load_failure, resolve_model_path

# Config attributes that hold dropout rates in the common architectures (BERT, RoBERTa, MPNet, DistilBERT).
_DROPOUT_ATTRS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout")


class ModelConfig(BaseModel):
    """The ``model`` section of a trial: which encoder, how it pools, how long its inputs are."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["transformer"] = "transformer"
    name: str = Field(
        "bert-base-uncased", description="hub id, local folder, or a short name such as 'minilm'"
    )
    pooling: PoolingName = "cls"
    mlp_only_train: bool = False
    max_seq_length: int = Field(32, ge=4, le=8192)
    dropout: float | None = Field(None, ge=0.0, lt=1.0, description="override hidden+attention dropout")


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    path = resolve_model_path(name)
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise describe_load_failure(name, err) from err


def _load_backbone(name: str, dropout: float | None) -> nn.Module:
    path = resolve_model_path(name)
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise describe_load_failure(name, err) from err
    if dropout is not None:
        for attr in _DROPOUT_ATTRS:
            if hasattr(config, attr):
                setattr(config, attr, dropout)
    kwargs: dict[str, Any] = {"config": config}
    hf_logging.set_verbosity_error()  # the load report lists BERT's unused pretrained pooler: expected
    hf_logging.disable_progress_bar()
    # BERT's pretrained pooler is never used (SimCSE adds its own MLP); leaving it out keeps DDP from
    # complaining about parameters without gradients.
    try:
        return AutoModel.from_pretrained(path, add_pooling_layer=False, **kwargs)
    except TypeError:
        return AutoModel.from_pretrained(path, **kwargs)


class TransformerEncoder(nn.Module):
    """``forward(input_ids, attention_mask) -> (batch, dim)`` sentence embeddings."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.backbone = _load_backbone(cfg.name, cfg.dropout)
        hidden = self.backbone.config.hidden_size
        init_std = getattr(self.backbone.config, "initializer_range", 0.02)
        self.pooler = Pooler(cfg.pooling, hidden, mlp_only_train=cfg.mlp_only_train, init_std=init_std)

    @property
    def dim(self) -> int:
        return self.backbone.config.hidden_size

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        out = self.backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=self.pooler.needs_all_layers,
        )
        hidden_states = out.hidden_states if self.pooler.needs_all_layers else (out.last_hidden_state,)
        return self.pooler(hidden_states, attention_mask)
