"""An MLflow client for the study driver's own writes that waits out a store that is briefly busy.

A SQLite store that another process is writing (a colleague's study, ``mlflow ui`` on the same file)
answers ``database is locked`` after its 20-second busy timeout (MLflow raises ``TEMPORARILY_UNAVAILABLE``);
a tracking server restarting refuses connections. Either would end the driver between two writes of its
record. Every call here goes through ``clsr.tracking.study_runs.patiently`` (retried with backoff while the
store is unavailable; an answer such as a refused value is raised at once) except the ones that create
something: a retry after a lost reply could create it twice.
"""

from __future__ import annotations

import functools
from typing import Any

from mlflow.tracking import MlflowClient

from clsr.tracking.study_runs import patiently

GIVE_UP_S = 600.0
NOT_RETRIED = frozenset({"create_run", "create_experiment"})


class PatientClient:
    """Wraps an ``MlflowClient``: the same methods, each retried while the store is unavailable."""

    def __init__(self, client: MlflowClient | str, give_up_s: float = GIVE_UP_S):
        self._client = MlflowClient(client) if isinstance(client, str) else client
        self._give_up_s = give_up_s

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._client, name)
        if not callable(attribute) or name in NOT_RETRIED:
            return attribute

        @functools.wraps(attribute)
        def call(*args: Any, **kwargs: Any) -> Any:
            return patiently(lambda: attribute(*args, **kwargs), f"calling MLflow's {name}", self._give_up_s)

        return call
