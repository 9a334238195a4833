"""Golden values: the example methods' losses (DCL, Matryoshka) equal independent NumPy computations on
fixed embeddings, and the examples use the public contract only."""

from __future__ import annotations

import ast

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from tests.unit.examples.example_modules import EXAMPLES, assert_validates, example

RNG = np.random.default_rng(54)
dcl = example("dcl")
matryoshka = example("matryoshka")


def np_cos(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return a @ b.T


def np_infonce(views: np.ndarray, tau: float) -> float:
    """SimCSE Eq. 4: mean over rows of -log softmax(row)[i] of cos(h_i, h_j^+)/τ."""
    logits = np_cos(views[:, 0], views[:, 1]) / tau
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return float(-np.mean(np.diag(log_softmax)))


def np_dcl(views: np.ndarray, tau: float) -> float:
    """Per row: -s_ii + log Σ_{j≠i} exp(s_ij), with s = cos/τ, written out with loops."""
    s = np_cos(views[:, 0], views[:, 1]) / tau
    n = len(s)
    rows = [-s[i, i] + np.log(sum(np.exp(s[i, j]) for j in range(n) if j != i)) for i in range(n)]
    return float(np.mean(rows))


@pytest.mark.parametrize("tau", [0.05, 0.5])
def test_dcl_matches_numpy(tau):
    views = RNG.normal(size=(6, 2, 8))
    got = dcl.DCL(dcl.DCLConfig(temperature=tau)).loss_from_embeddings(torch.tensor(views)).item()
    assert got == pytest.approx(np_dcl(views, tau), rel=1e-10)


def test_dcl_hand_value_and_its_gap_to_infonce():
    # Two orthogonal sentences with identical views, τ = 0.5: s = [[2, 0], [0, 2]]: per row -2 + log e^0.
    eye = torch.eye(2, dtype=torch.float64)
    assert dcl.dcl_loss(torch.stack([eye, eye], dim=1), 0.5).item() == pytest.approx(-2.0, abs=1e-12)
    # InfoNCE_i = DCL_i + log(1 + e^{s_ii} / Σ_{j≠i} e^{s_ij}): the positive's term, decoupled.
    views = RNG.normal(size=(5, 2, 4))
    s = np_cos(views[:, 0], views[:, 1]) / 0.1
    gap = np.mean([np.log1p(np.exp(s[i, i]) / (np.exp(s[i]).sum() - np.exp(s[i, i]))) for i in range(5)])
    got = dcl.dcl_loss(torch.tensor(views), 0.1).item()
    assert got + gap == pytest.approx(np_infonce(views, 0.1), rel=1e-10)


def test_dcl_reads_two_dropout_views_and_backpropagates():
    method = dcl.DCL(dcl.DCLConfig())
    assert method.views() == ("text", "text") and method.gradcache_supported()
    views = torch.tensor(RNG.normal(size=(4, 2, 5)), requires_grad=True)
    method.loss_from_embeddings(views).backward()
    assert torch.all(views.grad.abs().sum(dim=-1) > 0)


def test_matryoshka_is_the_weighted_sum_of_the_inner_loss_on_prefixes():
    views = RNG.normal(size=(5, 2, 8))
    cfg = matryoshka.MatryoshkaConfig(
        dims=[6, 4, 2], weights=[1.0, 0.5, 0.25], inner_config={"temperature": 0.1}
    )
    got = matryoshka.Matryoshka(cfg).loss_from_embeddings(torch.tensor(views)).item()
    expected = sum(w * np_infonce(views[..., :m], 0.1) for m, w in ((6, 1.0), (4, 0.5), (2, 0.25)))
    assert got == pytest.approx(expected, rel=1e-10)


def test_matryoshka_clips_dims_to_the_embedding_and_counts_each_prefix_once():
    views = RNG.normal(size=(4, 2, 8))
    cfg = matryoshka.MatryoshkaConfig(dims=[16, 8, 4], weights=[1.0, 2.0, 3.0])
    got = matryoshka.Matryoshka(cfg).loss_from_embeddings(torch.tensor(views)).item()
    assert got == pytest.approx(
        1.0 * np_infonce(views, 0.05) + 3.0 * np_infonce(views[..., :4], 0.05), rel=1e-10
    )
    # the default weights are 1 each, the paper's
    plain = matryoshka.Matryoshka(matryoshka.MatryoshkaConfig(dims=[8, 2])).loss_from_embeddings(
        torch.tensor(views)
    )
    assert plain.item() == pytest.approx(
        np_infonce(views, 0.05) + np_infonce(views[..., :2], 0.05), rel=1e-10
    )


def test_matryoshka_trains_what_the_inner_method_trains():
    method = matryoshka.Matryoshka(matryoshka.MatryoshkaConfig(inner_config={"same_dropout_mask": True}))
    assert method.views() == ("text",) and method.required_columns() == ("text",)
    assert matryoshka.Matryoshka(matryoshka.MatryoshkaConfig(inner="mnrl")).views() == (
        "anchor",
        "positive",
        "negative",
    )
    assert matryoshka.Matryoshka.gradcache_supported()


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dims": [64, 64]}, "distinct positive"),
        ({"dims": [64, 32], "weights": [1.0]}, "one per dim"),
        ({"weights": [1.0, -1.0, 1.0, 1.0, 1.0]}, "not negative"),
        ({"inner_config": {"temprature": 0.1}}, "temprature"),
        ({"inner": "no_such_method"}, "no_such_method"),
    ],
)
def test_matryoshka_refuses_a_bad_config(options, message):
    with pytest.raises((ValidationError, ValueError), match=message):
        matryoshka.MatryoshkaConfig(**options)


@pytest.mark.parametrize("stem", ["dcl", "matryoshka"])
def test_the_examples_import_only_the_public_contract(stem):
    tree = ast.parse((EXAMPLES / f"{stem}.py").read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in modules if m and m.startswith("clsr")} == {"clsr"}


@pytest.mark.parametrize("stem", ["dcl", "matryoshka"])
def test_the_example_studies_validate_smoke_sized(stem, capsys):
    assert_validates(EXAMPLES / f"{stem}.yaml", capsys, "--smoke")
