"""A study as a SLURM job (``platform cluster sbatch``), on a real ``slurmctld``/``slurmd`` on 127.0.0.1
(``tests/support/slurm_daemons.py``): submitted, requeued mid-trial, and stopped by its time limit, each read back
from MLflow. One node only: a multi-node allocation is covered by ``tests/unit/cluster/test_sbatch.py``'s fake ``srun``.

Slow (SLURM, Ray and a study per test): marked ``e2e``; skipped without root or without slurm-wlm/munge.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_e2e import runs_of
from tests.e2e.test_record import statuses
from tests.e2e.test_resilience import tiny_study
from tests.support.slurm_daemons import LocalSlurm, why_unavailable

pytestmark = pytest.mark.e2e

IN_PROCESS = {"resources": {"workers_per_trial": 0, "cpus_per_worker": 1}, "concurrency": 2}


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if why := why_unavailable():
        pytest.skip(why)
    daemons = LocalSlurm(tmp_path_factory.mktemp("slurm"))
    try:
        yield daemons.up()
    finally:
        daemons.down()


def write_script(study_file: Path, *options: str, cpus: int = 2) -> Path:
    script = study_file.parent / "job.sbatch"
    venv = Path(sys.executable).parent
    done = subprocess.run(
        [sys.executable, "-m", "clsr.cli", "cluster", "sbatch", study_file.name, "--gpus-per-node", "0",
         "--cpus-per-node", str(cpus), "--setup", f"export PATH={venv}:$PATH", "--out", str(script), *options],
        cwd=study_file.parent, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return script


def submit(slurm: LocalSlurm, script: Path, uri: str) -> int:
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "PYTHONUNBUFFERED": "1"}
    env.pop("RAY_ADDRESS", None)
    return slurm.submit(script, env=env)


def job_log(script: Path, job: int, name: str) -> str:
    log = script.parent / f"clsr-{name}-{job}.out"
    return log.read_text(errors="replace") if log.exists() else "(no log yet)"


def wait_for(condition, what: str, slurm: LocalSlurm, job: int, log, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        state = slurm.job(job).get("JobState")
        if state not in ("PENDING", "RUNNING", "CONFIGURING"):
            pytest.fail(f"job {job} is {state} before {what}:\n{log()[-4000:]}")
        assert time.monotonic() < deadline, f"timed out waiting for {what}:\n{log()[-4000:]}"
        time.sleep(0.5)


def test_two_jobs_on_one_node_each_finish_their_study(slurm, tmp_path):
    """Two jobs at once on the one node (a CPU each): each Ray has its own folder and ports, each study
    finishes with its runs in MLflow, and each job's Ray folder is gone afterwards."""
    trainer = {"max_steps": 20, "eval_steps": 10, "log_every": 5}
    jobs = {}
    for name in ("first", "second"):
        folder = tmp_path / name
        folder.mkdir()
        grid = {"lr": {"grid": {"trainer.lr": [3.0e-5, 1.0e-4]}}}
        study_file, uri = tiny_study(
            folder, name, trainer, grid, resources=IN_PROCESS["resources"], concurrency=1
        )
        script = write_script(study_file, cpus=1)
        jobs[name] = (submit(slurm, script, uri), script, uri)
    spans = []
    for name, (job, script, uri) in jobs.items():
        fields = slurm.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=600)
        spans.append((fields["StartTime"], fields["EndTime"]))  # ISO times of one slurmctld's clock
        output = job_log(script, job, name)
        assert fields["JobState"] == "COMPLETED", output[-4000:]
        assert f"clsr: job {job} (restart 0) on {slurm.host}: platform study run {name}.yaml" in output
        _, parents, children = runs_of(uri, name)
        assert [(p.info.status, p.data.tags["clsr.status"]) for p in parents] == [("FINISHED", "finished")]
        assert statuses(children) == [("FINISHED", "finished")] * 2
        assert not list(Path("/tmp").glob(f"clsr-ray-{job}-*"))
    ports = [re.search(r"--port=(\d+)", job_log(s, j, n)).group(1) for n, (j, s, _) in jobs.items()]
    assert len(set(ports)) == 2
    assert max(start for start, _ in spans) < min(end for _, end in spans)  # they ran at the same time


def test_a_requeued_job_resumes_and_finishes_without_duplicates(slurm, tmp_path):
    trainer = {"max_steps": 300, "eval_steps": 10, "log_every": 5}
    grid = {"lr": {"grid": {"trainer.lr": [3.0e-5, 1.0e-4]}}}
    study_file, uri = tiny_study(tmp_path, "requeued", trainer, grid, **IN_PROCESS)
    script = write_script(study_file)
    job = submit(slurm, script, uri)
    log = lambda: job_log(script, job, "requeued")  # noqa: E731
    wait_for(lambda: any((tmp_path / "runs").glob("**/checkpoint_*")), "a checkpoint", slurm, job, log)

    slurm.run("scontrol", "requeue", str(job))
    slurm.wait_state(job, {"PENDING"}, timeout=120)
    _, parents, children = runs_of(uri, "requeued")
    assert [(p.info.status, p.data.tags["clsr.status"]) for p in parents] == [("KILLED", "interrupted")], (
        log()
    )
    assert all(status != ("FINISHED", "finished") for status in statuses(children)), log()
    assert all(c.info.status != "RUNNING" for c in children), log()

    slurm.run("scontrol", "update", f"JobId={job}", "StartTime=now")
    fields = slurm.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=600)
    output = log()
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", output[-4000:]
    assert "platform study resume --or-run requeued.yaml" in output
    _, parents, children = runs_of(uri, "requeued")
    assert [(p.info.status, p.data.tags["clsr.status"]) for p in parents] == [("FINISHED", "finished")]
    assert statuses(children) == [("FINISHED", "finished")] * 2  # as a clean run: none twice, none RUNNING


def test_a_job_at_its_time_limit_leaves_a_true_record(slurm, tmp_path):
    """The script asks for SIGTERM ``--grace`` seconds before the limit (``--signal=B:TERM@60``); the
    limit is brought forward once a trial has a checkpoint (``scontrol update TimeLimit=1``, one minute
    from the job's start), so the signal comes within the next seconds, not after a long test."""
    trainer = {
        "max_steps": 20000,
        "epochs": 100,
        "eval_steps": 20,
        "log_every": 10,
    }  # minutes: never ends here
    one = {"one": {"grid": {"method.temperature": [0.05]}}}
    study_file, uri = tiny_study(tmp_path, "limited", trainer, one, **IN_PROCESS)
    script = write_script(study_file, "--time", "10:00", "--grace", "60")
    assert "#SBATCH --signal=B:TERM@60" in script.read_text()
    job = submit(slurm, script, uri)
    log = lambda: job_log(script, job, "limited")  # noqa: E731
    wait_for(lambda: any((tmp_path / "runs").glob("**/checkpoint_*")), "a checkpoint", slurm, job, log)

    slurm.run("scontrol", "update", f"JobId={job}", "TimeLimit=1")
    fields = slurm.wait_state(job, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=300)
    output = log()
    assert "clsr: SIGTERM: stopping the study with a true record" in output, output[-4000:]
    assert fields["ExitCode"] == "143:0", (fields, output[-4000:])
    assert output.count("Continue with: platform study resume limited.yaml") == 1, output[-4000:]
    _, parents, children = runs_of(uri, "limited")
    assert [(p.info.status, p.data.tags["clsr.status"]) for p in parents] == [("KILLED", "interrupted")]
    assert statuses(children) == [("KILLED", "interrupted")]
