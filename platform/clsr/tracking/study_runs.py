"""MLflow runs of a study: one parent run, one child run per trial, found again on resume.

Run identity lives in MLflow itself: the parent carries ``clsr.study`` and ``clsr.storage``; a child
carries ``clsr.trial_id`` and ``mlflow.parentRunId``. A resumed study or a retried trial looks its
run up by those tags and logs into it, so no run is ever duplicated.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
import warnings
from pathlib import Path
from typing import Any

from mlflow.entities import Param, RunStatus
from mlflow.tracking import MlflowClient

import clsr
from clsr.tracking.environment import ENV_ARTIFACTS, Environment, capture
from clsr.tracking.reach import check_reachable, resolve_tracking_uri  # noqa: F401 (imported from here)
from clsr.tracking.retry import call_with_retry
from clsr.tracking.secrets import mask_uri
from clsr.tracking.tags import (  # noqa: F401 (the names every reader of study runs imports from here)
    ALSO_TAG,
    CHECKPOINT_TAG,
    EARLIER_S_TAG,
    FINGERPRINT_TAG,
    OPENED_TAG,
    PARENT_TAG,
    STORAGE_TAG,
    SUPERSEDED_TAG,
    TIMED_OUT_ATTEMPT_TAG,
    TRIAL_TAG,
    run_labels,
)

MAX_PARAM_LENGTH = 6000


def git_commit() -> str:
    try:
        source = Path(clsr.__file__).resolve().parent  # the platform's own checkout, not the cwd
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=5, check=True
        )
        return out.stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"


# MLflow 3's UI opens an experiment of no declared kind on its GenAI overview; a study's experiment is
# model training (the value MLflow's own UI writes for "Model training").
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
TRAINING_KIND = "custom_model_development"


def experiment_id(client: MlflowClient, name: str) -> str:
    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        return client.create_experiment(name, tags={EXPERIMENT_KIND_TAG: TRAINING_KIND})
    if EXPERIMENT_KIND_TAG not in experiment.tags:  # made by an older clsr, or by hand
        client.set_experiment_tag(experiment.experiment_id, EXPERIMENT_KIND_TAG, TRAINING_KIND)
    return experiment.experiment_id


def trial_run_name(ablation: str, label: str, seed: int) -> str:
    """What the MLflow runs table shows for a trial: ``temperature method.temperature=0.05 · seed 1``."""
    return f"{ablation} {label} · seed {seed}"


def start_parent_run(client: MlflowClient, study_name: str, storage: str, description: str | None) -> str:
    run = client.create_run(
        experiment_id(client, study_name),
        run_name=study_name,
        tags={
            PARENT_TAG: study_name,
            STORAGE_TAG: mask_uri(storage),
            "clsr.git_commit": git_commit(),
            "clsr.version": clsr.__version__,
            "mlflow.note.content": description or "",
        },
    )
    log_environment(client, run.info.run_id, capture())  # the driver's; each trial logs its own
    return run.info.run_id


def log_environment(client: MlflowClient, run_id: str, env: Environment) -> None:
    """``env.*`` params and the ``environment/`` artifacts of a run the caller writes to directly."""
    client.log_batch(run_id, params=[Param(k, v[:MAX_PARAM_LENGTH]) for k, v in env.params().items()])
    client.log_text(run_id, env.lock_text(), f"{ENV_ARTIFACTS}/environment.txt")
    if env.diff:
        client.log_text(run_id, env.diff, f"{ENV_ARTIFACTS}/diff.patch")


def parent_runs(client: MlflowClient, study_name: str, running: bool = False, max_results: int = 1000):
    """A study's parent runs, newest first (only RUNNING ones with ``running``), leased or not: the
    study's record is ``clsr.study.record.reader.study_parent`` (leased runs first)."""
    experiment = client.get_experiment_by_name(study_name)
    if experiment is None:
        return []
    query = f"tags.`{PARENT_TAG}` = {quoted(study_name)}"
    if running:
        query += " and attributes.status = 'RUNNING'"
    return client.search_runs(
        [experiment.experiment_id], query, order_by=["attributes.start_time DESC"], max_results=max_results
    )


