"""Issue 55: where a run's environment comes from besides this process: NVML (through a stand-in module:
CI has no GPU; no driver is never a failure), a diff with a credential in it, and the study driver's
environment on the parent run, read back from MLflow."""

from __future__ import annotations

import sys
import types
from pathlib import Path

from mlflow.tracking import MlflowClient

from clsr.tracking import environment
from clsr.tracking.environment import MAX_DIFF_BYTES, capped, capture, gpus
from clsr.tracking.study_runs import start_parent_run
from tests.support.stores import sqlite_uri


def test_the_diff_is_capped_and_masked():
    assert capped("url = http://me:hunter2@host\n") == "url = http://me:***@host\n"
    big = capped("x" * (MAX_DIFF_BYTES + 10))
    assert big.startswith("x" * 1000) and big.count("x") == MAX_DIFF_BYTES
    assert big.endswith(f"# clsr: diff cut at {MAX_DIFF_BYTES} bytes of {MAX_DIFF_BYTES + 10}\n")


def fake_nvml(names: list[str], fail: bool = False) -> types.ModuleType:
    nv = types.ModuleType("pynvml")

    def init():
        if fail:
            raise RuntimeError("NVML Shared Library Not Found")

    nv.nvmlInit, nv.nvmlShutdown = init, lambda: None
    nv.nvmlDeviceGetCount = lambda: len(names)
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetName = lambda h: names[h].encode()  # older pynvml returns bytes
    nv.nvmlSystemGetDriverVersion = lambda: "570.86.15"
    return nv


def test_the_drivers_gpus_and_driver_come_from_nvml_and_no_gpu_is_none(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml(["NVIDIA H100 80GB HBM3"] * 2))
    assert gpus(None) == ("NVIDIA H100 80GB HBM3", 2)
    assert environment.nvml_driver() == "570.86.15"
    assert gpus("cpu") == ("none", 0)
    monkeypatch.setitem(sys.modules, "pynvml", fake_nvml([], fail=True))  # no driver: never a failure
    assert gpus(None) == ("none", 0) and environment.nvml_driver() == "none"


def test_the_parent_run_gets_the_drivers_environment(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    run = client.get_run(start_parent_run(client, "env", str(tmp_path / "runs"), None))
    assert {k: v for k, v in run.data.params.items() if k.startswith("env.")} == capture(None).params()
    lock = Path(client.download_artifacts(run.info.run_id, "environment/environment.txt", str(tmp_path)))
    assert lock.read_text() == capture(None).lock_text()
