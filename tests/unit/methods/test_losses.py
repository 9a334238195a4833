"""Golden values: each loss on a tiny hand-made batch equals an independent NumPy computation."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from clsr.config.trial import TrialConfig
from clsr.data.catalog import load_rows
from clsr.methods.mnrl import MNRL, MNRLConfig, mnrl_loss
from clsr.methods.simcse_sup import SimCSESup, SimCSESupConfig, simcse_sup_loss
from clsr.methods.simcse_unsup import SimCSEUnsup, SimCSEUnsupConfig, simcse_unsup_loss

RNG = np.random.default_rng(0)


def np_cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return a @ b.T


def np_cross_entropy(logits: np.ndarray) -> float:
    """Mean over rows of -log softmax(row)[i], computed with an explicit log-sum-exp."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-np.mean([log_softmax[i, i] for i in range(len(logits))]))


def test_simcse_unsup_matches_numpy_and_a_hand_value():
    views = RNG.normal(size=(4, 2, 8))
    expected = np_cross_entropy(np_cos(views[:, 0], views[:, 1]) / 0.05)
    got = simcse_unsup_loss(torch.tensor(views), temperature=0.05).item()
    assert got == pytest.approx(expected, rel=1e-10)

    # Two orthogonal sentences whose views are identical: sim(h_i, h_i+) = 1, sim(h_i, h_j+) = 0.
    eye = torch.eye(2, dtype=torch.float64)
    hand = simcse_unsup_loss(torch.stack([eye, eye], dim=1), temperature=0.5).item()
    assert hand == pytest.approx(np.log(1 + np.exp(-2.0)), rel=1e-12)  # -log(e^2 / (e^2 + e^0))


@pytest.mark.parametrize("alpha", [1.0, 0.5, 2.0])
def test_simcse_sup_with_hard_negatives_and_weight(alpha):
    views = RNG.normal(size=(5, 3, 6))
    tau = 0.05
    pos = np_cos(views[:, 0], views[:, 1]) / tau
    neg = np_cos(views[:, 0], views[:, 2]) / tau + np.log(alpha) * np.eye(5)
    expected = np_cross_entropy(np.concatenate([pos, neg], axis=1))
    got = simcse_sup_loss(torch.tensor(views), tau, alpha=alpha).item()
    assert got == pytest.approx(expected, rel=1e-10)


def test_simcse_sup_without_hard_negatives_is_pairs_only():
    views = RNG.normal(size=(3, 2, 4))
    expected = np_cross_entropy(np_cos(views[:, 0], views[:, 1]) / 0.1)
    assert simcse_sup_loss(torch.tensor(views), 0.1).item() == pytest.approx(expected, rel=1e-10)


def test_mnrl_candidates_are_all_positives_then_all_negatives():
    columns = RNG.normal(size=(4, 3, 5))  # anchor, positive, negative
    candidates = np.concatenate([columns[:, 1], columns[:, 2]])
    expected = np_cross_entropy(20.0 * np_cos(columns[:, 0], candidates))
    assert mnrl_loss(torch.tensor(columns), scale=20.0).item() == pytest.approx(expected, rel=1e-10)


def test_mnrl_with_scale_20_equals_simcse_sup_with_tau_005():
    views = torch.tensor(RNG.normal(size=(6, 3, 7)))
    assert mnrl_loss(views, 20.0).item() == pytest.approx(simcse_sup_loss(views, 0.05).item(), rel=1e-10)


def test_losses_backpropagate_to_every_view():
    views = torch.tensor(RNG.normal(size=(3, 3, 4)), requires_grad=True)
    simcse_sup_loss(views, 0.05).backward()
    assert torch.all(views.grad.abs().sum(dim=-1) > 0)


# --- SimCSE Table D.1: dot product ------------------------------------------------------------------


def test_simcse_sup_dot_product_matches_numpy_and_a_hand_value():
    views = RNG.normal(size=(4, 3, 5))
    a = views[:, 0]
    expected = np_cross_entropy(np.concatenate([a @ views[:, 1].T, a @ views[:, 2].T], axis=1))
    got = simcse_sup_loss(torch.tensor(views), 1.0, similarity="dot").item()
    assert got == pytest.approx(expected, rel=1e-10)

    # One row, no normalisation: logits u·p = 2·1 = 2 and u·n = 2·3 = 6 (the cosine would give 1 and 1).
    row = torch.tensor([[[2.0, 0.0], [1.0, 0.0], [3.0, 0.0]]], dtype=torch.float64)
    hand = simcse_sup_loss(row, 1.0, similarity="dot").item()
    assert hand == pytest.approx(np.log(1 + np.exp(4.0)), rel=1e-12)  # -log(e^2 / (e^2 + e^6))


