"""Encode sentences with a trained or pretrained encoder: unique sentences only, sorted by length.

A trial scores the same dev sentences at every evaluation (STS-B dev: 2,909 sentences, 20 times for a
GCLSR trial), so what the host does to them before the model sees them (tokenising and padding, or
word ids) is done once per tokenizer or word table and kept (``_prepared``): 0.19 s of host time per
evaluation with MiniLM's tokenizer here, a large share of an evaluation on a GPU. Hand-written because
``functools`` caches hold their keys strongly and need them hashable (a word table is not): this one
is per tokenizer or table by identity (held on it: ``PreparedSets``), dropped with it, and keeps a few
sentence sets.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from clsr.encoders.precision import autocast_context

Embedder = Callable[[Sequence[str]], np.ndarray]


PREPARED_SETS = 4  # sentence sets kept per tokenizer or word table: the dev sets a trial scores
PREPARED_ATTR = "_clsr_prepared_sets"  # where an owner holds its PreparedSets


class PreparedSets:
    """One owner's prepared sentence sets, least recently used dropped beyond ``PREPARED_SETS``.

    Held on the owner itself (attribute ``PREPARED_ATTR``): it lives and dies with its tokenizer or word
    table, and two owners never share one. It pickles empty, so a copy of its owner sent elsewhere (to a
    Ray worker, into a saved model) carries no tensors with it."""

    def __init__(self) -> None:
        self.sets: OrderedDict[tuple, Any] = OrderedDict()

    def __reduce__(self) -> tuple:
        return (PreparedSets, ())

    def get(self, key: tuple, prepare: Callable[[], Any]) -> Any:
        if key in self.sets:
            self.sets.move_to_end(key)
            return self.sets[key]
        value = self.sets[key] = prepare()
        while len(self.sets) > PREPARED_SETS:
            self.sets.popitem(last=False)
        return value


def _prepared(owner: Any, key: tuple, prepare: Callable[[], Any]) -> Any:
    """``prepare()``'s result for ``owner`` (a tokenizer, a word table: by identity, hashable or not) and
    ``key``, computed once while ``owner`` lives (``PreparedSets``, kept on the owner)."""
    sets = getattr(owner, PREPARED_ATTR, None)
    if not isinstance(sets, PreparedSets):
        sets = PreparedSets()
        try:
            setattr(owner, PREPARED_ATTR, sets)
        except (AttributeError, TypeError):  # frozen or slotted: nothing kept
            return prepare()
    return sets.get(key, prepare)


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
        key = (max_length, batch_size, tuple(unique))
        order, batches = _prepared(
            tokenizer, key, lambda: _padded_batches(tokenizer, unique, max_length, batch_size)
        )
        vectors: list[np.ndarray] = [None] * len(unique)  # type: ignore[list-item]
        for start, (input_ids, attention_mask) in zip(range(0, len(order), batch_size), batches, strict=True):
            with autocast_context(precision, device):
                out = encoder(input_ids.to(device), attention_mask.to(device))
            for i, row in zip(order[start : start + batch_size], out.float().cpu().numpy(), strict=True):
                vectors[i] = row
        encoder.train(was_training)
        position = {s: i for i, s in enumerate(unique)}
        return np.stack([vectors[position[s]] for s in sentences])

    return embed


def _padded_batches(
    tokenizer: Any, unique: list[str], max_length: int, batch_size: int
) -> tuple[np.ndarray, list[tuple[torch.Tensor, torch.Tensor]]]:
    """The sentences' order (longest first: padding stays small) and their padded batches in it."""
    ids = tokenizer(unique, truncation=True, max_length=max_length)["input_ids"]
    order = np.argsort([-len(x) for x in ids], kind="stable")
    batches = []
    for start in range(0, len(order), batch_size):
        batch = tokenizer.pad(
            {"input_ids": [ids[i] for i in order[start : start + batch_size]]}, return_tensors="pt"
        )
        batches.append((batch["input_ids"], batch["attention_mask"]))
    return order, batches


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
        ids, _mask = _prepared(table, (tuple(unique),), lambda: table.encode(unique))
        chunks = []
        for start in range(0, len(unique), batch_size):
            batch = torch.as_tensor(ids[start : start + batch_size], device=device)
            chunks.append(encoder(batch, generator).float().cpu().numpy())
        encoder.train(was_training)
        vectors = np.concatenate(chunks)
        position = {s: i for i, s in enumerate(unique)}
        return vectors[[position[s] for s in sentences]]

    return embed
