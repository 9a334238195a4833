"""Commands that run from a source checkout only: ``platform bench`` and ``platform cluster
up|down|kill-node`` (the loopback cluster). Their code is the checkout's ``benchmarks/clsr_bench``, which
the wheel leaves out; it is found beside ``platform/`` (an editable install, or ``PYTHONPATH=platform``)
and imported only when one of those commands runs."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from types import ModuleType


def benchmarks_folder() -> Path | None:
    """The checkout's ``benchmarks/`` folder (holding ``clsr_bench``), or None for an installed wheel."""
    import clsr

    folder = Path(clsr.__file__).resolve().parents[2] / "benchmarks"
    return folder if (folder / "clsr_bench" / "__init__.py").is_file() else None


def from_checkout(module: str, command: str, extra: str) -> ModuleType | None:
    """``module`` (``clsr_bench`` or one of its modules) from the checkout; without one, a line on stderr
    saying so and None (the command then exits 2)."""
    folder = benchmarks_folder()
    if folder is None:
        print(
            f"error: `{command}` runs from a source checkout of clsr (git clone the repository, then "
            f'pip install -e ".[{extra}]" in it); this clsr has no benchmarks/ folder beside it',
            file=sys.stderr,
        )
        return None
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    return importlib.import_module(module)
