"""Where the study's MLflow record goes, and whether it answers: light enough (no MLflow import) for the
command to check before it starts the study's driver."""

from __future__ import annotations

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
    elif uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).parent.mkdir(parents=True, exist_ok=True)
