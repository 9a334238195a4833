"""Study reports: the papers' tables rebuilt from a study's MLflow runs.

``platform study report <study.yaml>`` reads the child runs of the study's latest parent run and, per
ablation, puts each point's mean over seeds (std, Student-t 95 % CI, n) beside the number the paper
published with a reproduction verdict (an equivalence test within ``report.tolerance``, see
``clsr.study.stats.verdict``), tests every point against a reference point with a paired t-test over the
seeds both ran, shows every planned trial that did not finish instead of averaging it away, and
says which ablated keys matter (``clsr.study.stats.effects``: an ANOVA with partial eta² for grids over two
or more keys, Optuna's parameter importance for sampled ablations).

One ablation tests many rows against one reference, so its p-values are adjusted for multiple
comparisons with Holm's step-down method (Holm 1979, "A simple sequentially rejective multiple test
procedure"): the family is the rows of one ablation that have a p-value on the main metric. Holm, not
Benjamini-Hochberg, because each row's verdict ("differs from the paper's configuration") is read on
its own, which asks for the family-wise error to be controlled, not the share of false discoveries;
Holm holds under any dependence between the tests (they share the reference's seeds), and it is
uniformly more powerful than Bonferroni. SciPy has no Holm, so it is the few lines of ``holm``.

Two rows of different ablations can be one trial configuration (SupMPN's reference, P5xQ5 and
tau 0.05 all resolve to the paper's defaults): a study runs such trials once, and the run appears in each
row (``clsr.also``); each such row says ``same as <ablation>[<row>]``, so a reader sees that they are one
run, not independent replications. A row whose trials only scored
their starting model (``trainer.max_steps: 0``, tag ``clsr.eval_only``) is marked evaluation only. The same tables go to
the terminal, Markdown, CSV, JSON and a self-contained HTML page, with plots; the files are also logged on
the parent run under ``report/``, so the report travels with the runs it was built from. The Markdown,
HTML and CSV tables are written by pandas (``to_markdown``, ``Styler.to_html``, ``to_csv``); only the
terminal table is drawn here, because pandas' ``to_string`` cannot hold a cell of several lines and
tabulate's plain layouts do not rule between multi-line rows.
"""

from __future__ import annotations

import base64
import html
import json
import math
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from mlflow.tracking import MlflowClient
from pydantic import ValidationError
from scipy import stats as sps

from clsr.data.faq import FAQ_TASKS
from clsr.data.sts import STS_TASKS
from clsr.data.transfer import TRANSFER_TASKS
from clsr.study.plan.resolve import (
    Resolve,
    StudyDocuments,
    config_identity,
    find_point,
    grid_points,
    report_points,
)
from clsr.study.spec.schema import Ablation, Study
from clsr.study.spec.yaml_safe import YAMLSafetyError, read_yaml_file
from clsr.study.stats.effects import Effects, coerce, grid_effects, sampled_effects
from clsr.study.stats.pareto import ParetoFront, pareto_front
from clsr.study.stats.verdict import Verdict, legend, verdict
from clsr.tracking.secrets import mask_uri
from clsr.tracking.study_runs import (
    PARENT_TAG,
    SUPERSEDED_TAG,
    check_reachable,
    children,
    find_parent_run,
    parent_runs,
    resolve_tracking_uri,
    run_labels,
)
from clsr.tracking.tags import last_error_line

CONFIDENCE = 0.95
ALPHA = 0.05  # rows whose Holm-adjusted p against the reference is below this are flagged
OK = "finished"  # the only status whose metrics are averaged (stopped trials never reached their tests)
TEST_NAME = "paired t-test (scipy.stats.ttest_rel, two-sided)"
CORRECTION = "Holm (1979) step-down over the ablation's rows tested against its reference"
EVAL_ONLY_TAG = "clsr.eval_only"  # "true" on a trial that trained nothing (trainer.max_steps: 0)
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


class NoStudyRuns(LookupError):
    """MLflow holds no run of the study at the tracking URI searched."""


# --- the runs ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Trial:
    """One child run of the study: a (point, seed) trial and how it ended."""

    run_id: str
    ablation: str
    point: str
    seed: int | None
    status: str
    metrics: dict[str, float]
    tags: dict[str, str]
    start_time: int
    params: dict[str, str] = field(default_factory=dict)  # the resolved trial config, flattened (strings)

    @classmethod
    def from_run(cls, run: Any) -> Trial:
        tags = run.data.tags
        seed = tags.get("clsr.seed")
        return cls(
            run_id=run.info.run_id,
            ablation=tags["clsr.ablation"],
            point=tags.get("clsr.point", run.info.run_name or run.info.run_id),
            seed=int(seed) if seed not in (None, "") else None,
            status=tags.get("clsr.status", "unknown"),
            metrics=dict(run.data.metrics),
            tags=dict(tags),
            start_time=run.info.start_time or 0,
            params=dict(run.data.params),
        )

    @property
    def ok(self) -> bool:
        return self.status == OK

    @property
    def eval_only(self) -> bool:
        return self.tags.get(EVAL_ONLY_TAG, "").lower() == "true"

    def error_line(self) -> str:
        """The last line of the trial's error (the exception), short enough for a table."""
        return last_error_line(self.tags)[:200]


def open_study_runs(study_name: str, uri: str, run_id: str | None = None) -> tuple[MlflowClient, Any]:
    """The client and the study's latest parent run (or its parent run ``run_id``); a clear error when
    there is none at ``uri``."""
    hint = (
        "set MLFLOW_TRACKING_URI (or tracking_uri: in the study file, or --tracking-uri) to the store "
        "the study logged to, e.g. `export MLFLOW_TRACKING_URI=sqlite:////path/to/mlflow.db` or "
        "http://<host>:5000; a --smoke run is a study of its own, '<name>-smoke'"
    )
    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise NoStudyRuns(
            f"no MLflow store at {mask_uri(uri)} (no such file), so no run of study {study_name!r}; {hint}"
        )
    check_reachable(uri)
    client = MlflowClient(uri)
    if run_id is not None:
        return client, chosen_parent(client, study_name, run_id)
    parent = find_parent_run(client, study_name)
    if parent is None:
        raise NoStudyRuns(
            f"no MLflow run of study {study_name!r} at {mask_uri(uri)} (searched experiment "
            f"{study_name!r} for a run tagged clsr.study={study_name}); {hint}"
        )
    return client, parent


