"""A user's own method in a ``.py`` file beside their study, in a folder outside the repository: validated,
run through Ray Tune and MLflow (the file's hash in the record, the file as an artifact, the Ray worker
importing the driver's shipped copy), and resumed after an edit of the file (its trial reruns)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from clsr.config.method_source import file_module_name
from clsr.tracking.tags import SUPERSEDED_TAG
from tests.e2e.test_e2e import platform_cmd, runs_of
from tests.support.stores import sqlite_uri

pytestmark = [pytest.mark.e2e, pytest.mark.parallel, pytest.mark.minutes(4)]
REPO_ROOT = Path(__file__).resolve().parents[2]

MY_METHOD = """\
from clsr.methods.simcse_unsup import SimCSEUnsup

print(f"my_method loaded from {__file__}", flush=True)


class MyLoss(SimCSEUnsup):
    \"\"\"Unsupervised SimCSE's loss, as a user's own.\"\"\"
"""
STUDY = """\
name: own-method
method: ./my_method.py:MyLoss
base:
  model: {name: minilm, pooling: avg, mlp_only_train: false, max_seq_length: 32}
  data: {train: wiki1m, max_rows: 64}
  trainer: {batch_size: 16, max_steps: 2, eval_steps: 2, log_every: 1}
  eval: {tasks: [stsb], sts_max_pairs: 100, alignment_uniformity: false, log_model: false}
ablations:
  mine:
    grid: {method.temperature: [0.05]}
seeds: [1]
metric: best_dev_stsb
resources: {workers_per_trial: 0, cpus_per_worker: 1}
system_metrics_interval_s: null
"""


def platform(folder: Path, uri: str, *args: str) -> str:
    proc = platform_cmd(*args, cwd=folder, uri=uri)
    output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output[-3000:]
    return output


def driver_logs(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in sorted((folder / "runs").rglob("driver.log")))


def test_a_method_in_a_file_beside_the_study_runs_is_recorded_and_resumed_after_an_edit(tmp_path):
    assert REPO_ROOT not in tmp_path.parents
    folder, work = tmp_path / "my-study", tmp_path / "elsewhere"  # run from another folder than the study's
    folder.mkdir()
    work.mkdir()
    method = folder / "my_method.py"
    method.write_text(MY_METHOD)
    (folder / "study.yaml").write_text(STUDY + f"storage_path: {tmp_path / 'runs'}\n")
    uri = sqlite_uri(tmp_path / "mlflow.db")
    study = str(folder / "study.yaml")

    assert "1 trial" in platform(work, uri, "study", "validate", study)
    platform(work, uri, "study", "run", study)
    _, parents, children = runs_of(uri, "own-method")
    (run,) = children
    params = run.data.params
    assert params["method.name"] == f"{method}:MyLoss"
    assert params["method.source"] == "file"
    assert params["method.sha256"] == hashlib.sha256(MY_METHOD.encode()).hexdigest()
    assert run.data.tags["clsr.status"] == "finished" and 0 < run.data.metrics["test_stsb"] < 100
    client = runs_of(uri, "own-method")[0]
    local = client.download_artifacts(run.info.run_id, "method/my_method.py", str(tmp_path / "got"))
    assert Path(local).read_text() == MY_METHOD
    # the trial (a Ray worker) imported the driver's copy that Ray shipped, not the file
    shipped = "runtime_resources/py_modules_files/_ray_pkg_"
    loaded = [line for line in driver_logs(tmp_path).splitlines() if "my_method loaded from" in line]
    assert loaded and all(shipped in line for line in loaded), loaded
    assert all(f"/{file_module_name(method)}/__init__.py" in line for line in loaded)

    method.write_text(MY_METHOD + "# the loss, reweighted\n")
    refused = platform_cmd("study", "resume", study, cwd=work, uri=uri)
    output, _ = refused.communicate(timeout=900)
    assert refused.returncode != 0 and "1 changed: mine[method.temperature=0.05] seed=1" in output, output
    assert f"the method {method}:MyLoss changed" in output  # the file, not only the study, is named
    platform(work, uri, "study", "resume", study, "--allow-changes")
    _, _, children = runs_of(uri, "own-method")
    assert len(children) == 2
    old = next(r for r in children if r.info.run_id == run.info.run_id)
    new = next(r for r in children if r.info.run_id != run.info.run_id)
    assert SUPERSEDED_TAG in old.data.tags and SUPERSEDED_TAG not in new.data.tags
    assert new.data.params["method.sha256"] == hashlib.sha256(method.read_bytes()).hexdigest()
    assert new.data.tags["clsr.status"] == "finished"
