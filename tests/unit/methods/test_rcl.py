"""RCL (methods.md §6): Eq. 1-3 golden values on hand-made batches, the stored-embedding input, the two
encoder regularisers of Table 1 (attention dropout, DropHead), early stopping, and a two-stage local run."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from clsr.config.model import ModelConfig
from clsr.encoders.transformer import DropHead, TransformerEncoder
from clsr.methods.mnrl import mnrl_loss
from clsr.methods.rcl import (
    RCL,
    RCLConfig,
    entropy_model_loss,
    entropy_term,
    rcl_base_loss,
    rcl_final_loss,
    regulator_loss,
)
from clsr.train.loop_state import LoopState
from tests.support.models import save_tiny_bert

R = 1 / math.sqrt(2)
E = math.exp

# Two tuples in 2-d, chosen so that every cosine is 1, 1/√2, 0, -1/√2 or -1.
Q = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
IND = torch.tensor([[1.0, 0.0], [1.0, 1.0]])  # cos(q1, ·) = 1, r;  cos(q2, ·) = 0, r
NEG = torch.tensor([[0.0, 1.0], [-1.0, 0.0]])  # cos(q1, ·) = 0, -1; cos(q2, ·) = 1, 0


def test_eq1_golden_with_and_without_hard_negatives():
    with_neg = (
        -math.log(E(1) / (E(1) + E(R) + E(0) + E(-1))) - math.log(E(R) / (E(0) + E(R) + E(1) + E(0)))
    ) / 2
    without = (-math.log(E(1) / (E(1) + E(R))) - math.log(E(R) / (E(0) + E(R)))) / 2
    assert rcl_base_loss(Q, IND, NEG, scale=1.0).item() == pytest.approx(with_neg, abs=1e-6)
    assert rcl_base_loss(Q, IND, None, scale=1.0).item() == pytest.approx(without, abs=1e-6)
    # Eq. 1 with a hard negative is MNRL
    columns = torch.randn(6, 3, 5)
    expected = mnrl_loss(columns, 20.0)
    assert rcl_base_loss(columns[:, 0], columns[:, 1], columns[:, 2]).item() == pytest.approx(expected.item())


def test_entropy_term_sums_off_diagonal_with_the_full_softmax():
    # row 1: p = softmax(1, r), only p_12 enters; row 2: p = softmax(0, r), only p_21 enters
    p12 = E(R) / (E(1) + E(R))
    p21 = E(0) / (E(0) + E(R))
    h = (-p12 * math.log(p12) - p21 * math.log(p21)) / 2
    assert entropy_term(Q, IND, scale=1.0).item() == pytest.approx(h, abs=1e-6)
    assert entropy_term(Q, IND, scale=1.0).item() > 0
    # hard negatives change Eq. 1 but not the entropy (p_ij is normalised over the indices)
    base = rcl_base_loss(Q, IND, NEG, scale=1.0).item()
    for phi in (0.5, -0.5):  # J = CE - φ Σ_{j≠i} p log p = CE + φ H
        got = entropy_model_loss(Q, IND, NEG, phi, scale=1.0).item()
        assert got == pytest.approx(base + phi * h, abs=1e-6)
    assert entropy_model_loss(Q, IND, NEG, 0.0, scale=1.0).item() == pytest.approx(base, abs=1e-6)


def test_regulators_golden_and_constant():
    q_reg = torch.tensor(
        [
            [[1.0, 0.0], [0.0, 1.0]],  # model 1 stores q itself: cos(q_i, Au_k) = 1[i=k]
            [[0.0, 1.0], [1.0, 0.0]],  # model 2 stores them swapped
        ],
        requires_grad=True,
    )
    ind_reg = torch.tensor(
        [
            [[1.0, 1.0], [1.0, 0.0]],  # cos(ind1, ·) = r, 1; cos(ind2, ·) = 1, r
            [[2.0, 0.0], [0.0, -3.0]],  # cos(ind1, ·) = 1, 0; cos(ind2, ·) = r, -r
        ],
        requires_grad=True,
    )
    q_terms = [
        (-math.log(E(1) / (E(1) + E(0))) - math.log(E(1) / (E(0) + E(1)))) / 2,
        (-math.log(E(0) / (E(0) + E(1))) - math.log(E(0) / (E(1) + E(0)))) / 2,
    ]
    ind_terms = [
        (-math.log(E(R) / (E(R) + E(1))) - math.log(E(R) / (E(1) + E(R)))) / 2,
        (-math.log(E(1) / (E(1) + E(0))) - math.log(E(-R) / (E(R) + E(-R)))) / 2,
    ]
    q, ind = Q.clone().requires_grad_(), IND.clone().requires_grad_()
    reg = regulator_loss(q, ind, q_reg, ind_reg, scale=1.0)
    assert reg.item() == pytest.approx(sum(q_terms) + sum(ind_terms), abs=1e-6)
    final = rcl_final_loss(q, ind, NEG, q_reg, ind_reg, scale=1.0)
    assert final.item() == pytest.approx(rcl_base_loss(Q, IND, NEG, 1.0).item() + reg.item(), abs=1e-6)
    final.backward()
    assert q.grad is not None and ind.grad is not None
    assert q_reg.grad is None and ind_reg.grad is None  # the entropy models' embeddings are constants
    with pytest.raises(ValueError, match="models"):
        regulator_loss(Q, IND, q_reg[0], ind_reg[0])


def test_rcl_config_needs_a_checkpoint_per_phi():
    with pytest.raises(ValueError, match=r"no checkpoint for φ = \[0.02\]"):
        RCLConfig(phis=[0.01, 0.02], entropy_models={0.01: "a"})
    assert RCLConfig(phis=[0.01], entropy_models={"0.01": "a", 0.05: "b"}).entropy_models[0.01] == "a"


class CountingEncoder(torch.nn.Module):
    """Stands in for an entropy model: records every sequence it encodes; embedding = f(ids, model)."""

    def __init__(self, tag: float):
        super().__init__()
        self.tag = tag
        self.anchor = torch.nn.Parameter(torch.zeros(()))
        self.seen: list[tuple[int, ...]] = []

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        for ids, mask in zip(input_ids.tolist(), attention_mask.tolist(), strict=True):
            self.seen.append(tuple(i for i, m in zip(ids, mask, strict=True) if m))
        ids = (input_ids * attention_mask).float()
        return torch.stack(
            [ids.sum(1), attention_mask.sum(1).float(), torch.full_like(ids[:, 0], self.tag)], 1
        )


def test_prepare_shared_embeds_each_training_text_once_per_entropy_model(data_dir, monkeypatch):
    from clsr.config.trial import TrialConfig
    from clsr.data.training import training_rows
    from clsr.encoders.transformer import load_tokenizer
    from clsr.methods import build_method

    trial = TrialConfig.model_validate(
        {
            "model": {"name": "minilm", "pooling": "avg", "max_seq_length": 16},
            "data": {"train": "nli_triplets", "max_rows": 24},
            "method": {
                "name": "rcl",
                "phis": [0.02],
                "entropy_models": {0.01: "m1", 0.02: "m2"},
                "store_dtype": "float32",  # the fake's token-id sums are exact in float32 only
            },
        }
    )
    method = build_method(trial)
    encoders: dict[str, CountingEncoder] = {}
    monkeypatch.setattr(
        RCL,
        "load_entropy_model",
        lambda self, path, cfg: encoders.setdefault(path, CountingEncoder(len(encoders))),
    )
    shared = method.prepare_shared(trial)

    rows = training_rows(trial)
    tokenizer = load_tokenizer("minilm")
    texts = list(dict.fromkeys([r["anchor"] for r in rows] + [r["positive"] for r in rows]))
    expected = Counter(tuple(x) for x in tokenizer(texts, truncation=True, max_length=16)["input_ids"])
    assert sorted(encoders) == ["m1", "m2"] and shared.phis == (0.01, 0.02)
    for encoder in encoders.values():
        assert Counter(encoder.seen) == expected  # every distinct query/index text, once per model
    assert shared.vectors.shape == (2, len(texts), 3)

    # the batches carry their row indices; the loss picks those rows' stored embeddings (φ = 0.02 only)
    batcher = method.prepare_rows(rows, method.text_pipeline(trial, shared), trial)
    batch = batcher.collate([5, 2, 7])
    assert batch["rows"].tolist() == [5, 2, 7] and batch["input_ids"].size(0) == 9
    q_reg, ind_reg = method.stored(batch["rows"], torch.device("cpu"))
    assert q_reg.shape == ind_reg.shape == (1, 3, 3)
    for b, r in enumerate([5, 2, 7]):
        for column, stored in (("anchor", q_reg), ("positive", ind_reg)):
            ids = tokenizer(rows[r][column], truncation=True, max_length=16)["input_ids"]
            assert stored[0, b].tolist() == pytest.approx([sum(ids), len(ids), 1.0])  # model 2 = φ 0.02
    with pytest.raises(RuntimeError, match="other training rows"):
        method.prepare_rows(rows[1:], tokenizer, trial)


# --- encoder options: attention dropout and DropHead (Table 1) ------------------------------------------


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> str:
    """The shared tiny BERT without dropout."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"), dropout=0.0)


