"""The generic training loop shared by every method. Read it top to bottom: ``fit``.

The loop knows nothing about any method: the method builds the model, orders the rows into batches
and computes the loss. Rank 0 evaluates on the dev set every ``eval_steps`` steps (``Evaluator``),
keeps the best weights (the SimCSE protocol) and logs to MLflow; every rank reports to Ray Train at the
same steps. ``trainer.max_steps: 0`` makes an evaluation-only point (``evaluate_only``): the starting
model is scored. What the loop carries through a checkpoint: ``clsr.train.loop_state``; checkpoint I/O:
``clsr.train.checkpoint``; the trial's cost: ``clsr.train.clock``.
"""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from clsr.config.steps import eval_interval
from clsr.config.trial import TrainerConfig, TrialConfig
from clsr.data.training import training_rows
from clsr.encoders.precision import autocast_context, resolved_precision
from clsr.methods import build_method
from clsr.methods.base import Method
from clsr.tracking.environment import ENV_ARTIFACTS, capture
from clsr.tracking.run_logger import RunLogger, TrackingTarget
from clsr.train.checkpoint import (
    folder_bytes,
    load_checkpoint,
    load_trained_state,
    save_checkpoint,
    trained_state,
    unwrap,
    weights_sha256,
)
from clsr.train.clock import TrialClock
from clsr.train.data_record import data_params
from clsr.train.determinism import configure, seed_step
from clsr.train.evaluator import Evaluator, dev_scores
from clsr.train.gradcache import check_gradcache, gradcache_backward
from clsr.train.loop_state import LoopState
from clsr.train.optim import build_optimizer, build_scheduler, set_momentum, warmup_steps
from clsr.train.outcome import EVAL_ONLY_TAG, FINAL_FAILURES, is_evaluation_only
from clsr.train.readback import PendingSteps
from clsr.train.session import node_tags

WEIGHTS_TAG = "clsr.weights_sha256"


def loss_scaler(precision: str, device: torch.device) -> torch.amp.GradScaler:
    """fp16's dynamic loss scaling (small gradients underflow in fp16 otherwise); a disabled scaler,
    which passes everything through, for bf16 and fp32 (bf16 has fp32's exponent range)."""
    return torch.amp.GradScaler(device.type, enabled=resolved_precision(precision, device) == "fp16")


def compiled(model: nn.Module, t: TrainerConfig) -> nn.Module:
    """The model with ``trainer.compile`` applied (its training forward compiled in place)."""
    if t.compile:
        model.compile_for_training(t.compile_mode)
    return model


