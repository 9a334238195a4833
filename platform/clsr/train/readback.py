"""Per-step training metrics kept on the device and read back a window at a time.

Reading a GPU scalar (``loss.item()``, ``float(grad_norm)``) waits for every queued kernel, so doing it
every step stalls the host while the GPU drains, and the next step's launches start late. The loop keeps
each step's loss and gradient norm as device tensors and reads the window back in one transfer at log
and evaluation steps (``trainer.log_every``); every step's value still reaches MLflow. A diverged loss
is caught at that read, at most ``log_every`` steps late, and reported with the step it happened at.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch


@dataclass
class PendingSteps:
    """The steps since the last read: (step, loss, grad norm or None, learning rate, momentum or None)."""

    steps: list[tuple[int, torch.Tensor, torch.Tensor | None, float, float | None]] = field(
        default_factory=list
    )

    def add(
        self, step: int, loss: torch.Tensor, grad_norm: torch.Tensor | None, lr: float, momentum: float | None
    ) -> None:
        self.steps.append(
            (step, loss.detach(), None if grad_norm is None else grad_norm.detach(), lr, momentum)
        )

    def read(self) -> list[tuple[int, dict[str, float | None]]]:
        """``[(step, {"loss", "lr", "grad_norm", "momentum"})]`` in step order, with one device-to-host
        copy; raises ``FloatingPointError`` at the first step whose loss is not finite."""
        if not self.steps:
            return []
        values = torch.stack(
            [torch.stack([loss.float(), _or_nan(norm, loss)]) for _, loss, norm, _, _ in self.steps]
        )
        rows = values.tolist()  # the one synchronisation of the window
        out = []
        for (step, _, norm, lr, momentum), (loss, grad_norm) in zip(self.steps, rows, strict=True):
            if not math.isfinite(loss):
                self.steps = []
                raise FloatingPointError(f"loss became {loss} at step {step}; lower trainer.lr")
            metrics = {
                "loss": loss,
                "lr": lr,
                "grad_norm": None if norm is None else grad_norm,
                "momentum": momentum,
            }
            out.append((step, metrics))
        self.steps = []
        return out


def _or_nan(norm: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    return norm.float() if norm is not None else torch.full((), math.nan, device=like.device)