def test_attention_dropout_reaches_the_backbone(tiny_bert):
    encoder = TransformerEncoder(ModelConfig(name=tiny_bert, dropout=0.2, attention_dropout=0.3))
    config = encoder.backbone.config
    assert config.attention_probs_dropout_prob == 0.3 and config.hidden_dropout_prob == 0.2
    assert encoder.backbone.encoder.layer[0].attention.self.dropout.p == 0.3
    with pytest.raises(ValueError, match=r"model.attention_dropout is a probability in \[0, 1\)"):
        ModelConfig(attention_dropout=1.0)
    with pytest.raises(ValueError, match=r"model.drophead is a probability"):
        ModelConfig(drophead=-0.1)


def test_drophead_drops_whole_heads_in_training_only(tiny_bert):
    ids = torch.randint(1, 64, (64, 7))
    mask = torch.ones_like(ids)
    plain = TransformerEncoder(ModelConfig(name=tiny_bert, pooling="avg"))
    dropped = TransformerEncoder(ModelConfig(name=tiny_bert, pooling="avg", drophead=0.5))
    dropped.load_state_dict(plain.state_dict())
    captured: list[torch.Tensor] = []
    first = dropped.backbone.encoder.layer[0].attention.self  # runs after the DropHead hook
    first.register_forward_hook(lambda module, args, out: captured.append(out[0].detach()))

    plain.eval(), dropped.eval()
    with torch.no_grad():
        assert torch.equal(plain(ids, mask), dropped(ids, mask))  # off at eval
        reference = captured.pop().unflatten(-1, (4, -1))
        plain.train(), dropped.train()  # no other dropout in this config: plain is deterministic
        assert torch.allclose(plain(ids, mask), plain.eval()(ids, mask))
        assert not torch.allclose(dropped(ids, mask), plain(ids, mask))
    heads = captured.pop().unflatten(-1, (4, -1))  # (batch, seq, heads, head_dim)
    zero = (heads == 0).all(dim=(1, 3))  # whole heads of a sequence dropped, all positions at once
    kept = 4 - zero.sum(1)
    assert zero.any() and (kept >= 1).all()
    scale = (4 / kept)[:, None, None, None]
    expect = torch.where(zero[:, None, :, None], torch.zeros_like(reference), reference * scale)
    assert torch.allclose(heads, expect, atol=1e-5)


