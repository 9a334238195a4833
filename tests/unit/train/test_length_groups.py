"""Length-grouped encoding (``trainer.length_group_size``): the same embeddings and gradients as one
forward pass padded to the batch's longest sentence, with less padding."""

from __future__ import annotations

import pytest
import torch

from clsr.config.model import ModelConfig
from clsr.config.trial import AUTO_LENGTH_GROUP, TrainerConfig, TrialConfig
from clsr.data.batching import TextViewBatcher
from clsr.encoders.transformer import TransformerEncoder, encode_in_length_groups, load_tokenizer
from tests.support.models import save_tiny_bert

TEXT = "a man is playing a guitar on the stage while the crowd sings along loudly tonight"
WORDS = TEXT.split(" ")
# 15 rows × 2 views of 1 to 15 words: 30 sentences of many lengths
ROWS = [{"a": " ".join(WORDS[: 1 + i]), "b": " ".join(WORDS[i:])} for i in range(15)]


@pytest.fixture(scope="module")
def encoder(tmp_path_factory) -> TransformerEncoder:
    folder = save_tiny_bert(tmp_path_factory.mktemp("tiny-bert-groups"), dropout=0.0)
    return TransformerEncoder(ModelConfig(name=folder, pooling="avg"))


def batch_of(encoder: TransformerEncoder, group: int | None) -> dict:
    tokenizer = load_tokenizer(encoder.cfg.name)
    return TextViewBatcher(ROWS, ("a", "b"), tokenizer, 32, length_group_size=group).collate(range(len(ROWS)))


def test_collate_names_the_group_size_only_when_set(encoder):
    assert batch_of(encoder, 4)["length_group_size"] == 4
    assert "length_group_size" not in batch_of(encoder, None)


def test_groups_cut_each_forward_to_its_longest_sentence():
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0], [1, 1, 1, 1], [1, 1, 0, 0]])
    ids = torch.arange(16).view(4, 4)
    seen = []

    def encode(input_ids, attention_mask):
        seen.append(tuple(input_ids.shape))
        return input_ids[:, :1].float()  # the first token id stands for the row

    out = encode_in_length_groups(encode, ids, mask, group_size=2)
    assert seen == [(2, 2), (2, 4)]  # rows of length 1, 2 then 3, 4
    assert out.flatten().tolist() == [0.0, 4.0, 8.0, 12.0]  # back in input order


def test_grouped_embeddings_equal_one_padded_pass(encoder):
    encoder.eval()
    plain, grouped = batch_of(encoder, None), batch_of(encoder, 4)
    with torch.no_grad():
        expected = encoder(plain["input_ids"], plain["attention_mask"])
        got = encoder(grouped["input_ids"], grouped["attention_mask"], length_group_size=4)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_grouped_gradients_equal_one_padded_pass(encoder):
    encoder.train()  # dropout is 0: training mode is deterministic
    batch = batch_of(encoder, 4)
    grads = []
    for group in (None, 4):
        encoder.zero_grad()
        pooled = encoder(batch["input_ids"], batch["attention_mask"], length_group_size=group)
        (pooled.sin().sum()).backward()
        grads.append({n: p.grad.clone() for n, p in encoder.named_parameters() if p.grad is not None})
    assert grads[0].keys() == grads[1].keys() and grads[0]
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-5, rtol=1e-4, msg=name)


def test_length_group_size_setting(monkeypatch):
    assert TrainerConfig(length_group_size=None).resolved_length_group_size() is None
    assert TrainerConfig(length_group_size=8).resolved_length_group_size() == 8
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert TrainerConfig().resolved_length_group_size() == AUTO_LENGTH_GROUP[device]
    # auto: groups of 32 on a CPU, one pass on a GPU (groups were 2-4x slower a step on an H100)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert TrainerConfig().resolved_length_group_size() is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert TrainerConfig().resolved_length_group_size() == 32
    with pytest.raises(ValueError, match="length_group_size is 'auto', null or a positive integer"):
        TrainerConfig(length_group_size=0)


def test_methods_batch_with_the_trainer_group_size(encoder):
    from clsr.methods import build_method

    trial = TrialConfig(
        model={"name": encoder.cfg.name, "pooling": "avg"},
        data={"train": "nli_triplets"},
        trainer={"length_group_size": 6},
        method={"name": "simcse_sup"},
    )
    rows = [{"anchor": r["a"], "positive": r["b"], "negative": r["a"]} for r in ROWS]
    method = build_method(trial)
    batcher = method.prepare_rows(rows, load_tokenizer(encoder.cfg.name), trial)
    batch = batcher.collate(range(len(rows)))
    assert batch["length_group_size"] == 6
    assert method.encode_rows(encoder, batch).shape == (len(rows), 3, encoder.dim)


def test_compiled_training_forward_matches_eager_and_keeps_the_state_dict(tmp_path):
    """``trainer.compile``: widths padded to the next bucket, the same pooled output and gradients as eager,
    evaluation on the plain backbone, and state-dict keys without ``_orig_mod``."""
    folder = save_tiny_bert(tmp_path / "tiny-bert", dropout=0.0)
    eager = TransformerEncoder(ModelConfig(name=folder, pooling="avg"))
    compiled = TransformerEncoder(ModelConfig(name=folder, pooling="avg"))
    compiled.compile_for_training(width_multiple=8)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    batch = batch_of(eager, None)  # widths up to 16 tokens: one bucket of 16
    ids, mask = batch["input_ids"][:, :13], batch["attention_mask"][:, :13]
    outputs = []
    for model in (eager, compiled):
        model.train()
        pooled = model(ids, mask)
        pooled.sin().sum().backward()
        outputs.append((pooled.detach(), model.backbone.embeddings.word_embeddings.weight.grad))
    torch.testing.assert_close(outputs[1][0], outputs[0][0], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(outputs[1][1], outputs[0][1], atol=1e-5, rtol=1e-4)
    compiled.eval()
    with torch.no_grad():  # eval mode: the plain backbone at any width
        torch.testing.assert_close(compiled(ids, mask), eager.eval()(ids, mask), atol=1e-5, rtol=1e-4)
