"""Shared fixtures: the local data directory and quiet, offline defaults for every test."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))  # the tests import helpers from test_e2e

# Offline and quiet by default: these machines have no hub access.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("CLSR_DATA_DIR", str((REPO_ROOT.parent / "shared" / "data").resolve()))


# CI runs the end-to-end tests marked `parallel` two at a time (pytest-xdist, `--dist loadgroup`), each
# handed out in collection order as a process frees up: the longest first, so that the two processes end
# together instead of one running the longest test alone at the end (2 cores, 2026-12-01: SelfCCL 274 s,
# SupMPN 221, GCLSR 207, confirm 179, two workers 167, own data 145, adaptive 108, the rest under 40).
LONGEST_FIRST = (
    "test_selfccl_study.py",
    "test_supmpn_study.py",
    "test_gclsr_study.py",
    "test_confirm.py",
    "test_distributed.py",
    "test_e2e.py",
    "test_adaptive_e2e.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}

    def position(item: pytest.Item) -> int:
        return rank.get(item.path.name, len(rank)) if item.get_closest_marker("e2e") else len(rank)

    items.sort(key=position)  # stable: a file's tests keep their order, the unit tests theirs


_TEMPLATE_FOLDER: list[Path] = []


@pytest.fixture(scope="session", autouse=True)
def _mlflow_store_template(tmp_path_factory):
    """Where ``sqlite_uri`` keeps its migrated empty store (created on first use, once per test process)."""
    _TEMPLATE_FOLDER.append(tmp_path_factory.mktemp("mlflow-template"))
    yield
    _TEMPLATE_FOLDER.clear()


def sqlite_uri(path: Path) -> str:
    """The URI of a SQLite MLflow store at ``path``, each test's own. A new store is a copy of one that
    MLflow created and migrated once per test process: its migrations cost each process that opens a new
    file about 3 s of CPU (tests/test_first_hour.py still starts from no file, as a new user does). The
    copy's Default experiment keeps its artifacts where MLflow would have put them for a new file:
    ``mlruns/0`` under the working folder of the moment, not the template's."""
    path = Path(path)
    if not path.exists():
        template = _TEMPLATE_FOLDER[-1] / "mlflow.db"
        if not template.exists():
            from mlflow.tracking import MlflowClient

            MlflowClient(f"sqlite:///{template}").search_experiments()
        shutil.copyfile(template, path)
        with contextlib.closing(sqlite3.connect(path)) as db, db:
            default = str(Path.cwd() / "mlruns" / "0")
            db.execute("UPDATE experiments SET artifact_location = ? WHERE experiment_id = 0", (default,))
    return f"sqlite:///{path}"


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
    path = Path(os.environ["CLSR_DATA_DIR"])
    if not (path / "senteval").is_dir():
        pytest.skip(f"local data not found at {path}; set CLSR_DATA_DIR to the shared data folder")
    return path


@dataclass(frozen=True)
class FinishedStudy:
    """A study that ran end to end: its MLflow store, working folder and the command's output."""

    uri: str
    folder: Path
    output: str


SMOKE_STS_PAIRS = 300


@pytest.fixture(scope="session")
def smoke_study(tmp_path_factory) -> FinishedStudy:
    """`platform study run studies/smoke.yaml` once per test session (about 2 minutes on 2 cores);
    the end-to-end test checks it, and the report, MLflow UI and model tests read its store."""
    from test_e2e import platform_cmd

    folder = tmp_path_factory.mktemp("smoke-study")
    uri = sqlite_uri(folder / "mlflow.db")
    args = (
        "study",
        "run",
        str(REPO_ROOT / "studies" / "smoke.yaml"),
        "--set",
        f"storage_path={folder / 'runs'}",
        # system metrics add rows that shift the MLflow compare view's two grids apart for the UI test's
        # row matching; tests/test_resilience.py checks them through Ray Train
        "--set",
        "system_metrics_interval_s=null",
        # STS-B dev and test, STS16 test: a seeded sample of each (the full sets tripled the evaluation,
        # which was most of this study's 4 minutes); the round-trip test scores the same sample
        "--set",
        f"eval.sts_max_pairs={SMOKE_STS_PAIRS}",
    )
    proc = platform_cmd(*args, cwd=folder, uri=uri)
    output, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, output[-3000:]
    return FinishedStudy(uri, folder, output)


