"""Which floating-point precision an encoder runs in, for training and for evaluation alike.

``precision`` is ``trainer.precision`` (``auto``, ``fp32``, ``bf16``, ``fp16``): ``auto`` is bf16 on a
GPU that supports it, else fp32. A trial's evaluation runs in the precision it trained in, so its dev
scores (which pick the checkpoint) and test scores are of the model as trained.
"""

from __future__ import annotations

import contextlib

import torch


def resolved_precision(precision: str, device: torch.device) -> str:
    """``auto``: bf16 on a GPU that supports it, else fp32; any other value as given."""
    if precision != "auto":
        return precision
    return "bf16" if device.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"


def autocast_context(precision: str, device: torch.device) -> contextlib.AbstractContextManager:
    """PyTorch's autocast for ``precision`` on ``device`` (fp32: none)."""
    precision = resolved_precision(precision, device)
    if precision == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if precision == "bf16" else torch.float16)


def resolve_device(device: str) -> torch.device:
    """``auto``: the GPU when one is visible, else the CPU; ``cuda`` without a GPU is refused."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r}: no CUDA GPU is visible here; use --device cpu (or auto)")
    return torch.device(device)
