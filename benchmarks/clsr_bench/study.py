"""A whole study: wall time, trials per hour, and the share of the time spent outside training steps.

The study runs through ``clsr.study.run.runner.run_study`` on a temporary MLflow store (SQLite) and
temporary Ray storage. The time in training steps comes from what the trainer logs to each trial's
MLflow run (``clsr/train/loop.py``):

* ``loss`` at every step, stamped when the step ends: the gaps between consecutive steps, leaving out
  those that follow a dev evaluation or a flush to MLflow (every ``trainer.log_every`` steps), are pure
  training steps; their mean × steps is the trial's **step time**;
* ``samples_per_s`` at each evaluation = step × batch / seconds since the loop started, so
  step × batch / samples_per_s at the last evaluation is the trial's **loop time** (steps plus the dev
  evaluations, checkpoints and flushes inside the loop); used as step time if no clean gap exists;
* ``trial_wall_s`` at the end: ``fit`` from its start (model, data) to its end (test evaluation, model
  export).

Trials run side by side, so the wall time is shared: outside-steps fraction = 1 − Σ step time /
(wall × the most trials that ran at once, from the MLflow runs' start and end times).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from clsr_bench import format_table


def step_times(client, run) -> dict[str, float | None]:
    """The trial's steps, loop time and step time from its MLflow metrics (see the module docstring)."""
    run_id = run.info.run_id
    params = run.data.params
    evals = sorted(client.get_metric_history(run_id, "samples_per_s"), key=lambda m: m.step)
    losses = sorted(client.get_metric_history(run_id, "loss"), key=lambda m: m.step)
    if not evals or not losses or "trainer.batch_size" not in params:  # a skipped or failed trial
        return {"steps": None, "loop_s": None, "step_s": None}
    batch = int(params["trainer.batch_size"])
    log_every = int(params.get("trainer.log_every", 1))
    last = evals[-1]
    loop_s = last.step * batch / last.value
    eval_steps = {m.step for m in evals}
    gaps = [
        (b.timestamp - a.timestamp) / 1000
        for a, b in zip(losses, losses[1:], strict=False)
        if b.step == a.step + 1 and a.step not in eval_steps and a.step % log_every
    ]
    steps = losses[-1].step
    return {"steps": steps, "loop_s": loop_s, "step_s": float(np.mean(gaps)) * steps if gaps else loop_s}


def most_at_once(intervals: list[tuple[float, float]]) -> int:
    """The largest number of overlapping (start, end) intervals."""
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    running = peak = 0
    for _, change in events:
        running += change
        peak = max(peak, running)
    return max(peak, 1)