def save_tiny_bert(folder: Path, dropout: float | None = None, hidden: int = 16) -> str:
    """A 2-layer, 4-head BERT with MiniLM's tokenizer, saved in ``folder`` (random weights, seed 0):
    fast tests of the real encoder code. ``dropout`` overrides BERT's 0.1 hidden and attention dropout."""
    import torch
    from transformers import BertConfig, BertModel

    from clsr.encoders.transformer import load_tokenizer

    torch.manual_seed(0)
    tokenizer = load_tokenizer("minilm")
    rates = (
        {} if dropout is None else {"hidden_dropout_prob": dropout, "attention_probs_dropout_prob": dropout}
    )
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=32,
        max_position_embeddings=64,
        **rates,
    )
    BertModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="module")
def tiny_bert(tmp_path_factory) -> str:
    """``save_tiny_bert`` with BERT's default dropout."""
    return save_tiny_bert(tmp_path_factory.mktemp("tiny-bert"))


def stub_hub_cache(root: Path, repo_ids: list[str]) -> Path:
    """A Hugging Face hub cache at ``root`` in which each model id has a snapshot holding a config.json,
    laid out as ``hf download`` leaves it (``models--owner--name/refs/main`` → ``snapshots/<commit>``):
    what ``study validate`` looks for offline. No weights: validation never reads them."""
    commit = "0" * 40
    for repo_id in repo_ids:
        repo = root / f"models--{repo_id.replace('/', '--')}"
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit)
        snapshot = repo / "snapshots" / commit
        snapshot.mkdir(parents=True, exist_ok=True)
        (snapshot / "config.json").write_text("{}")
    return root


def stub_datasets_cache(root: Path) -> Path:
    """A datasets cache (``HF_DATASETS_CACHE``) at ``root`` holding every hub data set of the manifest as
    ``load_dataset`` leaves a prepared one (``owner___name/<config>/<version>/<hash>``), and the ordered
    Wikipedia text as ``wiki_ordered`` keeps it: what ``study validate`` looks for offline. No rows."""
    from clsr.data.hub_manifest import HUB_DATASETS
    from clsr.data.ordered_text import built_copy

    for hub_id, entry in HUB_DATASETS.items():
        for config in entry.configs or ("default",):
            (root / hub_id.replace("/", "___") / config / "0.0.0" / ("0" * 16)).mkdir(
                parents=True, exist_ok=True
            )
    built_copy(root).parent.mkdir(parents=True, exist_ok=True)
    built_copy(root).write_text("A sentence .\n")
    return root


def hub_model_ids(studies: list[Path]) -> list[str]:
    """Every hub id the shipped studies' trials name as model.name (not short names, not folders)."""
    from clsr.data.model_registry import SHORT_NAMES

    names = {getattr(trial.model, "name", "minilm") for trial in _shipped_trials(studies)}
    return sorted(names - set(SHORT_NAMES))


def _shipped_trials(studies: list[Path]) -> list:
    """One resolved trial per point (a sampled ablation's base) of each study."""
    from clsr.study.plan.load import load_study
    from clsr.study.plan.resolve import grid_points, resolve_trial

    trials = []
    for path in studies:
        study = load_study(path)
        for name, ablation in study.ablations.items():
            points = grid_points(ablation) if not ablation.space else [{"overrides": {}}]
            for point in points:
                trials.append(resolve_trial(study, name, point["overrides"], study.seeds_of(name)[0]))
    return trials