def test_drophead_keeps_the_expected_scale():
    torch.manual_seed(0)
    drop = DropHead(p=0.3, heads=4)
    scales = drop.mask((200_000,), torch.device("cpu"), torch.float32)
    assert torch.allclose(scales.sum(1), torch.full((200_000,), 4.0))  # kept heads rescaled by heads/kept
    assert torch.allclose(scales.mean(0), torch.ones(4), atol=0.01)  # E[scale] = 1 for every head
    assert (scales == 0).float().mean().item() == pytest.approx(0.3 - 0.3**4, abs=0.01)  # all-dropped: keep


# --- early stopping and the two stages ------------------------------------------------------------------


def test_loss_stalled_counts_steps_without_a_new_lowest_loss():
    state = LoopState()
    flags = [state.loss_stalled(loss, 3) for loss in (5.0, 4.0, 4.5, 4.0, 3.0, 3.5, 3.2, 3.1)]
    assert flags == [False, False, False, False, False, False, False, True]
    assert not any(LoopState(lowest_loss=0).loss_stalled(1.0, None) for _ in range(5))


# SICK-R dev picks the best weights (as STS-B dev does in the study); STS-B test is what the trial scores
STAGE_EVAL = {"dev_tasks": ["sickr"], "select_on": "sickr", "tasks": ["stsb"], "alignment_uniformity": False}


