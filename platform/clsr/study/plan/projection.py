"""``platform study plan``: what a study will cost before it runs, from per-phase costs measured on
trials that did run.

Each finished trial logs where its wall time went (``trial_setup_s``, ``trial_steps_s`` over
``trial_steps_run``, ``trial_dev_eval_s`` over ``trial_dev_evaluations``, ``trial_checkpoint_write_s``
over ``trial_checkpoints_written``, ``trial_test_eval_s``: ``clsr.train.clock.TrialClock``). The medians
over a recorded study's trials, per ablation where it has them, give per-unit costs; every distinct
trial of the planned study is then priced by its own steps, evaluations and checkpoints, the trials
of each stage are packed onto the GPUs (``concurrency`` slots, or as many as the GPUs hold), and the
stages add up. Measured on another device than the target, the steps and evaluations are divided by
a stated speed-up (``--gpu-speedup``); set-up and checkpoint writes are not (start-up, disk and
network). With no record at all, each trial is priced by the FLOPs cost model instead
(``clsr.study.plan.cost_model``), and the table's ``basis`` column says which figures are which.
Nothing here is a library's: no tool projects a Ray Tune study from its own trials' phases.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clsr.config.trial import TrialConfig
from clsr.study.plan.distinct import merge_identical
from clsr.study.plan.point import GridPoint
from clsr.study.plan.resolve import Resolve, grid_points, resolver, stages
from clsr.study.plan.study_plan import TrialSpec
from clsr.study.spec.schema import Study

# Assumptions, each printed with the projection and each overridable on the command line: how many
# times faster a GPU runs a 2-core CPU's optimiser steps and encoder passes (dense transformer work in
# bf16; a rough figure, for planning only), and an on-demand price per GPU-hour in USD.
GPUS: dict[str, dict[str, float]] = {
    "a100": {"speedup": 15.0, "usd_per_gpu_hour": 1.80},
    "h100": {"speedup": 30.0, "usd_per_gpu_hour": 2.50},
    "h200": {"speedup": 35.0, "usd_per_gpu_hour": 3.50},
}
PHASE_METRICS = ("trial_setup_s", "trial_steps_run", "trial_dev_evaluations", "trial_test_eval_s")


class NoMeasurements(LookupError):
    """The recorded study has no finished trial with phase timings."""


@dataclass(frozen=True)
class UnitCosts:
    """Seconds per unit of work, medians over ``trials`` measured trials on ``device``."""

    setup_s: float
    overhead_s: float  # the trial's run open longer than its loop (MLflow, shared inputs, Tune)
    step_s: float
    dev_eval_s: float
    checkpoint_s: float
    test_eval_s: float
    trials: int
    device: str


@dataclass
class Measured:
    """Unit costs per ablation of the recorded study, and over all of its trials."""

    source: str  # where the costs were measured: "study 'name'", or a probe's description
    overall: UnitCosts
    by_ablation: dict[str, UnitCosts] = field(default_factory=dict)
    # each measured trial's ablation and MLflow params (its configuration, flattened): what
    # ``clsr.study.plan.record_match`` compares with the planned study's
    configs: list[tuple[str | None, dict[str, str]]] = field(default_factory=list)

    def for_ablation(self, name: str) -> UnitCosts:
        return self.by_ablation.get(name, self.overall)


@dataclass(frozen=True)
class Sample:
    """One measured trial: its final metrics, the device it ran on, and its seconds outside the loop."""

    metrics: dict[str, float]
    device: str
    outside_s: float | None


def unit_costs(runs: list[Any]) -> UnitCosts | None:
    """Medians of the per-unit phase costs over finished, never resumed trials (a resumed attempt's
    clock starts at its restart), or None without any."""
    return costs_of(
        [
            Sample(
                r.data.metrics,
                r.data.tags.get("clsr.device", "unknown"),
                (r.info.end_time - r.info.start_time) / 1000 - r.data.metrics["trial_wall_s"]
                if r.info.end_time and "trial_wall_s" in r.data.metrics
                else None,
            )
            for r in runs
            if r.data.tags.get("clsr.status") == "finished"
        ]
    )


def costs_of(samples: list[Sample]) -> UnitCosts | None:
    """Medians of the per-unit phase costs over ``samples`` with phase timings (never resumed)."""
    usable = [
        s
        for s in samples
        if all(m in s.metrics for m in PHASE_METRICS) and "resumed_from_step" not in s.metrics
    ]
    if not usable:
        return None

    def median_of(total: str, count: str | None = None) -> float:
        values = [
            s.metrics.get(total, 0.0) / (s.metrics[count] if count else 1.0)
            for s in usable
            if count is None or s.metrics.get(count, 0) > 0
        ]
        return statistics.median(values) if values else 0.0

    outside = [s.outside_s for s in usable if s.outside_s is not None]
    return UnitCosts(
        setup_s=median_of("trial_setup_s"),
        overhead_s=max(statistics.median(outside), 0.0) if outside else 0.0,
        step_s=median_of("trial_steps_s", "trial_steps_run"),
        dev_eval_s=median_of("trial_dev_eval_s", "trial_dev_evaluations"),
        checkpoint_s=median_of("trial_checkpoint_write_s", "trial_checkpoints_written"),
        test_eval_s=median_of("trial_test_eval_s"),
        trials=len(usable),
        device=Counter(s.device for s in usable).most_common(1)[0][0],
    )


def measure(runs: list[Any], study_name: str) -> Measured:
    """``runs``: the recorded study's child runs."""
    overall = unit_costs(runs)
    if overall is None:
        raise NoMeasurements(
            f"study {study_name!r} has no finished trial with phase timings (trial_setup_s ...): run a "
            f"few short trials of the configuration first, e.g. `platform study run <study.yaml> --set "
            f"trainer.max_steps=20 --set name=<study>-probe`, then `platform study plan <study.yaml> "
            f"--from <study>-probe`"
        )
    by_ablation = {}
    for name in sorted({r.data.tags.get("clsr.ablation") for r in runs} - {None}):
        costs = unit_costs([r for r in runs if r.data.tags.get("clsr.ablation") == name])
        if costs is not None:
            by_ablation[name] = costs
    configs = [
        (r.data.tags.get("clsr.ablation"), dict(r.data.params))
        for r in runs
        if r.data.tags.get("clsr.status") == "finished"
    ]
    return Measured(f"study {study_name!r}", overall, by_ablation, configs)