def chosen_parent(client: MlflowClient, study_name: str, run_id: str):
    """The parent run ``run_id`` if it is one of this study's records, else NoStudyRuns listing them."""
    from mlflow.exceptions import MlflowException

    try:
        run = client.get_run(run_id)
    except MlflowException:
        run = None
    if run is None or run.data.tags.get(PARENT_TAG) != study_name:
        listed = "; ".join(record_lines(client, study_name)) or "none"
        raise NoStudyRuns(f"--run {run_id}: not a record of study {study_name!r}; its records: {listed}")
    return run


def record_lines(client: MlflowClient, study_name: str, limit: int = 10) -> list[str]:
    """One line per record of the study, newest first: run id, status, start (UTC), trials."""
    lines = []
    for run in parent_runs(client, study_name, max_results=limit):
        started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(run.info.start_time / 1000))
        status = run.data.tags.get("clsr.status") or run.info.status.lower()
        trials = run.data.tags.get("clsr.trials", "?")
        lines.append(f"{run.info.run_id} {status}, started {started}, {trials} trial(s)")
    return lines


def load_trials(client: MlflowClient, parent_run_id: str) -> list[Trial]:
    """Every child run that belongs to an ablation (skipped ones too: they are planned trials), once per
    point it stands for (identical trials of several points ran once)."""
    runs = children(client, parent_run_id)  # a run an edited resume superseded is not the trial's result
    kept = [r for r in runs if "clsr.ablation" in r.data.tags and SUPERSEDED_TAG not in r.data.tags]
    trials = []
    for run in kept:
        trial = Trial.from_run(run)
        trials += [replace(trial, ablation=a, point=p) for a, p in run_labels(run.data.tags)]
    return trials


def pick_trials(trials: Iterable[Trial]) -> dict[tuple[str, int | None], Trial]:
    """One trial per (point, seed): a resumed study can leave several runs; the finished one counts,
    else the latest, so an early failure that a resume fixed is not shown as a failure."""
    chosen: dict[tuple[str, int | None], Trial] = {}
    for trial in sorted(trials, key=lambda t: (t.ok, t.start_time)):
        chosen[(trial.point, trial.seed)] = trial
    return chosen


def study_from_run(client: MlflowClient, parent_run_id: str, dst: Path) -> Study:
    """The study as its run recorded it (``resolved.yaml``: ``from:`` files merged, smoke applied), for
    ``--name`` reports that have no study file at hand."""
    try:
        local = client.download_artifacts(parent_run_id, "resolved.yaml", str(dst))
    except Exception as err:  # MLflow raises its own exception types per artifact store
        raise NoStudyRuns(
            f"the parent run {parent_run_id} has no resolved.yaml artifact ({err}); give the study file"
        ) from err
    refused = f"the parent run {parent_run_id}'s resolved.yaml artifact was refused"
    try:  # anyone who can write to the tracking server can write it: size and alias limits
        recorded = read_yaml_file(local)
    except YAMLSafetyError as err:
        raise NoStudyRuns(f"{refused}: {err}; give the study file") from None
    if not isinstance(recorded, dict) or not isinstance(recorded.get("study"), dict):
        raise NoStudyRuns(f"{refused}: it holds no study: mapping; give the study file")
    try:
        return Study.model_validate(recorded["study"])
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "(top level)"
        raise NoStudyRuns(
            f"{refused}: not a valid study ({err.error_count()} problem(s); {where}: {first['msg']}); "
            f"give the study file"
        ) from None


# --- statistics --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stats:
    """A cell: mean over seeds, sample std (ddof 1) and the Student-t CI; std and CI are nan below n = 2."""

    mean: float
    std: float
    ci_low: float
    ci_high: float
    n: int


def seed_stats(values: Sequence[float]) -> Stats:
    """Seeds are few (3-5), so the interval uses Student's t with n - 1 degrees of freedom, not z."""
    v = np.asarray(values, dtype=float)
    n = len(v)
    if n == 0:
        return Stats(math.nan, math.nan, math.nan, math.nan, 0)
    mean = float(v.mean())
    if n < 2:
        return Stats(mean, math.nan, math.nan, math.nan, 1)
    std = float(v.std(ddof=1))
    half = float(sps.t.ppf(0.5 + CONFIDENCE / 2, n - 1)) * std / math.sqrt(n)
    return Stats(mean, std, mean - half, mean + half, n)


@dataclass(frozen=True)
class Paired:
    """A row against the reference row on the main metric, over the seeds both finished."""

    p_value: float  # nan: fewer than 2 paired seeds (or no spread at all in the differences)
    n: int
    mean_diff: float  # row - reference, mean over the paired seeds
    p_adjusted: float = math.nan  # Holm-adjusted over the ablation's tested rows; nan when p_value is

    @property
    def significant(self) -> bool:
        return self.p_adjusted < ALPHA


def paired_test(row: dict[int | None, float], reference: dict[int | None, float]) -> Paired:
    """Same seed = same data order and initialisation, so the paired test removes the seed's share of
    the variance that an unpaired test would count against the difference."""
    seeds = sorted((s for s in set(row) & set(reference) if s is not None), key=int)
    diffs = [row[s] - reference[s] for s in seeds]
    mean_diff = float(np.mean(diffs)) if diffs else math.nan
    if len(seeds) < 2:
        return Paired(math.nan, len(seeds), mean_diff)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # constant differences: SciPy warns and returns nan or 0
        p = float(sps.ttest_rel([row[s] for s in seeds], [reference[s] for s in seeds]).pvalue)
    return Paired(p, len(seeds), mean_diff)


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment (Holm 1979), in the input order: the k-th smallest of the m finite
    p-values becomes max over j <= k of min(1, (m - j + 1) p_(j)). A nan (too few paired seeds) stays
    nan and is not counted in m: a row without a test is not a comparison made."""
    ranked = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    adjusted = [math.nan] * len(p_values)
    running = 0.0  # the running max keeps the adjusted p-values in the order of the raw ones
    for k, (p, i) in enumerate(ranked):
        running = max(running, min(1.0, (len(ranked) - k) * p))
        adjusted[i] = running
    return adjusted


# --- one ablation ------------------------------------------------------------------------------------


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

    @property
    def eval_only(self) -> bool:
        """Trains nothing and scores its starting model: planned so, or a trial tagged so."""
        return self.planned_eval_only or any(t.eval_only for t in self.trials.values())

    @property
    def display_label(self) -> str:
        return self.label + (" (evaluation only)" if self.eval_only else "")

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
        return [s for s in self.seeds if s not in self.trials]

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
    tolerance: float = 0.5  # the study's report.tolerance: the verdicts' equivalence margin
    effects: Effects | None = None  # ANOVA of a grid over 2+ keys, or a sampled ablation's importance
    pareto: ParetoFront | None = None  # several objectives: the sampled configurations' front

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
    rows = {p["label"]: Row(p["label"], p["overrides"], dict(p["paper"]), list(seeds)) for p in points}
    resolve = StudyDocuments.of(study).config  # once: its staleness check reads the whole study
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
        folds = [by_label.pop(label) for label in point["members"] if label in by_label]
        row = Row(point["label"], point["overrides"], dict(point["paper"]), list(folds[0].seeds), folds=folds)
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
    ``--name`` report of a study recorded by an older clsr). ``resolve``: the study's documents'
    (``StudyDocuments.of``), so each point is resolved once."""
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
        for key, value in trial.tags.items():
            if key.startswith("clsr.paper."):
                paper.setdefault(key.removeprefix("clsr.paper."), float(value))
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
    tolerance = study.report.tolerance
    report = AblationReport(name, spec, main, metric_columns(present, main), rows, cost, tolerance=tolerance)
    mark_rows(report)
    for row in rows:
        row.stats = {m: seed_stats(list(row.values(m).values())) for m in report.metrics}
        row.verdicts = verdicts(row, report.metrics, tolerance)
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