def child_run_for_trial(client: MlflowClient, experiment: str, parent_run_id: str, trial_id: str):
    """The trial's current run (a run superseded by an edited resume is not it), or None."""
    stored = mask_uri(trial_id)  # the tag holds the id as open_child_run stored it
    runs = client.search_runs(
        [experiment], f"tags.`{TRIAL_TAG}` = {quoted(stored)} and {_child_of(parent_run_id)}"
    )
    runs = [r for r in runs if SUPERSEDED_TAG not in r.data.tags]
    return runs[0] if runs else None


def trial_run(client: MlflowClient, parent_run_id: str, trial_id: str):
    """The current run of the trial ``trial_id`` of a study, or None."""
    experiment = client.get_run(parent_run_id).info.experiment_id
    return child_run_for_trial(client, experiment, parent_run_id, trial_id)


def open_child_run(
    uri: str, parent_run_id: str, trial_id: str, run_name: str, tags: dict[str, Any], params: dict[str, Any]
) -> str:
    """Create the trial's run, or reopen it when the trial is resumed or retried. ``trial_id`` is the
    trial's key (``ablation[point] seed=n``): stable across retries, resumes and Tune experiments.
    While the tracking server is unreachable this waits for it (the trial has not started); a refusal
    (``clsr.tracking.retry``) is raised at once."""
    return call_with_retry(
        lambda: _open_child_run(uri, parent_run_id, trial_id, run_name, tags, params),
        patience_s=None,
        what=f"opening the MLflow run of {trial_id}",
    )


def _open_child_run(
    uri: str, parent_run_id: str, trial_id: str, run_name: str, tags: dict[str, Any], params: dict[str, Any]
) -> str:
    client = MlflowClient(uri)
    experiment = client.get_run(parent_run_id).info.experiment_id
    existing = child_run_for_trial(client, experiment, parent_run_id, trial_id)
    now_ms = int(time.time() * 1000)
    if existing is not None:
        # a retry or resume keeps the run's start_time: what it was open for until now is summed apart
        tags, info = existing.data.tags, existing.info
        opened = int(tags.get(OPENED_TAG, info.start_time or now_ms))
        earlier = float(tags.get(EARLIER_S_TAG, 0)) + max(0, (info.end_time or opened) - opened) / 1000
        client.set_tag(info.run_id, EARLIER_S_TAG, f"{earlier:.1f}")
        client.set_tag(info.run_id, OPENED_TAG, str(now_ms))
        client.update_run(existing.info.run_id, status="RUNNING")
        client.set_tag(existing.info.run_id, "clsr.status", "running")
        if "clsr.error" in existing.data.tags:  # why the last attempt ended; this one starts clean
            client.delete_tag(existing.info.run_id, "clsr.error")
        return existing.info.run_id
    all_tags = {
        "mlflow.parentRunId": parent_run_id,
        TRIAL_TAG: trial_id,
        "clsr.status": "running",
        OPENED_TAG: now_ms,
        **tags,
    }
    run = client.create_run(
        experiment,
        start_time=now_ms,
        run_name=run_name,
        tags={k: mask_uri(str(v)) for k, v in all_tags.items()},
    )
    flat = [Param(k, mask_uri(str(v))[:MAX_PARAM_LENGTH]) for k, v in flatten(params).items()]
    for start in range(0, len(flat), 100):  # MLflow's per-request param limit
        client.log_batch(run.info.run_id, params=flat[start : start + 100])
    return run.info.run_id


MLFLOW_STATUS = {"finished": "FINISHED", "stopped": "FINISHED", "failed": "FAILED"}  # else KILLED


def close_run(uri: str, run_id: str, status: str, error: str | None = None) -> None:
    """``status``: finished, failed, stopped (early stopping), skipped, interrupted or timed_out."""
    client = MlflowClient(uri)
    client.set_tag(run_id, "clsr.status", status)
    if error:
        client.set_tag(run_id, "clsr.error", mask_uri(error)[-5000:])
    client.set_terminated(run_id, status=MLFLOW_STATUS.get(status, "KILLED"))