@dataclass(frozen=True)
class Work:
    """What one trial does: optimiser steps, dev evaluations and checkpoint writes."""

    steps: int
    evaluations: int
    checkpoints: int


def trial_work(trial: TrialConfig, rows: int) -> Work:
    """The loop's own plan for a trial of ``rows`` training rows (one device per rank)."""
    from clsr.config.steps import eval_interval, plan_steps
    from clsr.methods import build_method

    try:
        steps_per_epoch, total = build_method(trial).plan_steps(rows, trial, 1)
    except RuntimeError:  # a method that plans from its prepared rows (SelfCCL's pacing): epochs of rows
        steps_per_epoch, total = plan_steps(rows, trial, 1)
    if total == 0:  # an evaluation-only point scores its starting model once
        return Work(0, 1, 0)
    evaluations = math.ceil(total / eval_interval(trial, steps_per_epoch))  # the last step evaluates too
    return Work(total, evaluations, math.ceil(evaluations / trial.trainer.checkpoint_every))


@dataclass
class TrialPlan:
    ablation: str
    label: str
    stage: int
    work: Work | None  # None: its training rows could not be counted here
    seconds: float
    gpus: float
    basis: str = "measured"  # measured, measured (others), model (the cost model), ? (no work known)


@dataclass
class Projection:
    trials: int
    distinct: int
    plans: list[TrialPlan]
    wall_s: float
    gpu_hours: float
    usd: float | None
    slots: int
    assumptions: list[str]


