"""Benchmarks (``platform bench <name>``): figures printed as tables, not tests.

Each module holds a ``run_*`` function that returns a dict of figures and a ``format_*`` function that
prints them: ``train`` (trainer step vs sentence-transformers), ``memory`` (GradCache), ``sts_eval``
(STS evaluation vs sentence-transformers' ``encode``), ``study`` (a whole study's overheads). This
module holds what they share: the machine description, device and precision choice, a plain table.
``loopback`` is the loopback cluster (``platform cluster up``), which ``cluster`` and the tests use.

A package of the source checkout, not of the wheel: ``platform bench`` and ``platform cluster up`` find
it beside ``platform/`` (``clsr.checkout``); pytest finds it through its ``pythonpath`` setting.
"""

from __future__ import annotations

import contextlib
import importlib.metadata as md
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or "unknown CPU"


def machine() -> dict[str, Any]:
    """What the figures were measured on: CPU (model, cores, torch threads), GPU, library versions."""
    import torch

    info: dict[str, Any] = {
        "cpu": cpu_model(),
        "cpu_cores": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    for name in ("torch", "transformers", "sentence-transformers"):
        try:
            info[name] = md.version(name)
        except md.PackageNotFoundError:
            info[name] = None
    return info


def format_machine(info: dict[str, Any]) -> str:
    where = f"GPU {info['gpu']}" if info.get("gpu") else "no GPU"
    return (
        f"machine: {info['cpu']} ({info['cpu_cores']} cores, {info['torch_threads']} torch threads), {where}; "
        f"torch {info['torch']}, transformers {info['transformers']}, "
        f"sentence-transformers {info['sentence-transformers']}"
    )


def resolve_device(name: str = "auto") -> Any:
    """``auto``: the GPU when there is one, else the CPU."""
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda: no CUDA device is available here")
    return torch.device(name)


def resolve_precision(precision: str, device: Any) -> str:
    """``auto``: bf16 on a GPU that supports it, else fp32 (the trainer's rule, one copy of it)."""
    from clsr.encoders.precision import resolved_precision

    return resolved_precision(precision, device)


def autocast(precision: str, device: Any) -> contextlib.AbstractContextManager:
    """The trainer's autocast for a resolved precision (``fp32``: none)."""
    from clsr.encoders.precision import autocast_context

    return autocast_context(precision, device)


def synchronize(device: Any) -> None:
    """Wait for queued GPU work, so that a clock read after it measures the work."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Left-aligned columns; floats with 4 significant digits."""

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4g}"
        return "-" if value is None else str(value)

    cells = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True))
    body = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join([line, "-" * len(line), *body])


def write_json(path: str | Path, figures: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(figures, indent=2, default=str) + "\n")
