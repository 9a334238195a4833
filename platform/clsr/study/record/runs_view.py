"""The study's runs in MLflow's UI as a table of what it found: its trials, the study's metrics and the
parameters its ablations vary as columns, the best first.

MLflow's runs table takes its filter and order from the URL (``searchFilter``, ``orderByKey``), its columns
only from the UI's own state. A *shared view* carries both: the experiment tag
``mlflow.sharedViewState.<key>``, the state as JSON, opened by
``#/experiments/<id>/runs?viewStateShareKey=<key>`` (what the UI's own Share button writes). The study
writes ``trials`` whenever a driver takes its record: the filter is that parent's children, so the
lease run and an earlier record of the study are not listed.
"""

from __future__ import annotations

import json

from clsr.study.spec.schema import Study
from clsr.tracking.study_runs import flatten, quoted

VIEW_KEY = "trials"
VIEW_TAG = f"mlflow.sharedViewState.{VIEW_KEY}"


def varied_params(study: Study) -> list[str]:
    """The params the study's ablations vary (grid axes, search space, explicit points), in study order."""
    keys: dict[str, None] = {}
    for ablation in study.ablations.values():
        keys |= dict.fromkeys(ablation.grid) | dict.fromkeys(ablation.space)
        for point in ablation.points:
            keys |= dict.fromkeys(flatten(point.set))
    return list(keys)


def trials_view(study: Study, parent_run_id: str) -> dict:
    """The shared view's state: the parent's children, by the first objective (best first), with each
    objective and each varied param as a column."""
    metric, mode = study.objectives[0]
    return {
        "searchFilter": f"tags.`mlflow.parentRunId` = {quoted(parent_run_id)}",
        "orderByKey": f"metrics.`{metric}`",
        "orderByAsc": mode == "min",
        "selectedColumns": [f"metrics.`{name}`" for name, _ in study.objectives]
        + [f"params.`{key}`" for key in varied_params(study)],
    }


def log_trials_view(client, experiment_id: str, study: Study, parent_run_id: str) -> None:
    """Write the study's shared view on its experiment (again on each resume: it names the parent)."""
    client.set_experiment_tag(experiment_id, VIEW_TAG, json.dumps(trials_view(study, parent_run_id)))


def trials_url(base_url: str, experiment_id: str) -> str:
    """The runs table of ``experiment_id`` opened on the study's view, for a UI at ``base_url``."""
    query = f"workflowType=machine_learning&viewStateShareKey={VIEW_KEY}"  # not MLflow 3's GenAI overview
    return f"{base_url.rstrip('/')}/#/experiments/{experiment_id}/runs?{query}"
