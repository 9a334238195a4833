"""The generic training loop shared by every method. Read it top to bottom: ``fit``.

The loop knows nothing about any method: the method builds the model, orders the rows into batches
and computes the loss. Rank 0 evaluates on the dev set every ``eval_steps`` steps, keeps the best
weights (the SimCSE protocol) and logs to MLflow; every rank reports to Ray Train at the same steps.
``trainer.max_steps: 0`` makes an evaluation-only point (``evaluate_only``): the starting model is scored.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import tempfile
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from clsr.config.steps import eval_interval
from clsr.config.trial import TrainerConfig, TrialConfig
from clsr.data.faq import FAQData, load_faq
from clsr.data.model_registry import ModelUnavailableError
from clsr.data.sources import DataUnavailableError, resolve_data_dir
from clsr.data.sts import load_sts, subsample
from clsr.data.tasks import split_eval_tasks
from clsr.data.training import training_rows
from clsr.encoders import checkpoint_files
from clsr.encoders.precision import autocast_context, resolved_precision
from clsr.eval.alignment import alignment_uniformity
from clsr.eval.custom import ClassifierSettings, evaluate_custom
from clsr.eval.faq import dev_map, evaluate_faq, faq_summary_metrics
from clsr.eval.sts import evaluate_sts, summary_metrics
from clsr.eval.transfer import TransferScore, evaluate_transfer, shares, transfer_summary_metrics
from clsr.methods import get_method
from clsr.methods.base import Method
from clsr.runtime.distributed import broadcast_, gather_or_raise, patient_group
from clsr.tracking.run_logger import RunLogger
from clsr.train.gradcache import check_gradcache, gradcache_backward
from clsr.train.optim import build_optimizer, build_scheduler, set_momentum, warmup_steps
from clsr.train.readback import PendingSteps
from clsr.train.rng import restore_rng, rng_state
from clsr.train.session import node_tags
from clsr.train.staging import staging_folder

DEV_SPLIT = "dev"
EVAL_ONLY_TAG = "clsr.eval_only"  # "true" on the MLflow run of a point that trained nothing
# Failures that come back on every retry from the same checkpoint (a diverging loss, a value the trial
# cannot run with, a data file or model that is not there, a batch that does not fit the device): the
# trial ends with them, never retried (``clsr.train.worker.NON_RETRYABLE``).
FINAL_FAILURES = (
    FloatingPointError, ValueError, TypeError, FileNotFoundError, DataUnavailableError,
    ModelUnavailableError, torch.OutOfMemoryError,
)  # fmt: skip


def failure_line(err: BaseException) -> str:
    """What a final failure is recorded as (the trial run's ``clsr.error``, the study's last table)."""
    text = f"{type(err).__name__}: {err}"
    if isinstance(err, torch.OutOfMemoryError):
        text = text.splitlines()[0] + (
            " -- the batch does not fit this device: set trainer.gradcache_chunk_rows (the same loss in "
            "less memory), trainer.precision: bf16, or a smaller trainer.batch_size"
        )
    return text


CPU = torch.device("cpu")


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if hasattr(model, "module") else model


def loss_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """fp16's dynamic loss scaling (small gradients underflow in fp16 otherwise); a disabled scaler,
    which passes everything through, for bf16 and fp32 (bf16 has fp32's exponent range)."""
    return torch.amp.GradScaler(device.type, enabled=resolved_precision(precision, device) == "fp16")


def is_evaluation_only(trial: TrialConfig) -> bool:
    """``trainer.max_steps: 0``: the point trains nothing and scores its starting model."""
    return trial.trainer.max_steps == 0


def compiled(model: nn.Module, t: TrainerConfig) -> nn.Module:
    """The model with ``trainer.compile`` applied (its training forward compiled in place)."""
    if t.compile:
        model.compile_for_training(t.compile_mode)
    return model


def build_method(trial: TrialConfig) -> Method:
    method_cls = get_method(trial.method["name"])
    return method_cls(method_cls.Config(**trial.method))


class Evaluator:
    """Dev scores during training and the final test scores, computed on rank 0; the ranks of a
    multi-worker trial share its final transfer tasks (``shared_transfer``)."""

    def __init__(self, trial: TrialConfig, method: Method, pipeline: Any):
        self.cfg = trial.eval
        self.data_dir = trial.data.data_dir
        self.method = method
        self.pipeline = pipeline  # the tokenizer or word table the method encodes text with
        self.trial = trial
        self._faq_data: FAQData | None = None  # the trained FAQ set, read once per trial for its dev scores

    def artifacts(self, model: nn.Module, stage: str, logger: RunLogger) -> None:
        """The method's own files for the MLflow run ("start": untrained model, "final": best)."""
        if logger.active:
            self.method.log_artifacts(stage, self.embedder(model), logger, self.trial)

    def embedder(self, model: nn.Module):
        """Scores in the precision the trial trains in (``trainer.precision``)."""
        return self.method.make_embedder(
            unwrap(model), self.pipeline, self.cfg.batch_size, self.trial.trainer.precision
        )

    def dev(self, model: nn.Module) -> dict[str, float]:
        sts = [task for task in self.cfg.dev_tasks if task != "faq"]
        cap = self.cfg.sts_max_pairs
        scores = evaluate_sts(self.embedder(model), sts, DEV_SPLIT, self.data_dir, cap) if sts else {}
        metrics = {f"dev_{task}": s.all for task, s in scores.items()}
        if "faq" in self.cfg.dev_tasks:  # MAP of the trained FAQ set's dev queries (RCL Table 2)
            if self._faq_data is None:
                self._faq_data = load_faq(self.trial.data.faq_set(), resolve_data_dir(self.data_dir))
            caps = {"max_queries": self.cfg.faq_max_queries, "max_items": self.cfg.faq_max_items}
            metrics["dev_faq"] = dev_map(self._faq_data, self.trial.data.fold, self.embedder(model), **caps)
        return metrics

    def log_model(self, model: nn.Module, logger: RunLogger) -> None:
        """The best model as the run's ``model/`` artifacts, in a format users load without clsr."""
        with tempfile.TemporaryDirectory(prefix="clsr-model-") as folder:
            try:
                self.method.export_model(unwrap(model), self.pipeline, self.trial, Path(folder) / "model")
                logger.log_artifacts(Path(folder) / "model", "model")
            except Exception as err:  # the scores stand; a trial is not lost over its export
                warnings.warn(f"the trained model could not be logged: {err!r}", stacklevel=2)
                logger.set_tags({"clsr.model_error": repr(err)[:5000]})

    def transfer_tasks(self) -> list[str]:
        return split_eval_tasks(self.cfg.builtin_tasks())[1]

    def shares_transfer(self, world_size: int) -> bool:
        """Whether the ranks share the final transfer tasks (the same answer on every rank)."""
        return world_size > 1 and len(self.transfer_tasks()) > 1

    def transfer(self, model: nn.Module, tasks: list[str]) -> dict[str, TransferScore]:
        return evaluate_transfer(
            self.embedder(model),
            tasks,
            self.data_dir,
            mode=self.cfg.transfer_mode,
            max_examples=self.cfg.transfer_max_examples,
            classifier=self.cfg.transfer_classifier,
            device=self.transfer_device(model),
        )

    def transfer_device(self, model: nn.Module) -> str | None:
        """The GPU that ``transfer_device: auto`` fits on: the model's, when it is on one."""
        if self.cfg.transfer_device != "auto":
            return None
        device = next(model.parameters()).device
        return str(device) if device.type == "cuda" else None

    def shared_transfer(self, model: nn.Module, session) -> dict[str, TransferScore]:
        """Every rank takes rank 0's weights (the best ones, loaded there) and scores its share of the
        transfer tasks (split by their fit cost) on its own device and CPUs; the scores are gathered on
        every rank. SentEval's classifier fits are CPU-bound, so on one GPU node the ranks' CPUs fit in
        parallel, and each rank embeds its tasks' sentences on its own GPU."""
        broadcast_(trained_state(unwrap(model)).values())
        tasks = self.transfer_tasks()
        mine = shares(tasks, session.world_size)[session.rank]
        # the ranks wait for the slowest share: longer than the default group's timeout allows
        with patient_group() as group:
            parts = gather_or_raise(lambda: self.transfer(model, mine) if mine else {}, group)
        gathered = {task: score for part in parts for task, score in part.items()}
        return {task: gathered[task] for task in tasks}

    def final(self, model: nn.Module, transfer: dict[str, TransferScore] | None = None) -> dict[str, float]:
        """The test scores; ``transfer``: the transfer scores when the ranks computed them together."""
        embed = self.embedder(model)
        sts_tasks, transfer_tasks, faq_tasks = split_eval_tasks(self.cfg.builtin_tasks())
        sts = (
            evaluate_sts(embed, sts_tasks, "test", self.data_dir, self.cfg.sts_max_pairs) if sts_tasks else {}
        )
        metrics = summary_metrics(sts) if sts else {}
        if transfer_tasks:
            scores = transfer if transfer is not None else self.transfer(model, transfer_tasks)
            metrics |= transfer_summary_metrics(scores)
        if faq_tasks:  # 5-fold CV over the queries, whole collection as the pool (methods.md §6.5)
            scores = evaluate_faq(
                embed,
                faq_tasks,
                self.data_dir,
                max_queries=self.cfg.faq_max_queries,
                max_items=self.cfg.faq_max_items,
                test_fold=(faq_set, self.trial.data.fold) if (faq_set := self.trial.data.faq_set()) else None,
            )
            metrics |= faq_summary_metrics(scores)
        if custom := self.cfg.custom_tasks():  # the user's own sets (clsr.eval.custom)
            fits = ClassifierSettings(
                self.cfg.transfer_mode, self.cfg.transfer_classifier, device=self.transfer_device(model)
            )
            metrics |= evaluate_custom(embed, custom, fits)
        if self.cfg.alignment_uniformity:
            dev = load_sts("stsb", DEV_SPLIT, resolve_data_dir(self.data_dir))
            metrics |= alignment_uniformity(subsample(dev, self.cfg.sts_max_pairs), embed)
        return metrics


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The batch's tensors on ``device``; to a GPU from pinned host memory without blocking, so the
    copy overlaps the work queued before it (the host does not wait for the GPU between steps)."""
    if device.type != "cuda":
        return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    return {
        k: v.pin_memory().to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()
    }


def frozen_parameters(model: nn.Module) -> set[str]:
    return {name for name, p in model.named_parameters() if not p.requires_grad}


def trained_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's state a checkpoint keeps: everything but its frozen parameters (GCLSR's word table,
    gigabytes for word2vec), which ``build_model`` rebuilds from the trial's config on a resume."""
    frozen = frozen_parameters(model)
    return {k: v for k, v in model.state_dict().items() if k not in frozen}


def load_trained_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Load what ``trained_state`` kept; only frozen parameters may be missing."""
    frozen = frozen_parameters(model)
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or set(missing) - frozen:
        raise RuntimeError(
            f"the checkpoint does not fit the model: missing {sorted(set(missing) - frozen)[:5]}, "
            f"unexpected {sorted(unexpected)[:5]}; was it written by a trial of another model config?"
        )


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.iterdir() if f.is_file())


def save_checkpoint(
    model: nn.Module,
    optimizer,
    scheduler,
    state: dict,
    best_weights: dict | None,
    device: torch.device = CPU,
    grad_scaler: torch.amp.GradScaler | None = None,
) -> Path:
    """A fresh folder with ``state.pt`` (and ``best_model.pt``), each written atomically, and a
    ``manifest.json`` of their SHA-256 written last; nothing is left behind when a write fails. The
    random states are the CPU's and ``device``'s only (``clsr.train.rng``: placement-independent)."""
    folder = staging_folder("ckpt")
    try:
        saved = {
            "model": trained_state(unwrap(model)),
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": rng_state(device),
            **state,
        }
        if grad_scaler is not None and grad_scaler.is_enabled():
            saved["grad_scaler"] = grad_scaler.state_dict()
        hashes = {"state.pt": checkpoint_files.save_tensors(saved, folder / "state.pt")}
        if best_weights is not None:
            hashes["best_model.pt"] = checkpoint_files.save_tensors(best_weights, folder / "best_model.pt")
        checkpoint_files.write_manifest(folder, hashes)
    except BaseException:
        shutil.rmtree(folder, ignore_errors=True)
        raise
    return folder


def load_checkpoint(
    folder: Path,
    model,
    optimizer,
    scheduler,
    state: dict,
    session,
    seed: int,
    device: torch.device = CPU,
    grad_scaler: torch.amp.GradScaler | None = None,
) -> dict | None:
    """Restore what ``save_checkpoint`` wrote into the live objects and ``state``; the best weights.

    Files are checked against the folder's manifest and loaded as tensors and plain data only."""
    saved = checkpoint_files.load_tensors(folder / "state.pt")
    if "optimizer" not in saved:  # shrunk once its study finished (clsr.study.record.retention): weights only
        raise ValueError(
            f"{folder}: this checkpoint keeps weights only (its study finished and was shrunk), so training "
            "cannot continue from it; start the trial anew, or set keep_checkpoints: true in the study"
        )
    load_trained_state(unwrap(model), saved.pop("model"))
    optimizer.load_state_dict(saved.pop("optimizer"))
    scheduler.load_state_dict(saved.pop("scheduler"))
    scaler_state = saved.pop("grad_scaler", None)
    if grad_scaler is not None and grad_scaler.is_enabled() and scaler_state is not None:
        grad_scaler.load_state_dict(scaler_state)  # the loss scale it had found, not the initial 2^16
    state.update(saved)
    rng = state.pop("rng")  # rank 0's dropout masks continue as if the run had never stopped
    if session.rank == 0:
        restore_rng(rng, device)
    else:  # other ranks keep masks of their own
        torch.manual_seed(seed + session.rank + 7919 * state["step"])
    best = folder / "best_model.pt"
    return checkpoint_files.load_tensors(best) if best.exists() else None


def fit(
    trial: TrialConfig, session, tracking: dict[str, str] | None = None, shared: Any = None
) -> dict[str, float]:
    """Train one trial and return its final metrics (on rank 0; other ranks return ``{}``).

    ``shared``: the method's ``prepare_shared`` result when the study runner built it once for many
    trials; built here when None and the method needs one. Per-step metrics reach MLflow with the
    checkpoint that covers their step (``RunLogger``), so that a trial resumed from a checkpoint leaves
    each step once in its run. Whatever way the trial ends, what MLflow has not taken yet is sent, or
    left in the study's storage for the study driver; only the points logged since the last checkpoint
    of a trial that will run again from it (any failure but a final one) are dropped: it logs them again.
    """
    at_checkpoints = (tracking or {}).get("commit_at_checkpoints", True)
    logger = RunLogger(tracking if session.rank == 0 else None, commit_at_checkpoints=at_checkpoints)
    try:
        final = train(trial, session, logger, shared)
    except BaseException as err:
        logger.close(keep_uncommitted=isinstance(err, FINAL_FAILURES))
        raise
    logger.close()
    return final


def train(trial: TrialConfig, session, logger: RunLogger, shared: Any = None) -> dict[str, float]:
    """``fit`` with its MLflow logger: the training loop, read top to bottom."""
    clock = TrialClock()
    t = trial.trainer
    torch.manual_seed(t.seed + session.rank)  # same init everywhere (DDP broadcasts), own dropout per rank
    np.random.seed(t.seed + session.rank)

    method = build_method(trial)
    if is_evaluation_only(trial):
        return evaluate_only(trial, method, session, logger, clock)
    check_gradcache(method, t.gradcache_chunk_rows)
    if shared is None and method.shared_key(trial) is not None:
        shared = method.prepare_shared(trial)
    pipeline = method.text_pipeline(trial, shared)
    rows = method.rows_for_training(training_rows(trial), trial)
    batcher = method.prepare_rows(rows, pipeline, trial)
    steps_per_epoch, total_steps = method.plan_steps(len(rows), trial, session.world_size)
    micro_rows = t.batch_size // t.grad_accum_steps  # global rows per forward pass
    local_rows = micro_rows // session.world_size
    eval_every = eval_interval(trial, steps_per_epoch)

    model = session.prepare_model(compiled(method.build_model(trial.model, pipeline), t))
    device = session.device
    optimizer = build_optimizer(unwrap(model), t, method.param_group_lrs(), method.fixed_lr_prefixes())
    scheduler = build_scheduler(optimizer, t, total_steps, steps_per_epoch)
    warmup = warmup_steps(t, total_steps, steps_per_epoch)
    autocast = autocast_context(t.precision, device)
    grad_scaler = loss_scaler(t.precision, device)
    is_main = session.rank == 0
    evaluator = Evaluator(trial, method, pipeline)  # scores on rank 0; every rank shares the transfer tasks
    if is_main:
        logger.set_tags(node_tags())  # a retry on another node (a lost machine) updates them
        evaluator.artifacts(model, "start", logger)

    state = {"step": 0, "best_score": -math.inf, "best_step": 0, "lowest_loss": math.inf, "stalled_steps": 0}
    patience = t.stop_when_loss_stalls or method.stop_when_loss_stalls()
    best_weights: dict | None = None
    with session.restored() as restore:  # a local copy of the last checkpoint, removed after loading
        if restore is not None:  # resume a retried or restored trial where its last checkpoint left it
            best_weights = load_checkpoint(
                restore, model, optimizer, scheduler, state, session, t.seed, device, grad_scaler
            )
            logger.load_from(restore)  # what the earlier attempt had not sent to MLflow yet
            logger.log({"resumed_from_step": state["step"]}, state["step"])  # one point per retry or resume

    select_key = f"dev_{trial.eval.select_on}"
    stalled = patience is not None and state["stalled_steps"] >= patience  # restored after stopping early
    epoch_batches: tuple[int, list[list[int]]] = (-1, [])
    recent_losses: list[float] = []
    pending = PendingSteps()  # losses and gradient norms on the device until a log step reads them
    clock.setup_done(state["step"])
    started = time.perf_counter()
    model.train()
    while state["step"] < total_steps and not stalled:
        epoch, position = divmod(state["step"], steps_per_epoch)
        if epoch_batches[0] != epoch:
            epoch_batches = (epoch, method.batch_order(rows, t.batch_size, epoch, t.seed))
        global_batch = epoch_batches[1][position]

        step_loss = torch.zeros((), device=device)
        for start in range(0, t.batch_size, micro_rows):
            micro = global_batch[start : start + micro_rows]
            mine = micro[session.rank * local_rows : (session.rank + 1) * local_rows]
            batch = to_device(batcher.collate(mine), device)
            last_micro = start + micro_rows >= t.batch_size
            if t.gradcache_chunk_rows:  # the same loss and step, encoded a chunk of rows at a time
                loss = gradcache_backward(
                    method,
                    model,
                    batcher,
                    mine,
                    batch,
                    t.gradcache_chunk_rows,
                    device=device,
                    scale=session.world_size / t.grad_accum_steps,
                    autocast=autocast,
                    sync=last_micro,
                    grad_scaler=grad_scaler,
                )
                step_loss += loss / t.grad_accum_steps
                continue
            sync = (
                contextlib.nullcontext() if last_micro or not hasattr(model, "no_sync") else model.no_sync()
            )
            with sync:
                with autocast:
                    loss = method.training_loss(model, batch)
                # every rank holds the global loss; × world makes DDP's gradient average its gradient
                grad_scaler.scale(loss * session.world_size / t.grad_accum_steps).backward()
            step_loss += loss.detach() / t.grad_accum_steps
        grad_scaler.unscale_(optimizer)  # fp16: clip and log the true gradient, not the scaled one
        grad_norm = (
            torch.nn.utils.clip_grad_norm_(model.parameters(), t.max_grad_norm) if t.max_grad_norm else None
        )
        momentum = set_momentum(optimizer, t, state["step"], warmup)
        grad_scaler.step(optimizer)  # fp16: skipped when a gradient overflowed (the scale then drops)
        grad_scaler.update()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        state["step"] += 1
        step = state["step"]
        pending.add(step, step_loss, grad_norm, scheduler.get_last_lr()[0], momentum)
        at_eval = step % eval_every == 0 or step == total_steps
        # one read-back per log window; every step when early stopping watches the loss
        if step % t.log_every == 0 or at_eval or patience is not None:
            for logged_step, logged in pending.read():  # raises on a diverged loss, naming its step
                recent_losses.append(logged["loss"])
                stalled = loss_stalled(state, logged["loss"], patience)
                logger.log(logged, logged_step)
        if step % t.log_every == 0:
            logger.flush()

        if not at_eval and not stalled:
            continue
        metrics = {"step": step, "epoch": step / steps_per_epoch, "loss_avg": float(np.mean(recent_losses))}
        state["loss_avg"] = metrics["loss_avg"]  # the final result carries it too (a study metric)
        if stalled:
            metrics["stopped_early"] = 1
        recent_losses = []
        checkpoint = None
        if is_main:
            with clock.phase("dev_eval"):
                metrics |= evaluator.dev(model)
            if select_key in metrics and metrics[select_key] > state["best_score"]:
                state["best_score"], state["best_step"] = metrics[select_key], step
                state["best_dev"] = dev_scores(metrics)
                # a copy on the model's device (no host round trip), without the frozen tensors
                best_weights = {k: v.detach().clone() for k, v in trained_state(unwrap(model)).items()}
            if best_weights is not None:
                metrics[f"best_{select_key}"] = state["best_score"]
            metrics["samples_per_s"] = step * t.batch_size / (time.perf_counter() - started)
            logger.log({k: v for k, v in metrics.items() if k != "step"}, step)
            logger.flush()
            state["evaluations"] = state.get("evaluations", 0) + 1
            # every checkpoint_every-th evaluation, and the last one (a test evaluation cut short resumes
            # from there, not from an earlier step)
            if state["evaluations"] % t.checkpoint_every == 0 or step == total_steps or stalled:
                with waiting_for_checkpoints(state):
                    session.wait_for_upload()  # one checkpoint copied in the background at a time
                with clock.phase("checkpoint"):
                    checkpoint = save_checkpoint(
                        model, optimizer, scheduler, state, best_weights, device, grad_scaler
                    )
                # over every attempt (the clock's phases are this attempt's)
                state["checkpoint_s"] = state.get("checkpoint_s", 0.0) + clock.last_phase_s
                state["checkpoint_bytes"] = state.get("checkpoint_bytes", 0) + folder_bytes(checkpoint)
                # the points so far are committed with the checkpoint that covers them; a retry
                # elsewhere sends what MLflow has not taken yet
                logger.save_to(checkpoint)
        # the session takes the folder (copies, moves or removes it); the copy's wait counts, unless async
        with waiting_for_checkpoints(state) if checkpoint is not None else contextlib.nullcontext():
            session.report(metrics, checkpoint)
        if checkpoint is not None:  # Tune has it now: the steps it covers are committed
            logger.commit()
        model.train()

    return finish(model, state, best_weights, evaluator, logger, session, clock)


@contextlib.contextmanager
def waiting_for_checkpoints(state: dict) -> Iterator[None]:
    """Adds the block's seconds to ``state["checkpoint_wait_s"]``: training waiting on checkpoint copies."""
    began = time.perf_counter()
    try:
        yield
    finally:
        state["checkpoint_wait_s"] = state.get("checkpoint_wait_s", 0.0) + time.perf_counter() - began


def evaluate_only(trial: TrialConfig, method: Method, session, logger: RunLogger, clock: TrialClock):
    """An evaluation-only point: no training rows, optimiser, steps or checkpoints. The starting model is
    scored on the dev set (the best-dev selection falls back to it, step 0) and on the test sets."""
    pipeline = method.text_pipeline(trial, None)  # no shared input: nothing is trained with it
    model = session.prepare_model(method.build_model(trial.model, pipeline))
    state: dict[str, Any] = {"step": 0, "best_score": -math.inf, "best_step": 0}
    evaluator = Evaluator(trial, method, pipeline)
    if session.rank == 0:
        logger.set_tags(node_tags() | {EVAL_ONLY_TAG: "true"})  # the method's "start" files describe
        # its training input (SelfCCL's scored rows): only the "final" ones are logged, by finish
        clock.setup_done(0)
        with clock.phase("dev_eval"):
            state["best_dev"] = evaluator.dev(model)
        state["best_score"] = state["best_dev"].get(f"dev_{trial.eval.select_on}", -math.inf)
    return finish(model, state, None, evaluator, logger, session, clock)


def dev_scores(metrics: dict[str, float]) -> dict[str, float]:
    """The dev-set scores of one evaluation (``dev_<task>``), kept for the step that was selected."""
    return {key: float(value) for key, value in metrics.items() if key.startswith("dev_")}


def loss_stalled(state: dict, loss: float, patience: int | None) -> bool:
    """Early stopping on the training loss: True once ``patience`` steps in a row brought no new lowest
    loss (the count lives in ``state``, so it survives a resume). Every rank sees the same global loss."""
    if patience is None:
        return False
    if loss < state["lowest_loss"]:
        state["lowest_loss"], state["stalled_steps"] = loss, 0
    else:
        state["stalled_steps"] += 1
    return state["stalled_steps"] >= patience


def finish(model, state, best_weights, evaluator, logger, session, clock: TrialClock) -> dict[str, float]:
    """Reload the best dev checkpoint, score it on the test sets, log the model and the trial's cost,
    and report the final metrics."""
    final: dict[str, float] = {"step": state["step"], "finished": 1}  # not "done": Tune would end the trial
    if "loss_avg" in state:
        final["loss_avg"] = state["loss_avg"]
    if "checkpoint_s" in state:  # what checkpoints cost this trial (written on rank 0)
        final |= {
            "trial_checkpoint_s": state["checkpoint_s"],
            "trial_checkpoint_bytes": state["checkpoint_bytes"],
            "trial_checkpoint_wait_s": state.get("checkpoint_wait_s", 0.0),
        }
    clock.stop_training(session)  # every rank
    main = session.rank == 0
    if main and best_weights is not None:
        load_trained_state(unwrap(model), best_weights)
    with clock.phase("test_eval"):
        # the ranks share the transfer tasks (with rank 0's weights), rank 0 scores the rest
        shared = evaluator.shares_transfer(session.world_size)
        transfer = evaluator.shared_transfer(model, session) if shared else None
        if shared:  # what the other ranks' shares cost in CPU seconds counts too
            clock.add_other_ranks_eval_cpu(session)
        if main:
            final |= evaluator.final(model, transfer)
    if main:
        if transfer is not None:
            logger.set_tags({"clsr.transfer_eval_ranks": str(session.world_size)})
        evaluator.artifacts(model, "final", logger)
        if state["best_score"] > -math.inf:  # a dev score picked the weights (step 0: the starting model)
            # every dev task's score at the selected step: a study metric may be another dev task than
            # the one that selects (the FAQ protocol selects on dev_faq, the study ranks on best_dev_stsb)
            final |= {f"best_{key}": value for key, value in state.get("best_dev", {}).items()}
            final |= {
                "best_step": state["best_step"],
                f"best_dev_{evaluator.cfg.select_on}": state["best_score"],
            }
        if evaluator.cfg.log_model and logger.active:
            evaluator.log_model(model, logger)
        final |= clock.phases(state["step"]) | clock.cost(session) | logger.stop_system_metrics()
        logger.set_tags({"clsr.device": clock.device(session)})
        logger.log({k: v for k, v in final.items() if k not in ("step", "finished")}, state["step"])
        logger.flush()
    session.report(final, None)
    return final if main else {}


class TrialClock:
    """What a trial cost: wall seconds, CPU seconds of every worker, and GPU seconds (GPUs held × wall);
    and where this attempt's wall time went (``phases``: what ``platform study plan`` projects from)."""

    def __init__(self) -> None:
        self.wall_started = time.perf_counter()
        self.cpu_started = time.process_time()
        self.training_cpu_s = 0.0
        self.eval_cpu_started = 0.0
        self.setup_s: float | None = None
        self.first_step = 0
        self.phase_s: dict[str, float] = {"dev_eval": 0.0, "checkpoint": 0.0, "test_eval": 0.0}
        self.phase_count: dict[str, int] = {"dev_eval": 0, "checkpoint": 0}
        self.last_phase_s = 0.0  # how long the last ``phase`` took
        self.other_ranks_eval_cpu_s = 0.0  # their shares of the final evaluation

    def setup_done(self, step: int) -> None:
        """Model, data and restored state are ready; this attempt trains from ``step``."""
        self.setup_s, self.first_step = time.perf_counter() - self.wall_started, step

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        try:
            yield
        finally:
            self.last_phase_s = time.perf_counter() - began
            self.phase_s[name] += self.last_phase_s
            if name in self.phase_count:
                self.phase_count[name] += 1

    def phases(self, step: int) -> dict[str, float]:
        """This attempt's wall seconds by phase (rank 0's view): set-up, optimiser steps (what is left),
        dev evaluations, checkpoint writes and the test evaluation, with the counts that make per-unit
        costs. Call after the test evaluation."""
        if self.setup_s is None:
            return {}
        wall = time.perf_counter() - self.wall_started
        steps = step - self.first_step
        train = wall - self.setup_s - sum(self.phase_s.values())
        return {
            "trial_setup_s": self.setup_s,
            "trial_steps_s": max(train, 0.0) if steps else 0.0,
            "trial_steps_run": float(steps),
            "trial_dev_eval_s": self.phase_s["dev_eval"],
            "trial_dev_evaluations": float(self.phase_count["dev_eval"]),
            "trial_checkpoint_write_s": self.phase_s["checkpoint"],
            "trial_checkpoints_written": float(self.phase_count["checkpoint"]),
            "trial_test_eval_s": self.phase_s["test_eval"],
        }

    def stop_training(self, session) -> None:
        """Sum the workers' CPU seconds so far (a collective: every rank calls it)."""
        self.training_cpu_s = _sum_over_ranks(time.process_time() - self.cpu_started, session)
        self.eval_cpu_started = time.process_time()

    def add_other_ranks_eval_cpu(self, session) -> None:
        """Sum the other ranks' CPU seconds since training stopped (a collective: every rank calls it)."""
        mine = 0.0 if session.rank == 0 else time.process_time() - self.eval_cpu_started
        self.other_ranks_eval_cpu_s = _sum_over_ranks(mine, session)

    def cost(self, session) -> dict[str, float]:
        wall = time.perf_counter() - self.wall_started
        gpus = session.world_size * session.gpu_share if session.device.type == "cuda" else 0.0
        eval_cpu = time.process_time() - self.eval_cpu_started + self.other_ranks_eval_cpu_s
        return {
            "trial_wall_s": wall,
            "trial_cpu_s": self.training_cpu_s + eval_cpu,
            "trial_gpu_s": wall * gpus,
        }

    @staticmethod
    def device(session) -> str:
        if session.device.type == "cuda":
            return f"{session.world_size} x {torch.cuda.get_device_name(session.device)}"
        return f"{session.world_size} x cpu"


def _sum_over_ranks(value: float, session) -> float:
    """``value`` summed over the trial's ranks (a collective when there are several)."""
    total = torch.tensor([value], dtype=torch.float64)
    if session.world_size > 1 and torch.distributed.is_initialized():
        backend = torch.distributed.get_backend()
        total = total.to(session.device if backend == "nccl" else torch.device("cpu"))
        torch.distributed.all_reduce(total)
    return float(total.item())
