"""A study whose trials no node can hold is refused (local Ray) or said (a cluster) before anything is
recorded, instead of showing ``running`` forever with Ray's reason only in the driver's log."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from clsr.study.plan.load import load_study
from clsr.study.run.resources import Node, check_resources, unmet_request
from clsr.study.spec.dotted import parse_override
from clsr.study.spec.schema import StudyError

REPO_ROOT = Path(__file__).resolve().parents[4]
SMOKE = REPO_ROOT / "studies" / "smoke.yaml"


def smoke(**resources: float):
    return load_study(str(SMOKE), [parse_override(f"resources.{k}={v}") for k, v in resources.items()])


def test_a_gpu_trial_on_a_machine_without_one_is_refused_naming_request_and_machine():
    study = smoke(gpus_per_worker=1)
    with pytest.raises(StudyError) as err:
        check_resources(study, [Node(cpus=2, gpus=0)], local=True)
    (line,) = err.value.problems
    assert line.startswith(
        f"resources (ablations {', '.join(study.ablations)}): every trial asks for 1 CPU and 1 GPU per "
        "worker, and no node has that (this Ray has 2 CPUs and 0 GPUs); nothing would ever start: set "
        "resources.gpus_per_worker: 0 to train on CPUs"
    )


def test_a_cluster_that_lacks_the_node_is_said_and_waited_for(capsys):
    check_resources(smoke(gpus_per_worker=1), [Node(8, 0), Node(4, 0)], local=False)
    out = capsys.readouterr().out
    assert "no node has that (2 nodes, the largest with 8 CPUs and 0 GPUs)" in out
    assert "wait until the cluster's autoscaler adds such a node" in out


def test_requests_that_fit_pass_and_a_trial_larger_than_the_cluster_is_named():
    assert unmet_request(smoke(), [Node(2, 0)]) is None
    assert unmet_request(smoke(gpus_per_worker=0.125), [Node(16, 1)]) is None  # GCLSR's eight per GPU
    wide = smoke(workers_per_trial=4, gpus_per_worker=1)
    assert unmet_request(wide, [Node(16, 2), Node(16, 1)]) == (
        "every trial asks for 4 workers of 1 CPU and 1 GPU per worker, more than the cluster has in all "
        "(2 nodes, the largest with 16 CPUs and 2 GPUs)"
    )


def test_study_run_refuses_a_gpu_study_here_before_recording_anything(tmp_path):
    """The README's example as a newcomer runs it on a laptop: one line, exit 1, no MLflow run."""
    done = subprocess.run(
        [sys.executable, "-m", "clsr.cli", "study", "run", str(SMOKE), "--set", "resources.gpus_per_worker=1",
         "--set", f"tracking_uri=sqlite:///{tmp_path}/mlflow.db", "--set", f"storage_path={tmp_path}/runs"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={**__import__("os").environ, "CUDA_VISIBLE_DEVICES": ""},
    )  # fmt: skip
    assert done.returncode != 0
    assert "no node has that (this Ray has" in done.stderr and "0 GPUs)" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "runs").exists()


def test_validate_warns_of_a_gpu_study_on_a_machine_without_one(monkeypatch, capsys):
    from clsr.cli import main

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert main(["study", "validate", str(SMOKE), "--set", "resources.gpus_per_worker=1"]) == 0
    out = capsys.readouterr().out
    assert "    warning: resources.gpus_per_worker is 1 and this machine has 0 GPUs (and no RAY_ADDRESS" in out
