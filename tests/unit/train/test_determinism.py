"""``trainer.deterministic: true`` on the CPU: the same trial twice, and a trial SIGKILLed after its first
checkpoint and resumed, give bitwise-equal final checkpoints and identical MLflow metrics
(``clsr_bench.determinism``, which the GPU check runs too); the settings it refuses, one line each."""

from __future__ import annotations

import pytest
import torch
from pydantic import ValidationError

from clsr.config.trial import TrialConfig
from tests.support.stores import sqlite_uri


@pytest.fixture(autouse=True)
def _settings_restored():
    """A deterministic trial switches this process's PyTorch settings: off again for the next tests."""
    yield
    from clsr.train.determinism import configure

    configure(False)


def test_a_trial_twice_and_a_killed_and_resumed_one_end_bitwise_equal(data_dir, tiny_bert, tmp_path):
    """On a 2-layer BERT with BERT's dropout (MiniLM's checkpoints are 360 MB each)."""
    from clsr_bench.determinism import differences, run_killed_and_resumed, run_whole, tiny_trial

    uri = sqlite_uri(tmp_path / "mlflow.db")
    first = run_whole(tiny_trial(tiny_bert), tmp_path / "first", uri)
    second = run_whole(tiny_trial(tiny_bert), tmp_path / "second", uri)
    resumed = run_killed_and_resumed(tiny_bert, tmp_path / "resumed", uri)

    assert differences(first, second) == []
    assert differences(first, resumed) == []
    assert resumed.histories["resumed_from_step"] == [(2, 2.0)]  # killed after step 2's checkpoint
    assert "resumed_from_step" not in first.histories
    # what was compared is all there: six logged steps, three dev scores, every state part, a digest
    assert [step for step, _ in first.histories["loss"]] == [1, 2, 3, 4, 5, 6]
    assert [step for step, _ in first.histories["dev_stsb"]] == [2, 4, 6]
    assert {"model", "optimizer", "scheduler", "rng", "step"} <= set(first.state) and first.best
    assert first.state["step"] == 6 and len(first.tags["clsr.weights_sha256"]) == 64
    # a one-ulp change anywhere is a difference
    weight = next(iter(second.state["model"]))
    second.state["model"][weight] = torch.nextafter(second.state["model"][weight], torch.tensor(2.0))
    second.histories["loss"][3] = (4, second.histories["loss"][3][1] + 1e-9)
    assert differences(first, second) == [f"state.model.{weight}", "metric loss"]


def _trial(**sections) -> TrialConfig:
    return TrialConfig.model_validate({"method": {"name": "simcse_unsup"}, **sections})


def test_settings_that_cannot_be_deterministic_are_refused_in_one_line():
    on = {"deterministic": True}
    with pytest.raises(ValidationError, match=r"trainer.compile_mode 'max-autotune' .*allowed: default, "):
        _trial(trainer=on | {"compile": True, "compile_mode": "max-autotune"})
    with pytest.raises(ValidationError, match=r"data.revision 'main': .*'owner/set' .*allowed: 40 hex"):
        _trial(trainer=on, data={"train": "owner/set", "revision": "main"})
    with pytest.raises(ValidationError, match=r"method.augmentation 'eda' .*use pwva, full, none"):
        TrialConfig.model_validate(
            {"model": {"type": "textcnn"}, "trainer": on, "method": {"name": "gclsr", "augmentation": "eda"}}
        )
    # what it holds to: a commit, compile's default mode; the same settings without it are not refused
    assert _trial(trainer=on, data={"train": "owner/set", "revision": "0a" * 20}).trainer.deterministic
    assert _trial(trainer=on | {"compile": True}).trainer.compile
    assert not _trial(trainer={"compile": True, "compile_mode": "max-autotune"}).trainer.deterministic


def test_the_step_seed_depends_on_seed_rank_and_step_only():
    from clsr.train.determinism import seed_step

    def draws(seed: int, rank: int, step: int) -> torch.Tensor:
        seed_step(seed, rank, step)
        return torch.rand(4)

    assert torch.equal(draws(1, 0, 5), draws(1, 0, 5))
    assert not torch.equal(draws(1, 0, 5), draws(1, 0, 6))
    assert not torch.equal(draws(1, 0, 5), draws(1, 1, 5))
    assert not torch.equal(draws(1, 0, 5), draws(2, 0, 5))


def test_the_weights_digest_sees_one_ulp_and_leaves_frozen_parameters_out():
    import hashlib

    from torch import nn

    from clsr.train.checkpoint import weights_sha256

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding.from_pretrained(torch.randn(5, 2)), nn.Linear(2, 1))
    digest = weights_sha256(model)
    # independently: names in order, dtype, shape, then the raw bytes, frozen table left out
    expected = hashlib.sha256()
    for name in ("1.bias", "1.weight"):
        value = model.state_dict()[name]
        expected.update(f"{name}|{value.dtype}|{tuple(value.shape)}|".encode() + value.numpy().tobytes())
    assert digest == expected.hexdigest()
    with torch.no_grad():
        model[0].weight.add_(1.0)  # frozen: rebuilt from the config, not part of what was trained
        assert weights_sha256(model) == digest
        model[1].bias.copy_(torch.nextafter(model[1].bias, torch.tensor(2.0)))
    assert weights_sha256(model) != digest