def ablation_pareto(ab: AblationReport, objectives: list[tuple[str, str]]) -> ParetoFront | None:
    """A sampled ablation of a study searched on several objectives: each configuration's mean over its
    seeds of every objective, and Optuna's Pareto front of them (``clsr.study.stats.pareto``)."""
    if len(objectives) < 2 or not ab.spec.space:
        return None
    values, seeds = {}, {}
    for row in ab.rows:
        per_metric = [row.values(m) for m, _ in objectives]
        finished = set.intersection(*(set(v) for v in per_metric))  # seeds that reported every objective
        if finished:
            values[row.label] = [float(np.mean([v[s] for s in finished])) for v in per_metric]
            seeds[row.label] = len(finished)
    front = pareto_front(values, [mode for _, mode in objectives]) if values else []
    return ParetoFront(list(objectives), values, seeds, front)


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
    points = [{"label": r.label, "overrides": r.overrides} for r in rows]
    choice = find_point(points, spec.paper_choice)
    if choice is not None:
        rows[points.index(choice)].paper_choice = True
    elif spec.paper_choice:
        report.notes.append(f"paper_choice {spec.paper_choice!r} names no row")
    reference = find_point(points, spec.reference) or choice or (points[0] if points else None)
    if reference is not None:
        rows[points.index(reference)].reference = True


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


# --- tables ------------------------------------------------------------------------------------------


@dataclass
class Table:
    """A rendered-anywhere table: each cell a list of lines; ``classes`` style the HTML rows."""

    title: str
    header: list[str]
    rows: list[list[list[str]]]
    classes: list[str] = field(default_factory=list)


def fmt(value: float | None, spec: str = ".2f") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def fmt_p(p: float | None) -> str:
    if p is None or math.isnan(p):
        return "n/a"
    return f"{p:.3f}" if p >= 0.001 else f"{p:.1e}"


def fmt_seconds(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.2f} h"


def mean_std(s: Stats | None) -> str:
    if s is None or s.n == 0:
        return "-"
    return fmt(s.mean) if s.n < 2 else f"{s.mean:.2f} ± {s.std:.2f}"


def ci_text(s: Stats | None) -> str:
    return "-" if s is None or s.n < 2 else f"[{s.ci_low:.2f}, {s.ci_high:.2f}]"


def n_text(s: Stats | None) -> str:
    """The CI and n of a detail cell: ``[lo, hi] n=3``, or ``n=1`` alone (no interval below two seeds)."""
    n = s.n if s else 0
    return f"n={n}" if s is None or n < 2 else f"{ci_text(s)} n={n}"


def row_class(row: Row) -> str:
    classes = ["paper-choice" if row.paper_choice else "", "reference" if row.reference else ""]
    if row.test is not None and row.test.significant:
        classes.append("significant")
    if any(not t.ok for t in row.trials.values()) or row.missing():
        classes.append("incomplete")
    return " ".join(c for c in classes if c)


def summary_table(ab: AblationReport) -> Table:
    """The ablation at a glance: the main metric, the paper, and the test against the reference."""
    m = ab.main_metric
    header = ["point", "row", "trials", f"{m} mean ± std", "95% CI", "n", "paper", "ours − paper", "verdict"]
    header += ["ours − ref", "p (paired t)", "p (Holm)", "sig."]
    rows = []
    for row in ab.rows:
        s, paper = row.stats.get(m), row.paper_value(m)
        diff = s.mean - paper if s is not None and s.n and paper is not None else None
        test = row.test
        cells = [row.display_label, "", row.trials_text(), mean_std(s), ci_text(s)]
        judged = row.verdicts.get(m)
        cells += [str(s.n if s else 0), fmt(paper), fmt(diff, "+.2f"), judged.short if judged else "-"]
        if test is None:
            cells += ["(reference)" if row.reference else "-", "", "", ""]
        else:
            sig = "*" if test.significant else ""
            cells += [fmt(test.mean_diff, "+.2f"), fmt_p(test.p_value), fmt_p(test.p_adjusted), sig]
        rows.append([[c] for c in cells])
        rows[-1][1] = row.mark_lines() or [""]
    return Table(f"{ab.name}: {m}", header, rows, [row_class(r) for r in ab.rows])


def column_groups(ab: AblationReport) -> list[tuple[str, list[str]]]:
    """The metric columns split by family, so no terminal table is wider than one family."""
    groups = [(title, [m for m in family if m in ab.metrics]) for title, family in FAMILIES]
    other = [m for m in ab.metrics if m not in KNOWN_TESTS and m.startswith("test_")]
    selection = [m for m in ab.metrics if not m.startswith("test_") and m != ab.main_metric]
    groups = [("selection / dev", selection), *groups, ("other test metrics", other)]
    return [(title, cols) for title, cols in groups if cols]


def cell_lines(row: Row, metric: str) -> list[str]:
    """mean ± std, then CI and n, then the paper's number, ours − paper and the verdict when it has one."""
    s, paper = row.stats.get(metric), row.paper_value(metric)
    lines = [mean_std(s), n_text(s)]
    if paper is not None:
        diff = fmt(s.mean - paper, "+.2f") if s is not None and s.n else "-"
        lines += [f"paper {paper:.2f}", f"Δ {diff}"]
        if judged := row.verdicts.get(metric):
            lines.append(judged.short)
    return lines