def run_study_bench(
    study_path: str = "studies/smoke.yaml", smoke: bool = False, overrides=()
) -> dict[str, Any]:
    """Run the study on a temporary store and return its time figures, overall and per trial."""
    from mlflow.tracking import MlflowClient

    from clsr.study.plan.load import load_study
    from clsr.study.record.reader import study_parent
    from clsr.study.run.runner import run_study
    from clsr.study.spec.dotted import parse_override
    from clsr.tracking.study_runs import children

    with tempfile.TemporaryDirectory(prefix="clsr-bench-study-") as tmp:
        uri = f"sqlite:///{Path(tmp) / 'mlflow.db'}"
        extra = [("tracking_uri", uri), ("storage_path", str(Path(tmp) / "runs"))]
        loading = time.perf_counter()
        study = load_study(study_path, [parse_override(o) for o in overrides] + extra, smoke=smoke)
        validate_s = time.perf_counter() - loading
        client = MlflowClient(uri)  # artifacts in the temporary folder too, not ./mlruns
        client.create_experiment(study.name, artifact_location=(Path(tmp) / "artifacts").as_uri())
        started, started_at = time.perf_counter(), time.time()
        rows = run_study(study, Path(study_path).read_text()).rows
        wall = time.perf_counter() - started
        runs = children(client, study_parent(client, study.name).info.run_id)
        # MLflow stamps a run's start with this machine's clock: compared with this machine's clock only
        first_trial_s = min(r.info.start_time for r in runs) / 1000 - started_at if runs else None
        trials = []
        for run in runs:
            end = run.info.end_time or run.info.start_time
            trials.append(
                {
                    "run": run.info.run_name,
                    "status": run.data.tags.get("clsr.status"),
                    "batch": int(run.data.params.get("trainer.batch_size", 0)),
                    "run_s": (end - run.info.start_time) / 1000,
                    "trial_wall_s": run.data.metrics.get("trial_wall_s"),
                    "checkpoint_s": run.data.metrics.get("trial_checkpoint_s"),
                    "checkpoint_mib": (run.data.metrics.get("trial_checkpoint_bytes") or 0) / 2**20 or None,
                    "checkpoint_wait_s": run.data.metrics.get("trial_checkpoint_wait_s"),
                    **step_times(client, run),
                    "interval": (run.info.start_time / 1000, end / 1000),
                }
            )
    at_once = most_at_once([t.pop("interval") for t in trials])
    in_steps = sum(t["step_s"] or 0.0 for t in trials)
    in_loops = sum(t["loop_s"] or 0.0 for t in trials)
    return {
        "benchmark": "study",
        "study": study.name,
        "file": study_path,
        "smoke": smoke,
        "wall_s": wall,
        "validate_s": validate_s,
        "first_trial_s": first_trial_s,
        "trials": len(rows),
        "trials_per_hour": len(rows) / wall * 3600,
        "trials_at_once": at_once,
        "step_s_total": in_steps,
        "loop_s_total": in_loops,
        "outside_steps_fraction": 1 - in_steps / (wall * at_once),
        "outside_loop_fraction": 1 - in_loops / (wall * at_once),
        "per_trial": trials,
    }


def format_study(f: dict[str, Any]) -> str:
    table = format_table(
        ["trial", "status", "steps", "batch", "run s", "trial_wall_s", "loop s", "steps s", "outside steps"]
        + ["ckpt s", "ckpt MiB", "ckpt wait s"],
        [
            [
                t["run"],
                t["status"],
                t["steps"],
                t["batch"],
                t["run_s"],
                t["trial_wall_s"],
                t["loop_s"],
                t["step_s"],
                f"{1 - t['step_s'] / t['run_s']:.0%}" if t["step_s"] and t["run_s"] else None,
                t.get("checkpoint_s"),
                t.get("checkpoint_mib"),
                t.get("checkpoint_wait_s"),
            ]
            for t in f["per_trial"]
        ],
    )
    return "\n".join(
        [
            f"study {f['study']!r} ({f['file']}{', --smoke' if f['smoke'] else ''}) on a temporary MLflow store",
            "",
            table,
            "",
            f"wall time {f['wall_s']:.1f} s for {f['trials']} trial(s): {f['trials_per_hour']:.1f} trials/hour; "
            f"at most {f['trials_at_once']} at once",
            f"start-up: {f['validate_s']:.1f} s to load and validate the study, then "
            + (f"{f['first_trial_s']:.1f} s" if f["first_trial_s"] is not None else "-")
            + " until the first trial's MLflow run opened (the record, Ray, Tune, the trial's process)",
            f"outside training steps: {f['outside_steps_fraction']:.0%} of wall × {f['trials_at_once']} "
            f"(start-up, data, evaluation, checkpoints, logging); outside the training loop: "
            f"{f['outside_loop_fraction']:.0%}",
            "ckpt s / MiB: seconds spent writing checkpoints and what they wrote, per trial "
            "(trial_checkpoint_s/_bytes); ckpt wait s: how long training waited in the reports that carried "
            "them (the copy to the study's storage, unless trainer.checkpoint_upload: async). "
            "run s: the trial's MLflow run from open to close (Ray Train start-up included); loop s: step × "
            "batch / samples_per_s at the last evaluation (dev evaluations inside); steps s: mean clean "
            "gap between per-step loss stamps × steps.",
        ]
    )
