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

REPO_ROOT = Path(__file__).resolve().parents[3]
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


def test_the_wheel_leaves_out_the_benchmarks_and_the_loopback_cluster():
    """``pip install .`` installs ``clsr`` alone: the benchmarks and the loopback cluster are the checkout's
    (``benchmarks/clsr_bench``), found by ``platform bench`` and ``platform cluster up`` at run time."""
    from setuptools import find_packages

    find = PYPROJECT["tool"]["setuptools"]["packages"]["find"]
    assert find == {"where": ["platform"], "include": ["clsr*"]}
    packages = find_packages(where="platform", include=find["include"])
    assert "clsr" in packages and "clsr.cluster" in packages
    assert [p for p in packages if "bench" in p] == []
    modules = [
        p.relative_to(REPO_ROOT / "platform").as_posix() for p in (REPO_ROOT / "platform").rglob("*.py")
    ]
    assert [m for m in modules if "bench" in m or "loopback" in m] == []
    assert (REPO_ROOT / "benchmarks" / "clsr_bench" / "loopback.py").is_file()
    assert not (REPO_ROOT / "platform" / "__init__.py").exists()


def test_the_platform_never_imports_the_checkouts_code():
    """Only ``clsr.checkout`` reaches ``clsr_bench``, by name, when ``platform bench`` or ``platform
    cluster up|down|kill-node`` runs; importing the CLI does not."""
    import subprocess

    for path in (REPO_ROOT / "platform" / "clsr").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            assert not [n for n in names if n.split(".")[0] == "clsr_bench"], path
    code = "import sys, clsr.cli, clsr.cluster.cli; assert not [m for m in sys.modules if 'clsr_bench' in m]"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_accelerate_is_the_bench_extra_not_core():
    core = {_name(r) for r in PYPROJECT["project"]["dependencies"]}
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert "accelerate" not in core and [_name(r) for r in extras["bench"]] == ["accelerate"]
    own = next(r for r in extras["dev"] if _name(r) == "clsr-platform")
    assert "bench" in own.split("[", 1)[1].rstrip("]").split(",")
