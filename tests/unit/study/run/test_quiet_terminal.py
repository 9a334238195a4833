"""A quiet terminal for ``platform study run``: Ray's and Tune's output in ``driver.log``, the platform's
own progress table and summary on the terminal (``clsr.study.run.progress``)."""

from __future__ import annotations

import logging
import pickle
from pathlib import Path
from types import SimpleNamespace

import pytest

from clsr.study.run.progress import (
    ELLIPSIS,
    DriverLog,
    Progress,
    error_line,
    log_path,
    progress_table,
    shorten,
    trial_label,
    trial_status,
)

SUMMARY_HEADER = "ablation    | point                   | seed | status   | best_dev_stsb | test_sts_avg"


def point(label="method.temperature=0.05", ablation="temperature", seed=1, **extra):
    return {
        "ablation": ablation,
        "label": label,
        "overrides": {},
        "paper": {},
        "seed": seed,
        "also": [],
        **extra,
    }


def trial(p, status="RUNNING", result=None, trial_id="56d0f_00000", error_file=None):
    return SimpleNamespace(
        config={"point": p}, status=status, last_result=result or {}, trial_id=trial_id, error_file=error_file
    )


def test_a_long_label_is_cut_in_the_middle_at_an_ellipsis():
    assert shorten("short", 10) == "short"
    text = "method.temperature=0.05, trainer.lr=3e-05, trainer.batch_size=64"
    cut = shorten(text, 30)
    assert len(cut) == 30 and ELLIPSIS in cut
    assert cut == "method.temperat….batch_size=64"  # its start and its end


def test_trial_labels_name_the_point_as_trial_keys_do():
    assert trial_label(point()) == "temperature[method.temperature=0.05]"
    sampled = point(label=None, ablation="lr", overrides={"trainer.lr": 3.123456e-05, "method.pooler": "cls"})
    assert trial_label(sampled) == "lr[trainer.lr=3.123e-05, method.pooler=cls]"
    merged = point(also=[["same", "trainer.lr=3e-05"], ["other", "x=1"]])
    assert trial_label(merged) == "temperature[method.temperature=0.05] (+2 identical)"


def test_statuses_in_the_platforms_words():
    assert trial_status("TERMINATED", {"finished": 1}) == "finished"
    assert trial_status("TERMINATED", {"step": 4}) == "ended early"  # ASHA, a time limit, a NaN loss
    assert trial_status("ERROR", {}) == "error"
    assert trial_status("RUNNING", {}) == "running" and trial_status("PENDING", {}) == "pending"


def test_the_progress_table_aligns_its_columns_and_keeps_whole_labels_that_fit():
    rows = [
        {"label": "temperature[method.temperature=0.05]", "seed": 1, "step": 4, "total": 8, "score": 85.587,
         "status": "running"},
        {"label": "temperature[method.temperature=0.1]", "seed": 42, "step": None, "total": None, "score": None,
         "status": "pending"},
    ]  # fmt: skip
    lines = progress_table(rows, "best_dev_stsb", width=120)
    assert lines[0].split() == ["point", "seed", "step", "best_dev_stsb", "status"]
    assert lines[1].split() == ["temperature[method.temperature=0.05]", "1", "4/8", "85.59", "running"]
    assert lines[2].split() == ["temperature[method.temperature=0.1]", "42", "-", "-", "pending"]
    assert len({line.index(" seed") if i == 0 else None for i, line in enumerate(lines)}) == 2
    assert lines[0].index("status") == lines[1].index("running") == lines[2].index("pending")


