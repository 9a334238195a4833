"""MLflow runs of a study: one parent run, one child run per trial, found again on resume.

Run identity lives in MLflow itself: the parent carries ``clsr.study`` and ``clsr.storage``; a child
carries ``clsr.trial_id`` and ``mlflow.parentRunId``. A resumed study or a retried trial looks its
run up by those tags and logs into it, so no run is ever duplicated.
"""

from __future__ import annotations

import os
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from mlflow.entities import Param, RunStatus
from mlflow.tracking import MlflowClient

import clsr
from clsr.study.dotted import flatten

PARENT_TAG, STORAGE_TAG, TRIAL_TAG = "clsr.study", "clsr.storage", "clsr.trial_id"
CHECKPOINT_TAG = "clsr.checkpoint"  # a finished trial's last checkpoint (local path or URI)
MAX_PARAM_LENGTH = 6000


def resolve_tracking_uri(configured: str | None) -> str:
    uri = configured or os.environ.get("MLFLOW_TRACKING_URI") or "sqlite:///mlflow.db"
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        # Ray runs trials in other working directories: pin relative SQLite paths to this one.
        uri = "sqlite:///" + str(Path(uri.removeprefix("sqlite:///")).resolve())
    return uri


def check_reachable(uri: str) -> None:
    """Fail before any training when the tracking server cannot be reached."""
    if uri.startswith(("http://", "https://")):
        try:
            urllib.request.urlopen(uri.rstrip("/") + "/health", timeout=5)
        except (urllib.error.URLError, OSError) as err:
            raise ConnectionError(
                f"MLflow tracking server {uri} is unreachable ({err}). Start it (`mlflow server ...`), "
                f"forward its port (`ray attach cluster.yaml -p 5000`), or unset MLFLOW_TRACKING_URI "
                f"to log into a local sqlite:///mlflow.db"
            ) from err
    elif uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)


def git_commit() -> str:
    try:
        source = Path(clsr.__file__).resolve().parent  # the platform's own checkout, not the cwd
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=5, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def experiment_id(client: MlflowClient, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    return experiment.experiment_id if experiment else client.create_experiment(name)


def start_parent_run(client: MlflowClient, study_name: str, storage: str, description: str | None) -> str:
    run = client.create_run(
        experiment_id(client, study_name),
        run_name=study_name,
        tags={
            PARENT_TAG: study_name,
            STORAGE_TAG: storage,
            "clsr.git_commit": git_commit(),
            "clsr.version": clsr.__version__,
            "mlflow.note.content": description or "",
        },
    )
    return run.info.run_id


def find_parent_run(client: MlflowClient, study_name: str):
    """The latest parent run of a study, or None."""
    experiment = client.get_experiment_by_name(study_name)
    if experiment is None:
        return None
    runs = client.search_runs(
        [experiment.experiment_id],
        f"tags.`{PARENT_TAG}` = '{study_name}'",
        order_by=["attributes.start_time DESC"],
        max_results=1,
    )
    return runs[0] if runs else None


def child_run_for_trial(client: MlflowClient, experiment: str, parent_run_id: str, trial_id: str):
    runs = client.search_runs(
        [experiment], f"tags.`{TRIAL_TAG}` = '{trial_id}' and tags.`mlflow.parentRunId` = '{parent_run_id}'"
    )
    return runs[0] if runs else None


def open_child_run(
    uri: str, parent_run_id: str, trial_id: str, run_name: str, tags: dict[str, Any], params: dict[str, Any]
) -> str:
    """Create the trial's run, or reopen it when the trial is resumed or retried."""
    client = MlflowClient(uri)
    experiment = client.get_run(parent_run_id).info.experiment_id
    existing = child_run_for_trial(client, experiment, parent_run_id, trial_id)
    if existing is not None:
        client.update_run(existing.info.run_id, status="RUNNING")
        client.set_tag(existing.info.run_id, "clsr.status", "running")
        return existing.info.run_id
    all_tags = {"mlflow.parentRunId": parent_run_id, TRIAL_TAG: trial_id, "clsr.status": "running", **tags}
    run = client.create_run(experiment, run_name=run_name, tags={k: str(v) for k, v in all_tags.items()})
    flat = [Param(k, str(v)[:MAX_PARAM_LENGTH]) for k, v in flatten(params).items()]
    for start in range(0, len(flat), 100):  # MLflow's per-request param limit
        client.log_batch(run.info.run_id, params=flat[start : start + 100])
    return run.info.run_id


def close_run(uri: str, run_id: str, status: str, error: str | None = None) -> None:
    """``status``: finished, failed, stopped (early stopping), skipped or interrupted."""
    client = MlflowClient(uri)
    client.set_tag(run_id, "clsr.status", status)
    if error:
        client.set_tag(run_id, "clsr.error", error[-5000:])
    mlflow_status = {"finished": "FINISHED", "stopped": "FINISHED", "failed": "FAILED"}.get(status, "KILLED")
    client.set_terminated(run_id, status=mlflow_status)


def open_children(client: MlflowClient, parent_run_id: str) -> list:
    running = RunStatus.to_string(RunStatus.RUNNING)
    return [r for r in children(client, parent_run_id) if r.info.status == running]


def children(client: MlflowClient, parent_run_id: str) -> list:
    experiment = client.get_run(parent_run_id).info.experiment_id
    return client.search_runs(
        [experiment], f"tags.`mlflow.parentRunId` = '{parent_run_id}'", max_results=50000
    )


def finished_outputs(client: MlflowClient, parent_run_id: str) -> dict[tuple[str, str, int], str]:
    """(ablation, point label, seed) -> checkpoint of every finished trial of a study (staged studies)."""
    outputs = {}
    for run in children(client, parent_run_id):
        tags = run.data.tags
        if tags.get("clsr.status") in ("finished", "stopped") and CHECKPOINT_TAG in tags:
            outputs[(tags["clsr.ablation"], tags["clsr.point"], int(tags["clsr.seed"]))] = tags[
                CHECKPOINT_TAG
            ]
    return outputs


def record_skipped(uri: str, parent_run_id: str, ablation: str, label: str, seed: int, reason: str) -> None:
    """A child run for a trial that could not start (its upstream trials failed), so MLflow lists it."""
    trial_id = f"skipped:{ablation}:{label}:{seed}"
    tags = {"clsr.ablation": ablation, "clsr.point": label, "clsr.seed": seed}
    run_id = open_child_run(uri, parent_run_id, trial_id, f"{ablation}/{label}/seed={seed}", tags, {})
    close_run(uri, run_id, "skipped", reason)
