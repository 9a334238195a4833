"""The trial driver hands its workers one typed config: it crosses Ray Train's dict whole and survives
the pickling Ray does on the way (cloudpickle)."""

from __future__ import annotations

import pickle

import cloudpickle

from clsr.config.loop import LoopConfig
from clsr.config.trial import TrialConfig
from clsr.tracking.run_logger import TrackingTarget


def test_a_loop_config_crosses_ray_trains_dict_as_it_was():
    trial = TrialConfig.model_validate(
        {
            "method": {"name": "simcse_unsup", "temperature": 0.05},
            "model": {"name": "minilm"},
            "trainer": {"lr": 3e-5},
        }
    )
    tracking = TrackingTarget("sqlite:///m.db", "abc", 5.0, "/runs/x", commit_at_checkpoints=False)
    config = LoopConfig(trial, tracking, None, in_process=True, gpus_per_worker=0.25)
    carried = pickle.loads(cloudpickle.dumps(config.for_ray_train()))
    assert list(carried) == ["loop"]
    loop = carried["loop"]
    assert loop == config and loop.trial.method["temperature"] == 0.05 and loop.trial.trainer.lr == 3e-5
    assert loop.tracking.commit_at_checkpoints is False and loop.tracking.pending_root == "/runs/x"