def detail_tables(ab: AblationReport) -> list[Table]:
    """Every metric column: mean ± std, 95% CI, n, paper, ours − paper and the verdict per cell."""
    tables = []
    for title, cols in column_groups(ab):
        rows = []
        for row in ab.rows:
            label = [row.display_label] + [f"({m})" for m in row.mark_lines()]
            rows.append([label, [row.trials_text()], *(cell_lines(row, m) for m in cols)])
        tables.append(
            Table(f"{ab.name}: {title}", ["point", "trials", *cols], rows, [row_class(r) for r in ab.rows])
        )
    return tables


def effects_table(ab: AblationReport) -> Table | None:
    """The ANOVA terms (partial η² with its bootstrap CI) or the importances; None when skipped."""
    e = ab.effects
    if e is None or e.kind == "skipped":
        return None
    if e.kind == "importance":
        rows = [[[k], [f"{v:.3f}"]] for k, v in e.importances.items()]
        return Table(f"{ab.name}: effects on {ab.main_metric}", ["parameter", "importance (fANOVA)"], rows)
    header = ["term", "SS", "df", "F", "p", "partial η²", f"{CONFIDENCE:.0%} CI (bootstrap)"]
    rows = [
        [
            [t.term],
            [fmt(t.sum_sq, ".3f")],
            [fmt(t.df, ".0f")],
            [fmt(t.f)],
            [fmt_p(t.p_value)],
            [fmt(t.partial_eta_sq, ".3f")],
            ["-" if math.isnan(t.ci_low) else f"[{t.ci_low:.3f}, {t.ci_high:.3f}]"],
        ]  # fmt: skip
        for t in e.terms
    ]
    return Table(f"{ab.name}: effects on {ab.main_metric}", header, rows)


def pareto_table(ab: AblationReport) -> Table | None:
    """The configurations on the Pareto front of the study's objectives, best first on the first."""
    front = ab.pareto
    if front is None:
        return None
    names = [f"{m} ({'higher' if mode == 'max' else 'lower'} is better)" for m, mode in front.objectives]
    first_mode = front.objectives[0][1]
    ordered = sorted(front.front, key=lambda label: front.values[label][0], reverse=first_mode == "max")
    rows = [
        [[label], *([fmt(v)] for v in front.values[label]), [str(front.seeds[label])]] for label in ordered
    ]
    title = (
        f"{ab.name}: Pareto front, {len(front.front)} of {len(front.values)} configurations (no other "
        f"configuration is at least as good on every objective and better on one; means over seeds)"
    )
    return Table(title, ["configuration", *names, "seeds"], rows)


def effects_note(ab: AblationReport) -> str:
    """What the effects table is, or why there is none (one line)."""
    e = ab.effects
    if e is None:
        return ""
    if e.kind == "skipped":
        return f"effects: {e.reason}"
    if e.kind == "importance":
        return f"effects: share of the main metric's variance each sampled key explains ({e.method})"
    return (
        f"effects: {e.method}; residual df {e.residual_df:.0f}; partial η² = SS_term / (SS_term + "
        f"SS_residual), the share of the variance left after the other terms that the term explains"
    )


