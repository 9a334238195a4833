"""A study's runs as MLflow holds them: the study's parent run (its latest, or one chosen by id, with a
clear error when the store has none), the child runs as trials (one per point a run stands for, the
superseded ones left out, one per point and seed when a resume left several), and the study as its run
recorded it (``resolved.yaml``, read under the YAML safety limits) for reports by name. The report, the
results frame, compare, promote and the runner read runs through these.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mlflow.tracking import MlflowClient
from pydantic import ValidationError

from clsr.study.record.reader import study_parent
from clsr.study.spec.schema import Study
from clsr.study.spec.yaml_safe import YAMLSafetyError, read_yaml_file
from clsr.tracking.escape import visible
from clsr.tracking.record_reader import tag_int
from clsr.tracking.secrets import mask_uri
from clsr.tracking.study_runs import (
    PARENT_TAG,
    SUPERSEDED_TAG,
    check_reachable,
    children,
    parent_runs,
    run_labels,
)
from clsr.tracking.tags import last_error_line

OK = "finished"  # the only status whose metrics are averaged (stopped trials never reached their tests)
EVAL_ONLY_TAG = "clsr.eval_only"  # "true" on a trial that trained nothing (trainer.max_steps: 0)


class NoStudyRuns(LookupError):
    """MLflow holds no run of the study at the tracking URI searched."""


# --- the runs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """One child run of the study: a (point, seed) trial and how it ended."""

    run_id: str
    ablation: str
    point: str
    seed: int | None
    status: str
    metrics: dict[str, float]
    tags: dict[str, str]
    start_time: int
    params: dict[str, str] = field(default_factory=dict)  # the resolved trial config, flattened (strings)

    @classmethod
    def from_run(cls, run: Any) -> Trial:
        tags = run.data.tags
        return cls(
            run_id=run.info.run_id,
            ablation=tags["clsr.ablation"],
            point=tags.get("clsr.point", run.info.run_name or run.info.run_id),
            seed=tag_int(tags, "clsr.seed", run.info.run_id),
            status=tags.get("clsr.status", "unknown"),
            metrics=dict(run.data.metrics),
            tags=dict(tags),
            start_time=run.info.start_time or 0,
            params=dict(run.data.params),
        )

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def eval_only(self) -> bool:
        return self.tags.get(EVAL_ONLY_TAG, "").lower() == "true"

    def error_line(self) -> str:
        """The last line of the trial's error (the exception), short enough for a table."""
        return last_error_line(self.tags)[:200]


def open_study_runs(study_name: str, uri: str, run_id: str | None = None) -> tuple[MlflowClient, Any]:
    """The client and the study's latest parent run (or its parent run ``run_id``); a clear error when
    there is none at ``uri``."""
    hint = (
        "set MLFLOW_TRACKING_URI (or tracking_uri: in the study file, or --tracking-uri) to the store "
        "the study logged to, e.g. `export MLFLOW_TRACKING_URI=sqlite:////path/to/mlflow.db` or "
        "http://<host>:5000; a --smoke run is a study of its own, '<name>-smoke'"
    )
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise NoStudyRuns(
            f"no MLflow store at {mask_uri(uri)} (no such file), so no run of study {study_name!r}; {hint}"
        )
    check_reachable(uri)
    client = MlflowClient(uri)
    if run_id is not None:
        return client, chosen_parent(client, study_name, run_id)
    parent = study_parent(client, study_name)  # leased runs first, as resume takes them
    if parent is None:
        raise NoStudyRuns(
            f"no MLflow run of study {study_name!r} at {mask_uri(uri)} (searched experiment "
            f"{study_name!r} for a run tagged clsr.study={study_name}); {hint}"
        )
    return client, parent


def chosen_parent(client: MlflowClient, study_name: str, run_id: str):
    """The parent run ``run_id`` if it is one of this study's records, else NoStudyRuns listing them."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        run = None
    if run is None or run.data.tags.get(PARENT_TAG) != study_name:
        listed = "; ".join(record_lines(client, study_name)) or "none"
        raise NoStudyRuns(f"--run {run_id}: not a record of study {study_name!r}; its records: {listed}")
    return run


def record_lines(client: MlflowClient, study_name: str, limit: int = 10) -> list[str]:
    """One line per record of the study, newest first: run id, status, start (UTC), trials."""
    lines = []
    for run in parent_runs(client, study_name, max_results=limit):
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(run.info.start_time / 1000))
        status = run.data.tags.get("clsr.status") or run.info.status.lower()
        trials = run.data.tags.get("clsr.trials", "?")
        lines.append(visible(f"{run.info.run_id} {status}, started {started}, {trials} trial(s)"))
    return lines


def load_trials(client: MlflowClient, parent_run_id: str) -> list[Trial]:
    """Every child run that belongs to an ablation (skipped ones too: they are planned trials), once per
    point it stands for (identical trials of several points ran once)."""
    runs = children(client, parent_run_id)  # a run an edited resume superseded is not the trial's result
    kept = [r for r in runs if "clsr.ablation" in r.data.tags and SUPERSEDED_TAG not in r.data.tags]
    trials = []
    for run in kept:
        trial = Trial.from_run(run)
        trials += [replace(trial, ablation=a, point=p) for a, p in run_labels(run.data.tags)]
    return trials


def pick_trials(trials: Iterable[Trial]) -> dict[tuple[str, int | None], Trial]:
    """One trial per (point, seed): a resumed study can leave several runs; the finished one counts,
    else the latest, so an early failure that a resume fixed is not shown as a failure."""
    chosen: dict[tuple[str, int | None], Trial] = {}
    for trial in sorted(trials, key=lambda t: (t.ok, t.start_time)):
        chosen[(trial.point, trial.seed)] = trial
    return chosen


def study_from_run(client: MlflowClient, parent_run_id: str, dst: Path) -> Study:
    """The study as its run recorded it (``resolved.yaml``: ``from:`` files merged, smoke applied), for
    ``--name`` reports that have no study file at hand."""
    return recorded_summary(client, parent_run_id, dst)[0]


def recorded_summary(client: MlflowClient, parent_run_id: str, dst: Path) -> tuple[Study, dict[str, Any]]:
    """The parent run's ``resolved.yaml``: its study validated, and the whole mapping (``base_trials``,
    ``points``: ``clsr.study.record.summary``); NoStudyRuns when it is missing or refused."""
    try:
        local = client.download_artifacts(parent_run_id, "resolved.yaml", str(dst))
    except Exception as err:  # MLflow raises its own exception types per artifact store
        raise NoStudyRuns(
            f"the parent run {parent_run_id} has no resolved.yaml artifact ({err}); give the study file"
        ) from err
    refused = f"the parent run {parent_run_id}'s resolved.yaml artifact was refused"
    try:  # anyone who can write to the tracking server can write it: size and alias limits
        recorded = read_yaml_file(local)
    except YAMLSafetyError as err:
        raise NoStudyRuns(f"{refused}: {err}; give the study file") from None
    if not isinstance(recorded, dict) or not isinstance(recorded.get("study"), dict):
        raise NoStudyRuns(f"{refused}: it holds no study: mapping; give the study file")
    try:
        return Study.model_validate(recorded["study"]), recorded
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise NoStudyRuns(
            f"{refused}: not a valid study ({err.error_count()} problem(s); {where}: {first['msg']}); "
            f"give the study file"
        ) from None
