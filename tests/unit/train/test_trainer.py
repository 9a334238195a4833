"""The generic loop in-process (no Ray): it trains, keeps the best checkpoint, and resumes."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import platform
from pathlib import Path

import pytest
import torch

import clsr
from clsr.config.trial import TrialConfig
from clsr.tracking.run_logger import TrackingTarget
from clsr.train.loop import fit
from clsr.train.session import LocalSession
from tests.support.stores import sqlite_uri


def tiny_trial(**trainer) -> TrialConfig:
    return TrialConfig.model_validate(
        {
            "model": {"name": "minilm", "pooling": "avg", "max_seq_length": 16},
            "data": {"train": "nli_triplets", "max_rows": 64},
            "trainer": {"batch_size": 8, "max_steps": 4, "eval_steps": 2, "lr": 1e-4, **trainer},
            "method": {"name": "simcse_sup"},
            "eval": {"dev_tasks": [], "tasks": [], "alignment_uniformity": False},
        }
    )


def test_training_changes_every_parameter_and_resumes_from_its_checkpoint(data_dir, tmp_path):
    session = LocalSession(tmp_path / "a")
    fit(tiny_trial(), session)
    assert [r["step"] for r in session.reports] == [2, 4, 4]
    first = torch.load(session.latest / "state.pt", weights_only=False)
    assert first["step"] == 4

    # A fresh session that finds the step-2 checkpoint continues to step 4 and lands on the same weights.
    resumed = LocalSession(tmp_path / "b")
    resumed.latest = tmp_path / "a" / "step_2"
    fit(tiny_trial(), resumed)
    assert [r["step"] for r in resumed.reports] == [4, 4]
    second = torch.load(resumed.latest / "state.pt", weights_only=False)
    for name, value in first["model"].items():
        assert torch.allclose(value, second["model"][name], atol=1e-5), name


def test_every_parameter_moves_after_one_step(data_dir):
    from clsr.methods import build_method

    trial = tiny_trial(max_steps=1, eval_steps=1)
    model = build_method(trial).build_model(trial.model, None)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    session = LocalSession()
    fit(trial, session)
    after = torch.load(session.latest / "state.pt", weights_only=False)["model"]
    unchanged = [n for n, v in before.items() if torch.equal(v, after[n])]
    assert unchanged == []


def test_a_restored_checkpoint_copy_is_removed_after_loading(tmp_path):
    """Ray sessions copy the checkpoint (maybe from cloud storage) to a temporary folder for the loop to
    load; the copy goes when the loop is done with it."""
    import ray.train

    from clsr.train.session import _local_copy

    saved = tmp_path / "checkpoint"
    saved.mkdir()
    (saved / "state.pt").write_text("weights")
    with _local_copy(ray.train.Checkpoint.from_directory(str(saved))) as copy:
        assert copy != saved and (copy / "state.pt").read_text() == "weights"
    assert not copy.exists() and (saved / "state.pt").exists()
    with _local_copy(None) as nothing:
        assert nothing is None


def test_max_steps_zero_is_an_evaluation_point_and_negative_is_refused():
    from pydantic import ValidationError

    assert tiny_trial(max_steps=0).trainer.max_steps == 0
    with pytest.raises(ValidationError, match="max_steps"):
        tiny_trial(max_steps=-1)
    # a word-vector TextCNN starts from random filters: nothing pretrained to score
    with pytest.raises(ValidationError, match="evaluation only.*'gclsr' trains a textcnn encoder"):
        TrialConfig.model_validate(
            {"model": {"type": "textcnn"}, "trainer": {"max_steps": 0}, "method": {"name": "gclsr"}}
        )


def test_an_evaluation_only_point_scores_the_untouched_model_and_trains_nothing(data_dir, tmp_path):
    """trainer.max_steps: 0 leaves a run with the starting model's scores, tag clsr.eval_only=true, no
    training metrics and no checkpoint. Golden values: sentence-transformers' own all-MiniLM-L6-v2 (mean
    pooling) and scipy's Spearman correlation, not clsr's encoder or STS code."""
    import numpy as np
    from mlflow.tracking import MlflowClient
    from scipy.spatial.distance import pdist
    from scipy.stats import spearmanr
    from sentence_transformers import SentenceTransformer

    from clsr.data.hub.model_registry import resolve_model_path
    from clsr.data.sts import load_sts, subsample

    max_pairs = 120  # a seeded sample of each split: the comparison is per sentence, not per set
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("eval-only", str(tmp_path / "art"))).info.run_id
    trial = TrialConfig.model_validate(
        {
            "model": {"name": "minilm", "pooling": "avg", "max_seq_length": 256},  # the reference's length
            "data": {"train": "nli_triplets", "max_rows": 64},
            "trainer": {"batch_size": 8, "max_steps": 0},
            "method": {"name": "simcse_sup"},
            "eval": {
                "dev_tasks": ["sickr", "stsb"],
                "select_on": "sickr",
                "tasks": ["stsb"],
                "log_model": False,
                "sts_max_pairs": max_pairs,  # each split's seeded sample, scored by the reference too
                # (alignment and uniformity on STS-B dev's sample as well)
            },
        }
    )
    session = LocalSession(tmp_path / "ckpt")
    final = fit(trial, session, tracking=TrackingTarget(uri, run_id))

    reference = SentenceTransformer(resolve_model_path("minilm"), device="cpu")

    def spearman(task: str, split: str) -> float:
        pairs = subsample(load_sts(task, split, data_dir), max_pairs)
        a, b = (reference.encode(s, normalize_embeddings=True) for s in (pairs.sentences1, pairs.sentences2))
        return 100 * spearmanr(np.sum(a * b, axis=1), pairs.scores).statistic

    assert abs(final["test_stsb"] - spearman("stsb", "test")) < 0.05
    assert abs(final["best_dev_sickr"] - spearman("sickr", "dev")) < 0.05
    assert abs(final["best_dev_stsb"] - spearman("stsb", "dev")) < 0.05  # every dev task, not only select_on
    # Wang & Isola on the same sample: positive pairs (gold > 4), and every pair of distinct sentences
    dev = subsample(load_sts("stsb", "dev", data_dir), max_pairs)
    sentences = sorted(set(dev.sentences1) | set(dev.sentences2))
    vectors = dict(zip(sentences, reference.encode(sentences, normalize_embeddings=True), strict=True))
    positive = [
        (a, b) for a, b, gold in zip(dev.sentences1, dev.sentences2, dev.scores, strict=True) if gold > 4
    ]
    align = np.mean([np.sum((vectors[a] - vectors[b]) ** 2) for a, b in positive])
    distances = pdist(np.stack(list(vectors.values())).astype(np.float64), "sqeuclidean")
    assert final["align"] == pytest.approx(align, abs=1e-3)
    assert final["uniform"] == pytest.approx(np.log(np.mean(np.exp(-2 * distances))), abs=1e-3)
    assert final["step"] == 0 and final["best_step"] == 0 and "loss_avg" not in final
    assert session.latest is None and len(session.reports) == 1  # no checkpoint, one (final) report
    run = client.get_run(run_id)
    assert run.data.tags["clsr.eval_only"] == "true"
    assert run.data.metrics["test_stsb"] == final["test_stsb"]
    assert not {"loss", "lr", "grad_norm", "loss_avg", "samples_per_s"} & set(run.data.metrics)
    # the trial's process logged the identity of each set it scored (issue 55): STS-B dev's sample, hashed
    # here from the pairs scored above as the docs say (one JSON line per [subset, score, s1, s2])
    lines = "".join(
        json.dumps(list(row), ensure_ascii=False, separators=(",", ":")) + "\n"
        for row in zip(dev.subsets, dev.scores.tolist(), dev.sentences1, dev.sentences2, strict=True)
    )
    params = run.data.params
    assert params["data.stsb_dev.sha256"] == hashlib.sha256(lines.encode()).hexdigest()
    assert params["data.stsb_dev.rows"] == str(len(dev.scores))
    assert (
        params["data.stsb_dev.source"] == f"local:{data_dir}/senteval/downstream/STS/STSBenchmark/sts-dev.csv"
    )
    assert {"data.sickr_dev.sha256", "data.stsb.sha256"} <= set(params)
    assert "data.train.sha256" not in params  # evaluation only: no training rows were read
    # and where it ran (issue 55): this process's own platform and torch, no GPU, its package list
    assert (params["env.python"], params["env.torch"]) == (
        platform.python_version(),
        importlib.metadata.version("torch"),
    )
    assert (params["env.gpu"], params["env.gpu_count"], params["env.clsr"]) == ("none", "0", clsr.__version__)
    lock = client.download_artifacts(run_id, "environment/environment.txt", str(tmp_path))
    assert f"torch=={importlib.metadata.version('torch')}" in Path(lock).read_text().splitlines()


def test_checkpoint_every_n_evaluations_and_always_at_the_last(data_dir, tmp_path):
    session = LocalSession(tmp_path / "c")
    final = fit(tiny_trial(max_steps=5, eval_steps=1, checkpoint_every=2), session)
    assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["step_2", "step_4", "step_5"]
    assert [r["step"] for r in session.reports] == [1, 2, 3, 4, 5, 5]
    saved = torch.load(session.latest / "state.pt", weights_only=True)
    assert saved["evaluations"] == 5 and saved["step"] == 5
    # what checkpointing cost the trial is a metric of its run
    sizes = sum(
        f.stat().st_size for step in ("step_2", "step_4", "step_5") for f in (tmp_path / "c" / step).iterdir()
    )
    assert final["trial_checkpoint_bytes"] == sizes and final["trial_checkpoint_s"] > 0
    assert 0 < final["trial_checkpoint_wait_s"] < 60  # the local session moves the folder
    # where the wall time went, with the counts that make per-unit costs (what `study plan` projects from)
    assert (final["trial_steps_run"], final["trial_dev_evaluations"], final["trial_checkpoints_written"]) == (
        5,
        5,
        3,
    )
    phases = (
        "trial_setup_s",
        "trial_steps_s",
        "trial_dev_eval_s",
        "trial_checkpoint_write_s",
        "trial_test_eval_s",
    )
    assert all(final[p] > 0 for p in phases)
    assert sum(final[p] for p in phases) <= final["trial_wall_s"]


def test_frozen_parameters_stay_out_of_checkpoints_and_are_rebuilt(tmp_path):
    """GCLSR's frozen word table (gigabytes for word2vec) is rebuilt from the config, not saved."""
    from torch import nn

    from clsr.train.checkpoint import load_checkpoint, save_checkpoint, trained_state

    def model() -> nn.Module:
        torch.manual_seed(0)
        net = nn.Sequential(nn.Embedding.from_pretrained(torch.randn(50, 4)), nn.Linear(4, 2))
        return net

    trained = model()
    optimizer = torch.optim.AdamW([p for p in trained.parameters() if p.requires_grad])
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    with torch.no_grad():
        trained[1].weight.add_(1.0)
    best = {k: v.clone() for k, v in trained_state(trained).items()}
    assert set(best) == {"1.weight", "1.bias"}  # the frozen table is not in it
    folder = save_checkpoint(trained, optimizer, scheduler, {"step": 3}, best)
    saved = torch.load(folder / "state.pt", weights_only=True)
    assert set(saved["model"]) == {"1.weight", "1.bias"}
    fresh = model()  # build_model rebuilds the same table
    got_best = load_checkpoint(folder, fresh, optimizer, scheduler, {}, type("S", (), {"rank": 0}), 0)
    assert torch.equal(fresh[1].weight, trained[1].weight) and torch.equal(fresh[0].weight, trained[0].weight)
    assert set(got_best) == {"1.weight", "1.bias"}
    unfrozen = nn.Sequential(nn.Embedding(50, 4), nn.Linear(4, 2))  # a trainable table must be in it
    try:
        load_checkpoint(folder, unfrozen, optimizer, scheduler, {}, type("S", (), {"rank": 0}), 0)
        raise AssertionError("a checkpoint without a trainable parameter loaded")
    except RuntimeError as err:
        assert "missing ['0.weight']" in str(err)
