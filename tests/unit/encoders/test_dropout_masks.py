"""Dropout with its CPU masks drawn by NumPy's PCG64 (clsr.encoders.dropout_masks): the same dropout
as ``torch.nn.functional.dropout`` (keep rate, scale, gradient, eval), decided by PyTorch's seed."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from scipy import stats
from torch import nn

from clsr.config.model import ModelConfig
from clsr.encoders.dropout_masks import UniformDropout, uniform_dropout, use_uniform_dropout
from clsr.encoders.transformer import TransformerEncoder
from tests.support.models import save_tiny_bert


@pytest.mark.parametrize("p", [0.1, 0.5])
def test_the_keep_rate_and_scale_are_dropouts(p: float):
    """Kept values are ``x`` times ``1 / (1 - p)`` (as PyTorch's own CPU dropout scales), dropped ones
    0, and the kept count is Binomial(n, 1 - p): a two-sided exact binomial test does not reject it
    (and does reject a rate off by 0.5 %)."""
    torch.manual_seed(0)
    x = torch.rand(1000, 1000) + 1.0  # no zeros: a zero out is a dropped value
    out = uniform_dropout(x, p)
    kept = out != 0
    scale = torch.ones(()).div_(1 - p)
    torch.testing.assert_close(out[kept], x[kept] * scale, rtol=0, atol=0)
    count, n = int(kept.sum()), x.numel()
    assert stats.binomtest(count, n, 1 - p).pvalue > 1e-3
    assert stats.binomtest(count, n, 1 - p - 0.005).pvalue < 1e-6


def test_torch_seed_decides_the_masks_and_a_saved_rng_state_replays_them():
    x = torch.ones(64, 384)
    torch.manual_seed(7)
    first, second = uniform_dropout(x, 0.1), uniform_dropout(x, 0.1)
    assert not torch.equal(first, second)  # each call its own mask
    torch.manual_seed(7)
    assert torch.equal(uniform_dropout(x, 0.1), first)
    state = torch.get_rng_state()  # what a checkpoint keeps
    after = uniform_dropout(x, 0.1)
    torch.set_rng_state(state)
    assert torch.equal(uniform_dropout(x, 0.1), after)
    torch.manual_seed(8)
    assert not torch.equal(uniform_dropout(x, 0.1), first)


def test_the_gradient_is_the_mask_and_the_dtype_is_kept():
    torch.manual_seed(0)
    x = torch.randn(32, 16, requires_grad=True)
    out = uniform_dropout(x, 0.25)
    out.sum().backward()
    expected = (out.detach() != 0).float() * torch.ones(()).div_(0.75)
    torch.testing.assert_close(x.grad, expected, rtol=0, atol=0)
    assert uniform_dropout(torch.ones(4, 8, dtype=torch.bfloat16), 0.1).dtype == torch.bfloat16


def test_eval_and_zero_rate_are_identity_and_a_full_rate_drops_all():
    x = torch.randn(8, 8)
    module = UniformDropout(0.3).eval()
    assert module(x) is x
    assert uniform_dropout(x, 0.0) is x
    assert torch.equal(uniform_dropout(x, 1.0), torch.zeros_like(x))


def test_a_transformer_encoder_draws_every_dropout_mask_here(tmp_path: Path):
    """Every plain ``nn.Dropout`` of the backbone is swapped, with its rate; in training the encoder's
    outputs follow PyTorch's seed, and in eval they do not depend on it."""
    encoder = TransformerEncoder(ModelConfig(name=save_tiny_bert(tmp_path, dropout=0.1), pooling="avg"))
    dropouts = [m for m in encoder.modules() if isinstance(m, nn.Dropout)]
    assert dropouts and all(type(m) is UniformDropout and m.p == 0.1 for m in dropouts)
    ids = torch.tensor([[101, 2023, 2003, 102], [101, 2003, 102, 0]])
    mask = (ids != 0).long()
    encoder.train()
    runs = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        runs.append(encoder(ids, mask).detach())
    assert torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])
    encoder.eval()
    torch.manual_seed(5)
    first = encoder(ids, mask)
    torch.manual_seed(6)
    assert torch.equal(first, encoder(ids, mask))


def test_use_uniform_dropout_leaves_subclasses_and_counts_what_it_swapped():
    class OwnDropout(nn.Dropout):
        pass

    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.2), nn.Sequential(nn.Dropout(0.3), OwnDropout(0.4)))
    assert use_uniform_dropout(model) == 2
    assert [type(m).__name__ for m in model.modules() if isinstance(m, nn.Dropout)] == [
        "UniformDropout",
        "UniformDropout",
        "OwnDropout",
    ]
    assert [m.p for m in model.modules() if isinstance(m, nn.Dropout)] == [0.2, 0.3, 0.4]