def test_a_narrow_terminal_cuts_labels_with_an_ellipsis_never_below_a_sane_width():
    label = "augment[" + ", ".join(f"augment.p{i}=0.{i}" for i in range(12)) + "]"
    rows = [{"label": label, "seed": 1, "step": 1, "total": 10, "score": 1.0, "status": "running"}]
    narrow = progress_table(rows, "dev", width=60)[1]
    assert ELLIPSIS in narrow and narrow.strip().startswith("augment[augment…") and "p11=0.11]" in narrow
    assert len(narrow) <= 60
    tiny = progress_table(rows, "dev", width=10)[1]
    assert tiny.split("  ")[1] == "augment[augm…t.p11=0.11]"  # 24 characters at least


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_tables_come_on_change_at_most_every_30_s_and_once_at_the_end():
    printed, clock = [], Clock()
    progress = Progress("grid", "best_dev_stsb", {"temperature": 8}, clock=clock, out=printed.append)
    a, b = trial(point()), trial(point("method.temperature=0.1"), trial_id="56d0f_00001")
    a.status = b.status = "PENDING"
    progress.on_step_end(1, [a, b])
    assert printed == []  # nothing started yet
    a.status = "RUNNING"
    progress.on_step_end(2, [a, b])
    assert printed[0].endswith("grid: 1 running, 1 pending") and len(printed) == 4
    b.status = "RUNNING"
    clock.now = 10
    progress.on_step_end(3, [a, b])
    assert len(printed) == 4  # changed, but within 30 s of the last table
    clock.now = 31
    progress.on_step_end(4, [a, b])
    assert len(printed) == 8 and printed[4].endswith("grid: 2 running")
    clock.now = 70
    progress.on_step_end(5, [a, b])
    assert len(printed) == 8  # nothing changed: no table
    a.last_result = b.last_result = {"step": 8, "finished": 1, "best_dev_stsb": 85.66}
    a.status = b.status = "TERMINATED"
    clock.now = 71
    progress.on_experiment_end([a, b])
    assert printed[8].endswith("grid: 2 finished")
    assert printed[10].split()[-3:] == ["8/8", "85.66", "finished"]


def test_a_large_experiment_shows_its_running_trials_first_and_counts_the_rest():
    trials = [trial(point(f"x={i}"), status="TERMINATED", result={"finished": 1}) for i in range(30)]
    trials[25].status = "RUNNING"
    lines = Progress("grid", "dev", out=lambda _: None).table(trials, width=100)
    assert lines[0].endswith("grid: 1 running, 29 finished")
    assert "temperature[x=25]" in lines[2] and lines[-1].strip() == f"{ELLIPSIS} and 10 more trial(s)"
    assert len(lines) == 1 + 1 + 20 + 1


def test_a_failed_trial_is_one_line_with_its_error_and_where_the_traceback_is(tmp_path):
    error = tmp_path / "error.txt"
    error.write_text(
        "Traceback (most recent call last):\n  File x\nRuntimeError: loss became nan at step 2\n"
    )
    printed = []
    progress = Progress("grid", "dev", out=printed.append)
    progress.on_trial_error(3, [], trial(point(), status="ERROR", error_file=str(error)))
    assert printed == [
        f"trial temperature[method.temperature=0.05] seed 1 failed: RuntimeError: loss became nan at step 2; "
        f"full traceback: {error}"
    ]
    progress.on_trial_recover(3, [], trial(point(), error_file=None))
    assert (
        printed[1]
        == "trial temperature[method.temperature=0.05] seed 1 failed, retrying from its last checkpoint"
    )
    assert error_line("a[b]", 2, str(tmp_path / "missing.txt")).startswith("trial a[b] seed 2 failed; full")
    stored = trial(point(), status="ERROR", error_file=str(error))
    stored.path = "/data/runs/smoke-1/grid/run_trial_0"  # the trial's folder in the study's storage
    progress.on_trial_error(3, [], stored)
    assert printed[2].endswith("at step 2; full traceback: /data/runs/smoke-1/grid/run_trial_0/error.txt")


def test_the_callback_takes_the_place_of_tunes_own_trial_printer():
    from ray.tune.progress_reporter import TrialProgressCallback
    from ray.tune.utils.callback import _create_default_callbacks

    progress = Progress("grid", "dev")
    callbacks = _create_default_callbacks([progress], air_verbosity=None)
    assert [c for c in callbacks if isinstance(c, TrialProgressCallback)] == [progress]


def test_the_callback_pickles_with_tunes_experiment_state_without_its_running_state():
    printed = []
    progress = Progress("grid", "dev", {"a": 8}, out=printed.append)
    progress.on_step_end(1, [trial(point())])
    copy = pickle.loads(pickle.dumps(progress))
    assert copy.max_steps == {"a": 8} and copy._shown is None and copy.out is None


def test_the_driver_log_lies_in_the_study_folder_or_beside_it_for_cloud_storage(tmp_path):
    assert log_path("/data/runs/smoke-20260101-000000-abcdef") == Path(
        "/data/runs/smoke-20260101-000000-abcdef/driver.log"
    )
    assert log_path("file:///data/runs/s") == Path("/data/runs/s/driver.log")
    assert log_path("s3://bucket/runs/s-1/", private=tmp_path) == tmp_path / "runs" / "s-1" / "driver.log"


