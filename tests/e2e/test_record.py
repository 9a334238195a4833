"""A study's record tells the truth: Ctrl-C, SIGTERM, SIGKILL, edited resumes, a second driver, time
limits, deterministic failures and a tracking-server outage, each through the real ``platform`` command,
Ray and MLflow, read back from MLflow afterwards."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
import yaml
from mlflow.tracking import MlflowClient

from clsr.cluster.ports import free_port
from clsr.study.record.lease import read_state
from clsr.tracking.study_runs import run_labels
from tests.e2e.test_e2e import platform_cmd, runs_of
from tests.e2e.test_resilience import tiny_study
from tests.support.stores import sqlite_uri

pytestmark = pytest.mark.e2e

IN_PROCESS = {"resources": {"workers_per_trial": 0, "cpus_per_worker": 1}, "concurrency": 2}
LR_GRID = {"lr": {"grid": {"trainer.lr": [3.0e-5, 1.0e-4]}}}


def wait_for(condition, proc: subprocess.Popen, what: str, timeout: float = 300) -> None:
    deadline = time.time() + timeout
    while not condition():
        if proc.poll() is not None:
            output, _ = proc.communicate()
            pytest.fail(f"the study ended before {what}:\n{output[-3000:]}")
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


def checkpointed(tmp_path: Path, pattern: str = "**/checkpoint_*"):
    return lambda: any((tmp_path / "runs").glob(pattern))


def run(*args: str, tmp_path: Path, uri: str, timeout: float = 900) -> tuple[int, str]:
    proc = platform_cmd(*args, cwd=tmp_path, uri=uri)
    output, _ = proc.communicate(timeout=timeout)
    return proc.returncode, output


def statuses(children) -> list[tuple[str, str]]:
    return sorted((c.info.status, c.data.tags.get("clsr.status")) for c in children)


def test_ctrl_c_twice_records_interrupted_and_resume_finishes_without_duplicates(tmp_path):
    """Ctrl-C (twice) to the driver's process group: exit 130, nothing unfinished marked finished; a
    second driver is refused meanwhile; an edited file is refused on resume with its changes; resume
    finishes with one run per trial; --allow-changes runs only what changed."""
    # long enough that the trials are still training after the second driver's refusal (~10 s) on a
    # busy machine too (400 steps let one trial finish first in CI)
    trainer = {"max_steps": 1200, "eval_steps": 20, "log_every": 5}
    # 'same' is lr's first point again: one trial, whose run stands for both (clsr.also)
    ablations = {**LR_GRID, "same": {"grid": {"trainer.lr": [3.0e-5]}}}
    study_file, uri = tiny_study(tmp_path, "record", trainer, ablations, **IN_PROCESS)
    proc = platform_cmd("study", "run", str(study_file), cwd=tmp_path, uri=uri, start_new_session=True)
    wait_for(checkpointed(tmp_path), proc, "the first checkpoint")

    code, second = run("study", "run", str(study_file), tmp_path=tmp_path, uri=uri)
    assert code == 2 and f"is being run by pid {proc.pid}" in second, second[-2000:]

    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.5)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGINT)  # a second Ctrl-C while the record is written
    output, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, output[-3000:]
    assert output.count(f"Continue with: platform study resume {study_file}") == 1, output[-3000:]
    assert "3 trials, 2 distinct" in output
    assert "lr[trainer.lr=3e-05] seed=1 also stands for same[trainer.lr=3e-05]" in output

    client, parents, children = runs_of(uri, "record")
    assert [(p.info.status, p.data.tags["clsr.status"]) for p in parents] == [("KILLED", "interrupted")]
    assert statuses(children) == [("KILLED", "interrupted")] * 2  # never FINISHED, never RUNNING

    # the edit: lr's 1e-4 becomes 2e-4, 'same' moves to 2e-4 (identical to the new point) and a new
    # ablation repeats 3e-5 (identical to a trial already run)
    edited = yaml.safe_load(study_file.read_text())
    edited["ablations"]["lr"]["grid"]["trainer.lr"] = [3.0e-5, 2.0e-4]
    edited["ablations"]["same"]["grid"]["trainer.lr"] = [2.0e-4]
    edited["ablations"]["again"] = {"grid": {"trainer.lr": [3.0e-5]}}
    edited_file = tmp_path / "edited.yaml"
    edited_file.write_text(yaml.safe_dump(edited, sort_keys=False))
    code, refused = run("study", "resume", str(edited_file), tmp_path=tmp_path, uri=uri)
    assert code == 2, refused[-2000:]
    assert "lr[trainer.lr=0.0002] seed=1" in refused and "2 removed: lr[trainer.lr=0.0001]" in refused
    assert "--allow-changes" in refused and "Traceback" not in refused

    code, resumed = run("study", "resume", str(study_file), tmp_path=tmp_path, uri=uri)
    assert code == 0, resumed[-3000:]
    client, parents, children = runs_of(uri, "record")
    assert [(p.info.status, p.data.tags["clsr.status"]) for p in parents] == [("FINISHED", "finished")]
    assert statuses(children) == [("FINISHED", "finished")] * 2  # as many as a clean run, none twice
    resumed_from = [client.get_metric_history(c.info.run_id, "resumed_from_step") for c in children]
    assert all(len(h) == 1 and h[0].value > 0 for h in resumed_from)  # from checkpoints, not from step 0
    for child in children:  # the steps logged again after the checkpoint were sent by one attempt only
        steps = Counter(m.step for m in client.get_metric_history(child.info.run_id, "loss"))
        assert sorted(steps) == list(range(1, max(steps) + 1)) and set(steps.values()) == {1}, steps
    for child in children:
        assert "clsr.error" not in child.data.tags and "test_sts16" in child.data.metrics
    kept = next(c for c in children if c.data.params["trainer.lr"] == "3e-05")

    code, changed = run("study", "resume", str(edited_file), "--allow-changes", tmp_path=tmp_path, uri=uri)
    assert code == 0, changed[-3000:]
    client, parents, children = runs_of(uri, "record")
    by_lr = {(c.data.params["trainer.lr"], c.data.tags.get("clsr.superseded")): c for c in children}
    assert set(by_lr) == {("3e-05", None), ("0.0001", "v3"), ("0.0002", None)}
    assert by_lr[("0.0002", None)].data.tags["clsr.status"] == "finished"
    unchanged = by_lr[("3e-05", None)]
    assert unchanged.info.run_id == kept.info.run_id  # kept, not run again
    # the kept run stopped standing for the moved point and stands for the added identical one; the new
    # trial stands for both of its points
    assert run_labels(unchanged.data.tags) == [("lr", "trainer.lr=3e-05"), ("again", "trainer.lr=3e-05")]
    assert run_labels(by_lr[("0.0002", None)].data.tags) == [
        ("lr", "trainer.lr=0.0002"),
        ("same", "trainer.lr=0.0002"),
    ]
    assert len(client.get_metric_history(kept.info.run_id, "loss")) == len(
        client.get_metric_history(unchanged.info.run_id, "loss")
    )
    artifacts = {a.path for a in client.list_artifacts(parents[0].info.run_id)}
    assert {"study.yaml", "fingerprint.json", "study-v3.yaml", "fingerprint-v3.json"} <= artifacts


def test_sigterm_to_the_process_group_records_interrupted(tmp_path):
    """What a batch scheduler or a preempted node sends: the whole process group, Ray's own processes
    included, gets SIGTERM; the record still says interrupted and the command exits 143. Once its
    raylet is gone, Ray may end the driver process at once with status 1 (once in CI); that happens
    here every time: the driver is SIGKILLed right after the SIGTERM, and the command's supervisor
    closes the record."""
    import psutil

    trainer = {"max_steps": 400, "eval_steps": 10, "log_every": 5}
    one = {"one": {"grid": {"method.temperature": [0.05]}}}
    study_file, uri = tiny_study(tmp_path, "sigterm", trainer, one)  # one Ray Train worker per trial
    proc = platform_cmd("study", "run", str(study_file), cwd=tmp_path, uri=uri, start_new_session=True)
    wait_for(checkpointed(tmp_path, "**/train-*/checkpoint_*"), proc, "the first checkpoint")
    (driver,) = psutil.Process(proc.pid).children()  # the command runs the study's driver as a child
    os.killpg(proc.pid, signal.SIGTERM)
    time.sleep(0.2)
    with contextlib.suppress(psutil.NoSuchProcess):
        driver.kill()
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, output[-3000:]
    assert "before closing its record; closing it here" in output, output[-3000:]
    _, parents, children = runs_of(uri, "sigterm")
    assert [(p.info.status, p.data.tags["clsr.status"]) for p in parents] == [("KILLED", "interrupted")]
    client = MlflowClient(uri)
    assert read_state(client, parents[0].info.run_id).released  # on its lease run: resume needs no wait
    assert statuses(children) == [("KILLED", "interrupted")]


def test_a_sigkilled_driver_is_taken_over_by_resume(tmp_path, monkeypatch):
    trainer = {"max_steps": 400, "eval_steps": 10, "log_every": 5}
    one = {"one": {"grid": {"method.temperature": [0.05]}}}
    study_file, uri = tiny_study(tmp_path, "killed", trainer, one, **IN_PROCESS)
    # Tune snapshots its experiment state (which checkpoint each trial has) every 10 s by default: a driver
    # killed sooner restarts the trial from scratch. Snapshot every second, and kill after two of them.
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "1")
    proc = platform_cmd("study", "run", str(study_file), cwd=tmp_path, uri=uri, start_new_session=True)
    monkeypatch.delenv("TUNE_GLOBAL_CHECKPOINT_S")
    wait_for(checkpointed(tmp_path), proc, "the first checkpoint")
    time.sleep(2.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    _, parents, children = runs_of(uri, "killed")
    assert parents[0].info.status == "RUNNING" and children[0].info.status == "RUNNING"
    # Tune copies its state to storage in place, in the background: a kill during that copy leaves the
    # storage files truncated (once in CI, which Tune's restore then took for a new experiment with no
    # trials). Leave them so here; the resume takes the killed driver's complete staging copies.
    (experiment,) = (tmp_path / "runs").glob("killed-*/grid")
    truncated = [*experiment.glob("experiment_state-*.json"), *experiment.glob("basic-variant-state-*.json")]
    assert len(truncated) == 2
    for state in truncated:
        state.write_bytes(state.read_bytes()[:20])
    # ... and as if Tune had registered the trial's next checkpoint (deleting the one its saved state
    # names: num_to_keep=1) just before the kill: the resume continues from that newer one under the old
    # name (the race that made Tune's restore fail the trial on every resume: "Could not recover from
    # checkpoint ... does not exist on storage anymore")
    *older, newest = sorted(experiment.glob("run_trial_*/checkpoint_*"))
    for folder in older:
        shutil.rmtree(folder)
    newer = newest.with_name(f"checkpoint_{int(newest.name.split('_')[1]) + 1:06d}")
    newest.rename(newer)

    code, output = run("study", "run", str(study_file), tmp_path=tmp_path, uri=uri)
    assert code == 2 and "stopped without closing" in output and "study resume" in output, output[-2000:]
    code, output = run("study", "resume", str(study_file), tmp_path=tmp_path, uri=uri)
    assert code == 0, output[-3000:]
    assert "closed 1 run(s) a stopped driver had left RUNNING" in output
    assert output.count("restored from the stopped driver's copy") == 2, output[-3000:]
    assert f"is gone; the newer {newer} takes its place" in output, output[-3000:]
    client, parents, children = runs_of(uri, "killed")
    assert [(p.info.status, p.data.tags["clsr.status"]) for p in parents] == [("FINISHED", "finished")]
    assert statuses(children) == [("FINISHED", "finished")]
    assert client.get_metric_history(children[0].info.run_id, "resumed_from_step")[0].value > 0


def test_a_trial_past_its_time_limit_and_a_diverging_trial_end_once_while_the_others_finish(tmp_path):
    """In-process trials that Tune retries (max_failures 2): the diverging trial is not retried (its
    first step was logged once), the slow one is stopped at trial_timeout_s and stays stopped, the quick
    one finishes. (Ray Train workers: test_resilience.py.)"""
    trainer = {"max_steps": 4, "eval_steps": 2, "log_every": 1}
    points = {
        "cases": {
            "points": [
                {"label": "quick", "set": {"trainer.max_steps": 4}},
                {"label": "slow", "set": {"trainer.max_steps": 100000, "trainer.epochs": 10000}},
                {"label": "diverges", "set": {"trainer.lr": 1.0e30}},
            ]
        }
    }
    study_file, uri = tiny_study(
        tmp_path, "limits", trainer, points, max_failures=2, trial_timeout_s=30, **IN_PROCESS
    )
    code, output = run("study", "run", str(study_file), tmp_path=tmp_path, uri=uri)
    assert code == 1, output[-3000:]
    client, parents, children = runs_of(uri, "limits")
    assert parents[0].info.status == "FINISHED"
    by_point = {c.data.tags["clsr.point"]: c for c in children}
    assert (by_point["quick"].info.status, by_point["quick"].data.tags["clsr.status"]) == (
        "FINISHED",
        "finished",
    )
    slow = by_point["slow"]
    assert (slow.info.status, slow.data.tags["clsr.status"]) == ("KILLED", "timed_out")
    assert "trial_timeout_s=30" in slow.data.tags["clsr.error"]
    diverged = by_point["diverges"]
    assert (diverged.info.status, diverged.data.tags["clsr.status"]) == ("FAILED", "failed")
    assert "loss became" in diverged.data.tags["clsr.error"]
    first_steps = [m.step for m in client.get_metric_history(diverged.info.run_id, "loss")]
    assert first_steps.count(1) == 1  # one attempt: a retry would have logged step 1 again
    assert not client.get_metric_history(diverged.info.run_id, "resumed_from_step")


# --- a tracking-server outage longer than MLflow's own retries ----------------------------------------

OUTAGE_S = 45  # well past the MLflow client's retries, which the test shortens to about 7 s (below)
CLIENT_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "3", "MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR": "1"}


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 over a SQLite store, stopped and started again on the same port."""

    def __init__(self, folder: Path):
        self.folder, self.port = folder, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        cmd = [
            sys.executable, "-m", "mlflow", "server",
            "--backend-store-uri", sqlite_uri(self.folder / "server.db"),
            "--artifacts-destination", str(self.folder / "artifacts"),
            "--host", "127.0.0.1", "--port", str(self.port), "--workers", "1",
        ]  # fmt: skip
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        log = open(self.folder / "server.log", "a")  # noqa: SIM115 (the server writes it while it runs)
        self.proc = subprocess.Popen(
            cmd, cwd=self.folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 120
        while True:
            assert self.proc.poll() is None, (self.folder / "server.log").read_text()[-3000:]
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{self.url}/health", timeout=5):
                return
            assert time.monotonic() < deadline, "mlflow server did not start"
            time.sleep(0.5)

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=30)
        self.proc = None