def count_rows(trial: TrialConfig, cache: dict[str, int | str]) -> int | str:
    """The trial's training rows (read once per data section), or why they could not be read."""
    from clsr.data.training import training_rows
    from clsr.methods import build_method

    key = trial.data.model_dump_json() + str(trial.trainer.seed) + str(sorted(trial.method.items()))
    if key not in cache:
        try:  # the rows the loop trains on (a method may pair the data set's rows into fewer)
            cache[key] = len(build_method(trial).rows_for_training(training_rows(trial), trial))
        except Exception as err:  # noqa: BLE001 - any loader's failure: priced without rows, and said why
            cache[key] = f"{type(err).__name__}: {err}"
    return cache[key]


def trial_seconds(work: Work, costs: UnitCosts, speedup: float) -> float:
    return (
        costs.overhead_s
        + costs.setup_s
        + work.steps * costs.step_s / speedup
        + work.evaluations * costs.dev_eval_s / speedup
        + work.checkpoints * costs.checkpoint_s
        + costs.test_eval_s / speedup
    )


def gpus_per_trial(study: Study) -> float:
    res = study.resources
    return res.gpus_per_worker * max(res.workers_per_trial, 1)


def pack(durations: list[float], slots: int) -> float:
    """Wall time of running ``durations`` on ``slots`` at once, longest first (each next trial goes to
    the slot that frees first, as Tune hands out its slots)."""
    ends = [0.0] * max(slots, 1)
    for duration in sorted(durations, reverse=True):
        heapq.heapreplace(ends, ends[0] + duration)
    return max(ends)


Price = Callable[[str, TrialConfig, Work], tuple[float, str]]  # (ablation, trial, work) -> (s, basis)


def project(
    study: Study,
    measured: Measured | None,
    gpus: int,
    gpu: str,
    speedup: float | None = None,
    usd_per_gpu_hour: float | None = None,
    progress=print,
    grids: dict[str, list[GridPoint]] | None = None,
    resolve: Resolve | None = None,
) -> Projection:
    """Price every distinct trial of ``study`` and pack each stage onto ``gpus`` GPUs of kind ``gpu``:
    by ``measured`` unit costs, or (None) by the FLOPs cost model (``clsr.study.plan.cost_model``).
    ``grids`` (ablation -> its ``grid_points``) and ``resolve`` (``resolve_trial`` of an ablation,
    overrides and seed): the study's documents (``clsr.study.plan.resolve.StudyDocuments``), each trial
    resolved once; by default resolved here."""
    resolve = resolver(study, resolve)
    per_trial_gpus = gpus_per_trial(study)
    price = GPUS[gpu]["usd_per_gpu_hour"] if usd_per_gpu_hour is None else usd_per_gpu_hour
    slots = study.concurrency or 10**6
    if per_trial_gpus > 0:
        slots = min(slots, int(gpus / per_trial_gpus + 1e-9))
    if slots < 1:
        raise ValueError(f"--gpus {gpus}: a trial of this study needs {per_trial_gpus:g} GPUs")
    pricer, assumptions = (
        measured_pricer(study, measured, gpu, speedup) if measured else model_pricer(study, gpu)
    )
    stage_of = {name: n for n, wave in enumerate(stages(study)) for name in wave}
    grid, sampled = priced_trials(study, grids, resolve)
    distinct = merge_identical(study, grid) + sampled
    progress(
        f"pricing {len(distinct)} distinct trials (of {len(grid) + len(sampled)}); reading their training rows ..."
    )
    rows_cache: dict[str, int | str] = {}
    read: dict[str, int] = {}  # training rows per data set, as read here
    plans = []
    for entry in distinct:
        rows = count_rows(entry.config, rows_cache)
        try:
            work = trial_work(entry.config, rows) if isinstance(rows, int) else None
        except ValueError as err:  # fewer rows than a batch, here: priced without them, and said why
            work, rows_cache[f"batch {entry.label}"] = None, str(err)
        if isinstance(rows, int):
            read[entry.config.data.train] = rows
        seconds, basis = pricer(entry.ablation, entry.config, work) if work else (0.0, "?")
        plans.append(
            TrialPlan(
                entry.ablation, entry.label, stage_of[entry.ablation], work, seconds, per_trial_gpus, basis
            )
        )
    wall = sum(
        pack([p.seconds for p in plans if p.stage == n], slots) for n in sorted(set(stage_of.values()))
    )
    gpu_hours = sum(p.seconds * p.gpus for p in plans) / 3600
    assumptions += [
        f"{slots} trials at a time ({gpus} x {gpu}, {per_trial_gpus:g} GPU per trial, concurrency "
        f"{study.concurrency or 'unlimited'}); stages run one after another",
        f"USD {price:.2f} per GPU-hour"
        + ("" if usd_per_gpu_hour is not None else " (assumed; --price to change it)"),
    ]
    assumptions.append(
        "training rows as read here (a data folder's head or sample prices fewer steps than the full set): "
        + (", ".join(f"{name} {rows:,}" for name, rows in sorted(read.items())) or "none")
    )
    unknown = [p for p in plans if p.work is None]
    if unknown:
        assumptions.append(
            f"{len(unknown)} trials priced at 0 s: their training rows could not be read here "
            f"({next(v for v in rows_cache.values() if isinstance(v, str))[:160]})"
        )
    usd = gpu_hours * price if per_trial_gpus > 0 else None
    return Projection(
        len(grid) + len(sampled), len(distinct), plans, wall, gpu_hours, usd, slots, assumptions
    )


