"""The example methods of ``examples/methods/`` run as a user runs their own: the study file and the
method's ``.py`` copied to a folder outside the repository, ``platform study run <study> --smoke``
through Ray Tune and MLflow, the new method beside the paper it extends.

Each study: 2 trials, about 2 minutes on 2 cores (measured with the examples registered by hand, before
the loader landed)."""

from __future__ import annotations

import shutil

import pytest

from tests.e2e.test_e2e import REPO_ROOT, platform_cmd, run_smoke_study, runs_of
from tests.support.stores import sqlite_uri
from tests.unit.examples.example_modules import assert_validates

pytestmark = [pytest.mark.e2e, pytest.mark.parallel, pytest.mark.minutes(2.5)]
EXAMPLES = REPO_ROOT / "examples" / "methods"


def finished_children(stem: str, tmp_path, capsys) -> list:
    """The child runs of the example's smoke study, run from a copy in ``tmp_path``."""
    for suffix in (".py", ".yaml"):
        shutil.copy(EXAMPLES / f"{stem}{suffix}", tmp_path / f"{stem}{suffix}")
    study = tmp_path / f"{stem}.yaml"
    assert_validates(study, capsys, "--smoke")
    uri, _ = run_smoke_study(study, tmp_path)
    _, parents, children = runs_of(uri, f"{stem}-smoke")
    assert len(parents) == 1 and len(children) == 2
    for run in children:
        assert run.data.tags["clsr.status"] == "finished", run.data.tags
        assert 20 < run.data.metrics["test_stsb"] < 95 and "best_dev_sickr" in run.data.metrics
    return children


def test_dcl_runs_beside_unsupervised_simcse(tmp_path, capsys):
    children = finished_children("dcl", tmp_path, capsys)
    methods = {r.data.tags["clsr.method"] for r in children}
    assert "simcse_unsup" in methods and len(methods) == 2
    assert {r.data.tags["clsr.seed"] for r in children} == {"1"}  # the same seed for both
    assert {r.data.tags["clsr.point"] for r in children} == {"SimCSE-unsup", "DCL"}


def test_matryoshka_runs_beside_its_inner_method_and_is_scored_truncated(tmp_path, capsys):
    children = finished_children("matryoshka", tmp_path, capsys)
    for run in children:
        metrics = run.data.metrics
        for dim in (256, 64):
            assert 0 < metrics[f"test_stsb_dim{dim}"] < 95 and f"test_sickr_dim{dim}" in metrics
            assert f"test_sts_avg_dim{dim}" in metrics
        assert metrics["test_stsb_dim64"] != metrics["test_stsb"]  # a prefix, not the whole embedding
    labels = {r.data.tags["clsr.point"] for r in children}
    assert labels == {"SimCSE-unsup", "Matryoshka"}


def test_the_scaffolds_study_runs_unchanged(tmp_path):
    """``platform method new my_loss`` and then ``platform study run my_loss.yaml`` as written: its method
    beside simcse_unsup over its 2 seeds (4 in-process trials, about 2 minutes)."""
    from clsr.cli import main

    assert main(["method", "new", "my_loss", "--dir", str(tmp_path)]) == 0
    uri = sqlite_uri(tmp_path / "mlflow.db")
    proc = platform_cmd("study", "run", "my_loss.yaml", cwd=tmp_path, uri=uri)
    output, _ = proc.communicate(timeout=1800)
    assert proc.returncode == 0, output[-3000:]
    _, parents, children = runs_of(uri, "my_loss")
    assert len(parents) == 1 and len(children) == 4
    assert {(r.data.tags["clsr.point"], r.data.tags["clsr.seed"]) for r in children} == {
        (point, seed) for point in ("simcse_unsup", "my_loss") for seed in ("1", "2")
    }
    for run in children:
        assert run.data.tags["clsr.status"] == "finished" and 0 < run.data.metrics["test_stsb"] < 100
    mine = [r for r in children if r.data.tags["clsr.point"] == "my_loss"]
    assert {r.data.params["method.source"] for r in mine} == {"file"}
