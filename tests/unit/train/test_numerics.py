"""The GPU path checked on CPU: the loss in float32 under bf16 autocast (CPU bf16 autocast rounds as
CUDA's does), fp16's loss scaling, random states that do not tie a checkpoint to the GPUs it was written
on, and per-step metrics read back a window at a time."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from clsr.methods import METHODS, get_method
from clsr.methods.losses import cos_sim
from clsr.train import checkpoint, loop, rng
from clsr.train.gradcache import gradcache_backward
from clsr.train.readback import PendingSteps

CONFIGS = {"rcl": {"phis": []}}  # the regulators' stored embeddings are another test's business
BF16 = torch.autocast("cpu", dtype=torch.bfloat16)


class FixedEmbeddings(nn.Module):
    """A stand-in encoder: row i of ``table`` for input id i (its output stays float32 under autocast)."""

    def __init__(self, table: torch.Tensor) -> None:
        super().__init__()
        self.table = nn.Parameter(table)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_) -> torch.Tensor:
        return self.table[input_ids[:, 0]]


def method_and_batch(name: str, rows: int = 128, dim: int = 768):
    cls = get_method(name)
    method = cls(cls.Config(**CONFIGS.get(name, {})))
    texts = rows * len(method.views())
    ids = torch.arange(texts)[:, None]
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "num_rows": rows}
    return method, FixedEmbeddings(anisotropic(texts, dim)), batch


def anisotropic(n: int, dim: int) -> torch.Tensor:
    """Sentence embeddings share a direction (cosines ~0.8, as trained encoders' do); random isotropic
    vectors would have cosines near 0, where bf16's rounding hardly shows."""
    generator = torch.Generator().manual_seed(0)
    return torch.randn(dim, generator=generator) + 0.5 * torch.randn(n, dim, generator=generator)


@pytest.mark.parametrize("name", [n for n in METHODS if n != "gclsr"])
def test_every_methods_loss_is_float32_under_bf16_autocast(name):
    method, model, batch = method_and_batch(name)
    exact = method.training_loss(model, batch)
    with BF16:
        mixed = method.training_loss(model, batch)
    assert mixed.dtype == torch.float32
    assert abs(mixed.item() - exact.item()) <= 1e-4 * abs(exact.item()), (mixed.item(), exact.item())


def test_a_bf16_similarity_matmul_is_what_the_fp32_loss_avoids():
    """The size of what is fixed: SimCSE-sup at N = 128, d = 768 with its cosines in bf16 is off by more
    than 1e-4 relative (autocast recasts the ``.float()`` embeddings in the similarity matmul)."""
    method, model, batch = method_and_batch("simcse_sup")
    embeddings = method.encode_rows(model, batch).float()
    exact = method.loss_from_embeddings(embeddings).item()
    with BF16:
        assert cos_sim(embeddings[:, 0], embeddings[:, 1]).dtype == torch.bfloat16
        rounded = method.loss_from_embeddings(embeddings).item()
    assert abs(rounded - exact) > 1e-4 * exact


def test_gclsr_loss_is_float32_under_bf16_autocast():
    method = get_method("gclsr")(get_method("gclsr").Config(group_size=4))

    class FourOutputs(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.table = nn.Parameter(anisotropic(4 * 64, 300).view(4, 64, 300))

        def forward(self, *_):
            return tuple(self.table)

    model, batch = FourOutputs(), {"ids": None, "mask": None}
    exact = method.training_loss(model, batch)
    with BF16:
        mixed = method.training_loss(model, batch)
    assert abs(mixed.item() - exact.item()) <= 1e-4 * abs(exact.item())


class RowBatcher:
    def collate(self, indices):
        ids = torch.tensor([[2 * i + v] for i in indices for v in range(2)])
        return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "num_rows": len(indices)}


def test_gradcache_loss_and_gradients_are_float32_under_bf16_autocast():
    method, model, _ = method_and_batch("simcse_unsup", rows=64)  # two views a row, as RowBatcher's
    rows, cpu = list(range(64)), torch.device("cpu")
    batch = RowBatcher().collate(rows)
    exact = gradcache_backward(method, model, RowBatcher(), rows, batch, 16, device=cpu, scale=1.0)
    exact_grad, model.table.grad = model.table.grad.clone(), None
    mixed = gradcache_backward(
        method, model, RowBatcher(), rows, batch, 16, device=cpu, scale=1.0, autocast=BF16
    )
    assert abs(mixed - exact) <= 1e-4 * abs(exact)
    torch.testing.assert_close(model.table.grad, exact_grad, rtol=1e-4, atol=1e-7)


def test_fp16_scales_the_loss_and_the_scale_survives_a_resume(tmp_path):
    cpu = torch.device("cpu")
    assert loop.loss_scaler("fp16", cpu).is_enabled()
    assert not any(loop.loss_scaler(p, cpu).is_enabled() for p in ("fp32", "bf16", "auto"))
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    scaler = loop.loss_scaler("fp16", cpu)
    for _ in range(3):  # tiny gradients: scaled, they survive fp16; the unscaled step equals fp32's
        loss = model(torch.ones(2, 4)).sum() * 1e-8
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        assert model.weight.grad.abs().max().item() == pytest.approx(2e-8)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    scaler.update(1234.0)  # a scale the run found
    folder = checkpoint.save_checkpoint(model, optimizer, scheduler, {"step": 3}, None, cpu, scaler)
    fresh = loop.loss_scaler("fp16", cpu)
    state: dict = {}
    checkpoint.load_checkpoint(
        folder, model, optimizer, scheduler, state, type("S", (), {"rank": 0}), 0, cpu, fresh
    )
    assert fresh.get_scale() == 1234.0 and state["step"] == 3 and "grad_scaler" not in state


def test_a_checkpoint_keeps_only_the_current_devices_random_state(tmp_path, monkeypatch):
    cpu = torch.device("cpu")
    assert set(rng.rng_state(cpu)) == {"cpu"}  # no CUDA states on a CPU trial
    calls = []
    monkeypatch.setattr(torch.cuda, "get_rng_state", lambda device: torch.tensor([device.index or 0]))
    monkeypatch.setattr(
        torch.cuda, "set_rng_state", lambda state, device: calls.append((state.tolist(), device.index))
    )
    gpu1 = torch.device("cuda", 1)
    saved = rng.rng_state(gpu1)
    assert saved["cuda"].tolist() == [1]  # its own GPU only, not every visible one
    rng.restore_rng(saved, torch.device("cuda", 0))  # resumed on another GPU, fewer visible: still fine
    rng.restore_rng({"cpu": saved["cpu"], "cuda": [torch.tensor([7]), torch.tensor([8])]}, gpu1)  # old format
    assert calls == [([1], 0), ([8], 1)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rng.restore_rng({"cpu": saved["cpu"], "cuda": [torch.tensor([7])]}, gpu1)  # its GPU is not in it
    assert calls == [([1], 0), ([8], 1)] and "none for cuda:1" in str(caught[0].message)
    rng.restore_rng(saved, cpu)  # a GPU state is not restored on CPU
    assert len(calls) == 2


def test_step_metrics_are_read_back_a_window_at_a_time_and_divergence_names_its_step():
    pending = PendingSteps()
    for step, loss in enumerate([2.0, 1.5, 1.25], start=11):
        pending.add(step, torch.tensor(loss), torch.tensor(loss / 2), step / 100, None)
    assert pending.read() == [
        (11, {"loss": 2.0, "lr": 0.11, "grad_norm": 1.0, "momentum": None}),
        (12, {"loss": 1.5, "lr": 0.12, "grad_norm": 0.75, "momentum": None}),
        (13, {"loss": 1.25, "lr": 0.13, "grad_norm": 0.625, "momentum": None}),
    ]
    assert pending.read() == []  # the window was emptied
    pending.add(14, torch.tensor(1.0), None, 0.1, 0.9)  # no clipping: no gradient norm
    pending.add(15, torch.tensor(float("nan")), None, 0.1, 0.9)
    pending.add(16, torch.tensor(float("inf")), None, 0.1, 0.9)
    with pytest.raises(FloatingPointError, match=r"^loss became nan at step 15; lower trainer.lr$"):
        pending.read()


def test_flash_attention_is_refused_where_no_gpu_runs_it(tmp_path):
    from clsr.config.model import ModelConfig
    from clsr.encoders.transformer import TransformerEncoder
    from clsr.study.plan.load import study_from_dict
    from clsr.study.spec.schema import StudyError

    doc = {
        "name": "fa2",
        "method": "simcse_unsup",
        "base": {"model": {"name": "minilm", "attention": "flash_attention_2"}},
        "ablations": {"t": {"grid": {"method.temperature": [0.05]}, "reference": "0.05"}},
    }
    with pytest.raises(StudyError) as caught:
        study_from_dict(doc, "fa2.yaml", tmp_path)
    assert caught.value.problems == [
        "ablations.t[method.temperature=0.05].model.attention: flash_attention_2 runs on CUDA GPUs only, and resources.gpus_per_worker is 0 "
        "(given: 'flash_attention_2'; allowed here: sdpa, eager); give the trials GPUs or use sdpa"
    ]
    doc["resources"] = {"gpus_per_worker": 1}
    study_from_dict(doc, "fa2.yaml", tmp_path)  # a GPU study may ask for it
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="needs a CUDA GPU, and this trial runs on the CPU; use sdpa"):
            TransformerEncoder(ModelConfig(name="minilm", attention="flash_attention_2"))


def test_a_trial_sharing_a_gpu_is_capped_at_its_share_of_the_memory(monkeypatch):
    """gpus_per_worker 0.125: eight trials on one card, each allowed 1/8 of its memory (the call PyTorch's
    caching allocator enforces); a whole GPU or a CPU trial is left alone. The CUDA call is recorded here:
    no GPU runs the tests."""
    from clsr.train.session import cap_gpu_memory

    calls = []
    monkeypatch.setattr(torch.cuda, "set_per_process_memory_fraction", lambda *a: calls.append(a))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 3)
    # the sessions' device is torch.device("cuda"), with no index, which PyTorch's call refuses (seen on
    # an H100): the index of the current device goes instead
    gpu = torch.device("cuda")
    assert cap_gpu_memory(0.125, gpu) == 0.125 and calls == [(0.125, 3)]
    assert cap_gpu_memory(0.125, torch.device("cuda", 1)) == 0.125 and calls[-1] == (0.125, 1)
    assert cap_gpu_memory(1.0, gpu) is None and cap_gpu_memory(0.125, torch.device("cpu")) is None
    assert len(calls) == 2


def test_adamw_is_fused_on_cpu_and_steps_as_the_per_parameter_loop_does():
    from clsr.config.trial import TrainerConfig
    from clsr.train.optim import build_optimizer

    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 16))
    twin = nn.Sequential(nn.Embedding(100, 16), nn.Linear(16, 16))
    twin.load_state_dict(model.state_dict())
    fused = build_optimizer(model, TrainerConfig(lr=1e-2), {})
    assert all(group["fused"] for group in fused.param_groups)
    looped = torch.optim.AdamW(twin.parameters(), lr=1e-2, weight_decay=fused.param_groups[0]["weight_decay"])
    ids = torch.randint(0, 100, (8, 4))
    for _ in range(5):
        for net, opt in ((model, fused), (twin, looped)):
            opt.zero_grad()
            net(ids).pow(2).mean().backward()
            opt.step()
    for a, b in zip(model.parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
