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

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from clsr.config.model import ModelConfig
from clsr.encoders.transformer import TransformerEncoder, choose_attention, first_position, load_tokenizer
from tests.support.models import save_tiny_bert

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
    longest = max(end - start for start, end in zip(bounds[:-1], bounds[1:], strict=True))
    assert kwargs["max_length_q"] == kwargs["max_length_k"] == longest  # what flash-attn's kernel takes
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
KERNELS = ("flash_reference", "sdpa_packed")


def save_tiny_roberta(folder: Path) -> str:
    """A 2-layer RoBERTa (random weights) with MiniLM's tokenizer: its position ids start after the
    padding id, not at 0 (RoBERTa's convention; nli-roberta-base-v2 is RCL's model)."""
    from transformers import RobertaConfig, RobertaModel

    torch.manual_seed(0)
    tokenizer = load_tokenizer("minilm")
    config = RobertaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=32,
        max_position_embeddings=64,
        pad_token_id=tokenizer.pad_token_id,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    RobertaModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


CASES = [(m, p, k) for m in ("bert", "roberta") for p in ("avg", "cls", "avg_first_last") for k in KERNELS]


@pytest.fixture(scope="module", params=CASES, ids=lambda param: "-".join(param))
def encoders(request, tmp_path_factory) -> tuple[TransformerEncoder, TransformerEncoder]:
    """A padded encoder and a packed one with the same weights: ``sdpa_packed`` as configured, or the
    packing of ``flash_attention_2`` with the reference kernel in flash-attn's place."""
    model, pooling, kernel = request.param
    tmp = tmp_path_factory.mktemp(f"tiny-{model}-packing")
    folder = save_tiny_bert(tmp, dropout=0.0) if model == "bert" else save_tiny_roberta(tmp)
    padded = TransformerEncoder(ModelConfig(name=folder, pooling=pooling, attention="sdpa"))
    attention = "sdpa_packed" if kernel == "sdpa_packed" else "sdpa"
    packed = TransformerEncoder(ModelConfig(name=folder, pooling=pooling, attention=attention))
    packed.load_state_dict(padded.state_dict())
    if kernel == "flash_reference":
        packed.backbone.set_attn_implementation("clsr_varlen_reference")
        packed.packed = packed.pass_longest = True  # what model.attention: flash_attention_2 sets
        packed.first_position = first_position(packed.backbone.config, "flash_attention_2", packed.cfg.name)
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


def test_packing_refuses_models_whose_positions_it_does_not_know():
    name = "all-mpnet-base-v2"
    with pytest.raises(
        ValueError, match="packs sentences for bert, roberta, xlm-roberta encoders; .* 'mpnet'"
    ):
        first_position(SimpleNamespace(model_type="mpnet", pad_token_id=1), "sdpa_packed", name)
    assert first_position(SimpleNamespace(model_type="roberta", pad_token_id=1), "sdpa_packed", name) == 2
    assert first_position(SimpleNamespace(model_type="bert", pad_token_id=0), "sdpa_packed", name) == 0


@pytest.mark.parametrize(
    ("model_type", "on_gpu", "chosen"),
    [("bert", False, "sdpa_packed"), ("roberta", False, "sdpa_packed"), ("mpnet", False, None),
     ("bert", True, None)],
)  # fmt: skip
def test_auto_attention_packs_on_a_cpu_for_the_encoders_packing_knows(model_type, on_gpu, chosen):
    assert choose_attention("auto", model_type, on_gpu) == chosen
    assert choose_attention("sdpa", model_type, on_gpu) == "sdpa"  # what the user set stays


def test_auto_attention_stays_padded_with_drophead_or_compile(tmp_path: Path):
    from clsr.config.trial import TrialConfig

    assert ModelConfig(name="minilm").attention == "auto"
    assert ModelConfig(name="minilm", drophead=0.1).attention is None
    trial = {"model": {"name": "minilm"}, "method": {"name": "simcse_unsup"}, "trainer": {"compile": True}}
    assert TrialConfig.model_validate(trial).model.attention is None
    encoder = TransformerEncoder(ModelConfig(name=save_tiny_bert(tmp_path)))  # the default, on this CPU
    assert encoder.attention == "sdpa_packed" and encoder.packed


def test_only_flash_attention_2_is_given_the_longest_sentence(tmp_path: Path):
    """The longest sentence costs a host sync per forward pass: only FlashAttention's kernel takes it."""
    packed = TransformerEncoder(ModelConfig(name=save_tiny_bert(tmp_path), attention="sdpa_packed"))
    assert not packed.pass_longest
    seen = {}
    forward = packed.backbone.forward
    packed.backbone.forward = lambda **kwargs: seen.update(kwargs) or forward(**kwargs)
    inputs = batch(packed)
    with torch.no_grad():
        packed.eval()(inputs["input_ids"], inputs["attention_mask"])
    assert "cu_seq_lens_q" in seen and "max_length_q" not in seen and "max_length_k" not in seen


