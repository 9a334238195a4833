"""A newcomer's first mistakes, refused before anything starts with what to do (issue 35): a data folder
one level off, and a folder of studies of which some need hub models this machine has not cached."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import yaml

from clsr.cli import main
from clsr.data.sources import data_folder_problem

SMOKE = Path(__file__).resolve().parents[1] / "studies" / "smoke.yaml"


def test_a_data_folder_one_level_too_high_is_refused_with_where_it_is(tmp_path, monkeypatch, capsys):
    (tmp_path / "data" / "wiki").mkdir(parents=True)
    monkeypatch.setenv("CLSR_DATA_DIR", str(tmp_path))
    started = time.monotonic()
    assert main(["study", "validate", str(SMOKE)]) == 1
    assert time.monotonic() - started < 30  # before any trial, model or Ray
    err = capsys.readouterr().err
    assert f"$CLSR_DATA_DIR = '{tmp_path}' holds none of senteval/, nli/, wiki/" in err
    assert f"did you mean '{tmp_path / 'data'}'?" in err
    assert err.count("\n") == 2  # the count line and one problem line, not one per trial


def test_a_data_folder_one_level_too_deep_points_up(tmp_path, monkeypatch):
    (tmp_path / "wiki" / "inner").mkdir(parents=True)
    (tmp_path / "nli").mkdir()
    problem = data_folder_problem(str(tmp_path / "wiki"))
    assert problem.startswith(f"data.data_dir = '{tmp_path / 'wiki'}' holds none of")
    assert problem.endswith(f"did you mean '{tmp_path}'?")
    assert data_folder_problem(str(tmp_path)) is None
    monkeypatch.delenv("CLSR_DATA_DIR")
    assert data_folder_problem() is None  # no folder: the hub


def test_a_folder_of_studies_ends_with_one_summary_line(tmp_path, capsys):
    shutil.copy(SMOKE, tmp_path / "smoke.yaml")
    hub = yaml.safe_load(SMOKE.read_text())
    hub["name"] = "hub"
    hub["base"]["model"]["name"] = "some-org/a-model-nobody-cached"
    (tmp_path / "hub.yaml").write_text(yaml.safe_dump(hub))
    broken = dict(hub, name="broken", metric="no_such_metric")
    (tmp_path / "broken.yaml").write_text(yaml.safe_dump(broken))
    assert main(["study", "validate", str(tmp_path)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == (
        "1 valid; 1 need hub models or sets that are not in your cache: hub.yaml — run once with the hub "
        "reachable, or add --set skip_unavailable=true; 1 invalid (above)"
    )
