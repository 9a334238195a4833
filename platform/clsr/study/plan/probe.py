"""``platform study plan --probe``: measure a study's per-phase costs here, on this machine's device,
by running short copies of one of its trials, before any of it runs on Ray.

The probe takes the first point of an ablation (the study's first unless named), cuts it to two
evaluation intervals (or ``--probe-steps``), and runs as many copies of it at once as the study packs
on one GPU (``1 / gpus_per_worker``: eight for GCLSR), each in its own process with its share of the
card's memory and a trial's CPUs (``OMP_NUM_THREADS``, as Ray sets it), so that the measured step and evaluation times include the contention of packed
trials. The copies run the trainer directly (``fit`` on a ``LocalSession``): no Ray, no MLflow, so a
machine with PyTorch and this package can probe. Their clocks (``TrialClock``) become the unit costs
that ``projection.project`` prices every distinct trial with.

Not measured by a probe: the study's own start (Ray, shared inputs built once for all trials; a probe
copy builds them itself, inside its set-up) and each trial's MLflow run; the projection says so.
"""

from __future__ import annotations

import multiprocessing
import queue
import statistics
import time
from typing import Any

from clsr.config.trial import TrialConfig
from clsr.study.plan.point import GridPoint
from clsr.study.plan.projection import Measured, Sample, costs_of, gpus_per_trial
from clsr.study.plan.resolve import Resolve, grid_points, resolver
from clsr.study.spec.dotted import set_dotted
from clsr.study.spec.schema import Study


