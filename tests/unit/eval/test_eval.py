"""The STS evaluator and alignment/uniformity on small hand-made examples."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import spearmanr

from clsr.data.sts import STSSplit
from clsr.eval.alignment import alignment, alignment_uniformity, uniformity
from clsr.eval.sts import cosine_scores, expand_tasks, format_table, score_split, summary_metrics

VECTORS = {  # 2-d sentence vectors whose cosines are easy to work out by hand
    "a": [1.0, 0.0], "b": [1.0, 0.0],    # cos 1
    "c": [1.0, 0.0], "d": [0.0, 1.0],    # cos 0
    "e": [1.0, 0.0], "f": [1.0, 1.0],    # cos 0.707
    "g": [1.0, 0.0], "h": [-1.0, 0.0],   # cos -1
}  # fmt: skip


def embed(sentences):
    return np.array([VECTORS[s] for s in sentences])


def test_score_split_all_mean_wmean():
    split = STSSplit(
        task="sts12",
        split="test",
        sentences1=["a", "c", "e", "g"],
        sentences2=["b", "d", "f", "h"],
        scores=np.array([5.0, 1.0, 2.0, 0.0]),
        subsets=["x", "x", "y", "y"],
    )
    score = score_split(split, embed)
    # cosines 1, 0, .707, -1 vs gold 5, 1, 2, 0: ranks (4,2,3,1) vs (4,2,3,1) → ρ = 1 over all pairs
    assert score.all == pytest.approx(100.0)
    # per subset: x (1 vs 0, 5 vs 1) ρ=1; y (.707 vs -1, 2 vs 0) ρ=1
    assert score.subsets == {"x": pytest.approx(100.0), "y": pytest.approx(100.0)}
    assert score.mean == pytest.approx(100.0) and score.wmean == pytest.approx(100.0)
    assert score.pairs == 4


def test_all_setting_differs_from_mean_of_subsets():
    split = STSSplit(
        task="sts13",
        split="test",
        sentences1=["a", "c", "e", "g"],
        sentences2=["b", "d", "f", "h"],
        scores=np.array([1.0, 0.0, 5.0, 4.0]),
        subsets=["x", "x", "y", "y"],
    )
    score = score_split(split, embed)
    cos = cosine_scores(embed(split.sentences1), embed(split.sentences2))
    assert score.all == pytest.approx(100 * spearmanr(cos, split.scores).statistic)
    assert score.mean == pytest.approx(100.0)  # each subset alone is perfectly ordered
    assert score.all < score.mean


def test_nan_cosine_is_zero():
    assert cosine_scores(np.zeros((1, 2)), np.ones((1, 2)))[0] == 0.0


def test_alignment_and_uniformity_by_hand():
    a, b = np.array([[1.0, 0.0], [0.0, 2.0]]), np.array([[0.0, 1.0], [0.0, 1.0]])
    assert alignment(a, b) == pytest.approx((2.0 + 0.0) / 2)  # |e1-e2|² = 2, |e2-e2|² = 0
    points = np.array([[1.0, 0.0], [0.0, 1.0], [-1.0, 0.0]])  # squared distances 2, 4, 2
    assert uniformity(points) == pytest.approx(np.log((2 * np.exp(-4) + np.exp(-8)) / 3))


def test_alignment_uniformity_embeds_each_sentence_once():
    split = STSSplit(  # positives (gold > 4): a-b and e-f; "a" recurs in a negative pair
        task="stsb",
        split="dev",
        sentences1=["a", "c", "e", "a"],
        sentences2=["b", "d", "f", "h"],
        scores=np.array([5.0, 1.0, 4.5, 0.0]),
        subsets=["x"] * 4,
    )
    calls = []
    scores = alignment_uniformity(split, lambda sentences: calls.append(sentences) or embed(sentences))
    assert calls == [["a", "c", "e", "b", "d", "f", "h"]]  # one call, each distinct sentence once
    assert scores["align"] == pytest.approx(alignment(embed(["a", "e"]), embed(["b", "f"])))
    assert scores["uniform"] == pytest.approx(uniformity(embed(["a", "c", "e", "b", "d", "f", "h"])))


def test_task_names_expand_and_unknown_names_fail():
    assert expand_tasks(["sts"]) == ["sts12", "sts13", "sts14", "sts15", "sts16", "stsb", "sickr"]
    with pytest.raises(ValueError, match="allowed: sts, sts12"):
        expand_tasks(["sts17"])


def test_summary_and_table(data_dir):
    from clsr.eval.sts import evaluate_sts

    def bag_of_chars(sentences):  # a deterministic, model-free encoder
        return np.array([[s.count(c) for c in "abcdefghijklmnopqrstuvwxyz"] for s in sentences], dtype=float)

    scores = evaluate_sts(bag_of_chars, ["sts16", "stsb"], "test", data_dir)
    metrics = summary_metrics(scores)
    assert set(metrics) == {"test_sts16", "test_stsb", "test_sts_avg"}
    assert scores["stsb"].pairs == 1379 and scores["sts16"].pairs == 1186
    assert 0 < metrics["test_stsb"] < 60  # letter counts carry little meaning, but some
    assert "STS-B" in format_table(scores) and "Avg." in format_table(scores)


def test_a_capped_split_keeps_every_subset_in_proportion_and_the_same_pairs_each_time(data_dir):
    from clsr.data.sts import load_sts, subsample

    sts12 = load_sts("sts12", "test", data_dir)  # 3,108 pairs in 5 subsets of 399 to 750
    capped = subsample(sts12, 300)
    sizes = {name: sts12.subsets.count(name) for name in dict.fromkeys(sts12.subsets)}
    kept = {name: capped.subsets.count(name) for name in sizes}
    assert kept == {name: round(300 * n / len(sts12.subsets)) for name, n in sizes.items()}
    assert sum(kept.values()) == len(capped.scores) == len(capped.sentences1) == len(capped.sentences2)
    pairs = set(zip(sts12.sentences1, sts12.sentences2, sts12.scores, strict=True))
    assert set(zip(capped.sentences1, capped.sentences2, capped.scores, strict=True)) <= pairs  # whole pairs
    again = subsample(sts12, 300)
    assert (
        again.sentences1 == capped.sentences1
        and subsample(sts12, 300, seed=1).sentences1 != capped.sentences1
    )
    assert subsample(sts12, 10).subsets.count("surprise.SMTnews") == 3  # every subset keeps a correlation
    assert subsample(sts12, 5000) is sts12 and subsample(sts12, None) is sts12


def test_evaluate_sts_scores_the_capped_pairs(data_dir):
    from clsr.data.sts import load_sts, subsample
    from clsr.eval.sts import evaluate_sts

    def lengths(sentences):  # a stand-in encoder: [length, word count]
        return np.array([[len(s), len(s.split())] for s in sentences], dtype=float)

    (score,) = evaluate_sts(lengths, ["stsb"], "test", data_dir, max_pairs=200).values()
    capped = subsample(load_sts("stsb", "test", data_dir), 200)
    expected = spearmanr(cosine_scores(lengths(capped.sentences1), lengths(capped.sentences2)), capped.scores)
    assert score.pairs == 200 and score.all == pytest.approx(100 * expected.statistic)


def test_truncate_dims_scores_each_prefix_from_one_encoding(data_dir):
    """``eval.truncate_dims``: ``<metric>_dim<d>`` is the STS score of the first d coordinates (computed
    here with SciPy on sliced features); each side of each split is encoded once."""
    from clsr.data.sts import load_sts, subsample
    from clsr.eval.suite import SuiteSettings, SuiteTasks, evaluate_suite

    calls = []

    def features(sentences):  # a stand-in encoder: centred length, word count, vowel count
        calls.append(len(sentences))
        rows = [[len(s) - 50, len(s.split()) - 9, sum(c in "aeiou" for c in s) - 15] for s in sentences]
        return np.array(rows, dtype=float)

    settings = SuiteSettings(data_dir=data_dir, sts_max_pairs=100, truncate_dims=(2, 1, 8))
    metrics = evaluate_suite(features, SuiteTasks(sts=["sts16", "stsb"]), settings)
    assert len(calls) == 4  # two sides of two tasks
    scores = {}
    for task in ("sts16", "stsb"):
        pairs = subsample(load_sts(task, "test", data_dir), 100)
        a, b = features(pairs.sentences1), features(pairs.sentences2)
        for dim in (1, 2, 3):
            rho = spearmanr(cosine_scores(a[:, :dim], b[:, :dim]), pairs.scores).statistic
            scores[task, dim] = 100 * rho
    for task in ("sts16", "stsb"):
        assert metrics[f"test_{task}"] == pytest.approx(scores[task, 3])
        assert metrics[f"test_{task}_dim8"] == pytest.approx(scores[task, 3])  # above the size: all of it
        for dim in (1, 2):
            assert metrics[f"test_{task}_dim{dim}"] == pytest.approx(scores[task, dim])
    for dim in (1, 2):
        mean = (scores["sts16", dim] + scores["stsb", dim]) / 2
        assert metrics[f"test_sts_avg_dim{dim}"] == pytest.approx(mean)
    assert metrics["test_sts_avg"] == pytest.approx((scores["sts16", 3] + scores["stsb", 3]) / 2)
    assert scores["stsb", 1] != pytest.approx(scores["stsb", 3])  # the prefixes do differ


def test_truncate_dims_is_a_list_of_positive_sizes():
    from pydantic import ValidationError

    from clsr.config.trial import EvalConfig

    assert EvalConfig(truncate_dims=[64, 128]).truncate_dims == [64, 128]
    assert EvalConfig().truncate_dims == []
    with pytest.raises(ValidationError, match="greater than or equal to 1"):
        EvalConfig(truncate_dims=[0])
