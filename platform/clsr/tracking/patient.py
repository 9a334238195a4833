"""An MLflow client for the study driver's own writes that waits out a store that is briefly busy.

A SQLite store that another process is writing (a colleague's study, ``mlflow ui`` on the same file)
answers ``database is locked`` after its busy timeout (MLflow raises ``TEMPORARILY_UNAVAILABLE``); a
tracking server restarting refuses connections. Either would end the driver between two writes of its
record. ``PatientClient`` is an ``MlflowClient`` whose reads and idempotent writes go through
``clsr.tracking.retry.call_with_retry`` (retried with backoff while the error is transient; a final one,
such as a refused value, is raised at once). Creations (``create_run``, ``create_experiment``) are
MlflowClient's own, tried once: a retry after a lost reply could create the run twice.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from mlflow.tracking import MlflowClient

from clsr.tracking.retry import DRIVER_PATIENCE_S, call_with_retry

P = ParamSpec("P")
R = TypeVar("R")


def _patient(method: Callable[Concatenate[MlflowClient, P], R]) -> Callable[Concatenate[PatientClient, P], R]:
    """``MlflowClient``'s ``method``, called through the retry policy with the client's patience."""

    @functools.wraps(method)
    def call(self: PatientClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return call_with_retry(
            lambda: method(self, *args, **kwargs),
            patience_s=self.patience_s,
            what=f"calling MLflow's {method.__name__}",
        )

    return call


class PatientClient(MlflowClient):
    """An ``MlflowClient`` whose reads and idempotent writes are retried while the store is unavailable,
    for up to ``patience_s`` (None: no limit)."""

    def __init__(
        self,
        tracking_uri: str | None = None,
        registry_uri: str | None = None,
        *,
        patience_s: float | None = DRIVER_PATIENCE_S,
    ):
        super().__init__(tracking_uri, registry_uri)
        self.patience_s = patience_s

    # reads
    get_run = _patient(MlflowClient.get_run)
    get_experiment_by_name = _patient(MlflowClient.get_experiment_by_name)
    search_runs = _patient(MlflowClient.search_runs)
    get_metric_history = _patient(MlflowClient.get_metric_history)
    list_artifacts = _patient(MlflowClient.list_artifacts)
    download_artifacts = _patient(MlflowClient.download_artifacts)
    # writes that may be sent again after a lost reply (a param logged again with its own value is taken)
    set_tag = _patient(MlflowClient.set_tag)
    delete_tag = _patient(MlflowClient.delete_tag)
    set_terminated = _patient(MlflowClient.set_terminated)
    update_run = _patient(MlflowClient.update_run)
    log_param = _patient(MlflowClient.log_param)
    log_batch = _patient(MlflowClient.log_batch)
    log_text = _patient(MlflowClient.log_text)
    log_dict = _patient(MlflowClient.log_dict)
    log_artifact = _patient(MlflowClient.log_artifact)
    log_artifacts = _patient(MlflowClient.log_artifacts)
    delete_run = _patient(MlflowClient.delete_run)
    restore_run = _patient(MlflowClient.restore_run)
    set_experiment_tag = _patient(MlflowClient.set_experiment_tag)