def test_ray_and_tune_records_go_to_the_file_and_errors_are_said_in_one_line(tmp_path, capsys):
    echoed = []
    log = DriverLog(echo=echoed.append)
    log.start()
    try:
        logging.getLogger("ray").warning("Token authentication is enabled for this Ray cluster")
        log.open(tmp_path / "driver.log")
        logging.getLogger("ray.tune.tune").warning("Resume experiment with: Tuner.restore(path=...)")
        logging.getLogger("ray.tune.execution").error("Trial task failed for trial x\nTraceback ...")
        logging.getLogger("ray.tune.tune").error("Experiment state snapshotting failed:\nTraceback ...")
        log.worker_output({"pid": 7, "actor_name": "RayTrainWorker", "is_err": True, "lines": [
            "Reporting training result 1: TrainingReport(checkpoint=None, metrics={})",
            "/x/platform/clsr/train/evaluator.py:80: UserWarning: the trained model could not be logged: E",
            "MLflow unreachable while logging metrics (ConnectionError); retrying in 5 s",
        ]})  # fmt: skip
        log.ray_message(
            {"pid": "raylet", "lines": ["WARNING: 8 PYTHON worker processes have been started on node: x"]}
        )
        log.ray_message(
            {"pid": "raylet", "lines": ["Task was killed due to the node running low on memory.\nMore"]}
        )
    finally:
        log.close()
    out = capsys.readouterr()
    assert "Tuner.restore" not in out.out + out.err and "TrainingReport(" not in out.out + out.err
    assert out.out == f"Ray's and Tune's logs: {tmp_path / 'driver.log'} (--verbose shows them here)\n"
    text = (tmp_path / "driver.log").read_text()
    for line in (
        "Token authentication",
        "Tuner.restore",
        "TrainingReport(",
        "PYTHON worker processes",
        "low on memory",
    ):
        assert line in text, line
    assert "(RayTrainWorker pid=7) Reporting training result 1" in text
    where = tmp_path / "driver.log"
    assert echoed == [
        f"ray: Experiment state snapshotting failed: (details in {where})",
        "/x/platform/clsr/train/evaluator.py:80: UserWarning: the trained model could not be logged: E",
        "MLflow unreachable while logging metrics (ConnectionError); retrying in 5 s",
        f"ray: Task was killed due to the node running low on memory. (details in {where})",
    ]
    handlers = [type(h).__name__ for h in logging.getLogger("ray").handlers]
    assert "PlainRayHandler" in handlers and "_Records" not in handlers  # Ray's handler is put back


def test_records_before_the_study_folder_is_known_reach_stderr_if_it_never_is(capsys):
    log = DriverLog(echo=lambda _: None)
    log.start()
    logging.getLogger("ray").warning("an early warning")
    log.close()
    assert "an early warning" in capsys.readouterr().err


def test_study_run_and_resume_take_verbose():
    from clsr.cli import _parser

    for action in ("run", "resume"):
        assert _parser().parse_args(["study", action, "s.yaml", "--verbose"]).verbose is True
        assert _parser().parse_args(["study", action, "s.yaml"]).verbose is False


@pytest.mark.e2e
@pytest.mark.parallel
@pytest.mark.xdist_group("smoke_study")
def test_the_smoke_studys_terminal_is_short_and_ends_with_the_summary(smoke_study):
    """``platform study run studies/smoke.yaml`` without --verbose (the shared smoke study's output)."""
    output = smoke_study.output
    lines = output.rstrip().splitlines()
    assert len(lines) < 60, output
    assert "Tuner.restore" not in output and "TrainingReport(" not in output, output
    assert "(raylet)" not in output and "core_worker" not in output and "tensorboard" not in output, output
    assert lines[-4:-2] == [SUMMARY_HEADER, "-" * len(SUMMARY_HEADER)], output
    assert all(line.startswith("temperature | method.temperature=0") for line in lines[-2:]), output
    assert "temperature[method.temperature=0.05]" in output and "8/8" in output  # the progress table
    (log,) = (smoke_study.folder / "runs").glob("smoke-*/driver.log")
    assert f"Ray's and Tune's logs: {log}" in output
    assert "TrainingReport(" in log.read_text()  # the workers' output is there
