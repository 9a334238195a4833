"""Golden values: each loss on a tiny hand-made batch equals an independent NumPy computation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from clsr.methods.mnrl import mnrl_loss
from clsr.methods.simcse_sup import simcse_sup_loss
from clsr.methods.simcse_unsup import simcse_unsup_loss

RNG = np.random.default_rng(0)


def np_cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return a @ b.T


def np_cross_entropy(logits: np.ndarray) -> float:
    """Mean over rows of -log softmax(row)[i], computed with an explicit log-sum-exp."""
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-np.mean([log_softmax[i, i] for i in range(len(logits))]))


def test_simcse_unsup_matches_numpy_and_a_hand_value():
    views = RNG.normal(size=(4, 2, 8))
    expected = np_cross_entropy(np_cos(views[:, 0], views[:, 1]) / 0.05)
    got = simcse_unsup_loss(torch.tensor(views), temperature=0.05).item()
    assert got == pytest.approx(expected, rel=1e-10)

    # Two orthogonal sentences whose views are identical: sim(h_i, h_i+) = 1, sim(h_i, h_j+) = 0.
    eye = torch.eye(2, dtype=torch.float64)
    hand = simcse_unsup_loss(torch.stack([eye, eye], dim=1), temperature=0.5).item()
    assert hand == pytest.approx(np.log(1 + np.exp(-2.0)), rel=1e-12)  # -log(e^2 / (e^2 + e^0))


@pytest.mark.parametrize("alpha", [1.0, 0.5, 2.0])
def test_simcse_sup_with_hard_negatives_and_weight(alpha):
    views = RNG.normal(size=(5, 3, 6))
    tau = 0.05
    pos = np_cos(views[:, 0], views[:, 1]) / tau
    neg = np_cos(views[:, 0], views[:, 2]) / tau + np.log(alpha) * np.eye(5)
    expected = np_cross_entropy(np.concatenate([pos, neg], axis=1))
    got = simcse_sup_loss(torch.tensor(views), tau, hard_negative_weight=alpha).item()
    assert got == pytest.approx(expected, rel=1e-10)


def test_simcse_sup_without_hard_negatives_is_pairs_only():
    views = RNG.normal(size=(3, 2, 4))
    expected = np_cross_entropy(np_cos(views[:, 0], views[:, 1]) / 0.1)
    assert simcse_sup_loss(torch.tensor(views), 0.1).item() == pytest.approx(expected, rel=1e-10)


def test_mnrl_candidates_are_all_positives_then_all_negatives():
    columns = RNG.normal(size=(4, 3, 5))  # anchor, positive, negative
    candidates = np.concatenate([columns[:, 1], columns[:, 2]])
    expected = np_cross_entropy(20.0 * np_cos(columns[:, 0], candidates))
    assert mnrl_loss(torch.tensor(columns), scale=20.0).item() == pytest.approx(expected, rel=1e-10)


def test_mnrl_with_scale_20_equals_simcse_sup_with_tau_005():
    views = torch.tensor(RNG.normal(size=(6, 3, 7)))
    assert mnrl_loss(views, 20.0).item() == pytest.approx(simcse_sup_loss(views, 0.05).item(), rel=1e-10)


def test_losses_backpropagate_to_every_view():
    views = torch.tensor(RNG.normal(size=(3, 3, 4)), requires_grad=True)
    simcse_sup_loss(views, 0.05).backward()
    assert torch.all(views.grad.abs().sum(dim=-1) > 0)
