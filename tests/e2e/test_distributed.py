"""A 2-worker Ray Train run takes the same steps as a 1-worker run with the same global batch.

In-batch negatives are gathered across workers, so both runs see the same 8×8 similarity matrix; the
loss is scaled by the world size so that DDP's gradient average equals the 1-worker gradient.
Dropout is off so that both runs compute identical embeddings.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import pytest
from mlflow.tracking import MlflowClient

from clsr.config.loop import LoopConfig
from clsr.config.trial import TrialConfig
from clsr.tracking.run_logger import TrackingTarget
from tests.support.stores import sqlite_uri

pytestmark = [pytest.mark.e2e, pytest.mark.parallel, pytest.mark.minutes(2.8)]


def trial_config(data_dir, upload: str = "async") -> dict:
    return {
        "model": {"name": "minilm", "pooling": "avg", "max_seq_length": 16, "dropout": 0.0},
        "data": {"train": "nli_triplets", "max_rows": 64, "data_dir": str(data_dir)},
        "trainer": {
            "batch_size": 8,
            "max_steps": 3,
            "eval_steps": 3,
            "log_every": 1,
            "lr": 1e-4,
            "seed": 3,
            "checkpoint_upload": upload,
        },
        "method": {"name": "simcse_sup"},
        "eval": {  # two transfer tasks: the two workers score one each (Evaluator.shared_transfer)
            "dev_tasks": [],
            "tasks": ["mr", "cr"],
            "transfer_mode": "fast",
            "transfer_classifier": "liblinear",
            "transfer_max_examples": 120,
            "alignment_uniformity": False,
        },
    }


def run_with_workers(workers: int, tmp_path, uri: str, data_dir, upload: str = "async"):
    """The trial's losses read back from MLflow, its MLflow run, and Ray Train's result."""
    import ray.train
    from ray.train.torch import TorchTrainer

    from clsr.train.worker import train_loop_per_worker

    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment(f"workers-{workers}")).info.run_id
    result = TorchTrainer(
        train_loop_per_worker,
        train_loop_config=LoopConfig(
            TrialConfig.model_validate(trial_config(data_dir, upload)), TrackingTarget(uri, run_id)
        ).for_ray_train(),
        scaling_config=ray.train.ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
        run_config=ray.train.RunConfig(name=f"w{workers}", storage_path=str(tmp_path / "ray")),
    ).fit()
    losses = [m.value for m in sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.step)]
    return losses, client.get_run(run_id), result


def test_two_workers_match_one_worker(tmp_path, data_dir):
    import ray

    from clsr.study.control.ray_session import init_ray

    init_ray()
    try:
        uri = sqlite_uri(tmp_path / "mlflow.db")
        mlflow.set_tracking_uri(uri)
        one, one_run, one_result = run_with_workers(1, tmp_path, uri, data_dir, upload="async")
        two, two_run, two_result = run_with_workers(2, tmp_path, uri, data_dir, upload="sync")
    finally:
        ray.shutdown()
    assert len(one) == len(two) == 3
    # step 1 checks the gathered loss; steps 2-3 check that the gradients (hence the updates) agree
    assert two == pytest.approx(one, rel=1e-4, abs=1e-5)
    # both upload modes: the checkpoint of the last evaluation is in the run's storage, whole, registered
    # with its report's metrics
    for result in (one_result, two_result):
        assert result.error is None and result.metrics["step"] == 3 and "loss_avg" in result.metrics
        files = {p.name for p in Path(result.checkpoint.path).iterdir()}
        manifest = json.loads((Path(result.checkpoint.path) / "manifest.json").read_text())
        assert "state.pt" in manifest["sha256"] and set(manifest["sha256"]) <= files, files
    # the final transfer evaluation: one worker scored both tasks, two workers one each, with the same
    # weights (equal to 1e-4): the same scores
    assert "clsr.transfer_eval_ranks" not in one_run.data.tags
    assert two_run.data.tags["clsr.transfer_eval_ranks"] == "2"
    for key in ("test_mr", "test_cr", "test_transfer_avg"):
        assert two_run.data.metrics[key] == pytest.approx(one_run.data.metrics[key], abs=1.0), key