def to_device(batch: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """The batch's tensors on ``device``; to a GPU from pinned host memory without blocking, so the
    copy overlaps the work queued before it (the host does not wait for the GPU between steps)."""
    if device.type != "cuda":
        return {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
    return {
        k: v.pin_memory().to(device, non_blocking=True) if torch.is_tensor(v) else v for k, v in batch.items()
    }


def fit(
    trial: TrialConfig, session, tracking: TrackingTarget | None = None, shared: Any = None
) -> dict[str, float]:
    """Train one trial and return its final metrics (on rank 0; other ranks return ``{}``).

    ``shared``: the method's ``prepare_shared`` result when the study runner built it once for many
    trials; built here when None and the method needs one. Per-step metrics reach MLflow with the
    checkpoint that covers their step (``RunLogger``), so that a trial resumed from a checkpoint leaves
    each step once in its run. Whatever way the trial ends, what MLflow has not taken yet is sent, or
    left in the study's storage for the study driver; only the points logged since the last checkpoint
    of a trial that will run again from it (any failure but a final one) are dropped: it logs them again.
    """
    at_checkpoints = tracking.commit_at_checkpoints if tracking is not None else True
    logger = RunLogger(tracking if session.rank == 0 else None, commit_at_checkpoints=at_checkpoints)
    try:
        final = train(trial, session, logger, shared)
    except BaseException as err:
        logger.close(keep_uncommitted=isinstance(err, FINAL_FAILURES))
        raise
    logger.close()
    return final


@dataclass
class Training:
    """What stays fixed while a trial trains: the method with its model, batcher and optimiser, where
    the trial reports, and its step plan."""

    trial: TrialConfig
    session: Any
    logger: RunLogger
    clock: TrialClock
    method: Method
    batcher: Any
    evaluator: Evaluator
    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    grad_scaler: torch.amp.GradScaler
    autocast: Any
    steps_per_epoch: int
    total_steps: int
    warmup: int

    @property
    def is_main(self) -> bool:
        return self.session.rank == 0


def train(trial: TrialConfig, session, logger: RunLogger, shared: Any = None) -> dict[str, float]:
    """``fit`` with its MLflow logger: the training loop, read top to bottom."""
    clock = TrialClock()
    t = trial.trainer
    configure(t.deterministic)
    torch.manual_seed(t.seed + session.rank)  # same init everywhere (DDP broadcasts), own dropout per rank
    np.random.seed(t.seed + session.rank)

    method = build_method(trial)
    if is_evaluation_only(trial):
        return evaluate_only(trial, method, session, logger, clock)
    check_gradcache(method, t.gradcache_chunk_rows)
    if shared is None and method.shared_key(trial) is not None:
        shared = method.prepare_shared(trial)
    pipeline = method.text_pipeline(trial, shared)
    read = training_rows(trial)
    log_data(trial, session, logger, read)  # hashed before a method reshapes its rows
    rows = method.rows_for_training(read, trial)
    batcher = method.prepare_rows(rows, pipeline, trial)
    run = prepared(trial, session, logger, clock, method, pipeline, batcher, len(rows))
    if run.is_main:
        logger.set_tags(node_tags())  # a retry on another node (a lost machine) updates them
        log_environment(session, logger)
        run.evaluator.artifacts(run.model, "start", logger)

    state, best_weights = restored(run)
    patience = t.stop_when_loss_stalls or method.stop_when_loss_stalls()
    stalled = patience is not None and state.stalled_steps >= patience  # restored after stopping early
    eval_every = eval_interval(trial, run.steps_per_epoch)
    epoch_batches: tuple[int, list[list[int]]] = (-1, [])
    recent_losses: list[float] = []
    pending = PendingSteps()  # losses and gradient norms on the device until a log step reads them
    clock.setup_done(state.step)
    started = time.perf_counter()
    run.model.train()
    while state.step < run.total_steps and not stalled:
        epoch, position = divmod(state.step, run.steps_per_epoch)
        if epoch_batches[0] != epoch:
            epoch_batches = (epoch, method.batch_order(rows, t.batch_size, epoch, t.seed))
        if t.deterministic:  # the step's draws depend on the step alone: a resume draws them again
            seed_step(t.seed, session.rank, state.step)
        step_loss, grad_norm, momentum = optimizer_step(run, epoch_batches[1][position], state.step)
        state.step += 1
        step = state.step
        pending.add(step, step_loss, grad_norm, run.scheduler.get_last_lr()[0], momentum)
        at_eval = step % eval_every == 0 or step == run.total_steps
        # one read-back per log window; every step when early stopping watches the loss
        if step % t.log_every == 0 or at_eval or patience is not None:
            for logged_step, logged in pending.read():  # raises on a diverged loss, naming its step
                recent_losses.append(logged["loss"])
                stalled = state.loss_stalled(logged["loss"], patience)
                logger.log(logged, logged_step)
        if step % t.log_every == 0:
            logger.flush()
        if at_eval or stalled:
            best_weights = evaluated(run, state, best_weights, recent_losses, stalled, started)
            recent_losses = []
            run.model.train()

    return finish(run.model, state, best_weights, run.evaluator, logger, session, clock)


def log_data(trial: TrialConfig, session, logger: RunLogger, rows: list[dict[str, str]] | None) -> None:
    """Rank 0 logs the identities of the data the trial reads (``clsr.train.data_record``)."""
    if session.rank == 0 and logger.active:
        logger.log_params(data_params(trial, rows))


def log_environment(session, logger: RunLogger) -> None:
    """Rank 0 logs where the trial runs (``clsr.tracking.environment``), once its model is on the device:
    the GPU named is the trial's own."""
    if session.rank == 0 and logger.active:
        env = capture(session.device.type)
        logger.log_params(env.params())
        logger.log_text(env.lock_text(), f"{ENV_ARTIFACTS}/environment.txt")
        if env.diff:
            logger.log_text(env.diff, f"{ENV_ARTIFACTS}/diff.patch")


def prepared(trial, session, logger, clock, method, pipeline, batcher, n_rows: int) -> Training:
    """The model on the session's device and what trains it, for ``n_rows`` training rows."""
    t = trial.trainer
    steps_per_epoch, total_steps = method.plan_steps(n_rows, trial, session.world_size)
    model = session.prepare_model(compiled(method.build_model(trial.model, pipeline), t))
    optimizer = build_optimizer(unwrap(model), t, method.param_group_lrs(), method.fixed_lr_prefixes())
    return Training(
        trial=trial,
        session=session,
        logger=logger,
        clock=clock,
        method=method,
        batcher=batcher,
        evaluator=Evaluator(trial, method, pipeline),  # scores on rank 0; every rank shares the transfer
        model=model,
        optimizer=optimizer,
        scheduler=build_scheduler(optimizer, t, total_steps, steps_per_epoch),
        grad_scaler=loss_scaler(t.precision, session.device),
        autocast=autocast_context(t.precision, session.device),
        steps_per_epoch=steps_per_epoch,
        total_steps=total_steps,
        warmup=warmup_steps(t, total_steps, steps_per_epoch),
    )


def restored(run: Training) -> tuple[LoopState, dict | None]:
    """The loop's state and best weights: fresh, or where the trial's last checkpoint left them (a
    retried or restored trial)."""
    session, logger = run.session, run.logger
    with session.restored() as restore:  # a local copy of the last checkpoint, removed after loading
        if restore is None:
            return LoopState(), None
        saved: dict[str, Any] = {}
        best_weights = load_checkpoint(
            restore,
            run.model,
            run.optimizer,
            run.scheduler,
            saved,
            session,
            run.trial.trainer.seed,
            session.device,
            run.grad_scaler,
        )
        state = LoopState.from_checkpoint(saved)
        logger.load_from(restore)  # what the earlier attempt had not sent to MLflow yet
        logger.log({"resumed_from_step": state.step}, state.step)  # one point per retry or resume
    return state, best_weights


def optimizer_step(run: Training, global_batch: list[int], step: int) -> tuple[torch.Tensor, Any, Any]:
    """One optimiser step over this rank's share of ``global_batch``, accumulated over micro-batches:
    the step's loss (on the device), the gradient norm before clipping and the momentum set."""
    t, session = run.trial.trainer, run.session
    micro_rows = t.batch_size // t.grad_accum_steps  # global rows per forward pass
    local_rows = micro_rows // session.world_size
    step_loss = torch.zeros((), device=session.device)
    for start in range(0, t.batch_size, micro_rows):
        micro = global_batch[start : start + micro_rows]
        mine = micro[session.rank * local_rows : (session.rank + 1) * local_rows]
        step_loss += micro_batch_loss(run, mine, last=start + micro_rows >= t.batch_size) / t.grad_accum_steps
    run.grad_scaler.unscale_(run.optimizer)  # fp16: clip and log the true gradient, not the scaled one
    grad_norm = (
        torch.nn.utils.clip_grad_norm_(run.model.parameters(), t.max_grad_norm) if t.max_grad_norm else None
    )
    momentum = set_momentum(run.optimizer, t, step, run.warmup)
    run.grad_scaler.step(run.optimizer)  # fp16: skipped when a gradient overflowed (the scale then drops)
    run.grad_scaler.update()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    return step_loss, grad_norm, momentum


def micro_batch_loss(run: Training, mine: list[int], last: bool) -> torch.Tensor:
    """Forward and backward over this rank's rows of one micro-batch; its (detached) loss. Gradients
    synchronise across ranks on the ``last`` micro-batch of the step only."""
    t, session, model = run.trial.trainer, run.session, run.model
    batch = to_device(run.batcher.collate(mine), session.device)
    if t.gradcache_chunk_rows:  # the same loss and step, encoded a chunk of rows at a time
        return gradcache_backward(
            run.method,
            model,
            run.batcher,
            mine,
            batch,
            t.gradcache_chunk_rows,
            device=session.device,
            scale=session.world_size / t.grad_accum_steps,
            autocast=run.autocast,
            sync=last,
            grad_scaler=run.grad_scaler,
        )
    sync = contextlib.nullcontext() if last or not hasattr(model, "no_sync") else model.no_sync()
    with sync:
        with run.autocast:
            loss = run.method.training_loss(model, batch)
        # every rank holds the global loss; × world makes DDP's gradient average its gradient
        run.grad_scaler.scale(loss * session.world_size / t.grad_accum_steps).backward()
    return loss.detach()


def evaluated(
    run: Training, state: LoopState, best_weights, recent_losses: list[float], stalled: bool, started: float
) -> dict | None:
    """An evaluation step: rank 0 scores the dev set, keeps the best weights (returned), logs and writes
    a checkpoint when one is due; every rank reports to the session."""
    step = state.step
    metrics = {"step": step, "epoch": step / run.steps_per_epoch, "loss_avg": float(np.mean(recent_losses))}
    state.loss_avg = metrics["loss_avg"]  # the final result carries it too (a study metric)
    if stalled:
        metrics["stopped_early"] = 1
    checkpoint = None
    if run.is_main:
        best_weights = dev_evaluation(run, state, best_weights, metrics)
        metrics["samples_per_s"] = step * run.trial.trainer.batch_size / (time.perf_counter() - started)
        run.logger.log({k: v for k, v in metrics.items() if k != "step"}, step)
        run.logger.flush()
        state.evaluations += 1
        # every checkpoint_every-th evaluation, and the last one (a test evaluation cut short resumes
        # from there, not from an earlier step)
        if state.evaluations % run.trial.trainer.checkpoint_every == 0 or step == run.total_steps or stalled:
            checkpoint = saved_checkpoint(run, state, best_weights)
    # the session takes the folder (copies, moves or removes it); the copy's wait counts, unless async
    with state.waiting_for_checkpoints() if checkpoint is not None else contextlib.nullcontext():
        run.session.report(metrics, checkpoint)
    if checkpoint is not None:  # Tune has it now: the steps it covers are committed
        run.logger.commit()
    return best_weights


def dev_evaluation(run: Training, state: LoopState, best_weights, metrics: dict) -> dict | None:
    """Adds the dev scores to ``metrics``; the best weights so far, these when they score best."""
    select_key = f"dev_{run.trial.eval.select_on}"
    with run.clock.phase("dev_eval"):
        metrics |= run.evaluator.dev(run.model)
    if select_key in metrics and metrics[select_key] > state.best_score:
        state.best_score, state.best_step = metrics[select_key], state.step
        state.best_dev = dev_scores(metrics)
        # a copy on the model's device (no host round trip), without the frozen tensors
        best_weights = {k: v.detach().clone() for k, v in trained_state(unwrap(run.model)).items()}
    if best_weights is not None:
        metrics[f"best_{select_key}"] = state.best_score
    return best_weights


def saved_checkpoint(run: Training, state: LoopState, best_weights) -> Path:
    """A checkpoint of this step, with the logged points it covers (a retry elsewhere sends what MLflow
    has not taken yet); what it cost counts over every attempt (the clock's phases are this attempt's)."""
    with state.waiting_for_checkpoints():
        run.session.wait_for_upload()  # one checkpoint copied in the background at a time
    with run.clock.phase("checkpoint"):
        checkpoint = save_checkpoint(
            run.model,
            run.optimizer,
            run.scheduler,
            state.to_checkpoint(),
            best_weights,
            run.session.device,
            run.grad_scaler,
        )
    state.add_checkpoint(run.clock.last_phase_s, folder_bytes(checkpoint))
    run.logger.save_to(checkpoint)
    return checkpoint


def evaluate_only(trial: TrialConfig, method: Method, session, logger: RunLogger, clock: TrialClock):
    """An evaluation-only point: no training rows, optimiser, steps or checkpoints. The starting model is
    scored on the dev set (the best-dev selection falls back to it, step 0) and on the test sets."""
    pipeline = method.text_pipeline(trial, None)  # no shared input: nothing is trained with it
    model = session.prepare_model(method.build_model(trial.model, pipeline))
    state = LoopState()
    evaluator = Evaluator(trial, method, pipeline)
    log_data(trial, session, logger, None)
    if session.rank == 0:
        log_environment(session, logger)
        logger.set_tags(node_tags() | {EVAL_ONLY_TAG: "true"})  # the method's "start" files describe
        # its training input (SelfCCL's scored rows): only the "final" ones are logged, by finish
        clock.setup_done(0)
        with clock.phase("dev_eval"):
            state.best_dev = evaluator.dev(model)
        state.best_score = state.best_dev.get(f"dev_{trial.eval.select_on}", -math.inf)
    return finish(model, state, None, evaluator, logger, session, clock)


def finish(
    model, state: LoopState, best_weights, evaluator, logger, session, clock: TrialClock
) -> dict[str, float]:
    """Reload the best dev checkpoint, score it on the test sets, log the model and the trial's cost,
    and report the final metrics."""
    final: dict[str, float] = {"step": state.step, "finished": 1}  # not "done": Tune would end the trial
    if state.loss_avg is not None:
        final["loss_avg"] = state.loss_avg
    if state.checkpoint_s is not None:  # what checkpoints cost this trial (written on rank 0)
        final |= {
            "trial_checkpoint_s": state.checkpoint_s,
            "trial_checkpoint_bytes": state.checkpoint_bytes,
            "trial_checkpoint_wait_s": state.checkpoint_wait_s,
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
        if state.best_score > -math.inf:  # a dev score picked the weights (step 0: the starting model)
            # every dev task's score at the selected step: a study metric may be another dev task than
            # the one that selects (the FAQ protocol selects on dev_faq, the study ranks on best_dev_stsb)
            final |= {f"best_{key}": value for key, value in (state.best_dev or {}).items()}
            final |= {
                "best_step": state.best_step,
                f"best_dev_{evaluator.cfg.select_on}": state.best_score,
            }
        if evaluator.cfg.log_model and logger.active:
            evaluator.log_model(model, logger)
        final |= clock.phases(state.step) | clock.cost(session) | logger.stop_system_metrics()
        # the weights scored: equal digests, bitwise-equal weights (trainer.deterministic's promise)
        logger.set_tags({"clsr.device": clock.device(session), WEIGHTS_TAG: weights_sha256(unwrap(model))})
        logger.log({k: v for k, v in final.items() if k not in ("step", "finished")}, state.step)
        logger.flush()
    session.report(final, None)
    return final if main else {}
