"""What the study found, on its parent run, for whoever opens it in the MLflow UI.

A parent run used to show Metrics (0) and Parameters (0): the answer lived on the children and in
``platform study report``. At the study's close the parent gets, per ablation and point, the mean of the
study's metric over the point's finished seeds (``<metric> mean - <ablation> - <point>``, with
``n_seeds - <ablation> - <point>`` beside it; no '/', which the UI's column picker would fold into a
tree of look-alike leaves), and the study's shape as params (its metric, mode, seeds and ablations).
A colleague's label becomes a metric key only through ``metric_key``: MLflow refuses other characters.
"""

from __future__ import annotations

import math
import re
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping
from statistics import mean
from typing import Any

from clsr.study.spec.schema import Study

_IDENTICAL = re.compile(r" \(\+\d+ identical\)$")  # summary_rows' note on a point, not its label
_NOT_IN_A_KEY = re.compile(r"[^\w.\- ]+")  # MLflow's key characters, less '/' and ':' (refused on Windows)


def metric_key(*parts: str) -> str:
    """``parts`` joined by ' - ', each reduced to the characters MLflow accepts in a metric key."""
    cleaned = [_NOT_IN_A_KEY.sub("_", part).replace("..", "_").strip(" ") or "_" for part in parts]
    return " - ".join(cleaned)


def point_means(rows: Iterable[Mapping[str, Any]], metric: str) -> dict[tuple[str, str], list[float]]:
    """The finished seeds' values of ``metric`` per (ablation, point), in the rows' order."""
    values: dict[tuple[str, str], list[float]] = defaultdict(list)
    for row in rows:
        value = row.get(metric)
        if row.get("status") != "finished" or not isinstance(value, float | int) or math.isnan(value):
            continue
        point = _IDENTICAL.sub("", str(row.get("point")))
        values[(str(row.get("ablation")), point)].append(float(value))
    return values


def log_parent_summary(client, parent_run_id: str, study: Study, rows: list[Mapping[str, Any]]) -> None:
    """The study's shape as params (once: a resume logs the same values) and each point's mean of each
    objective the rows carry."""
    from mlflow.entities import Metric, Param

    objectives = study.objectives
    params = {
        "study.metric": ",".join(metric for metric, _ in objectives),
        "study.mode": ",".join(mode for _, mode in objectives),
        "study.seeds": ",".join(str(seed) for seed in study.seeds),
        "study.ablations": ",".join(study.ablations),
    }
    logged = client.get_run(parent_run_id).data.params
    new_params = [Param(key, value) for key, value in params.items() if key not in logged]
    now = int(time.time() * 1000)
    metrics = []
    for metric, _ in objectives:
        for (ablation, point), values in point_means(rows, metric).items():
            metrics.append(Metric(metric_key(f"{metric} mean", ablation, point), mean(values), now, 0))
            metrics.append(Metric(metric_key("n_seeds", ablation, point), len(values), now, 0))
    for start in range(0, max(len(metrics), 1), 1000):  # MLflow takes up to 1,000 metrics a batch
        client.log_batch(parent_run_id, metrics=metrics[start : start + 1000], params=new_params)
        new_params = []
