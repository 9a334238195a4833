"""``platform study reproduce`` on the smoke study's record (issue 55): one of its trials rebuilt from the
record alone and trained again in this process gives bitwise-equal metrics and weights, read back from
MLflow; an edited data file and an installed package the trial did not have are reported as drift."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from clsr.cli import main
from tests.e2e.test_e2e import runs_of

pytestmark = [pytest.mark.e2e, pytest.mark.parallel, pytest.mark.minutes(1.5)]
POINT = "method.temperature=0.05"


def edited_data(data: Path, folder: Path) -> Path:
    """The data folder, its entries linked but for the training file, copied with one word replaced."""
    folder.mkdir()
    for entry in data.iterdir():
        if entry.name != "wiki":
            (folder / entry.name).symlink_to(entry.resolve())
    (folder / "wiki").mkdir()
    for f in (data / "wiki").iterdir():
        (folder / "wiki" / f.name).write_text(f.read_text().replace(" the ", " a "))
    return folder


def fake_distribution(folder: Path) -> Path:
    """A folder on sys.path holding an installed distribution the trial's environment did not have."""
    info = folder / "clsr_drift_probe-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: clsr-drift-probe\nVersion: 1.0\n")
    return folder


@pytest.mark.xdist_group("smoke_study")
def test_a_smoke_trial_reproduces_bitwise_and_edited_data_or_a_new_package_is_drift(
    smoke_study, tmp_path, monkeypatch, capsys
):
    from mlflow.tracking import MlflowClient

    from clsr.data.sources import resolve_data_dir

    # the record copied: the reproduction's run stays out of the store the other smoke tests count
    shutil.copy(smoke_study.uri.removeprefix("sqlite:///"), tmp_path / "mlflow.db")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.chdir(tmp_path)
    _, _, children = runs_of(uri, "smoke")
    original = next(r for r in children if r.data.tags["clsr.point"] == POINT)
    assert main(["study", "reproduce", original.info.run_id, "--tracking-uri", uri]) == 0
    out = capsys.readouterr().out
    assert "configuration: the rebuilt one equals the trial's logged params" in out
    assert "trained weights (sha256): bitwise equal" in out
    assert "data hashes agree (4 logged by both)" in out
    assert out.rstrip().splitlines()[-2] == "reproduction: bitwise equal"
    assert "not compared (cost): samples_per_s" in out

    client = MlflowClient(uri)
    again = client.search_runs(
        [original.info.experiment_id], f"tags.`clsr.reproduction_of` = '{original.info.run_id}'"
    )
    assert len(again) == 1 and "mlflow.parentRunId" not in again[0].data.tags  # no trial of the study
    run = again[0]
    assert run.data.tags["clsr.status"] == "finished"
    for name in ("best_dev_stsb", "test_sts_avg", "test_sts16", "loss", "align", "uniform"):
        assert run.data.metrics[name] == original.data.metrics[name], name
    assert run.data.tags["clsr.weights_sha256"] == original.data.tags["clsr.weights_sha256"]
    assert run.data.params["data.train.sha256"] == original.data.params["data.train.sha256"]

    # drift: an edited training file, and a package the trial's environment did not have
    if (data := resolve_data_dir(None)) is None:
        pytest.skip("no data folder ($CLSR_DATA_DIR) to copy and edit")
    monkeypatch.setenv("CLSR_DATA_DIR", str(edited_data(data, tmp_path / "data")))
    monkeypatch.syspath_prepend(str(fake_distribution(tmp_path / "site")))
    argv = ["study", "reproduce", "smoke", "--point", POINT, "--seed", "1", "--check-only"]
    assert main([*argv, "--tracking-uri", uri]) == 1
    out = capsys.readouterr().out
    recorded = original.data.params["data.train.sha256"][:12]
    assert f"data hashes differ: data.train.sha256 {recorded} (A) / " in out
    assert "packages differ: clsr-drift-probe - (A) / 1.0 (B)" in out
    assert out.rstrip().endswith("drift found: a rerun here may not reproduce the trial")
    assert len(client.search_runs([original.info.experiment_id])) == len(children) + 2  # nothing logged