def finish_child(
    uri: str,
    run_id: str,
    status: str,
    pending_root: str,
    error: str | None = None,
    tags: dict[str, Any] | None = None,
    wait_s: float = 15.0,
) -> None:
    """The trial driver's last writes to a trial's run, through a journal: sent now when MLflow answers,
    else left in the study's storage (after whatever the trial itself left there, so in order)."""
    from clsr.tracking.spool import Spool, hand_over, has_pending

    spool = Spool(uri, run_id)
    spool.tags(
        {**(tags or {}), "clsr.status": status} | ({"clsr.error": mask_uri(error)[-5000:]} if error else {})
    )
    spool.terminate(MLFLOW_STATUS.get(status, "KILLED"))
    if has_pending(pending_root, run_id):  # the trial's own writes wait there: ours go after them
        hand_over(spool.unsent(), spool.folder, pending_root, run_id)
        spool.close(0, None)
        shutil.rmtree(spool.folder, ignore_errors=True)  # its writes are in the hand-over now
        return
    spool.start().close(wait_s, pending_root)


def open_children(client: MlflowClient, parent_run_id: str) -> list:
    running = RunStatus.to_string(RunStatus.RUNNING)
    return [r for r in children(client, parent_run_id) if r.info.status == running]


SEARCH_PAGE_SIZE = 50_000  # MLflow's most results per search; a study may have more trials


def children(client: MlflowClient, parent_run_id: str) -> list:
    """Every child run of a parent run, page by page."""
    experiment = client.get_run(parent_run_id).info.experiment_id
    runs, token = [], None
    while True:
        page = client.search_runs(
            [experiment], _child_of(parent_run_id), max_results=SEARCH_PAGE_SIZE, page_token=token
        )
        runs += page
        token = page.token
        if not token:
            return runs


def _child_of(parent_run_id: str) -> str:
    return f"tags.`mlflow.parentRunId` = {quoted(parent_run_id)}"


def quoted(value: str) -> str:
    """``value`` as a string of MLflow's search filter grammar, which has no escapes: it strips the
    quotes around a string and keeps everything between them. So a value with ``'`` goes in double
    quotes; one with both kinds, or ending in a backslash (sqlparse reads ``\\'`` as an escaped
    quote), cannot be written at all. Trial ids end with their seed, and ``clsr.study.plan.load`` refuses
    point labels with both quotes."""
    if "'" in value and '"' in value:
        raise ValueError(f"{value!r} holds both ' and \", which MLflow's search cannot quote")
    if value.endswith("\\"):
        raise ValueError(f"{value!r} ends with a backslash, which MLflow's search cannot quote")
    return f'"{value}"' if "'" in value else f"'{value}'"


def finished_outputs(
    client: MlflowClient, parent_run_id: str, storage_root: str | None = None
) -> dict[tuple[str, str, int], str]:
    """(ablation, point label, seed) -> checkpoint of every finished trial of a study (staged studies).

    ``storage_root``: the study's own storage folder; a ``clsr.checkpoint`` tag outside it is dropped with
    a warning (a tag is anyone's to write on an open tracking server, and later stages load what it names).
    """
    outputs = {}
    for run in children(client, parent_run_id):
        tags = run.data.tags
        if tags.get("clsr.status") in ("finished", "stopped") and CHECKPOINT_TAG in tags:
            location = tags[CHECKPOINT_TAG]
            if storage_root is not None and not under_root(location, storage_root):
                warnings.warn(
                    f"run {run.info.run_id} ({run.info.run_name}): ignoring its {CHECKPOINT_TAG} tag "
                    f"{mask_uri(location)!r}, which is not under the study's storage "
                    f"{mask_uri(storage_root)!r}",
                    stacklevel=2,
                )
                continue
            for ablation, point in run_labels(tags):  # a run of identical trials is each point's output
                outputs[(ablation, point, int(tags["clsr.seed"]))] = location
    return outputs


