"""Encode sentences with a trained or pretrained encoder: unique sentences only, sorted by length."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from clsr.encoders.precision import autocast_context

Embedder = Callable[[Sequence[str]], np.ndarray]


def _unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def position_limit(encoder: nn.Module) -> int:
    """The longest input the encoder's position embeddings allow (BERT: 512; RoBERTa: 514 - 2 offset)."""
    config = getattr(getattr(encoder, "backbone", None), "config", None)
    positions = getattr(config, "max_position_embeddings", None) or 512
    return positions - 2 if getattr(config, "model_type", "") in ("roberta", "xlm-roberta") else positions


def transformer_embedder(
    model: nn.Module, tokenizer: Any, batch_size: int = 128, precision: str = "auto"
) -> Embedder:
    """SimCSE evaluation: no truncation below the model's limit, dynamic padding, eval-mode pooling, on
    the model's device in ``precision`` (``auto``: bf16 on a GPU that has it, else fp32)."""
    encoder = _unwrap(model)
    max_length = min(getattr(tokenizer, "model_max_length", 512), 512, position_limit(encoder))

    @torch.inference_mode()
    def embed(sentences: Sequence[str]) -> np.ndarray:
        was_training = encoder.training
        encoder.eval()
        device = next(encoder.parameters()).device
        unique = list(dict.fromkeys(sentences))
        ids = tokenizer(unique, truncation=True, max_length=max_length)["input_ids"]
        order = np.argsort([-len(x) for x in ids], kind="stable")  # longest first: padding stays small
        vectors: list[np.ndarray] = [None] * len(unique)  # type: ignore[list-item]
        for start in range(0, len(order), batch_size):
            chunk = [ids[i] for i in order[start : start + batch_size]]
            batch = tokenizer.pad({"input_ids": chunk}, return_tensors="pt")
            with autocast_context(precision, device):
                out = encoder(batch["input_ids"].to(device), batch["attention_mask"].to(device))
            for i, row in zip(order[start : start + batch_size], out.float().cpu().numpy(), strict=True):
                vectors[i] = row
        encoder.train(was_training)
        position = {s: i for i, s in enumerate(unique)}
        return np.stack([vectors[position[s]] for s in sentences])

    return embed


def sentence_transformers_embedder(
    model: nn.Module, batch_size: int = 128, precision: str = "auto"
) -> Embedder:
    """A ``SentenceTransformer`` as its authors meant it: its own tokenizer, ``max_seq_length`` and
    modules (pooling, Dense, Normalize), through its ``encode``, on its device in ``precision``."""

    @torch.inference_mode()
    def embed(sentences: Sequence[str]) -> np.ndarray:
        with autocast_context(precision, model.device):
            vectors = model.encode(list(sentences), batch_size=batch_size, convert_to_tensor=True)
        return vectors.float().cpu().numpy()

    return embed


def textcnn_embedder(encoder: nn.Module, table: Any, batch_size: int = 512) -> Embedder:
    """GCLSR evaluation: the TextCNN backbone on the plain word vectors (no self-attention, no mask).

    OOV words get fresh random vectors as in the paper's code, drawn from a generator seeded per call
    so that the same model scores the same every time.
    """

    @torch.inference_mode()
    def embed(sentences: Sequence[str]) -> np.ndarray:
        was_training = encoder.training
        encoder.eval()
        device = next(encoder.parameters()).device
        generator = torch.Generator(device).manual_seed(0)
        unique = list(dict.fromkeys(sentences))
        ids, _mask = table.encode(unique)
        chunks = []
        for start in range(0, len(unique), batch_size):
            batch = torch.as_tensor(ids[start : start + batch_size], device=device)
            chunks.append(encoder(batch, generator).float().cpu().numpy())
        encoder.train(was_training)
        vectors = np.concatenate(chunks)
        position = {s: i for i, s in enumerate(unique)}
        return vectors[[position[s] for s in sentences]]

    return embed
