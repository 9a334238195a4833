"""GradCache (``trainer.gradcache_chunk_rows``) takes the same step as the plain loop for every method
with in-batch negatives: same loss, same gradient of every parameter.

Dropout masks are drawn per forward call, so a chunked encoder cannot draw the masks of one full-batch
forward pass. Hence three comparisons:

* dropout off: GradCache with chunks of 3 rows (not dividing the batch of 8) == the plain loss;
* dropout on, one chunk holding the whole batch: GradCache == the plain loss, masks included;
* dropout on, chunks of 3: GradCache == the same chunks encoded with a graph (the full-memory step it
  replaces); only the RNG replay makes this hold, which a run without it shows.

All on a random 2-layer, 16-d BERT (MiniLM's tokenizer) on CPU.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch

import clsr.train.gradcache as gradcache
from clsr.config.model import ModelConfig
from clsr.data.batching import TextViewBatcher
from clsr.encoders.transformer import TransformerEncoder, load_tokenizer
from clsr.methods import get_method
from clsr.methods.rcl import RCLShared, RowIndexBatcher
from clsr.train.gradcache import check_gradcache, gradcache_backward

ROWS, CHUNK = 8, 3
HIDDEN = 16

METHODS = {
    "simcse_unsup": {"name": "simcse_unsup"},
    "simcse_sup": {"name": "simcse_sup"},
    "mnrl": {"name": "mnrl"},
    "supmpn": {"name": "supmpn", "positives": 2, "negatives": 2},
    "selfccl": {"name": "selfccl"},
    "rcl_entropy": {"name": "rcl_entropy", "phi": 0.05},
    "rcl": {"name": "rcl", "phis": [0.01, 0.02], "entropy_models": {0.01: "m1", 0.02: "m2"}},
}


def fake_rows(count: int) -> list[dict[str, str]]:
    """Rows with every column the methods read; sentences of 1-9 words, so chunks pad differently."""
    rng = random.Random(0)
    words = ["a", "the", "cat", "dog", "sat", "on", "mat", "ran", "far", "away", "under", "tree", "red"]
    columns = ["text", "anchor", "positive", "negative"]
    columns += [f"{kind}_{k}" for kind in ("positive", "negative") for k in range(1, 6)]
    return [{c: " ".join(rng.choices(words, k=rng.randint(1, 9))) for c in columns} for _ in range(count)]


def setup(name: str, tiny_bert: str, dropout: float):
    """(method, model, batcher) for one method; rcl gets random stored entropy-model embeddings."""
    cls = get_method(name)
    method = cls(cls.Config(**METHODS[name]))
    pooling = {"pooling": "cls", "mlp_only_train": True} if name == "simcse_unsup" else {"pooling": "avg"}
    torch.manual_seed(1)
    model = TransformerEncoder(ModelConfig(name=tiny_bert, max_seq_length=16, dropout=dropout, **pooling))
    model.train()
    rows = fake_rows(ROWS)
    tokenizer = load_tokenizer(tiny_bert)
    if name == "rcl":
        vectors = np.random.default_rng(0).standard_normal((2, 2 * ROWS, HIDDEN)).astype(np.float32)
        method._shared = RCLShared((0.01, 0.02), vectors, np.arange(ROWS), np.arange(ROWS, 2 * ROWS), "")
        method._models = [0, 1]
        batcher = RowIndexBatcher(rows, method.views(), tokenizer, 16)
    else:
        batcher = TextViewBatcher(rows, method.views(), tokenizer, 16)
    return method, model, batcher


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = {}
    for n, p in model.named_parameters():
        assert p.grad is not None, n
        out[n] = p.grad.clone()
    model.zero_grad(set_to_none=True)
    return out


ORDER = [5, 2, 7, 0, 3, 6, 1, 4]  # a shuffled batch, as the loop hands it over


def plain_step(method, model, batcher) -> tuple[float, dict[str, torch.Tensor]]:
    torch.manual_seed(123)
    loss = method.training_loss(model, batcher.collate(ORDER))
    loss.backward()
    return loss.item(), grads(model)


def chunked_reference_step(method, model, batcher) -> tuple[float, dict[str, torch.Tensor]]:
    """The step GradCache replaces: the same chunks, in the same RNG order, each kept with its graph."""
    torch.manual_seed(123)
    parts = [method.encode_rows(model, batcher.collate(ORDER[i : i + CHUNK])) for i in range(0, ROWS, CHUNK)]
    loss = method.embeddings_loss(torch.cat(parts).float(), batcher.collate(ORDER))
    loss.backward()
    return loss.item(), grads(model)


def gradcache_step(method, model, batcher, chunk: int = CHUNK) -> tuple[float, dict[str, torch.Tensor]]:
    torch.manual_seed(123)
    batch = batcher.collate(ORDER)
    loss = gradcache_backward(
        method, model, batcher, ORDER, batch, chunk, device=torch.device("cpu"), scale=1.0
    )
    return float(loss), grads(model)


def assert_same_step(got, expected) -> None:
    """Same loss and gradients up to float32 summation order (chunks pad to their own longest text)."""
    (loss, grad), (ref_loss, ref_grad) = got, expected
    assert math.isfinite(loss) and loss == pytest.approx(ref_loss, rel=1e-5, abs=1e-6)
    assert sum(g.norm() for g in ref_grad.values()) > 0
    for name, value in ref_grad.items():
        torch.testing.assert_close(grad[name], value, rtol=1e-5, atol=1e-5, msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.parametrize("name", list(METHODS))
def test_gradcache_equals_the_plain_loss_without_dropout(name, tiny_bert):
    method, model, batcher = setup(name, tiny_bert, dropout=0.0)
    assert method.gradcache_supported()
    assert_same_step(gradcache_step(method, model, batcher), plain_step(method, model, batcher))


@pytest.mark.parametrize("name", list(METHODS))
def test_gradcache_replays_the_dropout_masks(name, tiny_bert):
    method, model, batcher = setup(name, tiny_bert, dropout=0.1)
    # one chunk of the whole batch: the very masks of the plain forward pass
    assert_same_step(gradcache_step(method, model, batcher, chunk=ROWS), plain_step(method, model, batcher))
    # chunks of 3 rows: the masks of the same chunks encoded with a graph
    assert_same_step(gradcache_step(method, model, batcher), chunked_reference_step(method, model, batcher))


def test_without_the_rng_replay_unsupervised_simcse_takes_another_step(tiny_bert, monkeypatch):
    """The check above is sensitive: the second pass with fresh dropout masks gives other gradients."""
    method, model, batcher = setup("simcse_unsup", tiny_bert, dropout=0.1)
    reference = chunked_reference_step(method, model, batcher)
    monkeypatch.setattr(gradcache, "restore_rng", lambda state, device: None)
    loss, grad = gradcache_step(method, model, batcher)
    assert loss == pytest.approx(reference[0], rel=1e-5)  # the cached pass is not affected
    differ = [n for n, g in grad.items() if not torch.allclose(g, reference[1][n], rtol=1e-3, atol=1e-5)]
    assert len(differ) > len(grad) // 2


def test_gradcache_is_refused_for_gclsr():
    from clsr.methods.gclsr import GCLSR

    gclsr = GCLSR(GCLSR.Config())
    assert not gclsr.gradcache_supported()
    check_gradcache(gclsr, None)
    with pytest.raises(ValueError, match=r"trainer.gradcache_chunk_rows=4: method 'gclsr'"):
        check_gradcache(gclsr, 4)


def test_a_gclsr_trial_with_gradcache_is_refused_when_validated():
    from pydantic import ValidationError

    from clsr.config.trial import TrialConfig

    with pytest.raises(ValidationError, match="trainer.gradcache_chunk_rows=2: method 'gclsr'"):
        TrialConfig.model_validate(
            {
                "model": {"type": "textcnn", "vectors": "minilm", "filters": 8},
                "data": {"train": "wiki1m", "max_rows": 64},
                "trainer": {"batch_size": 8, "gradcache_chunk_rows": 2},
                "method": {"name": "gclsr"},
            }
        )


def test_fit_with_gradcache_gives_the_same_losses_and_weights(data_dir, tiny_bert, tmp_path, monkeypatch):
    """The whole loop, two micro-batches of 6 rows per step in chunks of 4 (dropout off)."""
    import clsr.train.loop as loop
    from clsr.config.trial import TrialConfig
    from clsr.train.loop import fit
    from clsr.train.session import LocalSession

    calls = []
    monkeypatch.setattr(
        loop, "gradcache_backward", lambda *a, **k: calls.append(1) or gradcache_backward(*a, **k)
    )

    def run(folder: str, **trainer) -> tuple[list[float], dict[str, torch.Tensor]]:
        trial = TrialConfig.model_validate(
            {
                "model": {"name": tiny_bert, "pooling": "avg", "max_seq_length": 16, "dropout": 0.0},
                "data": {"train": "nli_triplets", "max_rows": 48},
                "trainer": {"batch_size": 12, "grad_accum_steps": 2, "max_steps": 3, "eval_steps": 1}
                | {"lr": 1e-3, **trainer},
                "method": {"name": "mnrl"},
                "eval": {"dev_tasks": [], "tasks": [], "alignment_uniformity": False, "log_model": False},
            }
        )
        session = LocalSession(tmp_path / folder)
        fit(trial, session)
        weights = torch.load(session.latest / "state.pt", weights_only=False)["model"]
        return [r["loss_avg"] for r in session.reports if "loss_avg" in r and "finished" not in r], weights

    plain_losses, plain_weights = run("plain")
    cached_losses, cached_weights = run("gradcache", gradcache_chunk_rows=4)
    assert len(plain_losses) == 3 and len(calls) == 6  # 3 steps × 2 micro-batches, all through GradCache
    assert cached_losses == pytest.approx(plain_losses, rel=1e-5)
    for name, value in plain_weights.items():
        torch.testing.assert_close(cached_weights[name], value, rtol=1e-4, atol=1e-6)


def _ddp_worker(rank: int, world: int, init_file: str, tiny_bert: str, out: str) -> None:
    """One of 2 DDP workers (gloo): rcl, 2 micro-batches of 4 rows (2 per worker), chunks of 1 row."""
    from torch.nn.parallel import DistributedDataParallel

    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world
    )
    try:
        method, model, batcher = setup("rcl", tiny_bert, dropout=0.0)
        ddp = DistributedDataParallel(model)
        loss = 0.0
        for start in (0, 4):
            mine = ORDER[start : start + 4][rank * 2 : (rank + 1) * 2]
            batch = batcher.collate(mine)
            loss += float(
                gradcache_backward(
                    method,
                    ddp,
                    batcher,
                    mine,
                    batch,
                    1,
                    device=torch.device("cpu"),
                    scale=world / 2,
                    sync=start == 4,
                )
                / 2
            )
        torch.save({"loss": loss, "grads": grads(model)}, f"{out}/{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


def test_two_ddp_workers_with_gradcache_match_one_plain_worker(tiny_bert, tmp_path):
    """DDP averages what every worker back-propagates through its chunks (``no_sync`` until the last
    chunk of the last micro-batch); the gathered rows pick rcl's stored embeddings. ~10 s."""
    import torch.multiprocessing as mp

    mp.spawn(_ddp_worker, args=(2, str(tmp_path / "init"), tiny_bert, str(tmp_path)), nprocs=2, join=True)
    method, model, batcher = setup("rcl", tiny_bert, dropout=0.0)
    loss = 0.0
    for start in (0, 4):  # 1 worker, grad_accum_steps 2: the loop's plain step
        micro = method.training_loss(model, batcher.collate(ORDER[start : start + 4]))
        (micro / 2).backward()
        loss += micro.item() / 2
    expected = (loss, grads(model))
    for rank in (0, 1):
        got = torch.load(tmp_path / f"{rank}.pt", weights_only=False)
        assert_same_step((got["loss"], got["grads"]), expected)
