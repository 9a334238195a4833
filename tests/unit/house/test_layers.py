"""The house's rules, held: no import cycle among ``clsr``'s modules (imports inside functions and under
``TYPE_CHECKING`` count), and the layer contracts of ``pyproject.toml`` kept (``lint-imports``, which
.ci/run runs too). Imports are read by grimp, import-linter's own graph builder."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import grimp

REPO_ROOT = Path(__file__).resolve().parents[3]


def import_cycles(package: str) -> list[list[str]]:
    """The strongly connected groups of more than one module in ``package``'s import graph (Tarjan)."""
    graph = grimp.build_graph(package, include_external_packages=False)
    edges = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in sorted(graph.modules)}
    order: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        order[module] = low[module] = len(order)
        stack.append(module)
        for imported in edges[module]:
            if imported not in order:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], order[imported])
        if low[module] == order[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in edges:
        if module not in order:
            visit(module)
    return cycles


def test_no_module_of_the_platform_imports_one_that_imports_it_back():
    assert import_cycles("clsr") == []


def test_the_cycle_check_sees_imports_inside_functions_and_type_checking(tmp_path, monkeypatch):
    package = tmp_path / "toy"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "low.py").write_text("def f():\n    from toy.high import g\n")
    (package / "high.py").write_text("from toy.low import f\n")
    (package / "other.py").write_text("import toy.typed\n")
    (package / "back.py").write_text("import toy.other\n")
    (package / "typed.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import toy.back\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert sorted(import_cycles("toy")) == [["toy.back", "toy.other", "toy.typed"], ["toy.high", "toy.low"]]


def test_the_layer_contracts_are_kept():
    lint = Path(sys.executable).with_name("lint-imports")
    done = subprocess.run([str(lint)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "0 broken" in done.stdout


def test_the_configuration_imports_no_torch():
    """Reading and checking a study's own sections does not pay for torch (``clsr.config``)."""
    code = (
        "import sys, pkgutil, importlib, clsr.config\n"
        "for m in pkgutil.iter_modules(clsr.config.__path__): importlib.import_module('clsr.config.' + m.name)\n"
        "print(sorted(n for n in sys.modules if n == 'torch' or n.startswith('torch.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_every_built_in_method_is_registered_under_its_own_name():
    from clsr.config.methods import BUILT_IN, METHODS
    from clsr.methods.base import Method

    for name in BUILT_IN:
        assert issubclass(METHODS[name], Method) and METHODS[name].name == name
