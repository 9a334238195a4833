"""The platform's one retry policy for MLflow: which errors are final, which are waited out, and how long.

Why by hand: MLflow's client retries only at the HTTP transport. Each REST request to a tracking server
goes through a ``requests`` session with urllib3's ``Retry`` (``mlflow.utils.request_utils``):
connection errors and the statuses 408, 429, 500, 502, 503 and 504 are retried
``MLFLOW_HTTP_REQUEST_MAX_RETRIES`` times (default 7) with exponential backoff
(``MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR``, default 2, each wait capped at 120 s: about four minutes in
all), and then ``mlflow.utils.rest_utils.http_request`` raises an ``MlflowException`` with
``INTERNAL_ERROR``. A store the client opens itself (``sqlite:///…``, ``postgresql://…``: MLflow's
SQLAlchemy store) is not retried at all: a SQLite file another process holds a write lock on (a
colleague's study, ``mlflow ui``) answers ``database is locked`` after its busy timeout, which MLflow
raises as ``TEMPORARILY_UNAVAILABLE``. A server restarted for an upgrade, or a long write lock,
outlasts both; the study driver, its trials' write journals (``clsr.tracking.spool``) and the lease
wait them out with this policy. Neither Ray nor MLflow offers one for store errors.

The policy (``is_transient``):

* **final**, raised at once (retrying never changes the answer, and a refusal retried would wait
  forever): every MLflow error code not listed as transient below, among them ``PERMISSION_DENIED``,
  ``UNAUTHENTICATED``, ``INVALID_PARAMETER_VALUE`` (a param logged again with another value: the lease's
  compare-and-set), ``BAD_REQUEST``, ``RESOURCE_ALREADY_EXISTS``, ``RESOURCE_DOES_NOT_EXIST`` (``FINAL``
  names the ones the platform meets); an HTTP error other than 408, 429 or 5xx from an artifact store;
  a local file that is missing or not ours (``FileNotFoundError``, ``PermissionError``, ...); any other
  exception (a refused journal entry, a bug).
* **transient**, retried: the codes in ``TRANSIENT_CODES`` (``TEMPORARILY_UNAVAILABLE``: a locked or
  unreachable database; ``INTERNAL_ERROR``: a 5xx, or what MLflow raises once its own HTTP retries gave
  up; the rate limits ``REQUEST_LIMIT_EXCEEDED``/``RESOURCE_EXHAUSTED``; ``DEADLINE_EXCEEDED``, ...);
  other ``OSError``\\ s (connection refused or reset, timeouts, ``requests.ConnectionError``); an HTTP
  error with status 408, 429 or 5xx; a database's ``OperationalError`` (SQLite's ``database is locked``)
  that reaches us unwrapped; botocore's connection errors.

Waits (``backoff_s``) follow ``BACKOFF_S``, the last one repeating. How long to go on is the caller's:
``call_with_retry(..., patience_s=...)``; the driver's record writes and lease reads give up after
``DRIVER_PATIENCE_S`` (``clsr.tracking.patient.PatientClient``), opening a trial's run waits as long as
it takes (the trial has not started), a trial's journal retries until the trial ends and hands what is
left to the study's storage, and the end of a study replays that for the study's ``tracking_wait_s``.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from mlflow.exceptions import MlflowException

from clsr.tracking.secrets import mask_uri

T = TypeVar("T")

BACKOFF_S: tuple[float, ...] = (1, 2, 5, 10, 20, 30)  # between tries; the last repeats
DRIVER_PATIENCE_S = 600.0  # the study driver's record writes and lease reads, after MLflow's own retries

TRANSIENT_CODES = frozenset(
    {
        "TEMPORARILY_UNAVAILABLE",  # 503; MLflow's SQLAlchemy store: any OperationalError (SQLite locked)
        "INTERNAL_ERROR",  # 500; also what http_request raises once urllib3's retries gave up
        "DEADLINE_EXCEEDED",  # 504
        "REQUEST_LIMIT_EXCEEDED",  # 429
        "RESOURCE_EXHAUSTED",  # 429
        "ABORTED",  # a transaction aborted by a concurrent one
        "CANCELLED",  # 499: the request was cut off
        "IO_ERROR",
        "SERVICE_UNDER_MAINTENANCE",
        "WORKSPACE_TEMPORARILY_UNAVAILABLE",
        "COULD_NOT_ACQUIRE_LOCK",
    }
)
# final like every code not in TRANSIENT_CODES; named for the reader and the tests
FINAL = frozenset(
    {
        "PERMISSION_DENIED",
        "UNAUTHENTICATED",
        "CUSTOMER_UNAUTHORIZED",
        "INVALID_PARAMETER_VALUE",
        "BAD_REQUEST",
        "MALFORMED_REQUEST",
        "RESOURCE_ALREADY_EXISTS",
        "ALREADY_EXISTS",
        "RESOURCE_DOES_NOT_EXIST",
        "NOT_FOUND",
        "ENDPOINT_NOT_FOUND",
        "RESOURCE_CONFLICT",
        "INVALID_STATE",  # "bad data in database": the store holds something a retry does not change
        "NOT_IMPLEMENTED",
        "FEATURE_DISABLED",
    }
)
# a local file's problem, never the server's
_LOCAL_FILE_ERRORS = (
    FileNotFoundError,
    FileExistsError,
    IsADirectoryError,
    NotADirectoryError,
    PermissionError,
)


def is_transient(err: BaseException) -> bool:
    """Whether ``err`` may go away by itself (an outage, a busy store): retry. False: it is final."""
    if isinstance(err, MlflowException):
        return err.error_code in TRANSIENT_CODES
    status = _http_status(err)
    if status is not None:
        return status in (408, 429) or status >= 500
    if isinstance(err, _LOCAL_FILE_ERRORS):
        return False
    if isinstance(err, OSError | sqlite3.OperationalError):
        return True
    return _is_database_busy(err) or _is_boto_connection_error(err)


def backoff_s(attempt: int) -> float:
    """The wait after the ``attempt``-th failure in a row (0: the first)."""
    return BACKOFF_S[min(attempt, len(BACKOFF_S) - 1)]


def call_with_retry(fn: Callable[[], T], *, patience_s: float | None, what: str) -> T:
    """``fn()``, tried again after each transient error (``backoff_s`` apart, a line printed each time)
    until it answers or ``patience_s`` (None: no limit) has passed since the first try: then the last
    error is raised. A final error is raised at once. ``what``: what is being done, for the line."""
    started, attempt = _now(), 0
    while True:
        try:
            return fn()
        except Exception as err:
            if not is_transient(err):
                raise
            left = None if patience_s is None else patience_s - (_now() - started)
            if left is not None and left <= 0:
                raise
            wait = backoff_s(attempt) if left is None else min(backoff_s(attempt), left)
            # the quiet terminal shows worker lines that start so (clsr.study.run.progress.PLATFORM_LINES)
            print(f"MLflow unreachable while {what} ({describe(err)}); retrying in {wait:g} s", flush=True)
            _sleep(wait)
            attempt += 1


def describe(err: BaseException) -> str:
    """An error in one short line, credentials masked."""
    first = (mask_uri(str(err)).splitlines() or [""])[0]
    return f"{type(err).__name__}: {first}"[:200]


# the clock and the wait, looked up at each call (tests replace them)
_now: Callable[[], float] = time.monotonic
_sleep: Callable[[float], None] = time.sleep


def _http_status(err: BaseException) -> int | None:
    """The HTTP status of an error an artifact store raised with its response (``requests``' HTTPError,
    botocore's ClientError), or None."""
    response: Any = getattr(err, "response", None)
    if response is None:
        return None
    status = getattr(response, "status_code", None)
    if status is None and isinstance(response, dict):
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
    return status if isinstance(status, int) else None


def _is_database_busy(err: BaseException) -> bool:
    """SQLAlchemy's OperationalError (a locked or unreachable database), which MLflow's store wraps as
    TEMPORARILY_UNAVAILABLE. Not loaded: the error is none of its."""
    exc = sys.modules.get("sqlalchemy.exc")
    return exc is not None and isinstance(err, exc.OperationalError)


def _is_boto_connection_error(err: BaseException) -> bool:
    """botocore's errors for an object store that did not answer (most of them are not OSErrors)."""
    exc = sys.modules.get("botocore.exceptions")
    return exc is not None and isinstance(err, exc.ConnectionError | exc.HTTPClientError)