def record_of(uri: str, experiment: str) -> dict[str, dict]:
    """Per trial: params, tag names, and every metric point as (key, step) with its count."""
    client, _, children = runs_of(uri, experiment)
    record = {}
    for child in children:
        points = Counter()
        for key in child.data.metrics:
            points.update((key, m.step) for m in client.get_metric_history(child.info.run_id, key))
        record[child.data.tags["clsr.point"]] = {
            "status": (child.info.status, child.data.tags["clsr.status"]),
            "params": child.data.params,
            "tags": sorted(k for k in child.data.tags if not k.startswith("mlflow.")),
            "points": points,
        }
    return record


def test_a_tracking_server_outage_past_mlflows_retries_loses_no_trial_and_no_number(tmp_path, monkeypatch):
    """Stop the MLflow server mid-study for longer than its client's retries, with the trials finishing
    meanwhile; start it again on the same store: the study finishes, and each trial has every metric
    point, param and tag a clean run has, none twice. The client's retries (about two minutes by default)
    are shortened to about 7 s (1 + 2 + 4 s of back-off), so a 45 s outage is well past them."""
    for key, value in CLIENT_RETRIES.items():
        monkeypatch.setenv(key, value)  # the study's processes (driver, Ray, trials) inherit them
    server = MlflowServer(tmp_path)
    server.start()
    try:
        trainer = {"max_steps": 200, "eval_steps": 20, "log_every": 5}
        study_file, _ = tiny_study(
            tmp_path, "outage", trainer, LR_GRID, system_metrics_interval_s=None, **IN_PROCESS
        )
        proc = platform_cmd("study", "run", str(study_file), cwd=tmp_path, uri=server.url)

        def logging_started() -> bool:
            _, _, children = runs_of(server.url, "outage")
            return len(children) == 2 and all("loss" in c.data.metrics for c in children)

        wait_for(logging_started, proc, "both trials logging")
        server.stop()
        stopped = time.monotonic()
        time.sleep(OUTAGE_S)
        _, _, children = runs_of(sqlite_uri(tmp_path / "server.db"), "outage")
        assert proc.poll() is None  # the driver waits for the server
        server.start()
        output, _ = proc.communicate(timeout=900)
        assert proc.returncode == 0, output[-3000:]
        assert time.monotonic() - stopped > OUTAGE_S
        outage = record_of(server.url, "outage")

        clean_file = tmp_path / "clean.yaml"
        clean_file.write_text(study_file.read_text().replace("name: outage", "name: clean"))
        code, clean_output = run("study", "run", str(clean_file), tmp_path=tmp_path, uri=server.url)
        assert code == 0, clean_output[-3000:]
        clean = record_of(server.url, "clean")
    finally:
        server.stop()
    assert "MLflow write(s) that trials had kept while the tracking server was unreachable" in output
    assert sorted(outage) == sorted(clean) and len(outage) == 2
    for point, trial in outage.items():
        assert trial["status"] == ("FINISHED", "finished")
        assert trial["params"] == clean[point]["params"]
        assert trial["tags"] == clean[point]["tags"]
        # every (key, step) exactly as often as in the clean run: nothing lost, nothing twice
        assert trial["points"] == clean[point]["points"]
        assert trial["points"][("loss", 200)] == 1 and len(trial["points"]) > 400


