"""A 2-worker Ray Train run takes the same steps as a 1-worker run with the same global batch.

In-batch negatives are gathered across workers, so both runs see the same 8×8 similarity matrix; the
loss is scaled by the world size so that DDP's gradient average equals the 1-worker gradient.
Dropout is off so that both runs compute identical embeddings.
"""

from __future__ import annotations

import mlflow
import pytest
from mlflow.tracking import MlflowClient

pytestmark = pytest.mark.e2e


def trial_config(data_dir) -> dict:
    return {
        "model": {"name": "minilm", "pooling": "avg", "max_seq_length": 16, "dropout": 0.0},
        "data": {"train": "nli_triplets", "max_rows": 64, "data_dir": str(data_dir)},
        "trainer": {"batch_size": 8, "max_steps": 3, "eval_steps": 3, "log_every": 1, "lr": 1e-4, "seed": 3},
        "method": {"name": "simcse_sup"},
        "eval": {"dev_tasks": [], "tasks": [], "alignment_uniformity": False},
    }


def run_with_workers(workers: int, tmp_path, uri: str, data_dir) -> list[float]:
    import ray.train
    from ray.train.torch import TorchTrainer

    from clsr.train.worker import train_loop_per_worker

    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment(f"workers-{workers}")).info.run_id
    TorchTrainer(
        train_loop_per_worker,
        train_loop_config={"trial": trial_config(data_dir), "tracking": {"uri": uri, "run_id": run_id}},
        scaling_config=ray.train.ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
        run_config=ray.train.RunConfig(name=f"w{workers}", storage_path=str(tmp_path / "ray")),
    ).fit()
    return [m.value for m in sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.step)]


def test_two_workers_match_one_worker(tmp_path, data_dir):
    import ray

    from clsr.study.runner import init_ray

    init_ray()
    try:
        uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
        mlflow.set_tracking_uri(uri)
        one = run_with_workers(1, tmp_path, uri, data_dir)
        two = run_with_workers(2, tmp_path, uri, data_dir)
    finally:
        ray.shutdown()
    assert len(one) == len(two) == 3
    # step 1 checks the gathered loss; steps 2-3 check that the gradients (hence the updates) agree
    assert two == pytest.approx(one, rel=1e-4, abs=1e-5)