def probe_trial(
    study: Study,
    ablation: str | None = None,
    steps: int | None = None,
    grids: dict[str, list[GridPoint]] | None = None,
    resolve: Resolve | None = None,
) -> tuple[str, TrialConfig]:
    """The probe's trial and its label: ``ablation``'s first point and seed, cut to ``steps`` optimiser steps (default:
    two evaluation intervals, at least 10 steps, at most the trial's own). ``grids`` and ``resolve``:
    the study's documents (``clsr.study.plan.resolve.StudyDocuments``); by default resolved here."""
    from clsr.config.steps import eval_interval
    from clsr.data.training import training_rows
    from clsr.methods import build_method

    name = ablation or next(iter(study.ablations))
    if name not in study.ablations:
        raise ValueError(f"--probe-ablation {name!r}: study {study.name!r} has {', '.join(study.ablations)}")
    if study.ablations[name].space:
        raise ValueError(f"--probe-ablation {name!r} is a search space: name one of the study's grids")
    # a confirm ablation may have no points: its base stands in
    points = grid_points(study.ablations[name]) if grids is None else grids[name]
    point = points[0] if points else GridPoint("base", {}, {})
    first_seed = study.seeds_of(name)[0]
    trial = resolver(study, resolve)(name, point.overrides, first_seed)
    method = build_method(trial)
    steps_per_epoch, total = method.plan_steps(
        len(method.rows_for_training(training_rows(trial), trial)), trial, 1
    )
    if total == 0:
        raise ValueError(f"--probe-ablation {name!r} trains nothing (max_steps 0): name another ablation")
    cut = min(total, steps or max(2 * eval_interval(trial, steps_per_epoch), 10))
    doc = set_dotted(trial.model_dump(), "trainer.max_steps", cut)
    doc = set_dotted(doc, "trainer.log_every", max(1, cut // 10))  # progress, and a cut copy's timing
    return f"{name}/{point.label or 'first point'}", TrialConfig.model_validate(doc)


PROBE_LIMIT_S = 120.0  # --probe-limit's default: a probe answers in about two minutes


class ProbeIncomplete(RuntimeError):
    """No copy measured anything before the probe's time limit."""


def copy_main(n: int, trial_json: str, gpu_share: float, cpus: int, queue) -> None:
    """One probe copy, in its own process: the trial on this machine's device with its share of the GPU,
    each logged step (``step``) and its end (``done``, a Sample; or ``error``) sent on ``queue``."""
    try:
        limit_threads(cpus)
        queue.put(("done", n, run_copy(n, trial_json, gpu_share, queue)))
    except BaseException as err:  # the parent says which copy failed and why
        queue.put(("error", n, f"{type(err).__name__}: {err}"))


def run_copy(n: int, trial_json: str, gpu_share: float, queue) -> Sample:
    from clsr.train.clock import TrialClock
    from clsr.train.loop import train
    from clsr.train.session import LocalSession, cap_gpu_memory

    trial = TrialConfig.model_validate_json(trial_json)
    session = LocalSession()
    if gpu_share > 0:
        cap_gpu_memory(gpu_share, session.device)
    device = TrialClock.device(session)
    start = time.perf_counter()
    logger = progress_logger(lambda step: queue.put(("step", n, step, time.perf_counter() - start, device)))
    try:
        final = train(trial, session, logger)
    finally:
        logger.close()
    wall = time.perf_counter() - start
    stop_joblib_workers()
    return Sample(final, device, wall - final.get("trial_wall_s", wall))


def progress_logger(on_step):
    """A RunLogger with no MLflow run that calls ``on_step(step)`` at every logged step (made on call:
    the tracking layer loads in the copy's process only)."""
    from clsr.tracking.run_logger import RunLogger

    class _Progress(RunLogger):
        def log(self, metrics, step=None):
            if step is not None:
                on_step(step)
            return super().log(metrics, step)

    return _Progress(None, commit_at_checkpoints=True)


def limit_threads(cpus: int) -> None:
    """A copy gets the CPUs a trial of the study gets, as Ray gives them: ``OMP_NUM_THREADS`` (which
    torch and the transfer tasks' classifier processes follow)."""
    import os

    import torch

    os.environ["OMP_NUM_THREADS"] = str(cpus)
    torch.set_num_threads(cpus)


def stop_joblib_workers() -> None:
    """The transfer tasks' joblib (loky) workers idle for minutes before they exit, and a pool process
    cannot exit before its children: the copy is over, so they go now."""
    from joblib.externals.loky import reusable_executor

    if (workers := getattr(reusable_executor, "_executor", None)) is not None:
        workers.shutdown(wait=True, kill_workers=True)
    for child in multiprocessing.active_children():  # anything else this copy started
        child.terminate()
        child.join()


def probe(
    study: Study,
    copies: int | None = None,
    ablations: list[str] | None = None,
    steps: int | None = None,
    progress=print,
    grids: dict[str, list[GridPoint]] | None = None,
    resolve: Resolve | None = None,
    limit_s: float = PROBE_LIMIT_S,
) -> Measured:
    """Run ``copies`` (default: as many as share one GPU) of each named ablation's probe trial at once
    (default: the study's first ablation); the first one's unit costs price the ablations not probed.
    Within ``limit_s`` seconds in all: copies still running then are stopped and priced by the steps
    they logged (ProbeIncomplete when none logged two). ``grids`` and ``resolve``: as ``probe_trial``."""
    share = gpus_per_trial(study)
    copies = copies or (max(1, round(1 / share)) if 0 < share < 1 else 1)
    deadline = time.monotonic() + limit_s
    by_ablation, described = {}, []
    for ablation in ablations or [next(iter(study.ablations))]:
        progress(f"probe: {ablation}: resolving its first point and reading its training rows ...")
        label, trial = probe_trial(study, ablation, steps, grids, resolve)
        progress(
            f"probe: {copies} cop{'y' if copies == 1 else 'ies'} of {label} at once, "
            f"{trial.trainer.max_steps} steps each, on this machine (set-up first: model and data; "
            f"{deadline - time.monotonic():.0f} s left of the {limit_s:.0f} s limit) ..."
        )
        cpus = max(1, round(study.resources.cpus_per_worker))
        samples, cut = run_copies(trial, copies, share if share < 1 else 0, cpus, deadline, progress)
        for n, sample in enumerate(samples):
            progress(describe(n, sample))
        costs = costs_of(samples)
        if costs is None:  # fit returns its phases on rank 0 whenever it trains
            raise RuntimeError(f"probe: the copies of {label} returned no phase timings")
        by_ablation[label.split("/")[0]] = costs
        walls = statistics.median(s.metrics.get("trial_wall_s", 0.0) for s in samples)
        described.append(
            f"{label}: {trial.trainer.max_steps} steps, median wall {walls:.1f} s"
            + (f"; stopped at the {limit_s:.0f} s limit: steps timed from the logged ones (evaluations "
               "among them), test evaluation not measured" if cut else "")
        )  # fmt: skip
        if cut:  # no time left for the other ablations: the first one's costs price them
            break
    source = f"a probe here ({copies} at once of {'; '.join(described)})"
    return Measured(source, next(iter(by_ablation.values())), by_ablation)


def run_copies(
    trial: TrialConfig, copies: int, share: float, cpus: int, deadline: float, progress
) -> tuple[list[Sample], bool]:
    """The copies' samples, each copy in its own process, and whether the deadline cut them (a cut
    copy's sample is what its logged steps say: ``partial_sample``)."""
    spawn = multiprocessing.get_context("spawn")  # CUDA cannot be forked; each copy its own process
    messages = spawn.Queue()
    procs = [
        spawn.Process(target=copy_main, args=(n, trial.model_dump_json(), share, cpus, messages))
        for n in range(copies)
    ]
    for proc in procs:
        proc.start()
    done: dict[int, Sample] = {}
    logged: dict[int, list[tuple[int, float, str]]] = {n: [] for n in range(copies)}
    try:
        while len(done) < copies and (left := deadline - time.monotonic()) > 0:
            try:
                kind, n, *body = messages.get(timeout=min(left, 1.0))
            except queue.Empty:
                if not any(p.is_alive() for p in procs):
                    raise RuntimeError("probe: the copies ended without a result (killed?)") from None
                continue
            if kind == "error":
                raise RuntimeError(f"probe: copy {n} failed: {body[0]}")
            if kind == "done":
                done[n] = body[0]
                continue
            logged[n].append(tuple(body))
            if n == 0:  # one copy's progress stands for all (they run the same trial at once)
                progress(step_line(logged[0], trial.trainer.max_steps))
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()
    if len(done) == copies:
        return [done[n] for n in range(copies)], False
    partial = [partial_sample(steps) for n, steps in logged.items() if n not in done]
    samples = list(done.values()) + [s for s in partial if s is not None]
    if not samples:
        raise ProbeIncomplete(
            "probe: no copy logged two steps before the time limit (its set-up took most of it); "
            "raise --probe-limit or lower --probe-steps"
        )
    return samples, True


def step_line(logged: list[tuple[int, float, str]], total: int) -> str:
    """The progress line of a copy's latest logged step (logged again: it was just evaluated)."""
    step, t, _ = logged[-1]
    if len(logged) > 1 and logged[-2][0] == step:
        what = "trained; test evaluation ..." if step == total else "training on ..."
        return f"  copy 0: dev evaluation at step {step} took {t - logged[-2][1]:.0f} s; {what}"
    return f"  copy 0: step {step}/{total} after {t:.0f} s"


def partial_sample(logged: list[tuple[int, float, str]]) -> Sample | None:
    """A cut copy's sample from its logged ``(step, seconds since it started, device)``. A step logged
    twice was evaluated between the two (the loop logs the dev score at the step it scored): those gaps
    are its dev evaluations (a checkpoint written after one falls in the next step); the other gaps
    between the first and last logged step are its steps, and set-up the first one's time less its
    steps. None with fewer than two distinct steps logged."""
    if len(logged) < 2 or logged[-1][0] == logged[0][0]:
        return None
    evaluations, eval_s = 0, 0.0
    for (step, t, _), (next_step, next_t, _) in zip(logged, logged[1:], strict=False):
        if next_step == step:
            evaluations, eval_s = evaluations + 1, eval_s + next_t - t
    (first, t0, device), (last, t1, _) = logged[0], logged[-1]
    step_s = (t1 - t0 - eval_s) / (last - first)
    metrics = {
        "trial_setup_s": max(t0 - first * step_s, 0.0), "trial_steps_s": step_s * last,
        "trial_steps_run": float(last), "trial_dev_evaluations": float(evaluations),
        "trial_dev_eval_s": eval_s, "trial_test_eval_s": 0.0, "trial_wall_s": t1,
    }  # fmt: skip
    return Sample(metrics, device, None)


def describe(n: int, sample: Sample) -> str:
    m: dict[str, Any] = sample.metrics
    steps = m.get("trial_steps_run", 0.0)
    per_step = m.get("trial_steps_s", 0.0) / steps if steps else 0.0
    return (
        f"  copy {n}: set-up {m.get('trial_setup_s', 0):.1f} s, {steps:.0f} steps at {per_step * 1000:.0f} ms, "
        f"{m.get('trial_dev_evaluations', 0):.0f} dev evaluations {m.get('trial_dev_eval_s', 0):.1f} s, "
        f"test evaluation {m.get('trial_test_eval_s', 0):.1f} s, wall {m.get('trial_wall_s', 0):.1f} s "
        f"({sample.device})"
    )