def _stage_trial(model: str, method: dict, **trainer):
    from clsr.config.trial import TrialConfig

    return TrialConfig.model_validate(
        {
            "model": {"name": model, "pooling": "avg", "max_seq_length": 16},
            "data": {"train": "nli_triplets", "max_rows": 32},
            "trainer": {"batch_size": 8, "lr": 1e-4, "eval_steps": 1, **trainer},
            "method": method,
            "eval": STAGE_EVAL | {"log_model": False},
        }
    )


def _stage(model: str, method: dict, session, **trainer):
    from clsr.train.loop import fit

    return fit(_stage_trial(model, method, **trainer), session)


def test_entropy_models_then_rcl_train_locally(data_dir, tmp_path, tiny_bert):
    """The two stages through the real trainer, on the tiny BERT (same code path as MiniLM, 1000× cheaper)."""
    from clsr.train.session import LocalSession

    checkpoints = {}
    for phi in (0.01, 0.02):
        session = LocalSession(tmp_path / str(phi))
        method = {"name": "rcl_entropy", "phi": phi, "early_stop_patience": 1}
        _stage(tiny_bert, method, session, max_steps=4)
        losses = [r["loss_avg"] for r in session.reports[:-1]]  # the last report is the final one
        # patience 1: stop at the first step whose loss is not a new lowest (or run to max_steps)
        stop = next((i + 1 for i in range(1, len(losses)) if losses[i] >= min(losses[:i])), 4)
        assert len(losses) == stop and session.reports[-2].get("stopped_early", 0) == (stop < 4)
        checkpoints[phi] = str(session.latest)
        _assert_stage_2_loads_the_scored_weights(tiny_bert, phi, session, data_dir)

    session = LocalSession(tmp_path / "rcl")
    method = {"name": "rcl", "phis": [0.01, 0.02], "entropy_models": checkpoints}
    final = _stage(tiny_bert, method, session, max_steps=2)
    assert final["finished"] == 1 and [r["step"] for r in session.reports] == [1, 2, 2]
    assert all(math.isfinite(r["loss_avg"]) for r in session.reports[:2])


def _assert_stage_2_loads_the_scored_weights(model: str, phi: float, session, data_dir) -> None:
    """The weights stage 2 embeds with (entropy_weights: best, the default) are the ones the entropy
    model's trial scored for Table 5: its best-dev weights, scored again here to the same STS-B value."""
    from clsr.encoders.checkpoint_files import load_tensors
    from clsr.eval.sts import evaluate_sts
    from clsr.methods import build_method

    final = session.reports[-1]
    assert RCLConfig.model_fields["entropy_weights"].default == "best" and final["best_step"] >= 1
    trial = _stage_trial(model, {"name": "rcl", "phis": [phi], "entropy_models": {phi: str(session.latest)}})
    method = build_method(trial)
    loaded = method.load_entropy_model(str(session.latest), trial.model)
    best = load_tensors(session.latest / "best_model.pt")
    assert all(torch.equal(value, best[name]) for name, value in loaded.state_dict().items())
    embed = method.make_embedder(loaded, method.text_pipeline(trial, None), 128)
    rescored = evaluate_sts(embed, ["stsb"], "test", data_dir)["stsb"].all
    assert rescored == pytest.approx(final["test_stsb"], abs=1e-4)
