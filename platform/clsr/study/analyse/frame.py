"""A study's results as a pandas DataFrame, for notebooks and scripts.

``clsr.results.load("simcse_ablations")`` (a study name, or the path of its study file) reads the
study's latest parent run in MLflow (or the parent run ``run_id``) and returns one row per trial, the
trials the report counts: every child run of an ablation (skipped, failed and stopped ones too, with
their status), runs an edited resume superseded left out, and one run per (ablation, point, seed) where
a resume left several (the finished one, else the latest). A run that stood for identical points of
several ablations (``clsr.also``) appears once per point it stands for, with the same ``run_id``:
drop duplicates of ``run_id`` before summing costs.

Columns: ``ablation``, ``point``, ``seed``, ``status``, ``run_id``, ``start_time`` (UTC),
``eval_only`` (the trial trained nothing), ``device`` and ``error`` (the last line of a trial's error),
then every metric the trials logged, by name, at its final (latest) value (the test scores, the
``best_dev_*`` selection scores, the cost ``trial_wall_s``/``trial_cpu_s``/``trial_gpu_s`` where
logged, MLflow's system metrics), then the resolved trial parameters as ``params.<section>.<key>``
(MLflow's own prefix: the trial's ``seed`` parameter would clash with the ``seed`` column), each parsed
back from MLflow's string to the Python literal it was (``0.05``, ``True``, ``None``, a list), or left
as a string. ``df.attrs`` holds ``study``, ``parent_run_id`` and ``tracking_uri`` (without credentials).
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pandas as pd

from clsr.study.analyse.runs import Trial, load_trials, open_study_runs, pick_trials
from clsr.tracking.secrets import mask_uri
from clsr.tracking.study_runs import resolve_tracking_uri

ID_COLUMNS = ("ablation", "point", "seed", "status", "run_id", "start_time", "eval_only", "device", "error")
PARAM_PREFIX = "params."


def load(study: str | Path, tracking_uri: str | None = None, run_id: str | None = None) -> pd.DataFrame:
    """One row per trial of the study's latest parent run (or of its parent run ``run_id``).

    ``study``: a study name (the MLflow experiment; a ``--smoke`` run's is ``<name>-smoke``) or a study
    file. ``tracking_uri``: the MLflow store; default the study file's ``tracking_uri``, else
    ``$MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``. Raises ``clsr.study.analyse.runs.NoStudyRuns``
    when the store holds no run of the study."""
    name, file_uri = study_name_and_uri(study)
    uri = resolve_tracking_uri(tracking_uri or file_uri)
    client, parent = open_study_runs(name, uri, run_id)
    trials = load_trials(client, parent.info.run_id)
    chosen = [
        trial
        for ablation in dict.fromkeys(t.ablation for t in trials)
        for trial in pick_trials(t for t in trials if t.ablation == ablation).values()
    ]
    df = trials_frame(chosen)
    df.attrs.update(study=name, parent_run_id=parent.info.run_id, tracking_uri=mask_uri(uri))
    return df


def study_name_and_uri(study: str | Path) -> tuple[str, str | None]:
    """A study file's name and ``tracking_uri``; anything else that is no file is a study name."""
    path = Path(study)
    if path.is_file() or path.suffix in (".yaml", ".yml"):
        from clsr.study.plan.load import load_study  # raises StudyError for a missing or invalid file

        loaded = load_study(path)
        return loaded.name, loaded.tracking_uri
    return str(study), None


def trials_frame(trials: list[Trial]) -> pd.DataFrame:
    """The DataFrame of ``trials``: identity columns, metrics, then ``params.*``; sorted by ablation,
    point and seed."""
    records = [
        {
            "ablation": t.ablation,
            "point": t.point,
            "seed": t.seed,
            "status": t.status,
            "run_id": t.run_id,
            "start_time": t.start_time,
            "eval_only": t.eval_only,
            "device": t.tags.get("clsr.device"),
            "error": t.error_line() or None,
            **t.metrics,
            **{PARAM_PREFIX + k: literal(v) for k, v in t.params.items()},
        }
        for t in trials
    ]
    metrics = sorted({k for t in trials for k in t.metrics})
    params = sorted({PARAM_PREFIX + k for t in trials for k in t.params})
    df = pd.DataFrame.from_records(records, columns=[*ID_COLUMNS, *metrics, *params])
    df["seed"] = df["seed"].astype("Int64")  # None for a run without a seed tag
    df["start_time"] = pd.to_datetime(df["start_time"], unit="ms", utc=True)
    df["eval_only"] = df["eval_only"].astype(bool)
    df[metrics] = df[metrics].astype(float)
    return df.sort_values(["ablation", "point", "seed"], kind="stable").reset_index(drop=True)


def literal(text: str) -> Any:
    """A parameter as logged (``str(value)``) back to its value: ``ast.literal_eval`` (numbers, True,
    None, lists, dicts; it evaluates no code), else the string itself (``cls``, a path, a cut value)."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text
