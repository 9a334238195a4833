"""The example methods of ``examples/methods/``, loaded by file path as a user's study loads them."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

EXAMPLES = Path(__file__).resolve().parents[3] / "examples" / "methods"


def load_module(path: Path) -> ModuleType:
    """The module at ``path``, registered under a name of its own (pydantic resolves annotations there)."""
    name = f"clsr_example_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def example(stem: str) -> ModuleType:
    return load_module(EXAMPLES / f"{stem}.py")


def assert_validates(study: Path, capsys, *flags: str) -> None:
    """``platform study validate STUDY *flags`` says ok (``flags``: e.g. ``--smoke``, whose MiniLM is
    in the package; the full studies name hub models that an offline machine need not hold)."""
    from clsr.cli import main

    code = main(["study", "validate", str(study), *flags])
    assert code == 0, capsys.readouterr().err
