"""The generic loop in-process (no Ray): it trains, keeps the best checkpoint, and resumes."""

from __future__ import annotations

import torch

from clsr.train.config import TrialConfig
from clsr.train.loop import fit
from clsr.train.session import LocalSession


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
    from clsr.train.loop import build_method

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
    import pytest
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
    from scipy.stats import spearmanr
    from sentence_transformers import SentenceTransformer

    from clsr.data.sts import load_sts
    from clsr.encoders.registry import resolve_model_path

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
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
                "alignment_uniformity": False,
            },
        }
    )
    session = LocalSession(tmp_path / "ckpt")
    final = fit(trial, session, tracking={"uri": uri, "run_id": run_id})

    reference = SentenceTransformer(resolve_model_path("minilm"), device="cpu")

    def spearman(task: str, split: str) -> float:
        pairs = load_sts(task, split, data_dir)
        a, b = (reference.encode(s, normalize_embeddings=True) for s in (pairs.sentences1, pairs.sentences2))
        return 100 * spearmanr(np.sum(a * b, axis=1), pairs.scores).statistic

    assert abs(final["test_stsb"] - spearman("stsb", "test")) < 0.05
    assert abs(final["best_dev_sickr"] - spearman("sickr", "dev")) < 0.05
    assert abs(final["best_dev_stsb"] - spearman("stsb", "dev")) < 0.05  # every dev task, not only select_on
    assert final["step"] == 0 and final["best_step"] == 0 and "loss_avg" not in final
    assert session.latest is None and len(session.reports) == 1  # no checkpoint, one (final) report
    run = client.get_run(run_id)
    assert run.data.tags["clsr.eval_only"] == "true"
    assert run.data.metrics["test_stsb"] == final["test_stsb"]
    assert not {"loss", "lr", "grad_norm", "loss_avg", "samples_per_s"} & set(run.data.metrics)