DASHBOARD_PROBE = """
import json, os, stat, sys, urllib.error, urllib.request
import ray
from clsr.study.control.ray_session import init_ray, private_token

url = init_ray()
token = private_token().read_text().strip()
codes = {}
for name, headers in (("anonymous", {}), ("token", {"Authorization": f"Bearer {token}"})):
    request = urllib.request.Request(f"http://{url}/api/jobs/", headers=headers)
    try:
        codes[name] = urllib.request.urlopen(request, timeout=30).status
    except urllib.error.HTTPError as err:
        codes[name] = err.code
mode = stat.S_IMODE(os.stat(private_token()).st_mode)
ray.shutdown()
print(json.dumps({"url": url, "codes": codes, "mode": mode}))
"""


def test_the_local_dashboard_listens_on_loopback_and_runs_no_code_without_the_users_token(tmp_path):
    """The local Ray's dashboard (kept for the state API that frees a stopped trial's resources): its job
    API, which runs any code it is sent, answers only on 127.0.0.1 and only with the user's token, kept
    in a file no other user can read."""
    import json

    env = {**os.environ, "RAY_AUTH_TOKEN_PATH": str(tmp_path / "token")}
    for key in ("RAY_ADDRESS", "RAY_AUTH_MODE"):
        env.pop(key, None)
    probe = subprocess.run(
        [sys.executable, "-c", DASHBOARD_PROBE], env=env, capture_output=True, text=True, timeout=300
    )
    assert probe.returncode == 0, probe.stderr[-3000:]
    found = json.loads(probe.stdout.strip().splitlines()[-1])
    assert found["url"].startswith("127.0.0.1:")
    assert found["codes"] == {"anonymous": 401, "token": 200}
    assert found["mode"] == 0o600
