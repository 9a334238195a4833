"""What pyproject.toml declares matches what the code imports: every third-party module the package
imports comes from a declared distribution (core or an extra), every core dependency is imported or
used through a named library, and the build can write the SPDX license with its LICENSE file."""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
# core dependencies the package never imports by name, and who uses them
USED_THROUGH = {
    "optuna": "ray.tune.search.optuna",
    "psutil": "MLflow's system metrics",
    "nvidia-ml-py": "MLflow's system metrics (pynvml)",
    "tokenizers": "transformers' fast tokenizers",
    "tabulate": "pandas' DataFrame.to_markdown (the report)",
    "jinja2": "pandas' Styler (the report's HTML)",
}


def _name(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def imported_modules() -> set[str]:
    """Top-level modules the package imports (at module level or inside functions)."""
    found = set()
    for path in (REPO_ROOT / "platform" / "clsr").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return {m for m in found if m not in sys.stdlib_module_names and m not in ("clsr", "__future__")}


def test_every_imported_module_is_declared_and_every_core_dependency_is_used():
    core = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    extras = {_name(r) for reqs in PYPROJECT["project"]["optional-dependencies"].values() for r in reqs}
    declared = core | extras
    providers = md.packages_distributions()
    imported = imported_modules()
    undeclared = {
        module: providers.get(module)
        for module in imported
        if not {d.lower().replace("_", "-") for d in providers.get(module, [module])} & declared
    }
    assert undeclared == {}
    imported_from = {d.lower().replace("_", "-") for m in imported for d in providers.get(m, [])}
    unused = core - imported_from - set(USED_THROUGH)
    assert unused == set(), f"declared but never imported: {unused}"


def test_gclsr_and_the_browser_test_are_extras_not_core():
    core = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert "gensim" not in core and [_name(r) for r in extras["gclsr"]] == ["gensim"]
    assert "playwright" not in core and [_name(r) for r in extras["ui-test"]] == ["playwright"]


def test_the_build_can_write_the_spdx_license():
    requires = PYPROJECT["build-system"]["requires"]
    setuptools = next(r for r in requires if _name(r) == "setuptools")
    assert tuple(int(x) for x in setuptools.split(">=")[1].split(".")) >= (77,)
    assert PYPROJECT["project"]["license"] == "Apache-2.0"
    assert "Apache License" in (REPO_ROOT / "LICENSE").read_text()[:200]
