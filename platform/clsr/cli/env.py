"""``platform env``: the versions a bug report needs."""

from __future__ import annotations

import argparse


def add_parsers(commands) -> None:
    """``platform env`` (no options)."""
    commands.add_parser("env", help="print versions for bug reports")


def cmd_env(_: argparse.Namespace) -> int:
    import importlib.metadata as md
    import platform as stdlib_platform

    import clsr

    print(f"clsr {clsr.__version__}  python {stdlib_platform.python_version()}  {stdlib_platform.platform()}")
    for name in ("torch", "ray", "transformers", "datasets", "mlflow", "optuna", "pydantic", "scikit-learn"):
        try:
            print(f"  {name} {md.version(name)}")
        except md.PackageNotFoundError:
            print(f"  {name} (not installed)")
    return 0