_SAME_SCHEME = {"gs": "gcs", "s3a": "s3", "s3n": "s3"}  # pyarrow names Google Cloud Storage "gcs"
_NOT_IN_A_LOCATION = re.compile(r"[?#\\\x00-\x1f\x7f]")  # options, fragments, escapes, control characters
_BUCKET = re.compile(r"[A-Za-z0-9._-]+")


def under_root(location: str, root: str) -> bool:
    """Whether ``location`` (a local path or a ``scheme://bucket/...`` URI) is ``root`` or inside it.

    Local paths are compared after ``os.path.realpath`` (symlinks and ``..`` resolved: neither escapes);
    URIs by scheme, bucket and path prefix, with ``..`` resolved, and never above the bucket. A location
    URI must be plain: pyarrow reads a query (``?endpoint_override=host:port&scheme=http``), a user, a
    password and a port as where and how to connect, so a tag holding any of them (or a fragment, a
    backslash, a control character) is refused. The root is the study file's own (trusted) storage
    path: its options are the user's, and only its bucket and path are compared.
    """
    if not _plain(location):
        return False
    location_uri, root_uri = _as_uri(location), _as_uri(root)
    if (location_uri is None) != (root_uri is None):
        return False
    if location_uri is None:
        real_location, real_root = _real_path(location), _real_path(root)
        try:
            return os.path.commonpath([real_location, real_root]) == real_root
        except ValueError:  # different drives
            return False
    (scheme, bucket, parts), (root_scheme, root_bucket, root_parts) = location_uri, root_uri
    if parts is None or root_parts is None or (scheme, bucket) != (root_scheme, root_bucket):
        return False
    return parts[: len(root_parts)] == root_parts


def _plain(location: str) -> bool:
    """A local path, or a URI of nothing but a scheme, a bucket (a local ``file://`` URI: no host but
    ``localhost``) and a path."""
    if "://" not in location:
        return True
    if _NOT_IN_A_LOCATION.search(location):
        return False
    split = urllib.parse.urlsplit(location)
    if split.scheme.lower() == "file":
        return split.netloc in ("", "localhost")
    # an object store's keys are literal: "a/../root/x" is under "a/", not under "root/" (and pyarrow
    # decodes %2E%2E to ".."), so a location with such a segment is refused, not resolved
    segments = split.path.strip("/").split("/")
    if any(part in ("", ".", "..") for seg in segments for part in (seg, urllib.parse.unquote(seg))):
        return False
    return _BUCKET.fullmatch(split.netloc) is not None


def _real_path(text: str) -> str:
    if text.startswith("file://"):
        text = urllib.parse.unquote(urllib.parse.urlsplit(text).path)
    return os.path.realpath(os.path.expanduser(text))


def _as_uri(text: str) -> tuple[str, str, list[str] | None] | None:
    """(scheme, bucket, path parts with ``.``/``..`` resolved, None when ``..`` leaves the bucket) of
    a URI; None for a local path (``file://`` URIs are local paths)."""
    if "://" not in text:
        return None
    split = urllib.parse.urlsplit(text)
    scheme = split.scheme.lower()
    if scheme == "file":
        return None
    parts: list[str] | None = []
    for part in urllib.parse.unquote(split.path).split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                parts = None
                break
            parts.pop()
        else:
            parts.append(part)
    return _SAME_SCHEME.get(scheme, scheme), (split.hostname or "").lower(), parts


def record_skipped(uri: str, parent_run_id: str, ablation: str, label: str, seed: int, reason: str) -> None:
    """A child run for a trial that could not start (its upstream trials failed), so MLflow lists it."""
    trial_id = f"skipped:{ablation}:{label}:{seed}"
    tags = {"clsr.ablation": ablation, "clsr.point": label, "clsr.seed": seed}
    run_id = open_child_run(uri, parent_run_id, trial_id, trial_run_name(ablation, label, seed), tags, {})
    close_run(uri, run_id, "skipped", reason)


def flatten(doc: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested sections as MLflow params: ``{"trainer": {"lr": 1e-5}}`` -> ``{"trainer.lr": 1e-5}``."""
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat |= flatten(value, f"{path}.")
        else:
            flat[path] = value
    return flat
