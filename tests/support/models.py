"""Tiny real models for fast tests of the real encoder code."""

from __future__ import annotations

from pathlib import Path


def save_tiny_bert(folder: Path, dropout: float | None = None, hidden: int = 16) -> str:
    """A 2-layer, 4-head BERT with MiniLM's tokenizer, saved in ``folder`` (random weights, seed 0):
    fast tests of the real encoder code. ``dropout`` overrides BERT's 0.1 hidden and attention dropout."""
    import torch
    from transformers import BertConfig, BertModel

    from clsr.encoders.transformer import load_tokenizer

    torch.manual_seed(0)
    tokenizer = load_tokenizer("minilm")
    rates = (
        {} if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    )
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=32,
        max_position_embeddings=64,
        **rates,
    )
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)
