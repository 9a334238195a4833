"""The supported ranges are declared once: each pin of ``.ci/lowest.txt`` (the second CI environment) is
its package's lower bound in ``pyproject.toml``, and ``docs/index.md``'s table says the same."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

REPO_ROOT = Path(__file__).resolve().parents[3]


def _lower_bounds() -> dict[str, str]:
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    bounds = {}
    for line in pyproject["project"]["dependencies"]:
        requirement = Requirement(line)
        for spec in requirement.specifier:
            if spec.operator == ">=":
                bounds[requirement.name.lower().replace("_", "-")] = spec.version
    return bounds


def _lowest_pins() -> dict[str, str]:
    pins = {}
    for line in (REPO_ROOT / ".ci" / "lowest.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip().lower().replace("_", "-")] = version.strip()
    return pins


def test_each_lowest_pin_is_its_packages_lower_bound():
    bounds = _lower_bounds()
    for name, version in _lowest_pins().items():
        assert name in bounds, f"{name} is pinned in .ci/lowest.txt but has no lower bound in pyproject.toml"
        assert re.sub(r"(\.0)+$", "", version) == re.sub(r"(\.0)+$", "", bounds[name]), name


def test_the_docs_table_names_each_tested_lower_bound():
    table = (REPO_ROOT / "docs" / "index.md").read_text()
    pins = _lowest_pins()
    for name in ("ray", "torch", "mlflow", "optuna", "transformers", "sentence-transformers"):
        assert f" | {pins[name]} | " in table, name
