"""``platform method new NAME``: the scaffold's method imports and its loss runs (InfoNCE, checked against
NumPy); its study names it beside simcse_unsup over 2 seeds; nothing is overwritten."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import yaml

from clsr.cli import main
from tests.unit.examples.example_modules import assert_validates, load_module


def np_infonce(views: np.ndarray, tau: float) -> float:
    a = views[:, 0] / np.linalg.norm(views[:, 0], axis=1, keepdims=True)
    b = views[:, 1] / np.linalg.norm(views[:, 1], axis=1, keepdims=True)
    logits = a @ b.T / tau
    return float(np.mean(np.log(np.exp(logits).sum(axis=1)) - np.diag(logits)))


def test_the_scaffold_writes_a_method_that_imports_and_trains(tmp_path, capsys):
    assert main(["method", "new", "my_loss", "--dir", str(tmp_path)]) == 0
    assert "wrote" in capsys.readouterr().out
    module = load_module(tmp_path / "my_loss.py")
    method = module.MyLoss(module.MyLossConfig())
    assert method.name == "my_loss" and method.cfg.temperature == 0.05 and method.views() == ("text", "text")
    views = np.random.default_rng(5).normal(size=(6, 2, 16))
    loss = method.loss_from_embeddings(torch.tensor(views, requires_grad=True))
    assert loss.item() == pytest.approx(np_infonce(views, 0.05), rel=1e-10)
    loss.backward()
    assert "ℓ = (1/N) Σ_i -log" in module.my_loss_loss.__doc__  # the equation beside the code


def test_the_scaffold_study_compares_it_with_simcse_over_two_seeds(tmp_path, capsys):
    assert main(["method", "new", "my_loss", "--dir", str(tmp_path)]) == 0
    study = yaml.safe_load((tmp_path / "my_loss.yaml").read_text())
    assert study["ablations"]["my_loss"]["points"] == [
        {"label": "simcse_unsup", "set": {"method.name": "simcse_unsup"}},
        {"label": "my_loss", "set": {"method.name": "./my_loss.py:MyLoss"}},
    ]
    assert study["ablations"]["my_loss"]["reference"] == "simcse_unsup" and study["seeds"] == [1, 2]
    capsys.readouterr()
    assert_validates(tmp_path / "my_loss.yaml", capsys)


def test_the_scaffold_overwrites_nothing_and_refuses_a_bad_name(tmp_path, capsys):
    (tmp_path / "mine.yaml").write_text("mine\n")
    assert main(["method", "new", "mine", "--dir", str(tmp_path)]) == 2
    assert "not overwriting" in capsys.readouterr().err
    assert not (tmp_path / "mine.py").exists() and (tmp_path / "mine.yaml").read_text() == "mine\n"
    assert main(["method", "new", "My-Loss", "--dir", str(tmp_path)]) == 2
    assert "lower case letters" in capsys.readouterr().err
