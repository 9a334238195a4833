"""Each pooling on a hand-made hidden-state tensor (methods.md §1.1)."""

from __future__ import annotations

import pytest
import torch

from clsr.encoders.pooling import Pooler

# batch of 2, 3 tokens, dim 2; the second sentence has one padding token
EMB = torch.tensor([[[1.0, 1.0], [1.0, 1.0], [1.0, 1.0]], [[0.0, 0.0], [0.0, 0.0], [9.0, 9.0]]])
LAYER1 = torch.tensor([[[2.0, 0.0], [4.0, 0.0], [6.0, 0.0]], [[1.0, 1.0], [3.0, 3.0], [9.0, 9.0]]])
LAST = torch.tensor([[[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]], [[7.0, 8.0], [1.0, 0.0], [100.0, 100.0]]])
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])
HIDDEN = (EMB, LAYER1, LAST)


def pool(name: str, **kwargs) -> torch.Tensor:
    return Pooler(name, hidden_size=2, **kwargs)(HIDDEN, MASK)


def test_mean_ignores_padding():
    expected = torch.tensor([[3.0, 4.0], [4.0, 4.0]])
    assert torch.allclose(pool("avg"), expected)
    assert torch.allclose(pool("mean"), expected)


def test_avg_first_last_uses_layer_one():
    # sentence 0: mean of (layer1+last)/2 over 3 tokens; sentence 1: over 2 tokens
    expected = torch.tensor([[(1.5 + 3.5 + 5.5) / 3, (1 + 2 + 3) / 3], [(4 + 2) / 2, (4.5 + 1.5) / 2]])
    assert torch.allclose(pool("avg_first_last"), expected)


def test_avg_first_last_emb_uses_embedding_output():
    expected = torch.tensor([[(1 + 2 + 3) / 3, (1.5 + 2.5 + 3.5) / 3], [(3.5 + 0.5) / 2, 2.0]])
    assert torch.allclose(pool("avg_first_last_emb"), expected)


def test_cls_before_pooler_is_the_first_token():
    assert torch.allclose(pool("cls_before_pooler"), torch.tensor([[1.0, 2.0], [7.0, 8.0]]))


def test_cls_mlp_is_dense_tanh_and_mlp_only_train_skips_it_in_eval():
    pooler = Pooler("cls", hidden_size=2, mlp_only_train=True)
    dense = pooler.mlp[0]
    with torch.no_grad():
        dense.weight.copy_(torch.tensor([[0.1, 0.0], [0.0, -0.2]]))
        dense.bias.copy_(torch.tensor([0.5, 0.0]))
    pooler.train()
    expected = torch.tanh(torch.tensor([[0.6, -0.4], [1.2, -1.6]]))
    assert torch.allclose(pooler(HIDDEN, MASK), expected)
    pooler.eval()
    assert torch.allclose(pooler(HIDDEN, MASK), torch.tensor([[1.0, 2.0], [7.0, 8.0]]))


def test_cls_mlp_is_freshly_initialised():
    dense = Pooler("cls", hidden_size=64).mlp[0]
    assert torch.count_nonzero(dense.bias) == 0
    assert 0.01 < dense.weight.std().item() < 0.03  # normal(0, 0.02)


def test_unknown_pooling_lists_the_allowed_names():
    with pytest.raises(ValueError, match="allowed: cls, cls_before_pooler, avg"):
        Pooler("max", hidden_size=2)