def test_sdpa_packed_plans_buckets_of_sentences_by_length():
    from clsr.encoders.packing import attention_plan

    cu = torch.tensor([0, 3, 4, 6], dtype=torch.int32)  # lengths 3, 1, 2
    plan = attention_plan(cu, buckets=2)
    assert plan.buckets == [(2, 3), (1, 1)]  # longest first: sentences 0 and 2 padded to 3, then 1
    assert plan.gather.tolist() == [0, 1, 2, 4, 5, 4, 3]  # padding points at the sentence's first token
    assert [m.tolist() for m in plan.masks] == [[[True, True, True], [True, True, False]], [[True]]]
    assert plan.scatter.tolist() == [0, 1, 2, 6, 3, 4]  # packed token -> its slot in the gathered rows


def test_sdpa_packed_keeps_each_sentence_to_itself_across_buckets():
    from clsr.encoders.packing import ATTENTION_BUCKETS, sdpa_packed

    generator = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 20, (10 * ATTENTION_BUCKETS + 3,), generator=generator)  # 11 a bucket
    cu = torch.nn.functional.pad(lengths.cumsum(0), (1, 0)).to(torch.int32)
    tokens = int(cu[-1])
    q, k, v = (torch.randn(1, 2, tokens, 4, generator=generator, requires_grad=True) for _ in range(3))
    out, _ = sdpa_packed(None, q, k, v, None, cu_seq_lens_q=cu)  # sizes its buckets itself
    longest = {"max_length_q": int(lengths.max()), "max_length_k": int(lengths.max())}
    expected, _ = varlen_reference(
        SimpleNamespace(is_causal=False), q, k, v, None, cu_seq_lens_q=cu, **longest
    )
    torch.testing.assert_close(out, expected)
    weights = torch.randn(out.shape, generator=generator)
    got = torch.autograd.grad((out * weights).sum(), (q, k, v))
    want = torch.autograd.grad((expected * weights).sum(), (q, k, v))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a CUDA GPU")
def test_the_bench_refuses_flash_attention_2_on_a_cpu_in_one_line(capsys):
    from clsr.cli import main

    argv = ["bench", "train", "--batch", "4", "--length", "16", "--steps", "1", "--warmup", "0"]
    assert main([*argv, "--attention", "flash_attention_2"]) == 2
    err = capsys.readouterr().err
    assert (
        err.startswith("error: model.attention flash_attention_2 needs a CUDA GPU") and "Traceback" not in err
    )


def test_packing_refuses_compile():
    from clsr.config.trial import TrialConfig

    trial = {"model": {"name": "minilm", "attention": "sdpa_packed"}, "method": {"name": "simcse_unsup"}}
    with pytest.raises(
        ValueError, match="trainer.compile: true does not combine with model.attention sdpa_packed"
    ):
        TrialConfig.model_validate({**trial, "trainer": {"compile": True}})


def test_sdpa_packed_plans_once_per_forward_pass_and_each_pass_holds_its_own(tmp_path: Path, monkeypatch):
    """The plan is built by ``encode_packed`` and passed to every layer: no plan outlives its forward
    pass or is shared between encoders (it once sat in a module global)."""
    from clsr.encoders import packing, transformer

    built, used = [], []
    monkeypatch.setattr(
        transformer, "attention_plan", lambda cu: built.append(packing.attention_plan(cu)) or built[-1]
    )
    kernel = packing.sdpa_packed

    def spy(*args, attention_plan_=None, **kwargs):
        used.append(attention_plan_)
        return kernel(*args, attention_plan_=attention_plan_, **kwargs)

    monkeypatch.setattr(packing, "sdpa_packed", spy)
    packing.register_sdpa_packed()
    try:
        first = TransformerEncoder(ModelConfig(name=save_tiny_bert(tmp_path), attention="sdpa_packed"))
        second = TransformerEncoder(ModelConfig(name=save_tiny_bert(tmp_path), attention="sdpa_packed"))
        inputs = batch(first)
        with torch.no_grad():
            first.eval()(inputs["input_ids"], inputs["attention_mask"])
            second.eval()(inputs["input_ids"], inputs["attention_mask"])
    finally:
        monkeypatch.undo()
        packing.register_sdpa_packed()
    layers = first.backbone.config.num_hidden_layers
    assert len(built) == 2 and built[0] is not built[1]
    assert used == [built[0]] * layers + [built[1]] * layers