def measured_pricer(
    study: Study, measured: Measured, gpu: str, speedup: float | None
) -> tuple[Price, list[str]]:
    """Each trial's work at its ablation's measured unit costs (or the study's overall ones), with the
    steps and evaluations sped up from the measured device to ``gpu``."""
    measured_on_target = gpu.lower() in measured.overall.device.lower()
    if gpus_per_trial(study) == 0:  # the study's trials hold no GPU: they run where they were measured
        speedup = 1.0
    elif speedup is None:
        speedup = 1.0 if measured_on_target else GPUS[gpu]["speedup"]

    def price(ablation: str, trial: TrialConfig, work: Work) -> tuple[float, str]:
        basis = "measured" if ablation in measured.by_ablation else "measured (others)"
        return trial_seconds(work, measured.for_ablation(ablation), speedup), basis

    o = measured.overall
    return price, [
        f"unit costs: medians over {o.trials} finished trials of {measured.source} on {o.device} (per "
        f"ablation where it ran one; 'measured (others)': priced by the other ablations' medians): outside "
        f"the loop {o.overhead_s:.1f} s, set-up {o.setup_s:.1f} s, step {o.step_s:.3f} s, dev evaluation "
        f"{o.dev_eval_s:.1f} s, checkpoint {o.checkpoint_s:.2f} s, test evaluation {o.test_eval_s:.1f} s",
        "the study's trials hold no GPU: projected on the measured device"
        if gpus_per_trial(study) == 0
        else f"steps and evaluations {speedup:g}x faster on {gpu} than where they were measured"
        + (" (measured on it)" if measured_on_target else " (assumed; --gpu-speedup to change it)"),
        "set-up, the time outside the loop and checkpoint writes as measured (start-up, disk and network "
        "do not speed up); not counted: the study's own start (Ray, shared inputs, about a minute)",
    ]


