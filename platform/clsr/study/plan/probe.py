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
import statistics
import time
from concurrent.futures import ProcessPoolExecutor
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
    return f"{name}/{point.label or 'first point'}", TrialConfig.model_validate(doc)


def run_copy(trial_json: str, gpu_share: float) -> Sample:
    """One probe copy, in its own process: the trial on this machine's device, its share of the GPU."""
    from clsr.train.clock import TrialClock
    from clsr.train.loop import fit
    from clsr.train.session import LocalSession, cap_gpu_memory

    trial = TrialConfig.model_validate_json(trial_json)
    session = LocalSession()
    if gpu_share > 0:
        cap_gpu_memory(gpu_share, session.device)
    start = time.perf_counter()
    final = fit(trial, session)
    wall = time.perf_counter() - start
    stop_joblib_workers()
    return Sample(final, TrialClock.device(session), wall - final.get("trial_wall_s", wall))


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
) -> Measured:
    """Run ``copies`` (default: as many as share one GPU) of each named ablation's probe trial at once
    (default: the study's first ablation); the first one's unit costs price the ablations not probed.
    ``grids`` and ``resolve``: as ``probe_trial`` takes them."""
    share = gpus_per_trial(study)
    copies = copies or (max(1, round(1 / share)) if 0 < share < 1 else 1)
    by_ablation, described = {}, []
    for ablation in ablations or [next(iter(study.ablations))]:
        label, trial = probe_trial(study, ablation, steps, grids, resolve)
        progress(
            f"probe: {copies} cop{'y' if copies == 1 else 'ies'} of {label} at once, "
            f"{trial.trainer.max_steps} steps each, on this machine ..."
        )
        spawn = multiprocessing.get_context("spawn")  # CUDA cannot be forked; each copy its own process
        cpus = max(1, round(study.resources.cpus_per_worker))
        with ProcessPoolExecutor(
            copies, mp_context=spawn, initializer=limit_threads, initargs=(cpus,)
        ) as pool:
            jobs = [trial.model_dump_json()] * copies
            samples = list(pool.map(run_copy, jobs, [share if share < 1 else 0] * copies))
        for n, sample in enumerate(samples):
            progress(describe(n, sample))
        costs = costs_of(samples)
        if costs is None:  # fit returns its phases on rank 0 whenever it trains
            raise RuntimeError(f"probe: the copies of {label} returned no phase timings")
        by_ablation[label.split("/")[0]] = costs
        walls = statistics.median(s.metrics.get("trial_wall_s", 0.0) for s in samples)
        described.append(f"{label}: {trial.trainer.max_steps} steps, median wall {walls:.1f} s")
    source = f"a probe here ({copies} at once of {'; '.join(described)})"
    return Measured(source, next(iter(by_ablation.values())), by_ablation)


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
