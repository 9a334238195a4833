"""The study file's JSON Schema (``platform study schema``): generated from the pydantic models, committed
beside the shipped studies, named on their first line for editors, and accepting every one of them."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from clsr.cli import main
from clsr.study.spec.json_schema import schema_text

REPO_ROOT = Path(__file__).resolve().parents[4]
STUDIES = sorted((REPO_ROOT / "studies").glob("*.yaml"))


@pytest.fixture(scope="module")
def validator() -> jsonschema.Draft202012Validator:
    schema = json.loads((REPO_ROOT / "studies" / "schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def test_the_committed_schema_is_the_generated_one(tmp_path, capsys):
    committed = (REPO_ROOT / "studies" / "schema.json").read_text()
    assert committed == schema_text(), "regenerate: platform study schema --out studies/schema.json"
    assert main(["study", "schema", "--out", str(tmp_path / "s.json")]) == 0
    assert (tmp_path / "s.json").read_text() == committed


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.name)
def test_every_shipped_study_names_the_schema_and_passes_it(path, validator):
    assert path.read_text().splitlines()[0] == "# yaml-language-server: $schema=schema.json"
    errors = [
        f"{list(e.absolute_path)}: {e.message}"
        for e in validator.iter_errors(yaml.safe_load(path.read_text()))
    ]
    assert errors == []


@pytest.mark.parametrize(
    ("change", "where"),
    [
        ({"concurency": 2}, []),
        ({"method": ["simcse_unsup"]}, ["method"]),  # any name may be an installed entry point's
        ({"base": {"trainer": {"lerning_rate": 1e-5}}}, ["base", "trainer"]),
        ({"base": {"model": {"poling": "avg"}}}, ["base", "model"]),
        ({"base": {"eval": {"custom": {"mine": {"type": "sts"}}}}}, ["base", "eval", "custom", "mine"]),
    ],
)
def test_the_schema_flags_what_an_editor_should(change, where, validator):
    doc = yaml.safe_load((REPO_ROOT / "studies" / "smoke.yaml").read_text()) | change
    errors = list(validator.iter_errors(doc))
    assert errors and any(list(e.absolute_path)[: len(where)] == where for e in errors)
