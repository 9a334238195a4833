"""The stacked transfer fits' training step without autograd or ``torch.optim``: the same bits, faster.

SentEval's classifier (``nhid=0``) is a linear layer trained on each fit's batch-mean cross-entropy with
PyTorch's Adam ("test" mode) or RMSprop ("fast"), at their default hyperparameters plus an L2 penalty
(``weight_decay``). ``clsr.eval.transfer_fits`` steps up to 32 such fits as one stacked layer ``[fits,
classes, dim]``: thousands of steps a fit, each a few microseconds of arithmetic, so autograd's graph
and engine and the optimizer's per-step Python (about 0.5 ms a step on one CPU thread) were most of a
stack's time. Here, for logits ``z = b + W xᵀ`` and log-probabilities ``ℓ = log_softmax(z)`` over the
classes:

* the gradients come from the kernels autograd's backward runs, in its order: ``∂L/∂ℓ`` is ``−1/rows``
  at each row's target (the batch mean's and ``nll_loss``'s backward), ``∂L/∂z`` is
  ``_log_softmax_backward_data``'s, ``∂L/∂W = (∂L/∂z) x`` (``bmm``) and ``∂L/∂b = Σ_rows ∂L/∂z``;
* the update is ``torch.optim``'s single-tensor Adam or RMSprop (no amsgrad, momentum or centring),
  operation for operation as PyTorch writes it.

Why by hand: no library steps many small linear classifiers in lockstep, and the result has to equal
the autograd and ``torch.optim`` loop SentEval runs, bit for bit; the tests compare both, for both
optimizers, also after fits have left the stack. (On a GPU ``torch.optim`` itself would take its
multi-tensor path, whose rounding may differ; the GPU's stacked fits are documented to differ from the
CPU's by rounding either way.)
"""

from __future__ import annotations

import torch
from torch import Tensor

ADAM_LR, ADAM_BETAS, ADAM_EPS = 1e-3, (0.9, 0.999), 1e-8  # torch.optim.Adam's defaults (SentEval sets none)
RMSPROP_LR, RMSPROP_ALPHA, RMSPROP_EPS = 1e-2, 0.99, 1e-8  # torch.optim.RMSprop's defaults


def gradients(inputs: Tensor, targets: Tensor, weight: Tensor, bias: Tensor) -> tuple[Tensor, Tensor]:
    """∂/∂(weight, bias) of Σ_fits mean_rows cross_entropy(bias + weight · inputsᵀ, targets), formed as
    autograd forms them. ``inputs`` [fits, rows, dim], ``targets`` [fits, rows], ``weight`` [fits,
    classes, dim], ``bias`` [fits, classes]."""
    # [fits, classes, rows]: the weights' gradient is then (classes × rows) @ (rows × dim), a fast shape;
    # x @ wᵀ would give it as dim × classes, 3-10× slower on a CPU thread
    logits = torch.baddbmm(bias.unsqueeze(2), weight, inputs.transpose(1, 2))
    log_probs = torch.log_softmax(logits, 1)
    per_row = torch.ones(targets.shape, dtype=logits.dtype, device=logits.device).div_(targets.shape[1])
    grad_log_probs = torch.zeros_like(log_probs).scatter_(
        1, targets.unsqueeze(1), per_row.neg_().unsqueeze(1)
    )
    # private but what autograd runs (torch is pinned; tests/unit/eval/test_transfer.py compares with autograd)
    grad_logits = torch._log_softmax_backward_data(grad_log_probs, log_probs, 1, logits.dtype)
    return torch.bmm(grad_logits, inputs), grad_logits.sum(2, keepdim=True).squeeze(2)


class StackedOptimizer:
    """``torch.optim.Adam`` (``"adam"``) or ``RMSprop`` (``"rmsprop"``) at their defaults with L2
    ``weight_decay``, on a stack's weight and bias, which it owns (``weight``, ``bias``)."""

    def __init__(self, optim: str, weight: Tensor, bias: Tensor, weight_decay: float) -> None:
        if optim not in ("adam", "rmsprop"):
            raise ValueError(f"unknown optimizer {optim!r}; allowed: adam, rmsprop")
        self.optim, self.weight_decay = optim, weight_decay
        self.params = [weight, bias]
        moments = 2 if optim == "adam" else 1  # Adam: exp_avg, exp_avg_sq; RMSprop: square_avg
        self.state = [[torch.zeros_like(p) for _ in range(moments)] for p in self.params]
        self.steps = 0

    @property
    def weight(self) -> Tensor:
        return self.params[0]

    @property
    def bias(self) -> Tensor:
        return self.params[1]

    def step(self, grads: tuple[Tensor, Tensor]) -> None:
        self.steps += 1
        if self.optim == "adam":
            self._adam(grads)
        else:
            self._rmsprop(grads)

    def keep(self, index: Tensor) -> None:
        """Only the fits at stack slots ``index`` stay: their weights, biases and moments."""
        self.params = [p[index] for p in self.params]
        self.state = [[m[index] for m in moments] for moments in self.state]

    def _decayed(self, param: Tensor, grad: Tensor) -> Tensor:
        return grad.add(param, alpha=self.weight_decay) if self.weight_decay != 0 else grad

    def _adam(self, grads: tuple[Tensor, Tensor]) -> None:
        beta1, beta2 = ADAM_BETAS
        step = float(self.steps)  # torch.optim counts in a float32 tensor: the same below 2**24 steps
        step_size = ADAM_LR / (1 - beta1**step)
        bias_correction2_sqrt = (1 - beta2**step) ** 0.5
        for param, grad, (exp_avg, exp_avg_sq) in zip(self.params, grads, self.state, strict=True):
            grad = self._decayed(param, grad)
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(ADAM_EPS)
            param.addcdiv_(exp_avg, denom, value=-step_size)

    def _rmsprop(self, grads: tuple[Tensor, Tensor]) -> None:
        for param, grad, (square_avg,) in zip(self.params, grads, self.state, strict=True):
            grad = self._decayed(param, grad)
            square_avg.mul_(RMSPROP_ALPHA).addcmul_(grad, grad, value=1 - RMSPROP_ALPHA)
            param.addcdiv_(grad, square_avg.sqrt().add_(RMSPROP_EPS), value=-RMSPROP_LR)