def model_pricer(study: Study, gpu: str) -> tuple[Price, list[str]]:
    """Each trial by the FLOPs cost model on ``gpu`` (or the CPUs, for trials that hold no GPU)."""
    from clsr.study.plan import cost_model as cm

    share = gpus_per_trial(study)
    cpus = study.resources.cpus_per_worker * max(study.resources.workers_per_trial, 1)
    flops = cm.device_flops(gpu, share, cpus)
    sizes: dict[str, str] = {}

    def price(ablation: str, trial: TrialConfig, work: Work) -> tuple[float, str]:
        size = cm.model_size(trial)
        sizes[getattr(trial.model, "name", None) or trial.model.vectors] = f"{size.dense:,} ({size.source})"
        lines[2] = "parameters N: " + "; ".join(f"{k} {v}" for k, v in sorted(sizes.items()))
        cost = cm.trial_cost(trial, work.steps, work.evaluations, work.checkpoints, flops, cpus)
        return cost.total_s, "model"

    device = f"{share:g} x {gpu}" if share > 0 else f"{cpus:g} CPU core(s)"
    kind = "cpu" if share == 0 else gpu
    measured = "measured" if cm.MEASURED_ON[kind] else "extrapolated, not measured"
    lines = [
        "no recorded trial: every trial priced by the cost model ('model'; clsr/study/plan/cost_model.py): "
        "6 x N x training tokens + 2 x N x evaluation tokens (N: non-embedding parameters), divided by "
        f"{flops:.3g} FLOP/s per trial ({device}; the device's figure {measured} by `platform bench train`"
        + (
            f", scaled from {cm.CPU_CORES_MEASURED} cores"
            if share == 0 and cpus != cm.CPU_CORES_MEASURED
            else ""
        )
        + ")",
        f"extrapolated: {cm.TOKENS_PER_SENTENCE} tokens a sentence (measured on NLI at length 32) capped "
        f"by max_seq_length; set-up {cm.SETUP_S} s and checkpoint writes at "
        f"{cm.CHECKPOINT_BYTES_PER_S / 1e6:.0f} MB/s as measured on GPUs; TextCNN steps at "
        f"{cm.EFFICIENCY['textcnn']:g} of the throughput (measured: the GCLSR probe); transfer tasks "
        f"{cm.TRANSFER_S / 60:.0f} min on {cm.CPU_CORES_MEASURED} CPUs (measured); not priced: FAQ "
        "retrieval, RCL's regulators, SelfCCL's scoring pass, the study's own start",
        "parameters N: none priced",  # filled in as trials are priced
        "a measured projection replaces all of this: --probe here, or --from a run of this configuration",
    ]
    return price, lines


def priced_trials(
    study: Study, grids: dict[str, list[GridPoint]] | None, resolve: Resolve
) -> tuple[list[TrialSpec], list[TrialSpec]]:
    """The grid trials, each resolved, and the trials a search or a confirmation will run, each
    standing as its ablation's base."""
    grid, sampled = [], []
    for name, ablation in study.ablations.items():
        seeds = study.seeds_of(name)
        # a sampled ablation's configurations, and those a confirm ablation reruns: its base stands for each
        samples = study.search.num_samples if ablation.space else 0
        samples = ablation.confirm.top_k if ablation.confirm is not None else samples
        base = [TrialSpec(name, "sample", {}, {}, s, resolve(name, {}, s)) for s in seeds] if samples else []
        sampled += base * samples
        points = [] if ablation.space else grid_points(ablation) if grids is None else grids[name]
        grid += [
            TrialSpec(name, p.label, p.overrides, p.paper, s, resolve(name, p.overrides, s))
            for p in points
            for s in seeds
        ]
    return grid, sampled


def render(projection: Projection, gpu: str, gpus: int) -> str:
    """Per ablation: its distinct trials, steps and minutes per trial; then the study's totals."""
    by_ablation: dict[str, list[TrialPlan]] = {}
    for plan in projection.plans:
        by_ablation.setdefault(plan.ablation, []).append(plan)
    header = f"{'ablation':<24} {'distinct':>8} {'steps/trial':>12} {'min/trial':>10} {'GPU-h':>8}  basis"
    lines = [header, "-" * len(header)]
    for name, plans in by_ablation.items():
        steps = [p.work.steps for p in plans if p.work]
        minutes = statistics.mean(p.seconds for p in plans) / 60
        gpu_h = sum(p.seconds * p.gpus for p in plans) / 3600
        shown = f"{statistics.median(steps):,.0f}" if steps else "?"
        basis = ", ".join(dict.fromkeys(p.basis for p in plans))
        lines.append(f"{name:<24} {len(plans):>8} {shown:>12} {minutes:>10.1f} {gpu_h:>8.2f}  {basis}")
    cost = f", about USD {projection.usd:,.0f}" if projection.usd is not None else ""
    lines += [
        "",
        f"{projection.trials} trials, {projection.distinct} distinct; on {gpus} x {gpu}: about "
        f"{projection.wall_s / 60:,.0f} min wall, {projection.gpu_hours:,.1f} GPU-hours{cost}",
        "assumptions:",
        *(f"  - {a}" for a in projection.assumptions),
    ]
    return "\n".join(lines)
