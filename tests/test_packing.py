"""Padding-free encoding for FlashAttention-2 (``model.attention: flash_attention_2``): a batch's
sentences packed into one row, position ids per sentence, attention kept inside each sentence by its
cumulative lengths.

FlashAttention-2 runs on CUDA GPUs only, so here the packed path runs through transformers' own
padding-free plumbing with a reference variable-length kernel registered in its place: PyTorch's SDPA
one sentence at a time, which is what ``flash_attn_varlen_func`` computes. The embeddings and every
gradient equal one padded pass; what the packing itself gets wrong (positions, boundaries, unpacking,
pooling) would show here.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from clsr.encoders.transformer import ModelConfig, TransformerEncoder, load_tokenizer
from conftest import save_tiny_bert

SENTENCES = [
    "a man is playing a guitar on the stage",
    "two dogs run",
    "the crowd sings along loudly tonight while a man is playing",
    "hello",
    "a woman slices an onion in the kitchen",
]


def varlen_reference(module, query, key, value, attention_mask, cu_seq_lens_q=None, **kwargs):
    """``(1, heads, tokens, head_dim)`` packed queries; attention within each ``cu_seq_lens_q`` span."""
    assert query.size(0) == 1 and attention_mask is None and cu_seq_lens_q is not None
    bounds = cu_seq_lens_q.tolist()
    parts = [
        sdpa_attention_forward(
            module,
            query[:, :, start:end],
            key[:, :, start:end],
            value[:, :, start:end],
            None,
            dropout=kwargs.get("dropout", 0.0),
            scaling=kwargs.get("scaling"),
        )[0]
        for start, end in zip(bounds[:-1], bounds[1:], strict=True)
    ]
    return torch.cat(parts, dim=1), None  # (1, tokens, heads, head_dim), as flash-attn returns


AttentionInterface.register("clsr_varlen_reference", varlen_reference)


@pytest.fixture(
    scope="module",
    params=[(p, k) for p in ("avg", "cls", "avg_first_last") for k in ("flash_reference", "sdpa_packed")],
    ids=lambda param: "-".join(param),
)
def encoders(request, tmp_path_factory) -> tuple[TransformerEncoder, TransformerEncoder]:
    """A padded encoder and a packed one with the same weights: ``sdpa_packed`` as configured, or the
    packing of ``flash_attention_2`` with the reference kernel in flash-attn's place."""
    pooling, kernel = request.param
    folder = save_tiny_bert(tmp_path_factory.mktemp("tiny-bert-packing"), dropout=0.0)
    padded = TransformerEncoder(ModelConfig(name=folder, pooling=pooling))
    attention = "sdpa_packed" if kernel == "sdpa_packed" else None
    packed = TransformerEncoder(ModelConfig(name=folder, pooling=pooling, attention=attention))
    packed.load_state_dict(padded.state_dict())
    if kernel == "flash_reference":
        packed.backbone.set_attn_implementation("clsr_varlen_reference")
        packed.packed = True  # what model.attention: flash_attention_2 sets
    assert packed.packed
    return padded, packed


def batch(encoder: TransformerEncoder) -> dict:
    return load_tokenizer(encoder.cfg.name)(SENTENCES, padding=True, return_tensors="pt")


def test_packed_embeddings_equal_one_padded_pass(encoders):
    padded, packed = encoders
    inputs = batch(padded)
    assert (inputs["attention_mask"] == 0).any()  # there is padding to leave out
    with torch.no_grad():
        expected = padded.eval()(inputs["input_ids"], inputs["attention_mask"])
        got = packed.eval()(inputs["input_ids"], inputs["attention_mask"], length_group_size=2)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_packed_gradients_equal_one_padded_pass(encoders):
    padded, packed = encoders
    inputs = batch(padded)
    for encoder in encoders:
        encoder.train().zero_grad()
        encoder(inputs["input_ids"], inputs["attention_mask"]).pow(2).sum().backward()
    grads = {name: p.grad for name, p in padded.named_parameters() if p.grad is not None}
    assert grads
    for name, param in packed.named_parameters():
        if name in grads:
            torch.testing.assert_close(param.grad, grads[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("attention", ["flash_attention_2", "sdpa_packed"])
def test_packing_refuses_drophead(attention):
    with pytest.raises(ValueError, match=f"drophead does not combine with model.attention {attention}"):
        ModelConfig(name="minilm", attention=attention, drophead=0.1)


def test_sdpa_packed_keeps_each_sentence_to_itself():
    from clsr.encoders.packing import padded_view, sdpa_packed

    lengths = [3, 1, 2]
    cu = torch.tensor([0, 3, 4, 6], dtype=torch.int32)
    index, real = padded_view(cu, 3)
    assert index.tolist() == [[0, 1, 2], [3, 3, 3], [4, 5, 4]]
    assert real.sum(1).tolist() == lengths
    q, k, v = (torch.randn(1, 2, 6, 4) for _ in range(3))  # (1, heads, tokens, head_dim)
    out, _ = sdpa_packed(None, q, k, v, None, cu_seq_lens_q=cu, max_length_q=3)
    expected = torch.cat(
        [
            torch.nn.functional.scaled_dot_product_attention(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b])
            for a, b in ((0, 3), (3, 4), (4, 6))
        ],
        dim=2,
    ).transpose(1, 2)
    torch.testing.assert_close(out, expected)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a CUDA GPU")
def test_the_bench_refuses_flash_attention_2_on_a_cpu_in_one_line(capsys):
    from clsr.cli import main

    argv = ["bench", "train", "--batch", "4", "--length", "16", "--steps", "1", "--warmup", "0"]
    assert main([*argv, "--attention", "flash_attention_2"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("error: model.attention flash_attention_2 needs a CUDA GPU") and "Traceback" not in err
    )