def problems(ab: AblationReport) -> list[str]:
    """Every planned trial without a finished run, with why, so nothing disappears from the means."""
    lines = []
    for row in ab.rows:
        for part in row.folds or [row]:  # an averaged row's failures are its folds' runs
            for seed, trial in sorted(part.trials.items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
                if not trial.ok:
                    why = f": {trial.error_line()}" if trial.error_line() else ""
                    lines.append(f"{part.label} seed {seed}: {trial.status}{why} (run {trial.run_id})")
            lines += [f"{part.label} seed {seed}: missing (no run)" for seed in part.missing()]
        if not row.in_study:
            lines.append(f"{row.label}: runs of a point the study file does not have")
    return lines


def cost_table(report: StudyReport) -> Table:
    """Compute per ablation and for the study, from the trials' trial_wall_s / _cpu_s / _gpu_s, and the
    GPU utilisation sampled by MLflow system metrics (weighted by GPU seconds)."""
    header = ["ablation", "runs", "with cost", "wall (sum of trials)", "CPU", "GPU", "GPU util", "devices"]
    items = [(a.name, a.cost) for a in report.ablations] + [("study", report.cost)]
    rows = []
    for name, c in items:
        devices = "; ".join(f"{d} ({n})" for d, n in sorted(c.devices.items())) or "-"
        times = [fmt_seconds(x) for x in (c.wall_s, c.cpu_s, c.gpu_s)] if c.measured else ["not logged"] * 3
        busy = "-" if c.gpu_utilization is None else f"{c.gpu_utilization:.0f} %"
        rows.append([[name], [str(c.runs)], [str(c.measured)], *([t] for t in times), [busy], [devices]])
    classes = [""] * (len(rows) - 1) + ["total"]
    if report.wall_s is not None:  # trials overlap: the study took less than their sum
        rows.append(
            [["study, start to end"], [""], [""], [fmt_seconds(report.wall_s)], ["-"], ["-"], ["-"], ["-"]]
        )
        classes.append("total")
    return Table("cost", header, rows, classes)


def ablation_notes(ab: AblationReport) -> list[str]:
    ref = ab.reference
    why = (
        "the study's reference"
        if ab.spec.reference
        else "the paper's choice"
        if ab.spec.paper_choice
        else "the first point"
    )
    lines = [f"{ab.spec.table or ab.name}" + (f" — {ab.spec.description}" if ab.spec.description else "")]
    lines.append(
        f"main metric {ab.main_metric}; reference row {ref.label!r} ({why}); cells: mean ± std over "
        f"seeds, {CONFIDENCE:.0%} CI (Student t), n seeds; rows vs reference: {TEST_NAME} on "
        f"{ab.main_metric} across the seeds both finished, n/a below 2 paired seeds; p (Holm): "
        f"{CORRECTION} ({tested(ab)} tested, family-wise error); * Holm-adjusted p < {ALPHA}"
        if ref is not None
        else "no rows: no point planned and no run found"
    )
    if any(r.verdicts.get(ab.main_metric) for r in ab.rows):
        lines.append(legend(ab.tolerance))
    if ab.spec.average_over:
        lines.append(
            f"each row is the mean over its {ab.spec.average_over} points ({len(ab.spec.grid[ab.spec.average_over])}) "
            f"per seed; a seed counts once all of them finished (the runs of each are in MLflow)"
        )
    lines += [f"fidelity: {line}" for line in fidelity_lines(ab)]
    return lines + ab.notes


def fidelity_lines(ab: AblationReport) -> list[str]:
    """How faithful the table is, one line each: from the study file's ``fidelity:`` where the schema
    has it (exact rows, rows on stand-in data, the paper's rows not expressible, each with why), and
    always what the paper numbers show: the rows with none on the main metric, or that no row has one
    (a stand-in metric: the description says why)."""
    lines = declared_fidelity(getattr(ab.spec, "fidelity", None))
    m = ab.main_metric
    rows = [r for r in ab.rows if r.in_study]
    without = [r.label for r in rows if r.paper_value(m) is None]
    others = sorted({k for r in rows for k in r.paper} - {m, m.removeprefix("best_")})
    if rows and len(without) == len(rows):
        elsewhere = f"; the paper's numbers are on {', '.join(others)}" if others else ""
        lines.append(
            f"no published number for the main metric {m} in any row: nothing here is compared with the "
            f"paper on it{elsewhere}" + (f" ({ab.spec.description})" if ab.spec.description else "")
        )
    elif without:
        lines.append(f"rows without a published {m} (not compared with the paper): {'; '.join(without)}")
    return lines


def declared_fidelity(fidelity: Any) -> list[str]:
    """``fidelity: {exact: [labels], stand_in: {label: why}, not_expressible: {paper row: why}}``."""
    if fidelity is None:
        return []
    lines = []
    if exact := list(getattr(fidelity, "exact", None) or []):
        lines.append(f"exact reproductions: {'; '.join(exact)}")
    for label, why in (getattr(fidelity, "stand_in", None) or {}).items():
        lines.append(f"stand-in data: {label}: {why}")
    for label, why in (getattr(fidelity, "not_expressible", None) or {}).items():
        lines.append(f"not expressible: {label}: {why}")
    return lines


def tested(ab: AblationReport) -> int:
    """The size of the Holm family: rows with a p-value on the main metric."""
    return sum(r.test is not None and not math.isnan(r.test.p_value) for r in ab.rows)


def text_table(table: Table) -> str:
    """Columns padded to their widest line; a rule between rows when cells span several lines."""
    widths = [
        max(len(h), *(len(line) for r in table.rows for line in r[i])) for i, h in enumerate(table.header)
    ]
    multi = any(len(cell) > 1 for r in table.rows for cell in r)

    def line(cells: Sequence[str]) -> str:
        padded = [c.ljust(w) for c, w in zip(cells, widths, strict=True)]
        while len(padded) > 1 and not padded[-1].strip():  # no dangling separators after the last value
            padded.pop()
        return " | ".join(padded).rstrip()

    out = [line(table.header), "-+-".join("-" * w for w in widths)]
    for i, row in enumerate(table.rows):
        if multi and i:
            out.append("-+-".join("-" * w for w in widths))
        height = max(len(c) for c in row)
        out += [line([c[k] if k < len(c) else "" for c in row]) for k in range(height)]
    return "\n".join(out)


# --- renderers ---------------------------------------------------------------------------------------


def render_text(report: StudyReport) -> str:
    """What the terminal shows: per ablation the summary and the detail tables, then cost."""
    out = [
        f"study {report.study.name!r}: parent run {report.parent_run_id} at {report.tracking_uri}",
        *report.notes,
    ]
    for ab in report.ablations:
        out += ["", f"== {ab.name} ==", *ablation_notes(ab), "", text_table(summary_table(ab))]
        for table in detail_tables(ab):
            out += ["", table.title, text_table(table)]
        if note := effects_note(ab):
            out += ["", note]
        if table := effects_table(ab):
            out += [table.title, text_table(table)]
        if table := pareto_table(ab):
            out += ["", table.title, text_table(table)]
        if lines := problems(ab):
            out += ["", "not averaged:", *(f"  {p}" for p in lines)]
    out += ["", "== cost ==", text_table(cost_table(report))]
    return "\n".join(out)


def md_escape(text: str) -> str:
    return text.replace("|", "\\|")


def frame(table: Table, sep: str) -> pd.DataFrame:
    """The table as a DataFrame of strings, a cell's lines joined by ``sep``."""
    return pd.DataFrame([[sep.join(cell) for cell in row] for row in table.rows], columns=table.header)


def markdown_table(table: Table) -> str:
    """GitHub Markdown through pandas (tabulate's pipe format); cells stay text (no number parsing)."""
    cells = frame(table, "<br>").map(md_escape)
    cells.columns = [md_escape(h) for h in table.header]
    return cells.to_markdown(index=False, disable_numparse=True)


def render_markdown(report: StudyReport, images: dict[str, list[Path]]) -> str:
    out = [
        f"# Study report: {report.study.name}",
        "",
        f"Parent run `{report.parent_run_id}` at `{report.tracking_uri}`; built {report.created}.",
        *report.notes,
    ]
    for ab in report.ablations:
        out += [
            "",
            f"## {ab.name}",
            "",
            *(f"{n}  " for n in ablation_notes(ab)),
            "",
            markdown_table(summary_table(ab)),
        ]
        for table in detail_tables(ab):
            out += ["", f"### {table.title}", "", markdown_table(table)]
        if note := effects_note(ab):
            out += ["", f"### {ab.name}: effects", "", md_escape(note)]
        if table := effects_table(ab):
            out += ["", markdown_table(table)]
        if table := pareto_table(ab):
            out += ["", f"### {md_escape(table.title)}", "", markdown_table(table)]
        if lines := problems(ab):
            out += ["", "Not averaged:", "", *(f"* {md_escape(p)}" for p in lines)]
        out += ["", *(f"![{p.stem}]({p.name})" for p in images.get(ab.name, []))]
    out += ["", "## Cost", "", markdown_table(cost_table(report)), ""]
    return "\n".join(out)


CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em;color:#222;max-width:1600px}
table{border-collapse:collapse;margin:.6em 0 1.4em;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 7px;text-align:right;vertical-align:top;white-space:pre}
th{background:#f0f0f0} td.col0,th.col0{text-align:left}
td.paper-choice{background:#fff8dc} td.reference.col0{font-weight:bold}
td.significant{color:#a00000} td.incomplete.col2{background:#fde2e2}
td.total{font-weight:bold} .notes{color:#555;font-size:13px} img{max-width:100%;margin:.5em 0}
"""


def html_table(table: Table) -> str:
    """An HTML table through pandas' Styler: cells escaped, each row's classes on its cells (CSS above);
    a cell's lines break at its newlines only (``white-space: pre``)."""
    cells = frame(table, "\n")
    classes = [table.classes[i] if i < len(table.classes) else "" for i in range(len(cells))]
    per_cell = pd.DataFrame([[c] * len(cells.columns) for c in classes], columns=cells.columns)
    styled = cells.style.hide(axis="index").format(escape="html").format_index(escape="html", axis=1)
    styled = styled.set_td_classes(per_cell)
    return styled.to_html()


def render_html(report: StudyReport, images: dict[str, list[Path]]) -> str:
    """One page, no outside files: inline CSS, PNGs embedded as base64."""
    esc = html.escape
    parts = [
        f"<h1>Study report: {esc(report.study.name)}</h1>",
        f'<p class="notes">Parent run <code>{esc(report.parent_run_id)}</code> at '
        f"<code>{esc(report.tracking_uri)}</code>; built {esc(report.created)}.</p>",
        *(f'<p class="notes">{esc(n)}</p>' for n in report.notes),
    ]
    for ab in report.ablations:
        parts += [f"<h2>{esc(ab.name)}</h2>", *(f'<p class="notes">{esc(n)}</p>' for n in ablation_notes(ab))]
        parts.append(html_table(summary_table(ab)))
        for table in detail_tables(ab):
            parts += [f"<h3>{esc(table.title)}</h3>", html_table(table)]
        if note := effects_note(ab):
            parts += [f"<h3>{esc(ab.name)}: effects</h3>", f'<p class="notes">{esc(note)}</p>']
        if table := effects_table(ab):
            parts.append(html_table(table))
        if table := pareto_table(ab):
            parts += [f"<h3>{esc(table.title)}</h3>", html_table(table)]
        if lines := problems(ab):
            parts.append("<p>Not averaged:</p><ul>" + "".join(f"<li>{esc(p)}</li>" for p in lines) + "</ul>")
        for png in images.get(ab.name, []):
            data = base64.b64encode(png.read_bytes()).decode()
            parts.append(f'<img alt="{esc(png.stem)}" src="data:image/png;base64,{data}">')
    parts += ["<h2>Cost</h2>", html_table(cost_table(report))]
    title = esc(f"Study report: {report.study.name}")
    return (
        f'<!doctype html>\n<html><head><meta charset="utf-8"><title>{title}</title><style>{CSS}</style>'
        f"</head><body>\n" + "\n".join(parts) + "\n</body></html>\n"
    )


CSV_FIELDS = (
    "ablation", "table", "point", "paper_choice", "reference", "eval_only", "same_as", "trials", "metric",
    "main_metric", "mean", "std", "ci_low", "ci_high", "n", "paper", "diff", "verdict", "tost_p",
    "tolerance", "seeds_needed", "p_value", "p_adjusted", "test", "correction",
)  # fmt: skip


def csv_rows(report: StudyReport) -> list[dict[str, Any]]:
    """One row per ablation x point x metric; p_value and its Holm adjustment on the main metric's rows
    (blank for the reference)."""
    out = []
    for ab in report.ablations:
        for row in ab.rows:
            for metric in ab.metrics:
                s, paper = row.stats[metric], row.paper_value(metric)
                main = metric == ab.main_metric
                test = row.test if main else None
                judged = row.verdicts.get(metric)
                out.append(
                    {
                        "ablation": ab.name, "table": ab.spec.table or "", "point": row.label,
                        "paper_choice": row.paper_choice, "reference": row.reference,
                        "eval_only": row.eval_only, "same_as": "; ".join(row.same_as),
                        "trials": row.trials_text(), "metric": metric, "main_metric": main,
                        "mean": _num(s.mean), "std": _num(s.std), "ci_low": _num(s.ci_low),
                        "ci_high": _num(s.ci_high), "n": s.n, "paper": _num(paper),
                        "diff": _num(s.mean - paper) if paper is not None and s.n else "",
                        "verdict": judged.short if judged else "",
                        "tost_p": _num(judged.p_value) if judged else "",
                        "tolerance": judged.tolerance if judged else "",
                        "seeds_needed": (judged.seeds_needed or "") if judged else "",
                        "p_value": _num(test.p_value) if test else "",
                        "p_adjusted": _num(test.p_adjusted) if test else "",
                        "test": TEST_NAME if test else "", "correction": CORRECTION if test else "",
                    }
                )  # fmt: skip
    return out


def _num(value: float | None) -> float | str:
    return "" if value is None or math.isnan(value) else value


JSON_VERSION = 1  # bumped when a key changes meaning or goes away (added keys do not bump it)


def _clean(value: Any) -> Any:
    """nan and inf as null (JSON has neither), recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def json_cell(row: Row, metric: str) -> dict[str, Any]:
    s, paper, judged = row.stats[metric], row.paper_value(metric), row.verdicts.get(metric)
    return {
        "mean": s.mean if s.n else None, "std": s.std, "ci_low": s.ci_low, "ci_high": s.ci_high, "n": s.n,
        "seeds": {str(k): v for k, v in row.values(metric).items()},
        "paper": paper, "diff": s.mean - paper if paper is not None and s.n else None,
        "verdict": None if judged is None else {
            "kind": judged.kind, "direction": judged.direction, "text": judged.short,
            "tost_p": judged.p_value, "tolerance": judged.tolerance, "seeds_needed": judged.seeds_needed,
        },
    }  # fmt: skip


def json_row(row: Row, metrics: list[str]) -> dict[str, Any]:
    test = row.test
    return {
        "label": row.label, "overrides": row.overrides, "paper_choice": row.paper_choice,
        "reference": row.reference, "eval_only": row.eval_only, "in_study": row.in_study,
        "same_as": row.same_as, "trials": row.trials_text(),
        "runs": [{"seed": t.seed, "status": t.status, "run_id": t.run_id} for t in row.runs()],
        "metrics": {m: json_cell(row, m) for m in metrics},
        "test": None if test is None else {
            "name": TEST_NAME, "correction": CORRECTION, "n": test.n, "mean_diff": test.mean_diff,
            "p_value": test.p_value, "p_adjusted": test.p_adjusted, "significant": test.significant,
        },
    }  # fmt: skip


def json_effects(ab: AblationReport) -> dict[str, Any] | None:
    e = ab.effects
    if e is None:
        return None
    return {
        "kind": e.kind, "method": e.method, "reason": e.reason, "residual_df": e.residual_df,
        "metric": ab.main_metric, "importances": e.importances,
        "terms": [vars(t) for t in e.terms],
    }  # fmt: skip


def json_pareto(ab: AblationReport) -> dict[str, Any] | None:
    front = ab.pareto
    if front is None:
        return None
    return {
        "objectives": [{"metric": m, "mode": mode} for m, mode in front.objectives],
        "configurations": [
            {"label": label, "values": values, "seeds": front.seeds[label], "on_front": label in front.front}
            for label, values in front.values.items()
        ],
    }


def json_cost(c: Cost) -> dict[str, Any]:
    return {
        "runs": c.runs, "with_cost": c.measured, "wall_s": c.wall_s, "cpu_s": c.cpu_s, "gpu_s": c.gpu_s,
        "gpu_utilization": c.gpu_utilization, "devices": dict(c.devices),
    }  # fmt: skip


def json_report(report: StudyReport) -> dict[str, Any]:
    """The report's content as plain data (``--format json``): what the Markdown shows, as numbers."""
    ablations = [
        {
            "name": ab.name,
            "table": ab.spec.table,
            "description": ab.spec.description,
            "main_metric": ab.main_metric,
            "metrics": ab.metrics,
            "tolerance": ab.tolerance,
            "notes": ablation_notes(ab),
            "fidelity": fidelity_lines(ab),
            "rows": [json_row(r, ab.metrics) for r in ab.rows],
            "effects": json_effects(ab),
            "pareto": json_pareto(ab),
            "not_averaged": problems(ab),
            "cost": json_cost(ab.cost),
        }
        for ab in report.ablations
    ]
    return _clean(
        {
            "version": JSON_VERSION,
            "study": report.study.name,
            "parent_run_id": report.parent_run_id,
            "tracking_uri": report.tracking_uri,
            "created": report.created,
            "notes": report.notes,
            "confidence": CONFIDENCE,
            "alpha": ALPHA,
            "wall_s": report.wall_s,
            "ablations": ablations,
            "cost": json_cost(report.cost),
        }  # fmt: skip
    )


def render_json(report: StudyReport) -> str:
    """``json_report`` as text; values that are no JSON type (a path in an override) as strings."""
    return json.dumps(json_report(report), indent=2, default=str, allow_nan=False) + "\n"


# --- plots -------------------------------------------------------------------------------------------


def _figure(width: float, height: float, panels: int = 1):
    """A Figure on the Agg canvas, without pyplot's global state (safe in threads and on servers)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig, [fig.add_subplot(1, panels, i + 1) for i in range(panels)]


def _x_axis(rows: list[Row]) -> tuple[list[float], str | None]:
    """Numbers when every row sets the same single key to a number (a 1-D grid), else positions."""
    keys = {tuple(r.overrides) for r in rows}
    values = [next(iter(r.overrides.values()), None) for r in rows]
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) for v in values)
    if len(keys) == 1 and len(next(iter(keys))) == 1 and numeric and len(set(values)) == len(values):
        return [float(v) for v in values], next(iter(keys))[0]
    return [float(i) for i in range(len(rows))], None


def plot_main_metric(ab: AblationReport, path: Path) -> Path | None:
    """The main metric against the ablated value: seeds as dots, mean with its 95% CI, paper as diamonds."""
    rows = ab.rows
    if not rows:
        return None
    m = ab.main_metric
    x, key = _x_axis(rows)
    fig, (ax,) = _figure(max(5.0, 0.8 * len(rows) + 2.5), 4.0)
    for xi, row in zip(x, rows, strict=True):
        seeds = list(row.values(m).values())
        ax.scatter([xi] * len(seeds), seeds, s=12, color="0.6", zorder=2)
    stats = [(xi, row.stats[m]) for xi, row in zip(x, rows, strict=True) if row.stats[m].n]
    if stats:
        xs, ss = [p[0] for p in stats], [p[1] for p in stats]
        low = [0.0 if math.isnan(s.ci_low) else s.mean - s.ci_low for s in ss]
        high = [0.0 if math.isnan(s.ci_high) else s.ci_high - s.mean for s in ss]
        ax.errorbar(xs, [s.mean for s in ss], yerr=[low, high], fmt="o-" if key else "o", capsize=4,
                    color="tab:blue", label=f"ours: mean, {CONFIDENCE:.0%} CI", zorder=3)  # fmt: skip
    paper = [
        (xi, row.paper_value(m)) for xi, row in zip(x, rows, strict=True) if row.paper_value(m) is not None
    ]
    if paper:
        ax.scatter([p[0] for p in paper], [p[1] for p in paper], marker="D", s=40, color="tab:red",
                   label="paper", zorder=4)  # fmt: skip
    if key:
        ax.set_xlabel(key)
        for xi in (xi for xi, row in zip(x, rows, strict=True) if row.paper_choice):
            ax.axvline(xi, ls=":", color="0.4", label="paper's choice", zorder=1)
        if min(x) > 0 and max(x) / min(x) >= 16:
            ax.set_xscale("log")
    else:
        ax.set_xticks(x, [r.display_label + (" (paper)" if r.paper_choice else "") for r in rows],
                      rotation=30 if len(rows) > 3 else 0, ha="right" if len(rows) > 3 else "center")  # fmt: skip
    ax.set_ylabel(m)
    ax.set_title(f"{ab.name}: {m} over seeds")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:  # an ablation without finished trials has nothing to label
        ax.legend(fontsize=8)
    fig.savefig(path, dpi=110)
    return path


def plot_pareto(ab: AblationReport, path: Path) -> Path | None:
    """The configurations on the first two objectives (means over seeds), the Pareto front joined."""
    front = ab.pareto
    if front is None or not front.values:
        return None
    (mx, mode_x), (my, mode_y) = front.objectives[:2]
    fig, (ax,) = _figure(6.0, 4.5)
    points = np.array(list(front.values.values()))[:, :2]
    ax.scatter(points[:, 0], points[:, 1], s=18, color="0.6", label="configurations", zorder=2)
    on = np.array([front.values[label][:2] for label in front.front])
    on = on[np.argsort(on[:, 0])]
    ax.plot(on[:, 0], on[:, 1], "o-", color="tab:blue", label="Pareto front", zorder=3)
    ax.set_xlabel(f"{mx} ({'higher' if mode_x == 'max' else 'lower'} is better)")
    ax.set_ylabel(f"{my} ({'higher' if mode_y == 'max' else 'lower'} is better)")
    ax.set_title(f"{ab.name}: configurations, means over seeds")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def dev_metric(ab: AblationReport, study: Study) -> str | None:
    """The dev score the trials selected on (``dev_stsb``/``dev_sickr``), for the learning curves."""
    present = {k for t in ab.trials for k in t.metrics}
    wanted = [m.removeprefix("best_") for m in (ab.main_metric, study.metric) if m.startswith("best_dev_")]
    return next((m for m in [*wanted, *sorted(present)] if m in present and m.startswith("dev_")), None)


def histories(client: MlflowClient, trials: list[Trial], keys: list[str]) -> dict[str, dict[str, np.ndarray]]:
    """run id -> metric -> (steps, values), sorted by step, for the metrics each run logged."""
    out: dict[str, dict[str, np.ndarray]] = {}
    for trial in trials:
        for key in keys:
            if key in trial.metrics:
                points = sorted((m.step, m.value) for m in client.get_metric_history(trial.run_id, key))
                out.setdefault(trial.run_id, {})[key] = np.array(points, dtype=float).reshape(-1, 2)
    return out


def _smooth(values: np.ndarray) -> tuple[np.ndarray, int]:
    window = max(1, len(values) // 100)
    if window == 1:
        return values, 1
    return np.convolve(values, np.ones(window) / window, mode="valid"), window


def spans_decades(series: list[np.ndarray], decades: float = 2.0) -> bool:
    """Whether positive values span ``decades`` powers of ten or more: drawn on a linear axis, the small
    ones (a loss of 1e-5 after 1.0) would lie flat on zero."""
    values = np.concatenate([np.asarray(v, dtype=float) for v in series]) if series else np.array([])
    values = values[np.isfinite(values)]
    if not len(values) or (values <= 0).any():
        return False
    return bool(np.log10(values.max() / values.min()) >= decades)


def plot_curves(ab: AblationReport, study: Study, client: MlflowClient, path: Path) -> Path | None:
    """Training loss and the dev score against the step for every trial; a colour per point, dashed
    lines for trials that did not finish; steps on whole numbers, the loss on a log axis where it spans
    two decades or more."""
    from matplotlib import colormaps
    from matplotlib.ticker import MaxNLocator

    dev = dev_metric(ab, study)
    keys = ["loss"] + ([dev] if dev else [])
    curves = histories(client, ab.trials, keys)
    if not curves:
        return None
    fig, axes = _figure(12.0, 4.2, len(keys))
    colours = colormaps["tab10" if len(ab.rows) <= 10 else "tab20"]
    windows, drawn = {1}, {key: [] for key in keys}
    for i, row in enumerate(ab.rows):
        colour, labelled = colours(i % colours.N), False
        for trial in row.runs():
            for ax, key in zip(axes, keys, strict=True):
                data = curves.get(trial.run_id, {}).get(key)
                if data is None or not len(data):
                    continue
                values, window = _smooth(data[:, 1]) if key == "loss" else (data[:, 1], 1)
                windows.add(window)
                drawn[key].append(values)
                steps = data[window - 1 :, 0]
                ax.plot(steps, values, color=colour, lw=1.0, ls="-" if trial.ok else "--",
                        marker="o" if key != "loss" and len(steps) < 30 else None, ms=3,
                        label=None if labelled else row.label)  # fmt: skip
                labelled = True
    smoothed = f" (running mean of {max(windows)} steps)" if max(windows) > 1 else ""
    for ax, key in zip(axes, keys, strict=True):
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no tick at 4.5
        log = key == "loss" and spans_decades(drawn[key])
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(key + (" (log scale)" if log else ""))
        ax.set_title(f"{key}{smoothed if key == 'loss' else ''}")
        ax.grid(alpha=0.3)
    handles = [h for ax in axes for h in ax.get_legend_handles_labels()[0]]
    fig.legend(handles=handles, loc="outside lower center", fontsize=7, ncol=min(4, max(1, len(handles))))
    fig.suptitle(f"{ab.name}: learning curves (dashed: trial did not finish)")
    fig.savefig(path, dpi=110)
    return path


# --- the whole report --------------------------------------------------------------------------------


def write_report(report: StudyReport, client: MlflowClient, out: Path) -> list[Path]:
    """report.md, report.csv, report.html, report.json and the PNGs under ``out``; returns the files
    written."""
    out.mkdir(parents=True, exist_ok=True)
    images: dict[str, list[Path]] = {}
    for ab in report.ablations:
        made = [
            plot_main_metric(ab, out / f"{ab.name}_main.png"),
            plot_curves(ab, report.study, client, out / f"{ab.name}_curves.png"),
            plot_pareto(ab, out / f"{ab.name}_pareto.png"),
        ]
        images[ab.name] = [p for p in made if p is not None]
    md, html_path, csv_path = out / "report.md", out / "report.html", out / "report.csv"
    json_path = out / "report.json"
    md.write_text(render_markdown(report, images))
    html_path.write_text(render_html(report, images))
    pd.DataFrame(csv_rows(report), columns=list(CSV_FIELDS)).to_csv(csv_path, index=False)
    json_path.write_text(render_json(report))
    return [md, csv_path, html_path, json_path, *(p for paths in images.values() for p in paths)]


def log_report(client: MlflowClient, parent_run_id: str, files: list[Path]) -> None:
    """The files as artifacts of the parent run under ``report/``, next to study.yaml and resolved.yaml."""
    for path in files:
        client.log_artifact(parent_run_id, str(path), "report")


def report_study(
    study: Study,
    out: Path | None = None,
    tracking_uri: str | None = None,
    log: bool = True,
    run_id: str | None = None,
) -> tuple[StudyReport, list[Path]]:
    """Build, write and (unless ``log`` is False) log the report of a study's latest parent run (or of
    its parent run ``run_id``)."""
    uri = resolve_tracking_uri(tracking_uri or study.tracking_uri)
    client, parent = open_study_runs(study.name, uri, run_id)
    report = build_report(study, client, parent.info.run_id, uri)
    files = write_report(report, client, out or Path("reports") / study.name)
    if log:
        log_report(client, parent.info.run_id, files)
    return report, files


def study_by_name(name: str, tracking_uri: str | None, dst: Path, run_id: str | None = None) -> Study:
    """The study a parent run recorded, for a report by study name (no study file)."""
    uri = resolve_tracking_uri(tracking_uri)
    client, parent = open_study_runs(name, uri, run_id)
    return study_from_run(client, parent.info.run_id, dst)
