"""Shared fixtures: the local data directory and quiet, offline defaults for every test."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]

# Offline and quiet by default: these machines have no hub access.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CLSR_DATA_DIR", str((REPO_ROOT.parent / "shared" / "data").resolve()))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The local data folder (``CLSR_DATA_DIR``, default ``../shared/data``)."""
    path = Path(os.environ["CLSR_DATA_DIR"])
    if not (path / "senteval").is_dir():
        pytest.skip(f"local data not found at {path}; set CLSR_DATA_DIR to the shared data folder")
    return path