# --- SimCSE Table 7: α and the neutral hypothesis as a second hard negative -------------------------


@pytest.mark.parametrize("alpha", [0.5, 1.0, 2.0])
def test_simcse_sup_contradiction_and_neutral_each_get_alpha_on_their_own_row(alpha):
    views = RNG.normal(size=(4, 4, 6))  # anchor, entailment, contradiction, neutral
    tau = 0.05
    blocks = [np_cos(views[:, 0], views[:, 1]) / tau]
    blocks += [np_cos(views[:, 0], views[:, k]) / tau + np.log(alpha) * np.eye(4) for k in (2, 3)]
    expected = np_cross_entropy(np.concatenate(blocks, axis=1))
    got = simcse_sup_loss(torch.tensor(views), tau, alpha=alpha).item()
    assert got == pytest.approx(expected, rel=1e-10)


def test_hard_negative_policy_picks_the_columns():
    def views(**cfg):
        return SimCSESup(SimCSESupConfig(**cfg)).views()

    assert views() == ("anchor", "positive", "negative")
    assert views(hard_negative="contradiction+neutral") == ("anchor", "positive", "negative", "neutral")
    assert views(hard_negative="neutral") == ("anchor", "positive", "neutral")
    assert views(hard_negatives=False, hard_negative="neutral") == ("anchor", "positive")


def test_old_hard_negative_weight_name_is_refused_with_the_reason():
    with pytest.raises(
        ValueError, match="renamed to method.hard_negative_alpha; it holds α, not SimCSE's log α"
    ):
        SimCSESupConfig(hard_negative_weight=0.0)


def _senteval_snli(root, pairs):
    folder = root / "nli/snli_senteval_devtest"
    folder.mkdir(parents=True)
    for i, name in enumerate(("s1", "s2", "labels")):
        (folder / f"{name}.dev").write_text("".join(p[i] + "\n" for p in pairs), encoding="utf-8")


def test_neutral_rows_pick_the_neutral_hypothesis(tmp_path):
    _senteval_snli(
        tmp_path,
        [
            ("a man sleeps .", "a person rests .", "entailment"),
            ("a man sleeps .", "a man is awake .", "contradiction"),
            ("a man sleeps .", "a man dreams of cats .", "neutral"),
            ("two dogs run .", "animals move .", "entailment"),
            ("two dogs run .", "no dog moves .", "contradiction"),  # no neutral: not a Table 7 row
        ],
    )
    assert load_rows("nli_triplets_neutral", tmp_path) == [
        {
            "anchor": "a man sleeps .",
            "positive": "a person rests .",
            "negative": "a man is awake .",
            "neutral": "a man dreams of cats .",
        }
    ]
    assert len(load_rows("nli_triplets", tmp_path)) == 2  # the plain triplets keep both premises


# --- SimCSE Table 3: "Fixed 0.1" ---------------------------------------------------------------------


