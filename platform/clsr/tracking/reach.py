"""Where the study's MLflow record goes, and whether it answers: light enough (no MLflow import) for the
command to check before it starts the study's driver."""

from __future__ import annotations

import base64
import os
import urllib.error
import urllib.request
from pathlib import Path

from clsr.tracking.secrets import mask_uri


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
                f"MLflow tracking server {mask_uri(uri)} is unreachable ({mask_uri(str(err))}). "
                f"Start it (`mlflow server ...`), "
                f"forward its port (`ssh -N -L 5000:<server address>:5000 <head>`), or unset MLFLOW_TRACKING_URI "
                f"to log into a local sqlite:///mlflow.db"
            ) from None  # the chained error would print the URI with its credentials
        check_login(uri)
    elif uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)


def check_login(uri: str) -> None:
    """Fail before any training when the server wants a login this process does not have (``/health``
    needs none; MLflow's own 401 would come only at the first write, inside the driver)."""
    request = urllib.request.Request(uri.rstrip("/") + "/api/2.0/mlflow/experiments/search?max_results=1")
    if os.environ.get("MLFLOW_TRACKING_AUTH"):  # an auth plugin of MLflow's client: only it knows how
        return
    user, password = os.environ.get("MLFLOW_TRACKING_USERNAME"), os.environ.get("MLFLOW_TRACKING_PASSWORD")
    sent = None
    if token := os.environ.get("MLFLOW_TRACKING_TOKEN"):  # MLflow's client sends it as a bearer token
        request.add_header("Authorization", f"Bearer {token}")
        sent = "MLFLOW_TRACKING_TOKEN"
    elif user and password:
        basic = base64.b64encode(f"{user}:{password}".encode()).decode()
        request.add_header("Authorization", f"Basic {basic}")
        sent = "MLFLOW_TRACKING_USERNAME/PASSWORD"
    try:
        urllib.request.urlopen(request, timeout=10)
    except urllib.error.HTTPError as err:
        if err.code == 401:
            given = f"the login in {sent} was refused" if sent else "none was given"
            raise ConnectionError(
                f"MLflow tracking server {mask_uri(uri)} wants a login and {given}: set "
                f"MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (on a cluster the project started: "
                f"`source loopback-cluster/env.sh`, or the head's shell; docs/clusters.md, Logins)"
            ) from None
    except (urllib.error.URLError, OSError):
        pass  # answered /health a moment ago: MLflow's client retries what is transient
