"""SelfCCL: the scoring rule on hand-made vectors, the pacing function, the paced batch order, the loss,
and a short local run that leaves the scored table and Figure 4 in its MLflow run."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from clsr.data.batching import shuffled_batches
from clsr.methods import get_method
from clsr.methods.selfccl import (
    EASY,
    HARD,
    SEMI_HARD,
    SelfCCL,
    SelfCCLConfig,
    TripletScores,
    classify_triplets,
    curriculum_order,
    pacing_size,
    rows_fingerprint,
    triplet_margins,
)
from clsr.methods.simcse_sup import simcse_sup_loss
from clsr.train.config import TrialConfig


# --- phase 1: scoring ------------------------------------------------------------------------------
def test_cosine_distances_on_hand_made_vectors():
    anchor = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 2.0]])
    positive = np.array([[2.0, 0.0], [3.0, 4.0], [0.0, -1.0]])
    negative = np.array([[0.0, 1.0], [-1.0, 0.0], [1.0, 1.0]])
    d_pos, d_neg = triplet_margins(anchor, positive, negative)
    np.testing.assert_allclose(d_pos, [0.0, 0.4, 2.0], atol=1e-12)
    np.testing.assert_allclose(d_neg, [1.0, 2.0, 1 - 1 / np.sqrt(2)], atol=1e-12)


def test_classes_with_ties_going_to_the_harder_class():
    # δ = d_neg − d_pos: 0.5 easy, 0.25 = m (tie → semi-hard), 0.125 semi-hard, 0 (tie → hard), −0.25 hard
    d_pos = np.array([0.25, 0.25, 0.25, 0.25, 0.5])
    d_neg = np.array([0.75, 0.5, 0.375, 0.25, 0.25])
    assert classify_triplets(d_pos, d_neg, margin=0.25).tolist() == [EASY, SEMI_HARD, SEMI_HARD, HARD, HARD]
    assert classify_triplets(d_pos, d_neg, margin=0.0).tolist() == [EASY, EASY, EASY, HARD, HARD]


def test_classes_of_hand_made_triplets_at_the_default_margin():
    anchor = np.array([[1.0, 0.0]] * 4)
    positive = np.array([[1.0, 0.0], [1.0, 1.0], [3.0, 4.0], [3.0, 4.0]])  # d_pos 0, 0.293, 0.4, 0.4
    negative = np.array([[0.0, 1.0], [3.0, 4.0], [1.0, 0.0], [3.0, 4.0]])  # d_neg 1, 0.4, 0, 0.4
    d_pos, d_neg = triplet_margins(anchor, positive, negative)
    assert classify_triplets(d_pos, d_neg).tolist() == [EASY, SEMI_HARD, HARD, HARD]
    # d(x, x⁻) = 1 − 3/5 = 0.4 = d(x, x⁺) + m exactly for m = 0.4: the tie is semi-hard
    d_pos, d_neg = triplet_margins(anchor[:1], anchor[:1], np.array([[3.0, 4.0]]))
    assert classify_triplets(d_pos, d_neg, margin=0.4).tolist() == [SEMI_HARD]
    assert classify_triplets(d_pos, d_neg, margin=0.39).tolist() == [EASY]


CLASSES = np.array([HARD, EASY, SEMI_HARD, EASY, HARD, SEMI_HARD])
MARGINS = np.array([-0.1, 0.5, 0.1, 0.3, -0.3, 0.05])


def test_curriculum_orders():
    assert curriculum_order(CLASSES, MARGINS, "curriculum", "margin").tolist() == [1, 3, 2, 5, 0, 4]
    assert curriculum_order(CLASSES, MARGINS, "anti", "margin").tolist() == [4, 0, 5, 2, 3, 1]
    assert curriculum_order(CLASSES, MARGINS, "none").tolist() == [0, 1, 2, 3, 4, 5]
    shuffled = curriculum_order(CLASSES, MARGINS, "curriculum", "shuffle", seed=3)
    assert [set(shuffled[:2]), set(shuffled[2:4]), set(shuffled[4:])] == [{1, 3}, {2, 5}, {0, 4}]
    assert shuffled.tolist() == curriculum_order(CLASSES, MARGINS, "curriculum", "shuffle", seed=3).tolist()
    anti = curriculum_order(CLASSES, MARGINS, "anti", "shuffle", seed=3)
    assert [set(anti[:2]), set(anti[2:4]), set(anti[4:])] == [{0, 4}, {2, 5}, {1, 3}]
    random = curriculum_order(CLASSES, MARGINS, "random", seed=3)
    assert sorted(random.tolist()) == list(range(6))
    assert random.tolist() == np.random.default_rng(3).permutation(6).tolist()


# --- phase 2: pacing -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("lam", "expected"),
    [(0.5, [100, 500, 708, 1000]), (1.0, [10, 250, 500, 1000]), (2.0, [1, 63, 250, 1000])],
)
def test_pacing_size_root_linear_quadratic(lam, expected):
    assert [pacing_size(t, 100, 1000, lam) for t in (1, 25, 50, 100)] == expected


def test_pacing_size_floor_and_bounds():
    assert pacing_size(1, 100, 1000, 1.0, minimum=64) == 64
    assert pacing_size(0, 100, 1000, 2.0) == 0
    assert pacing_size(150, 100, 1000, 1.0) == 1000  # past T: everything
    assert SelfCCLConfig(pacing="root").lam == 0.5 and SelfCCLConfig(pacing=2).lam == 2.0
    with pytest.raises(ValueError, match="λ must be > 0"):
        SelfCCLConfig(pacing=0)


def _rows(n: int = 200) -> list[dict[str, str]]:
    return [{"anchor": f"a{i}", "positive": f"p{i}", "negative": f"n{i}"} for i in range(n)]


class _WordTokenizer:
    """Enough of a tokenizer for ``TextViewBatcher``: one id per word."""

    pad_token_id = 0

    def __call__(self, texts, **_):
        return {"input_ids": [[1] * len(t.split()) for t in texts]}


def _prepared(order: str = "curriculum", unit: str = "step", seed: int = 0) -> tuple[SelfCCL, list]:
    """200 rows: 0–99 easy, 100–149 semi-hard, 150–199 hard; B = 10, 2 epochs = 40 steps."""
    rows = _rows()
    d_pos = np.full(200, 0.3, np.float32)
    d_neg = np.concatenate([np.full(100, 0.9), np.full(50, 0.4), np.full(50, 0.1)]).astype(np.float32)
    trial = TrialConfig.model_validate(
        {
            "model": {"name": "minilm", "pooling": "avg"},
            "trainer": {"batch_size": 10, "epochs": 2, "seed": seed},
            "method": {"name": "selfccl", "order": order, "pacing_unit": unit},
        }
    )
    method = SelfCCL(SelfCCLConfig(**trial.method))
    scores = TripletScores(d_pos, d_neg, rows_fingerprint(rows), "test", "avg", 32, 0.0)
    method.text_pipeline(trial, scores)
    method.prepare_rows(rows, _WordTokenizer(), trial)
    return method, rows


def _epochs(method: SelfCCL, rows: list, seed: int = 0) -> list[list[int]]:
    return [batch for epoch in (0, 1) for batch in method.batch_order(rows, 10, epoch, seed)]


def test_per_step_pacing_starts_in_the_easy_pool():
    method, rows = _prepared()
    order = method._plan["order"]
    batches = _epochs(method, rows)
    assert len(batches) == 40 and all(len(set(b)) == 10 for b in batches)
    assert set(batches[0]) == set(order[:10].tolist())  # step 1: pool max(B, ⌈200/40⌉) = 10
    assert all(max(b) < 100 for b in batches[:20])  # g(t) = 5t ≤ 100 through step 20: easy rows only
    assert all(set(b) <= set(order[: 5 * t].tolist()) for t, b in enumerate(batches[2:], start=3))
    assert max(max(b) for b in batches[20:]) >= 150  # the hard rows come in the second epoch
    assert batches == _epochs(method, rows)  # deterministic per seed
    other, _ = _prepared(seed=1)
    assert _epochs(other, rows, seed=1) != batches


def test_anti_random_none_and_per_epoch_orders():
    anti, rows = _prepared("anti")
    assert all(min(b) >= 150 for b in anti.batch_order(rows, 10, 0, 0)[:10])  # 5t ≤ 50: hard rows only
    random, _ = _prepared("random")
    first_epoch = random.batch_order(rows, 10, 0, 0)
    assert set().union(*first_epoch) <= set(random._plan["order"][:100].tolist())
    assert len({c for b in first_epoch for c in random._plan["classes"][b]}) == 3  # classes mixed
    none, _ = _prepared("none")
    assert none.batch_order(rows, 10, 1, 0) == shuffled_batches(200, 10, 1, 0)
    epoch_paced, _ = _prepared(unit="epoch")
    first, second = (epoch_paced.batch_order(rows, 10, e, 0) for e in (0, 1))
    assert all(max(b) < 100 for b in first)  # epoch 1 of 2: the first ⌈½·200⌉ = 100 rows (easy)
    assert max(max(b) for b in second) >= 150 and all(len(set(b)) == 10 for b in first + second)


def test_shared_scores_must_match_the_rows():
    method, rows = _prepared()
    with pytest.raises(ValueError, match="other training rows"):
        method.prepare_rows(rows[:-1], None, None)


# --- loss, registry ----------------------------------------------------------------------------------
def test_loss_is_supervised_simcse_with_hard_negatives():
    batch = torch.randn(6, 3, 8, generator=torch.Generator().manual_seed(0))
    method = get_method("selfccl")(SelfCCLConfig())
    assert method.views() == ("anchor", "positive", "negative")
    assert method.loss_from_embeddings(batch).item() == pytest.approx(simcse_sup_loss(batch, 0.05).item())
    trial = TrialConfig.model_validate({"method": {"name": "selfccl", "pacing": "quadratic"}})
    assert SelfCCLConfig(**trial.method).lam == 2.0
    # one scoring per row set and scoring encoder, whatever the order, pacing or margin
    anti = SelfCCL(SelfCCLConfig(order="anti", pacing="root", margin=0.1))
    assert anti.shared_key(trial) == method.shared_key(trial)
    assert SelfCCL(SelfCCLConfig(scoring_model="minilm")).shared_key(trial) != method.shared_key(trial)


# --- a local run with MLflow artifacts ---------------------------------------------------------------
def test_local_run_logs_the_scored_table_and_figure_4(data_dir, tmp_path):
    from mlflow.tracking import MlflowClient

    from clsr.train.loop import fit
    from clsr.train.session import LocalSession

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(uri)
    experiment = client.create_experiment("selfccl", artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(experiment).info.run_id
    trial = TrialConfig.model_validate(
        {
            "model": {"name": "minilm", "pooling": "avg", "max_seq_length": 16},
            "data": {"train": "nli_triplets", "max_rows": 48},
            "trainer": {"batch_size": 8, "max_steps": 3, "eval_steps": 3, "lr": 1e-4},
            "method": {"name": "selfccl", "figure_max_pairs": 60},
            "eval": {"dev_tasks": [], "tasks": [], "alignment_uniformity": False},
        }
    )
    fit(trial, LocalSession(tmp_path / "ckpt"), tracking={"uri": uri, "run_id": run_id})

    folder = tmp_path / "artifacts" / run_id / "artifacts" / "selfccl"
    names = {p.name for p in folder.iterdir()}
    assert {
        "scored_triplets.csv",
        "scoring_summary.json",
        "fig4_sickr_start.png",
        "fig4_sickr_final.png",
    } <= names
    for png in ("fig4_sickr_start.png", "fig4_sickr_final.png"):
        assert (folder / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    table = list(csv.DictReader((folder / "scored_triplets.csv").open()))
    summary = json.loads((folder / "scoring_summary.json").read_text())
    counts = summary["counts"]
    assert len(table) == summary["rows"] == sum(counts.values()) == 48
    assert {name: sum(r["label"] == name for r in table) for name in counts} == counts
    assert sorted(int(r["position"]) for r in table) == list(range(48))
    run = client.get_run(run_id)
    metrics = run.data.metrics
    assert {k: int(metrics[f"selfccl_{k}"]) for k in counts} == counts
    # the trial's cost: wall and CPU seconds, no GPU here; the device it ran on
    assert 0 < metrics["trial_wall_s"] < 600 and metrics["trial_cpu_s"] > 0 and metrics["trial_gpu_s"] == 0
    assert run.data.tags["clsr.device"] == "1 x cpu"