class _DropoutBag(torch.nn.Module):
    """A bag of embeddings followed by dropout: enough to see what a dropout mask does to the views."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(20, 16)
        self.drop = torch.nn.Dropout(0.1)

    def forward(self, input_ids, attention_mask):
        return self.drop(self.embed(input_ids).mean(dim=1))


def _encode(method, ids):
    views = len(method.views())
    batch = {
        "input_ids": ids.repeat_interleave(views, dim=0),  # row-major: every view of row 0, then row 1
        "attention_mask": torch.ones(len(ids) * views, ids.size(1), dtype=torch.long),
        "num_rows": len(ids),
    }
    torch.manual_seed(0)
    return method.encode_rows(_DropoutBag().train(), batch)


def test_fixed_mask_gives_identical_positive_pairs_and_the_loss_of_h_plus_equal_h():
    ids = torch.arange(12).view(4, 3)
    fixed = SimCSEUnsup(SimCSEUnsupConfig(same_dropout_mask=True))
    independent = SimCSEUnsup(SimCSEUnsupConfig())
    assert fixed.views() == ("text",) and independent.views() == ("text", "text")
    two = _encode(independent, ids)
    assert not torch.allclose(two[:, 0], two[:, 1])  # two masks: the views differ

    one = _encode(fixed, ids).detach().double()
    assert one.shape == (4, 1, 16)
    # Eq. 4 with h_i^+ = h_i: the positive logit is 1/τ, the negatives cos(h_i, h_j)/τ.
    h = one[:, 0].numpy()
    expected = np_cross_entropy(np_cos(h, h) / 0.05)
    assert np.allclose(np.diag(np_cos(h, h)), 1.0)
    assert fixed.loss_from_embeddings(one).item() == pytest.approx(expected, rel=1e-10)


# --- SimCSE Table 2: two encoders ---------------------------------------------------------------------


@pytest.mark.parametrize("attention", ["eager", "sdpa_packed"])
def test_two_encoders_is_eq4_with_each_view_through_its_own_encoder(tiny_bert, attention):
    from clsr.config.model import ModelConfig
    from clsr.encoders.transformer import TransformerEncoder

    method = SimCSEUnsup(SimCSEUnsupConfig(two_encoders=True))
    model = method.build_model(ModelConfig(name=tiny_bert, pooling="cls", dropout=0.0, attention=attention))
    first_weights = model.backbone.embeddings.word_embeddings.weight
    second_weights = model.second.backbone.embeddings.word_embeddings.weight
    assert first_weights is not second_weights and torch.equal(first_weights, second_weights)  # loaded alike
    generator = torch.Generator().manual_seed(0)
    texts, positives = (torch.randint(5, 90, (3, 6), generator=generator) for _ in range(2))
    mask = torch.ones(3, 6, dtype=torch.long)
    mask[1, 4:] = 0  # a shorter sentence
    batch = {  # row-major: row 0's text, row 0's positive, row 1's text, ...
        "input_ids": torch.stack([texts, positives], dim=1).flatten(0, 1),
        "attention_mask": torch.stack([mask, mask], dim=1).flatten(0, 1),
        "num_rows": 3,
    }
    model.train()
    embeddings = method.encode_rows(model, batch)
    h = TransformerEncoder.forward(model, texts, mask)  # f_θ1 on the first views
    h_plus = model.second(positives, mask)  # f_θ2 on the second
    assert torch.allclose(embeddings[:, 0], h, atol=1e-6) and torch.allclose(
        embeddings[:, 1], h_plus, atol=1e-6
    )
    loss = method.loss_from_embeddings(embeddings.double())
    a, b = h.detach().double().numpy(), h_plus.detach().double().numpy()
    assert loss.item() == pytest.approx(np_cross_entropy(np_cos(a, b) / 0.05), rel=1e-6)
    loss.backward()
    assert first_weights.grad.abs().sum() > 0 and second_weights.grad.abs().sum() > 0  # both trained
    model.eval()  # evaluation and export: f_θ1 alone
    assert torch.allclose(model(texts, mask), TransformerEncoder.forward(model, texts, mask))
    plain = TransformerEncoder(ModelConfig(name=tiny_bert, pooling="cls", dropout=0.0, attention=attention))
    missing, unexpected = plain.load_state_dict(model.state_dict(), strict=False)  # a later stage's load
    assert missing == [] and unexpected and all(key.startswith("second.") for key in unexpected)
    with pytest.raises(ValueError, match="two_encoders"):
        SimCSEUnsupConfig(two_encoders=True, same_dropout_mask=True)


# --- MNRL with several negative columns ------------------------------------------------------------


def test_mnrl_with_two_negatives_matches_a_hand_computation():
    columns = RNG.normal(size=(3, 4, 5))  # anchor, positive, negative_1, negative_2
    # candidate list as sentence-transformers builds it: all positives, all first, all second negatives
    candidates = np.concatenate([columns[:, 1], columns[:, 2], columns[:, 3]])
    sims = 20.0 * np_cos(columns[:, 0], candidates)
    expected = float(np.mean([np.log(np.exp(sims[i]).sum()) - sims[i, i] for i in range(3)]))
    assert mnrl_loss(torch.tensor(columns), scale=20.0).item() == pytest.approx(expected, rel=1e-10)


def test_mnrl_negative_columns_and_the_data_that_has_them():
    assert MNRL(MNRLConfig(num_negatives=2)).views() == ("anchor", "positive_1", "negative_1", "negative_2")
    assert MNRL(MNRLConfig(num_negatives=1)).views() == ("anchor", "positive", "negative")

    def trial(train, negatives):
        return TrialConfig.model_validate(
            {"method": {"name": "mnrl", "num_negatives": negatives}, "data": {"train": train}}
        )

    assert trial("nli_supmpn", 5).method["num_negatives"] == 5
    with pytest.raises(ValueError, match=r"data.train: 'nli_triplets' lacks columns .*allowed: nli_supmpn"):
        trial("nli_triplets", 2)
    with pytest.raises(ValueError, match=r"lacks columns \['negative_6'\].*none of the catalogue sets"):
        trial("nli_supmpn", 6)


def test_two_encoders_train_through_the_loop_and_are_evaluated_with_the_first(tiny_bert, data_dir, tmp_path):
    """The trainer's loop with Table 2's two encoders: two steps, a dev evaluation, a checkpoint and the
    test scores, all on the first encoder."""
    from clsr.train.loop import fit
    from clsr.train.session import LocalSession

    trial = TrialConfig.model_validate(
        {
            "model": {"name": tiny_bert, "max_seq_length": 16},
            "method": {"name": "simcse_unsup", "two_encoders": True},
            "data": {"train": "wiki1m", "max_rows": 32},
            "trainer": {"batch_size": 8, "max_steps": 2, "eval_steps": 2, "log_every": 1},
            "eval": {"dev_tasks": ["stsb"], "tasks": ["stsb"], "sts_max_pairs": 50},
        }
    )
    session = LocalSession(checkpoint_root=tmp_path)
    final = fit(trial, session)
    assert session.reports[-1]["finished"] == 1 and -100 < final["test_stsb"] < 100
    assert session.latest is not None and any(session.latest.iterdir())  # a checkpoint of both encoders


# --- SimCSE Table 2: next-sentence positives -----------------------------------------------------------


def test_next_sentence_positives_follow_the_text_within_each_document():
    from random import Random

    from clsr.methods.simcse_unsup import next_sentence_rows

    rows = [
        {"text": t, "document": d}
        for t, d in (("a1", "A"), ("a2", "A"), ("a3", "A"), ("b1", "B"), ("b2", "B"))
    ]
    assert [(r["text"], r["positive"]) for r in next_sentence_rows(rows, 1, Random(0))] == [
        ("a1", "a2"), ("a2", "a3"), ("b1", "b2"),  # a3 and b2 end their documents: no positive
    ]  # fmt: skip
    drawn = next_sentence_rows(rows, 3, Random(7))
    rng = Random(7)  # one of the next three of the same document, drawn in row order
    assert [r["positive"] for r in drawn] == [
        rng.choice(["a2", "a3"]),
        rng.choice(["a3"]),
        rng.choice(["b2"]),
    ]
    plain = [{"text": t} for t in ("s1", "s2", "s3")]  # no document column: one document
    assert [r["positive"] for r in next_sentence_rows(plain, 1, Random(0))] == ["s2", "s3"]


def test_next_sentence_trains_on_ordered_text_and_refuses_rows_out_of_order(tiny_bert, data_dir, tmp_path):
    from pydantic import ValidationError

    from clsr.train.loop import fit
    from clsr.train.session import LocalSession

    corpus = tmp_path / "ordered.txt"
    corpus.write_text("".join(f"Sentence number {i} of the story .\n" for i in range(40)))
    doc = {
        "model": {"name": tiny_bert, "max_seq_length": 16},
        "method": {"name": "simcse_unsup", "positive": "next_3_sentences"},
        "data": {"train": str(corpus)},
        "trainer": {"batch_size": 8, "max_steps": 2, "eval_steps": 2, "log_every": 1},
        "eval": {"dev_tasks": ["stsb"], "tasks": [], "sts_max_pairs": 50},
    }
    session = LocalSession(checkpoint_root=tmp_path / "ckpt")
    fit(TrialConfig.model_validate(doc), session)
    assert session.reports[-1]["finished"] == 1
    for data, said in (
        (
            {"train": str(corpus), "max_rows": 10},
            "data.max_rows would leave out sentences between them: unset it",
        ),
        ({"train": str(corpus), "filter": {"text": "x"}}, "data.filter would leave out sentences"),
        (
            {"train": "wiki1m"},
            "must be a corpus in order (wiki_ordered, or a file, folder or hub set of yours), not 'wiki1m'",
        ),
    ):
        with pytest.raises(ValidationError, match=re.escape(said)):
            TrialConfig.model_validate({**doc, "data": data})
    TrialConfig.model_validate({**doc, "data": {"train": "wiki_ordered"}})  # the catalogue's ordered text
