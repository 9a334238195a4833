"""What a report shows, before it is drawn: per ablation its rows (the planned points in study order with
their seeds, paper numbers and trials; ``average_over`` rows as the mean of their folds), each row's
cells over seeds, its verdicts against the paper and its paired test against the reference row (Holm
over the ablation), the ablation's effects and Pareto front, and the compute it spent; rows that are
one configuration in several ablations marked; and the study's report of all of them, with a banner
when its numbers cannot be set beside the papers'.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from mlflow.tracking import MlflowClient

from clsr.data.faq import FAQ_TASKS
from clsr.data.sts import STS_TASKS
from clsr.data.transfer import TRANSFER_TASKS
from clsr.study.analyse.averages import Printed, checked
from clsr.study.analyse.drift import mixed
from clsr.study.analyse.runs import Trial, load_trials, pick_trials
from clsr.study.plan.point import GridPoint
from clsr.study.plan.resolve import (
    Resolve,
    StudyDocuments,
    config_identity,
    find_point,
    grid_points,
    report_points,
)
from clsr.study.spec.ablation import Ablation
from clsr.study.spec.schema import Study
from clsr.study.stats.effects import Effects, coerce, grid_effects, sampled_effects
from clsr.study.stats.pareto import ParetoFront, near_front, pareto_front
from clsr.study.stats.seeds import Paired, Stats, holm, paired_test, seed_stats
from clsr.study.stats.verdict import Verdict, verdict
from clsr.tracking.record_reader import prefixed_floats
from clsr.tracking.secrets import mask_uri
from clsr.tracking.tags import PRUNED_TAG

COST_METRICS = ("trial_wall_s", "trial_cpu_s", "trial_gpu_s")
FAMILIES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("STS test, Spearman x 100", (*(f"test_{t}" for t in STS_TASKS), "test_sts_avg", "test_sts12_15_avg")),
    (
        "SentEval transfer test, accuracy x 100",
        (*(f"test_{t}" for t in TRANSFER_TASKS), "test_mrpc_f1", "test_transfer_avg"),
    ),
    (
        "FAQ retrieval test, x 100",
        tuple(f"test_{s}_{k}" for s in FAQ_TASKS for k in ("top1", "top3", "top5", "map")),
    ),
)
KNOWN_TESTS = tuple(m for _, family in FAMILIES for m in family)


@dataclass
class Row:
    """One point of an ablation: its planned seeds, the trials found, and the cells built from them."""

    label: str
    overrides: dict[str, Any]
    paper: dict[str, float]
    seeds: list[int]
    trials: dict[int | None, Trial] = field(default_factory=dict)
    in_study: bool = True
    paper_choice: bool = False
    reference: bool = False
    stats: dict[str, Stats] = field(default_factory=dict)
    test: Paired | None = None  # None for the reference row itself
    config: str | None = None  # hash of the resolved trial config (seed aside); None: not planned
    planned_eval_only: bool = False  # the point sets trainer.max_steps: 0
    same_as: list[str] = field(default_factory=list)  # "<ablation>[<label>]" of identical rows elsewhere
    folds: list[Row] = field(default_factory=list)  # average_over: the points averaged into this row
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # metric -> against its paper number
    printed: dict[str, Printed] = field(default_factory=dict)  # averages the paper prints off its row's mean

    @property
    def eval_only(self) -> bool:
        """Trains nothing and scores its starting model: planned so, or a trial tagged so."""
        return self.planned_eval_only or any(t.eval_only for t in self.trials.values())

    @property
    def display_label(self) -> str:
        pruned = f" (pruned after {len(self.trials)} seeds)" if self.pruned else ""
        return self.label + (" (evaluation only)" if self.eval_only else "") + pruned

    @property
    def pruned(self) -> str | None:
        """Why seed pruning stopped this sampled configuration (its seeds' ``clsr.pruned`` tag), or None."""
        return next((t.tags[PRUNED_TAG] for t in self.trials.values() if PRUNED_TAG in t.tags), None)

    def values(self, metric: str) -> dict[int | None, float]:
        """Seed -> value of the finished trials that logged ``metric``."""
        return {s: t.metrics[metric] for s, t in self.trials.items() if t.ok and metric in t.metrics}

    def paper_value(self, metric: str) -> float | None:
        """The published number of ``metric``; a ``best_dev_*`` column shows a ``dev_*`` paper number
        (papers report the dev score of the checkpoint they kept)."""
        if metric in self.paper:
            return self.paper[metric]
        return self.paper.get(metric.removeprefix("best_")) if metric.startswith("best_") else None

    def missing(self) -> list[int]:
        """Planned seeds with no run yet, or lost: not those seed pruning decided never to run."""
        return [] if self.pruned else [s for s in self.seeds if s not in self.trials]

    def skipped(self) -> list[int]:
        """Planned seeds seed pruning never ran: a pruned configuration's seeds without a run."""
        return [s for s in self.seeds if s not in self.trials] if self.pruned else []

    def runs(self) -> list[Trial]:
        """The MLflow runs behind the row: its trials, or its folds' (an averaged row's are not runs)."""
        return (
            [t for r in self.folds for t in r.trials.values()] if self.folds else list(self.trials.values())
        )

    def trials_text(self) -> str:
        """``2/3 ok, 1 failed``: every planned trial is accounted for."""
        planned = len(set(self.seeds) | set(self.trials))
        ok = sum(t.ok for t in self.trials.values())
        others = Counter(t.status for t in self.trials.values() if not t.ok)
        parts = [f"{ok}/{planned} ok", *(f"{n} {status}" for status, n in sorted(others.items()))]
        if self.missing():
            parts.append(f"{len(self.missing())} missing")
        if self.skipped():
            parts.append(f"{len(self.skipped())} not run (pruned)")
        return ", ".join(parts)

    def marks(self) -> str:
        return ", ".join(
            m for m, on in (("paper choice", self.paper_choice), ("reference", self.reference)) if on
        )

    def mark_lines(self) -> list[str]:
        """The marks, then one ``same as <ablation>[<row>]`` line per identical row of another ablation."""
        return [m for m in [self.marks()] if m] + [f"same as {other}" for other in self.same_as]


@dataclass
class Cost:
    """Compute spent: sums of the trials' cost metrics (runs without them are counted, not summed)."""

    wall_s: float = 0.0
    cpu_s: float = 0.0
    gpu_s: float = 0.0
    runs: int = 0
    measured: int = 0
    devices: Counter = field(default_factory=Counter)
    busy_gpu_s: float = 0.0  # Σ GPU seconds × mean utilisation, over trials that sampled their GPUs
    sampled_gpu_s: float = 0.0

    @property
    def gpu_utilization(self) -> float | None:
        """Mean GPU utilisation (%) weighted by GPU seconds; None when no trial sampled its GPUs."""
        return 100 * self.busy_gpu_s / self.sampled_gpu_s if self.sampled_gpu_s else None

    def add(self, trial: Trial) -> None:
        self.runs += 1
        if any(m in trial.metrics for m in COST_METRICS):
            self.measured += 1
            self.wall_s += trial.metrics.get("trial_wall_s", 0.0)
            self.cpu_s += trial.metrics.get("trial_cpu_s", 0.0)
            self.gpu_s += trial.metrics.get("trial_gpu_s", 0.0)
        if "trial_gpu_utilization_mean" in trial.metrics and trial.metrics.get("trial_gpu_s"):
            self.sampled_gpu_s += trial.metrics["trial_gpu_s"]
            self.busy_gpu_s += (
                trial.metrics["trial_gpu_s"] * trial.metrics["trial_gpu_utilization_mean"] / 100
            )
        if "clsr.device" in trial.tags:
            self.devices[trial.tags["clsr.device"]] += 1

    def merge(self, other: Cost) -> None:
        self.wall_s, self.cpu_s, self.gpu_s = (
            self.wall_s + other.wall_s,
            self.cpu_s + other.cpu_s,
            self.gpu_s + other.gpu_s,
        )
        self.runs, self.measured = self.runs + other.runs, self.measured + other.measured
        self.devices.update(other.devices)
        self.busy_gpu_s += other.busy_gpu_s
        self.sampled_gpu_s += other.sampled_gpu_s


@dataclass
class AblationReport:
    """One paper table: rows (points), metric columns, the main metric and the reference row."""

    name: str
    spec: Ablation
    main_metric: str
    metrics: list[str]
    rows: list[Row]
    cost: Cost
    notes: list[str] = field(default_factory=list)
    tolerance: float = 0.5  # the table's tolerance, else the study's report.tolerance: the verdicts' margin
    tolerance_source: str | None = None  # where the table's tolerance comes from (None: the study's)
    effects: Effects | None = None  # ANOVA of a grid over 2+ keys, or a sampled ablation's importance
    pareto: ParetoFront | None = None  # several objectives: the configurations' (points') front

    @property
    def reference(self) -> Row | None:
        return next((r for r in self.rows if r.reference), None)

    @property
    def trials(self) -> list[Trial]:
        """Every run behind the rows (the folds' runs of an averaged row)."""
        return [t for r in self.rows for t in r.runs()]


def plan_rows(study: Study, name: str, trials: list[Trial]) -> list[Row]:
    """The points in study order with their planned seeds and paper numbers (from the study file), and
    the trials found for them; rows of runs the file no longer plans come last (sampled ablations: one
    row per sampled point, in running order)."""
    spec = study.ablations[name]
    points = [] if spec.space else grid_points(spec)
    seeds = [] if spec.space else study.seeds_of(name)
    rows = {p.label: Row(p.label, p.overrides, dict(p.paper), list(seeds)) for p in points}
    resolve = StudyDocuments(study).config  # each point resolved once
    for row in rows.values():
        row.config, row.planned_eval_only = planned_config(resolve, name, row.overrides)
    for (label, seed), trial in sorted(pick_trials(trials).items(), key=lambda kv: kv[1].start_time):
        if label not in rows:  # a confirm ablation's best upstream configurations: its planned seeds
            rows[label] = Row(
                label, {}, {}, list(seeds) if spec.confirm else [], in_study=bool(spec.space or spec.confirm)
            )
        rows[label].trials[seed] = trial
    for row in rows.values():
        row.paper = row.paper or paper_from_tags(row.trials.values())
        if study.adaptive_of(name) is not None:  # adaptive: the seeds added to it are planned too
            row.seeds = sorted(set(row.seeds) | {s for s in row.trials if s is not None})
    return average_rows(spec, list(rows.values())) if spec.average_over else list(rows.values())


def average_rows(spec: Ablation, rows: list[Row]) -> list[Row]:
    """``average_over``: one row per report point, each seed's trial the mean of its folds' trials.

    A seed counts only when every fold of it finished (a k-fold estimate with a fold missing is another
    number); a failed fold makes the seed failed, a fold not run yet makes it missing. Metrics are those
    every fold logged. Rows of runs the study no longer plans stay as they are."""
    by_label = {r.label: r for r in rows}
    out = []
    for point in report_points(spec):
        folds = [by_label.pop(label) for label in point.members if label in by_label]
        row = Row(point.label, point.overrides, dict(point.paper), list(folds[0].seeds), folds=folds)
        row.paper = row.paper or folds[0].paper
        row.planned_eval_only = all(f.planned_eval_only for f in folds)
        for seed in sorted({s for f in folds for s in f.trials}, key=lambda s: (s is None, s or 0)):
            merged = fold_mean(row.label, seed, [f.trials.get(seed) for f in folds])
            if merged is not None:
                row.trials[seed] = merged
        out.append(row)
    return out + list(by_label.values())


def fold_mean(label: str, seed: int | None, trials: list[Trial | None]) -> Trial | None:
    """One seed of an averaged row: the folds' mean when all finished, the first failure when one
    failed, None (missing) when a fold has no run yet."""
    failed = [t for t in trials if t is not None and not t.ok]
    if failed:
        return replace(failed[0], point=label, metrics={})
    if any(t is None for t in trials):
        return None
    done = [t for t in trials if t is not None]
    shared = set.intersection(*(set(t.metrics) for t in done))
    metrics = {m: float(np.mean([t.metrics[m] for t in done])) for m in shared}
    return replace(
        done[0], run_id="", point=label, metrics=metrics, start_time=min(t.start_time for t in done)
    )


def planned_config(resolve: Resolve, name: str, overrides: dict[str, Any]) -> tuple[str | None, bool]:
    """The hash of the point's validated trial config at a fixed seed (pydantic fills defaults and
    coerces types, so a point that writes out a default equals one that inherits it), and whether it
    trains nothing (``trainer.max_steps: 0``); (None, False) when the point no longer resolves (a
    ``--name`` report of a study recorded by an older clsr). ``resolve``: a ``StudyDocuments``'
    (``plan_rows``), so each point is resolved once."""
    try:
        config = resolve(name, overrides, 0)
    except ValueError:  # pydantic's ValidationError included
        return None, False
    return config_identity(config), config.trainer.max_steps == 0


def mark_duplicates(ablations: list[AblationReport]) -> None:
    """``same_as`` on every row whose resolved config a row of another ablation shares."""
    by_config: dict[str, list[tuple[str, Row]]] = {}
    for ab in ablations:
        for row in ab.rows:
            if row.config is not None:
                by_config.setdefault(row.config, []).append((ab.name, row))
    for group in by_config.values():
        for name, row in group:
            row.same_as = [f"{other}[{r.label}]" for other, r in group if other != name]


def paper_from_tags(trials: Iterable[Trial]) -> dict[str, float]:
    """The fallback when the study file gives none: the ``clsr.paper.<metric>`` tags the trials carry."""
    paper: dict[str, float] = {}
    for trial in trials:
        for name, value in prefixed_floats(trial.tags, "clsr.paper.", trial.run_id).items():
            paper.setdefault(name, value)
    return paper


def main_metric(spec: Ablation, study: Study, present: set[str]) -> str:
    """The metric the paper's numbers are, if measured (``dev_*`` as its best-checkpoint ``best_dev_*``),
    else the STS test average, else the study's selection metric."""
    pm = spec.paper_metric
    candidates = [f"best_{pm}", pm] if pm.startswith("dev_") else [pm]
    return next((m for m in [*candidates, "test_sts_avg"] if m in present), study.metric)


def metric_columns(present: set[str], main: str) -> list[str]:
    """Test metrics in the papers' order (STS, then transfer, then FAQ), the main metric first when it
    is not a test metric (a dev score)."""
    known = [m for m in KNOWN_TESTS if m in present]
    others = sorted(m for m in present if m.startswith("test_") and m not in KNOWN_TESTS)
    columns = known + others
    return columns if main in columns else [main, *columns]


def ablation_report(study: Study, name: str, trials: list[Trial]) -> AblationReport:
    """Rows, cells and tests of one ablation; ``trials`` are all its child runs (cost counts each)."""
    spec = study.ablations[name]
    rows = plan_rows(study, name, trials)
    present = {k for r in rows for t in r.trials.values() if t.ok for k in t.metrics}
    main = main_metric(spec, study, present)
    cost = Cost()
    for trial in trials:
        cost.add(trial)
    tolerance = spec.tolerance.points if spec.tolerance else study.report.tolerance
    report = AblationReport(name, spec, main, metric_columns(present, main), rows, cost, tolerance=tolerance)
    report.tolerance_source = spec.tolerance.source if spec.tolerance else None
    mark_rows(report)
    for row in rows:  # a printed average off its row's mean: judged against the mean, both shown
        row.paper, row.printed = checked(row.paper)
        report.notes += [p.note(row.label) for p in row.printed.values()]
    for row in rows:
        row.stats = {m: seed_stats(list(row.values(m).values())) for m in report.metrics}
        row.verdicts = verdicts(row, report.metrics, tolerance)
    report.notes += verdict_drift(rows)
    reference = report.reference
    for row in rows:
        if reference is not None and row is not reference:
            row.test = paired_test(row.values(main), reference.values(main))
    tested = [r for r in rows if r.test is not None]
    for row, p in zip(tested, holm([r.test.p_value for r in tested]), strict=True):
        row.test = replace(row.test, p_adjusted=p)
    report.effects = ablation_effects(report)
    report.pareto = ablation_pareto(report, study.objectives)
    return report


def verdict_drift(rows: list[Row]) -> list[str]:
    """A line per row whose verdicts pool trials that ran in several environments (``clsr.study.analyse.
    drift``): the verdict says so."""
    lines = []
    for row in rows:
        finished = [t for t in row.runs() if t.ok]
        if row.verdicts and (several := mixed(finished)):
            lines.append(f"{row.label}: its verdict pools trials that ran in {several}")
    return lines


def ablation_pareto(ab: AblationReport, objectives: list[tuple[str, str]]) -> ParetoFront | None:
    """An ablation of a study on several objectives (a sampled one's configurations, a grid's points):
    each one's mean over its seeds of every objective, Optuna's Pareto front of them and those near it
    (``clsr.study.stats.pareto``)."""
    if len(objectives) < 2:
        return None
    values, seeds, intervals = {}, {}, {}
    for row in ab.rows:
        per_metric = [row.values(m) for m, _ in objectives]
        finished = sorted(set.intersection(*(set(v) for v in per_metric)), key=str)  # every objective's
        if finished:
            cells = [seed_stats([v[s] for s in finished]) for v in per_metric]
            values[row.label] = [c.mean for c in cells]
            intervals[row.label] = [(c.ci_low, c.ci_high) for c in cells]
            seeds[row.label] = len(finished)
    front = pareto_front(values, [mode for _, mode in objectives]) if values else []
    return ParetoFront(list(objectives), values, seeds, front, near_front(intervals, front))


def ablation_effects(ab: AblationReport) -> Effects:
    """The effects of the ablated keys on the main metric (``clsr.study.stats.effects``): an ANOVA over a
    grid's rows with seeds as replicates, Optuna's importance over a sampled ablation's trials."""
    m, space = ab.main_metric, ab.spec.space
    if space:
        sampled = [
            ({k: coerce(space[k], t.params[k]) for k in space}, t.metrics[m])
            for r in ab.rows
            for t in r.trials.values()
            if t.ok and m in t.metrics and all(k in t.params for k in space)
        ]
        return sampled_effects(space, sampled)
    cells = [(r.overrides, list(r.values(m).values())) for r in ab.rows if r.in_study and r.values(m)]
    return grid_effects(cells)


def verdicts(row: Row, metrics: list[str], tolerance: float) -> dict[str, Verdict]:
    """The reproduction verdict of every metric with a paper number and a finished seed
    (``clsr.study.stats.verdict``)."""
    out = {}
    for metric in metrics:
        paper, values = row.paper_value(metric), list(row.values(metric).values())
        if paper is not None and values:
            out[metric] = verdict(values, paper, tolerance)
    return out


def mark_rows(report: AblationReport) -> None:
    """The paper's choice, and the reference: ``reference:``, else the paper's choice, else row one."""
    spec, rows = report.spec, report.rows
    points = [GridPoint(r.label, r.overrides, {}) for r in rows]
    choice = find_point(points, spec.paper_choice)
    if choice is not None:
        rows[points.index(choice)].paper_choice = True
    elif spec.paper_choice:
        report.notes.append(f"paper_choice {spec.paper_choice!r} names no row")
    reference = find_point(points, spec.reference) or choice or (points[0] if points else None)
    if reference is not None:
        rows[points.index(reference)].reference = True


STOPPED_BY = {  # a stopped study's reason (``StudyOutcome.stopped_by``), as its report says it
    "SIGINT": "an interrupt (SIGINT)",
    "SIGTERM": "SIGTERM",
    "study_timeout": "its time limit",
    "budget": "its budget",
    "stop_request": "`platform study stop`",
    "error": "an error",
}


@dataclass(frozen=True)
class Partial:
    """A report of a study that has not run all it planned: ``finished`` of the ``planned`` trials ended
    finished so far. Built while its study runs (``clsr.study.analyse.live``; ``every``: how often it is
    refreshed, the study file's), or as it ended without running them all (``stopped_by``: why)."""

    finished: int
    planned: int
    every: str
    stopped_by: str | None = None

    @property
    def mark(self) -> str:
        state = "partial" if self.stopped_by is None else "stopped"
        return f"{state}: {self.finished} of {self.planned} trials"

    @property
    def detail(self) -> str:
        settled = (
            "Verdicts of rows whose planned seeds have not all ended are provisional, as are the tests "
            "against the reference row and the effects."
        )
        if self.stopped_by is not None:
            why = STOPPED_BY.get(self.stopped_by, self.stopped_by)
            return (
                f"finished; the study was stopped by {why} before it ran all it planned, and "
                f"`platform study resume` runs the rest. {settled}"
            )
        return (
            f"finished; the study is running and this report is rebuilt every {self.every} and at each "
            f"wave's end. {settled}"
        )

    @property
    def line(self) -> str:
        return f"{self.mark} {self.detail}"


@dataclass
class StudyReport:
    """Everything one report shows, before it is rendered."""

    study: Study
    tracking_uri: str
    parent_run_id: str
    ablations: list[AblationReport]
    cost: Cost
    notes: list[str]
    wall_s: float | None = None  # the parent run's start to end: the study's own wall time
    created: str = field(default_factory=lambda: time.strftime("%Y-%m-%d %H:%M:%S %Z"))
    partial: Partial | None = None  # built mid-study (mark_partial); None: the study's report as it ended


def skipped_by_pruning(report: StudyReport) -> int:
    """Planned trials seed pruning decided never to run, found so far: what a count of the study's
    planned trials (``clsr.study.analyse.live.planned_trials``) holds but no run will ever fill. A
    sampled row lists only the seeds it ran, so the ablation's seeds are the plan here."""
    return sum(
        len(set(report.study.seeds_of(ab.name)) - set(row.trials))
        for ab in report.ablations
        for row in ab.rows
        if row.pruned
    )


def mark_partial(report: StudyReport, planned: int, every: str) -> None:
    """The report as a partial one: the trials finished of those planned (less the seeds seed pruning
    skipped; at least as many as found, an adaptive round's or a confirmation's seeds counting), and the verdicts of every row still waiting
    for a seed (an adaptive ablation's rows always: a round may add one) marked provisional."""
    finished = 0
    for ab in report.ablations:
        adaptive = report.study.adaptive_of(ab.name) is not None
        for row in ab.rows:
            runs = row.runs()
            finished += sum(t.ok for t in runs)
            waiting = adaptive or row.missing() or any(t.status == "running" for t in runs)
            if waiting:
                row.verdicts = {m: replace(v, provisional=True) for m, v in row.verdicts.items()}
    seen = sum(len(row.runs()) for ab in report.ablations for row in ab.rows)
    report.partial = Partial(finished, max(planned - skipped_by_pruning(report), seen), every)


def build_report(study: Study, client: MlflowClient, parent_run_id: str, uri: str) -> StudyReport:
    """All ablations of the study from the parent run's children."""
    trials = load_trials(client, parent_run_id)
    ablations = [
        ablation_report(study, name, [t for t in trials if t.ablation == name]) for name in study.ablations
    ]
    mark_duplicates(ablations)
    total = Cost()  # a run that stood for points of several ablations is counted in each, once here
    for trial in {t.run_id: t for t in trials if t.ablation in study.ablations}.values():
        total.add(trial)
    unknown = sorted({t.ablation for t in trials} - set(study.ablations))
    notes = not_comparable(study)
    notes += [f"runs of ablations the study file does not have (not shown): {unknown}"] if unknown else []
    parent = client.get_run(parent_run_id).info
    wall_s = (parent.end_time - parent.start_time) / 1000 if parent.end_time and parent.start_time else None
    # the report is written to files and logged as artifacts: the store's address without credentials
    return StudyReport(study, mask_uri(uri), parent_run_id, ablations, total, notes, wall_s)


CAPS = ("data.max_rows", "eval.sts_max_pairs", "eval.transfer_max_examples", "eval.faq_max_queries")


def not_comparable(study: Study) -> list[str]:
    """A banner when the rows cannot be set beside the papers' numbers: a smoke run, a subsampled
    training set, capped evaluation sets (in the base, or in an ablation's grid)."""
    reasons = ["a --smoke run"] if study.name.endswith("-smoke") else []
    for dotted in CAPS:
        section, key = dotted.split(".")
        if (study.base.get(section) or {}).get(key) is not None or any(
            dotted in ab.grid for ab in study.ablations.values()
        ):
            reasons.append(f"{dotted} set")
    if not reasons:
        return []
    return [
        f"NOT COMPARABLE WITH THE PAPERS ({'; '.join(reasons)}): the paper, ours − paper and verdict "
        f"columns are for orientation only"
    ]
