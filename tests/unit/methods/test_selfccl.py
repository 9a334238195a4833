"""SelfCCL: the scoring rule on hand-made vectors, the pacing function, the paced batch order (per epoch
and per step) and its draw counts, the loss, and a short local run that leaves the scored table, the
draw counts and Figure 4 in its MLflow run and trains the per-epoch plan's steps."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest
import torch

from clsr.config.trial import TrialConfig
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
    draw_means,
    pacing_size,
    rows_fingerprint,
    triplet_margins,
)
from clsr.methods.simcse_sup import simcse_sup_loss
from clsr.tracking.run_logger import TrackingTarget
from tests.support.stores import sqlite_uri


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


def _method_on(
    d_neg: np.ndarray, trainer: dict, method: dict, d_pos: float = 0.3
) -> tuple[SelfCCL, list, TrialConfig]:
    """SelfCCL prepared on ``len(d_neg)`` rows whose δ = d_neg − d_pos is given, skipping the scoring."""
    rows = _rows(len(d_neg))
    trial = TrialConfig.model_validate(
        {
            "model": {"name": "minilm", "pooling": "avg"},
            "data": {"train": "nli_triplets"},
            "trainer": trainer,
            "method": {"name": "selfccl"} | method,
        }
    )
    selfccl = SelfCCL(SelfCCLConfig(**trial.method))
    d_pos_rows = np.full(len(d_neg), d_pos, np.float32)
    scores = TripletScores(
        d_pos_rows, np.asarray(d_neg, np.float32), rows_fingerprint(rows), "t", "avg", 32, 0.0
    )
    selfccl.text_pipeline(trial, scores)
    selfccl.prepare_rows(rows, _WordTokenizer(), trial)
    return selfccl, rows, trial


def _prepared(order: str = "curriculum", unit: str = "step", seed: int = 0) -> tuple[SelfCCL, list]:
    """200 rows: 0–99 easy, 100–149 semi-hard, 150–199 hard; B = 10, 2 epochs = 40 steps per step."""
    d_neg = np.concatenate([np.full(100, 0.9), np.full(50, 0.4), np.full(50, 0.1)])
    trainer = {"batch_size": 10, "epochs": 2, "seed": seed}
    method, rows, _ = _method_on(d_neg, trainer, {"order": order, "pacing_unit": unit})
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


def test_per_step_pacing_is_unchanged():
    # T = 2 epochs × ⌊200/10⌋ = 40; step t draws 10 distinct rows from the first max(10, ⌈5t⌉) listed
    d_neg = np.concatenate([np.full(100, 0.9), np.full(50, 0.4), np.full(50, 0.1)])
    trainer = {"batch_size": 10, "epochs": 2, "seed": 7}
    method, rows, trial = _method_on(d_neg, trainer, {"pacing_unit": "step"})
    assert method.plan_steps(200, trial, 1) == (20, 40)
    order = method._plan["order"]
    for epoch in (0, 1):
        rng = np.random.default_rng([7, epoch])
        pools = [max(10, 5 * t) for t in range(20 * epoch + 1, 20 * epoch + 21)]
        expected = [order[rng.choice(pool, 10, replace=False)].tolist() for pool in pools]
        assert method.batch_order(rows, 10, epoch, 7) == expected


# the list (within: margin, δ largest first) is rows 3, 7, 1, 9, 0, 5, 2, 8, 6, 4
LIST_10 = [3, 7, 1, 9, 0, 5, 2, 8, 6, 4]
D_NEG_10 = np.zeros(10)
D_NEG_10[LIST_10] = [0.9, 0.8, 0.7, 0.6, 0.45, 0.4, 0.35, 0.25, 0.2, 0.1]  # δ = d_neg − 0.3
# classes at m = 0.2: easy δ > 0.2 (3, 7, 1, 9), semi-hard 0 < δ ≤ 0.2 (0, 5, 2), hard δ ≤ 0 (8, 6, 4)


def _per_epoch_10(seed: int = 0) -> tuple[SelfCCL, list, TrialConfig]:
    return _method_on(D_NEG_10, {"batch_size": 5, "epochs": 2, "seed": seed}, {"within": "margin"})


def _loop_batches(method: SelfCCL, rows: list, batch_size: int, total: int, seed: int) -> list[list[int]]:
    """What the loop trains on: ``batch_order`` per ⌊k/B⌋-step slice, the first ``total`` batches."""
    per_slice, out, epoch = len(rows) // batch_size, [], 0
    while len(out) < total:
        part = method.batch_order(rows, batch_size, epoch, seed)
        assert len(part) == per_slice
        out, epoch = out + part, epoch + 1
    return out[:total]


def test_per_epoch_pacing_visits_each_listed_row_once_per_epoch():
    # k = 10, E = 2, λ = 1, B = 5: epoch 1 = the first ⌈½·10⌉ = 5 listed rows, epoch 2 = all 10: 1 + 2 steps
    method, rows, trial = _per_epoch_10()
    assert SelfCCLConfig().pacing_unit == "epoch" and method.per_epoch
    assert method._plan["order"].tolist() == LIST_10
    assert method.plan_steps(10, trial, 1) == (2, 3)
    batches = _loop_batches(method, rows, 5, 3, seed=0)
    assert sorted(batches[0]) == [0, 1, 3, 7, 9]
    assert sorted(batches[1] + batches[2]) == list(range(10))
    assert method.draws().tolist() == [2, 2, 1, 2, 1, 1, 1, 2, 1, 2]  # row i: 2 if in the first 5 listed


def test_per_epoch_pools_with_a_remainder_and_quadratic_pacing():
    # k = 11, B = 4, E = 2, λ = 1: pools ⌈5.5⌉ = 6 (1 batch, 2 rows wait) and 11 (2 batches, 3 wait)
    d_neg = np.linspace(0.9, 0.0, 11)
    method, rows, trial = _method_on(d_neg, {"batch_size": 4, "epochs": 2}, {"within": "margin"})
    assert method.plan_steps(11, trial, 1) == (2, 3)
    first, *second = _loop_batches(method, rows, 4, 3, seed=0)
    assert len(set(first)) == 4 and set(first) <= set(range(6))  # the list is rows 0..10 in order
    assert len(set(second[0] + second[1])) == 8
    # λ = 2, k = 200, B = 10, E = 4: pools ⌈12.5⌉ = 13, 50, ⌈112.5⌉ = 113, 200 → 1 + 5 + 11 + 20 steps
    method, rows, trial = _method_on(np.full(200, 0.9), {"batch_size": 10, "epochs": 4}, {"pacing": 2})
    assert method.plan_steps(200, trial, 1) == (20, 37)
    batches = _loop_batches(method, rows, 10, 37, seed=0)
    order = method._plan["order"]
    starts = [0, 1, 6, 17, 37]
    for pool, a, b in zip([13, 50, 113, 200], starts[:-1], starts[1:], strict=True):
        epoch = [r for batch in batches[a:b] for r in batch]
        assert len(epoch) == len(set(epoch)) == (pool // 10) * 10 and set(epoch) <= set(order[:pool].tolist())


def test_per_epoch_steps_follow_fractional_epochs_and_max_steps():
    d_neg = np.full(200, 0.9)
    for trainer, total in [
        ({"epochs": 2}, 10 + 20),  # pools 100, 200
        ({"epochs": 1.5}, 10 + 10),  # E = 2, the second epoch cut to half its 20 steps
        ({"epochs": 2, "max_steps": 15}, 15),
    ]:
        method, _, trial = _method_on(d_neg, {"batch_size": 10} | trainer, {})
        assert method.plan_steps(200, trial, 1) == (20, total)
    method, _, trial = _method_on(d_neg, {"batch_size": 10, "epochs": 2}, {"pacing_unit": "step"})
    assert method.plan_steps(200, trial, 1) == (20, 40)
    method, _, trial = _method_on(d_neg, {"batch_size": 10, "epochs": 2}, {"order": "none"})
    assert method.plan_steps(200, trial, 1) == (20, 40)


def test_per_epoch_pacing_is_seeded():
    method, rows, _ = _per_epoch_10(seed=3)
    same, _, _ = _per_epoch_10(seed=3)
    other, _, _ = _per_epoch_10(seed=4)
    batches = _loop_batches(method, rows, 5, 3, seed=3)
    assert batches == _loop_batches(same, rows, 5, 3, seed=3)
    assert batches != _loop_batches(other, rows, 5, 3, seed=4)
    # the last paced epoch over all k rows is a plain shuffled epoch of the list
    full = [[LIST_10[i] for i in b] for b in shuffled_batches(10, 5, 1, 3)]
    assert batches[1:] == full


def test_band_draw_counts_per_class_and_decile():
    method, _, _ = _per_epoch_10()
    draws = method.draws()
    means = draw_means(draws, method._plan["classes"], method._plan["margins"])
    # easy rows 3, 7, 1, 9: 2 draws each; semi-hard 0 (2), 5, 2 (1 each); hard 8, 6, 4: 1 each
    assert means["curriculum_draws_easy"] == 2.0
    assert means["curriculum_draws_semi_hard"] == pytest.approx(4 / 3)
    assert means["curriculum_draws_hard"] == 1.0
    # one row per tenth, by δ: the first five listed twice, the rest once
    assert [means[f"curriculum_draws_decile_{i:02d}"] for i in range(1, 11)] == [2.0] * 5 + [1.0] * 5


def test_four_epochs_of_per_step_pacing_are_not_four_passes():
    # k = 1000, B = 10, 4 epochs, λ = 1, within: margin (the list is δ order)
    d_neg = np.linspace(1.2, 0.0, 1000)
    trainer = {"batch_size": 10, "epochs": 4}
    epoch_paced, _, _ = _method_on(d_neg, trainer, {"within": "margin"})
    deciles = draw_means(epoch_paced.draws(), epoch_paced._plan["classes"], d_neg)
    # pools 250, 500, 750, 1000: list positions [0, 250) drawn 4 times, [250, 500) 3, [500, 750) 2, then 1
    expected = [4, 4, 3.5, 3, 3, 2, 2, 1.5, 1, 1]
    assert [deciles[f"curriculum_draws_decile_{i:02d}"] for i in range(1, 11)] == expected
    step_paced, _, _ = _method_on(d_neg, trainer, {"within": "margin", "pacing_unit": "step"})
    draws = step_paced.draws()
    assert draws.sum() == 400 * 10
    # expected draws of list position x: Σ_t B / n_t over the steps whose pool n_t = max(10, ⌈2.5t⌉) holds it
    pools = np.maximum(10, np.ceil(2.5 * np.arange(1, 401)))
    expect = np.array([np.sum(10 / pools[pools > x]) for x in range(1000)])
    assert expect[:10].mean() == pytest.approx(21.9, abs=0.1) and expect[900:].mean() == pytest.approx(
        0.21, abs=0.01
    )
    assert draws[:100].mean() == pytest.approx(expect[:100].mean(), rel=0.05)
    assert draws[900:].mean() == pytest.approx(expect[900:].mean(), abs=0.08)


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
    assert all(max(b) < 100 for b in first[:10])  # epoch 1 of 2: the first ⌈½·200⌉ = 100 rows (easy)
    assert max(max(b) for b in first[10:] + second) >= 150 and all(len(set(b)) == 10 for b in first + second)


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
    trial = TrialConfig.model_validate(
        {"data": {"train": "nli_triplets"}, "method": {"name": "selfccl", "pacing": "quadratic"}}
    )
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

    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    experiment = client.create_experiment("selfccl", artifact_location=str(tmp_path / "artifacts"))
    run_id = client.create_run(experiment).info.run_id
    trial = TrialConfig.model_validate(
        {
            "model": {"name": "minilm", "pooling": "avg", "max_seq_length": 16},
            "data": {"train": "nli_triplets", "max_rows": 48},
            # per-epoch pacing over 2 epochs of 48 rows: pools 24 and 48, 3 + 6 = 9 steps (not 2 × 6)
            "trainer": {"batch_size": 8, "epochs": 2, "eval_steps": 9, "lr": 1e-4},
            "method": {"name": "selfccl", "figure_max_pairs": 60},
            "eval": {"dev_tasks": [], "tasks": [], "alignment_uniformity": False},
        }
    )
    fit(trial, LocalSession(tmp_path / "ckpt"), tracking=TrackingTarget(uri, run_id))

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
    # the planned draws: 9 steps × 8 rows, the first 24 listed rows twice, the other 24 once
    draws = {int(r["position"]): int(r["draws"]) for r in table}
    assert sum(draws.values()) == 72 and {p: draws[p] for p in (0, 23, 24, 47)} == {0: 2, 23: 2, 24: 1, 47: 1}
    for name in counts:
        band = [int(r["draws"]) for r in table if r["label"] == name]
        if band:
            assert metrics[f"curriculum_draws_{name}"] == pytest.approx(sum(band) / len(band))
    assert summary["epoch_pools"] == [24, 48] and summary["total_steps"] == 9
    # the loop trained the 9 planned steps, the linear LR schedule reaching 0 at the last
    lrs = client.get_metric_history(run_id, "lr")
    assert [m.step for m in lrs] == list(range(1, 10))
    assert [m.value for m in lrs] == pytest.approx([1e-4 * (1 - s / 9) for s in range(1, 10)])
    # the trial's cost: wall and CPU seconds, no GPU here; the device it ran on
    assert 0 < metrics["trial_wall_s"] < 600 and metrics["trial_cpu_s"] > 0 and metrics["trial_gpu_s"] == 0
    assert run.data.tags["clsr.device"] == "1 x cpu"
