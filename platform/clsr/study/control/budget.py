"""A study's ``budget:`` while it runs: what its trials have spent (read from the record), what the
next trial will cost (the median of the trials that finished, else ``study plan``'s projection), and
whether launching it would pass a limit.

The GPU-hours count every child run of the study (each run's time open x the GPUs a trial holds), over
every driver of it; the wall time is this driver's. A trial's projected seconds are the median run time
of the study's finished trials; before any has finished, the mean per-trial seconds of
``clsr.study.plan.projection.project`` (the FLOPs cost model on one H100, or the trial's CPUs).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from clsr.study.spec.schema import Study
from clsr.tracking.tags import EARLIER_S_TAG, OPENED_TAG, SUPERSEDED_TAG

PRIOR_GPU = "h100"  # the device `study plan` prices a GPU trial on before any trial has finished
COUNTED = ("finished", "stopped", "failed", "timed_out", "interrupted")  # statuses of trials that ran


@dataclass(frozen=True)
class TrialTime:
    """One trial run of the record: its status (clsr.status, ``running`` while open) and seconds open."""

    status: str
    seconds: float
    superseded: bool = False  # replaced by an edited resume: its time was spent, its failure is not one


@dataclass(frozen=True)
class Spent:
    """What the study has used when the account is taken."""

    elapsed_s: float  # this driver's wall time
    gpu_hours: float  # every trial run's time open x GPUs per trial
    failed: int  # trial runs closed failed (a failure Tune retries counts until the retry reopens it)
    finished_s: tuple[float, ...]  # run times of the trials that finished


def spent(trials: list[TrialTime], elapsed_s: float, gpus_per_trial: float) -> Spent:
    ran = [t for t in trials if t.status in COUNTED or t.status == "running"]
    return Spent(
        elapsed_s,
        sum(t.seconds for t in ran) * gpus_per_trial / 3600,
        sum(t.status == "failed" and not t.superseded for t in trials),
        tuple(t.seconds for t in trials if t.status == "finished"),
    )


def next_trial_s(used: Spent, prior_s: float) -> float:
    """The next trial's projected seconds: the median finished trial's, else the plan's ``prior_s``."""
    return statistics.median(used.finished_s) if used.finished_s else prior_s


def over_budget(study: Study, used: Spent, next_s: float, gpus_per_trial: float) -> str | None:
    """Why no further trial may be launched (one line), or None while the budget allows one."""
    budget = study.budget
    if budget.max_failed_trials is not None and used.failed >= budget.max_failed_trials:
        return f"budget.max_failed_trials {budget.max_failed_trials} reached: {used.failed} trial(s) failed"
    next_h = next_s * gpus_per_trial / 3600
    if budget.gpu_hours is not None and gpus_per_trial > 0 and used.gpu_hours + next_h > budget.gpu_hours:
        return (
            f"budget.gpu_hours {budget.gpu_hours:g}: {used.gpu_hours:.2f} GPU-hours spent + {next_h:.2f} "
            f"projected for the next trial would pass it"
        )
    wall_s = budget.wall_s
    if wall_s is not None and used.elapsed_s + next_s > wall_s:
        return (
            f"budget.wall {budget.wall}: {used.elapsed_s / 60:.1f} min run + {next_s / 60:.1f} min projected "
            f"for the next trial would pass it"
        )
    return None


def trial_times(runs: list, now_ms: int) -> list[TrialTime]:
    """The record's child runs as ``TrialTime`` (an open run counts up to ``now_ms``). A retried or
    resumed trial reopens its run, which keeps its first start: its seconds are its earlier attempts'
    (``EARLIER_S_TAG``) plus the last one's, measured by the trial itself (``trial_wall_s``) once it
    ended, else from its last opening (``OPENED_TAG``). A run with neither (a record written before
    them) counts from its run's start."""
    times = []
    for run in runs:
        info, tags = run.info, run.data.tags
        status = "running" if info.status == "RUNNING" else tags.get("clsr.status", "")
        end = info.end_time if info.end_time and status != "running" else now_ms
        earlier = float(tags.get(EARLIER_S_TAG, 0))
        measured = run.data.metrics.get("trial_wall_s")
        if status != "running" and measured is not None:
            seconds = earlier + measured
        elif OPENED_TAG in tags:
            seconds = earlier + max(0, end - int(tags[OPENED_TAG])) / 1000
        else:
            seconds = max(0, end - (info.start_time or end)) / 1000
        times.append(TrialTime(status, seconds, SUPERSEDED_TAG in tags))
    return times


def prior_seconds(study: Study) -> tuple[float, str]:
    """The mean per-trial seconds ``study plan`` projects with no record (and how it was had); 0 when
    it cannot price the study here (a missing data set): the budget then waits for measured trials."""
    from clsr.study.plan.projection import gpus_per_trial, project

    gpus = max(1, int(gpus_per_trial(study) + 0.999))
    try:
        projection = project(study, None, gpus, PRIOR_GPU, progress=lambda _line: None)
    except Exception as err:  # noqa: BLE001 - the budget then goes by measured trials only
        return 0.0, f"not projected ({type(err).__name__}: {str(err)[:200]})"
    priced = [p.seconds for p in projection.plans if p.work is not None]
    if not priced:
        return 0.0, "not projected (no trial could be priced here)"
    mean_s = statistics.mean(priced)
    return mean_s, f"{mean_s / 60:.1f} min a trial (study plan's cost model)"
