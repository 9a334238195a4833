"""Shared fixtures: the local data directory and quiet, offline defaults for every test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import REPO_ROOT
from tests.support.models import save_tiny_bert
from tests.support.stores import _TEMPLATE_FOLDER, sqlite_uri
from tests.support.studies import SMOKE_STS_PAIRS
from tests.support.webhook_server import WebhookServer

# Offline and quiet by default: these machines have no hub access.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
if (_SHARED_DATA := (REPO_ROOT.parent / "shared" / "data").resolve()).is_dir():  # else the embedded set
    os.environ.setdefault("CLSR_DATA_DIR", str(_SHARED_DATA))


# CI runs the end-to-end tests marked `parallel` two at a time (pytest-xdist, `--dist loadgroup`), each
# handed out in collection order as a process frees up: the longest first, so that the two processes end
# together instead of one running the longest test alone at the end. A test of minutes declares its
# measured length with `@pytest.mark.minutes(n)` (2 cores, 2026-12-01: SelfCCL 4.6, SupMPN 3.7, GCLSR 3.5,
# confirm 3.0, two workers 2.8, the smoke study 2.4, adaptive 1.8; the rest under 1).
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    def minutes(item: pytest.Item) -> float:
        marker = item.get_closest_marker("minutes")
        return -float(marker.args[0]) if marker and item.get_closest_marker("e2e") else 0.0

    items.sort(key=minutes)  # stable: a file's tests keep their order, the unit tests theirs


@pytest.fixture(scope="session", autouse=True)
def _remove_the_sessions_folders_once_all_passed(request, tmp_path_factory):
    """The suite writes gigabytes under pytest's folder (models, checkpoints, MLflow stores): a session
    whose every test passed removes its folder at its very end (this fixture is set up first, so torn down
    last); a failed one keeps it to look into (``tmp_path_retention_count``: the last one only). Not with
    ``--basetemp``: whoever names the folder removes it (``.ci/run`` does)."""
    import shutil

    yield
    if request.config.option.basetemp is None and request.session.testsfailed == 0:
        shutil.rmtree(tmp_path_factory.getbasetemp(), ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _mlflow_store_template(tmp_path_factory):
    """Where ``sqlite_uri`` keeps its migrated empty store (created on first use, once per test process)."""
    _TEMPLATE_FOLDER.append(tmp_path_factory.mktemp("mlflow-template"))
    yield
    _TEMPLATE_FOLDER.clear()


@pytest.fixture
def store(tmp_path):
    """A RUNNING MLflow run on a SQLite store of its own: (tracking URI, client, run id)."""
    from mlflow.tracking import MlflowClient

    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    experiment = client.create_experiment("record", artifact_location=(tmp_path / "artifacts").as_uri())
    return uri, client, client.create_run(experiment).info.run_id


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The local data folder (``CLSR_DATA_DIR``, default ``../shared/data``)."""
    path = Path(os.environ.get("CLSR_DATA_DIR") or REPO_ROOT.parent / "shared" / "data")
    if not (path / "senteval").is_dir():
        pytest.skip(f"local data not found at {path}; set CLSR_DATA_DIR to the shared data folder")
    return path


@dataclass(frozen=True)
class FinishedStudy:
    """A study that ran end to end: its MLflow store, working folder and the command's output; the
    webhook server its ``notify`` posted to, and that URL's secret part (issue 56)."""

    uri: str
    folder: Path
    output: str
    webhook: WebhookServer | None = None
    notify_secret: str = ""


@pytest.fixture(scope="session")
def smoke_study(tmp_path_factory) -> Iterator[FinishedStudy]:
    """`platform study run studies/smoke.yaml` once per test session (about 2 minutes on 2 cores);
    the end-to-end test checks it, and the report, MLflow UI and model tests read its store. Run from a
    copy that adds ``notify`` (in the file: the URL is never argv) pointing at a real HTTP server on
    127.0.0.1, whose URL path stands for a webhook's secret."""
    from tests.e2e.test_e2e import platform_cmd

    folder = tmp_path_factory.mktemp("smoke-study")
    uri = sqlite_uri(folder / "mlflow.db")
    webhook = WebhookServer()
    secret = "T0SMOKE/B0SMOKE/smoke-webhook-s3cret"
    study_file = folder / "smoke.yaml"
    study_file.write_text(
        (REPO_ROOT / "studies" / "smoke.yaml").read_text()
        + f"notify: {{url: '{webhook.url('/services/' + secret)}', on: [failed, finished, verdicts]}}\n"
    )
    args = (
        "study",
        "run",
        str(study_file),
        "--set",
        f"storage_path={folder / 'runs'}",
        # system metrics add rows that shift the MLflow compare view's two grids apart for the UI test's
        # row matching; tests/e2e/test_resilience.py checks them through Ray Train
        "--set",
        "system_metrics_interval_s=null",
        # STS-B dev and test, STS16 test: a seeded sample of each (the full sets tripled the evaluation,
        # which was most of this study's 4 minutes); the round-trip test scores the same sample
        "--set",
        f"eval.sts_max_pairs={SMOKE_STS_PAIRS}",
    )
    proc = platform_cmd(*args, cwd=folder, uri=uri)
    try:
        output, _ = proc.communicate(timeout=600)
        assert proc.returncode == 0, output[-3000:]
        yield FinishedStudy(uri, folder, output, webhook, secret)
    finally:
        webhook.close()


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> str:
    """``save_tiny_bert`` with BERT's default dropout."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))
