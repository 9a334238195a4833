"""Dropout whose CPU masks are drawn by NumPy's PCG64: the same dropout, its masks drawn faster.

Dropout keeps each value with probability ``1 − p`` and scales the kept ones by ``1 / (1 − p)``. On a
CPU, PyTorch draws that mask with ``bernoulli_`` on one thread: 9.5 ms for a MiniLM batch's hidden
states (2,900 tokens × 384) on the 2-core development machine, where NumPy's PCG64 draws as many
uniform floats in 3.3 ms (``torch.rand``: 4.6 ms). A MiniLM training step on those cores draws 13 such
masks (the embeddings' and two a layer); drawn here, the step took 4–5 % less time (the same
batches, alternated: ``benchmarks/results/2026-12-02-cpu2/``). Every ``nn.Dropout`` the model calls
draws here (MPNet's attention probabilities too); BERT and RoBERTa hand their attention dropout's rate
to the attention kernel, which keeps its own: those masks are smaller, and attention by hand measured
no faster.

``uniform_dropout`` draws ``u ~ U[0, 1)`` (float32) per value and keeps ``u ≥ p``: the same
distribution as ``bernoulli_(1 − p)`` (to within float32's 2⁻²⁴), other masks. Each call seeds a
fresh PCG64 from PyTorch's default generator, so ``torch.manual_seed`` and the trainer's saved RNG
state decide the masks as they decide PyTorch's. Off a CPU (a GPU's fused dropout is fast) and inside
``torch.compile`` (its own fused random numbers), it is ``torch.nn.functional.dropout`` itself.

Why by hand: no library draws PyTorch's CPU dropout masks faster; this module is that one draw.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

_SEEDS = 2**62  # a PCG64 seed per mask, drawn from PyTorch's generator


def uniform_dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """``x`` with dropout ``p`` applied (training), its CPU mask from PCG64; as ``F.dropout`` else."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p == 1.0 or torch.compiler.is_compiling():
        return nn.functional.dropout(x, p, training)
    seed = int(torch.randint(_SEEDS, (1,)))
    draws = np.random.Generator(np.random.PCG64(seed)).random(x.numel(), dtype=np.float32)
    keep = torch.from_numpy(draws).view(x.shape).ge_(p).div_(1.0 - p)
    return x * keep.to(x.dtype)


class UniformDropout(nn.Dropout):
    """``nn.Dropout`` (same ``p``, same place in the model) whose CPU masks ``uniform_dropout`` draws;
    never in place (the output is the same)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return uniform_dropout(x, self.p, self.training)


def use_uniform_dropout(model: nn.Module) -> int:
    """Replace every plain ``nn.Dropout`` of ``model`` with a ``UniformDropout`` of the same ``p``;
    returns how many. An attention module that hands its dropout's ``p`` to an attention kernel keeps
    the module for its ``p`` and does not call it."""
    swapped = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if type(child) is nn.Dropout:
                setattr(module, name, UniformDropout(child.p))
                swapped += 1
    return swapped
