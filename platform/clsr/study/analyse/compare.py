"""Two study records compared point by point: "did this commit change the results?", "does the H100 give
the CPU's numbers?".

``platform study compare A B`` reads each record's trials (those the report counts) and pairs the trials
the two share: the same resolved configuration, as each child run logged it in its parameters (less the
``study.*`` labels, the seed, and any ``--ignore`` prefixes, e.g. a data folder that differs between two
machines), and the same seed. Per point it reports the paired differences B - A of the metric: their
mean, SciPy's Student-t 95 % CI and paired t-test (``scipy.stats.ttest_rel``), and the p-values adjusted
across points with Holm's method, the report's own (``clsr.study.stats.seeds.holm``).
Points only one record holds are listed apart; a label both hold with another configuration is listed
with the parameters that differ (why it was not paired). Only values are compared: nothing here takes a path or
a location from a run's tags. The pairing and the table are the only hand-written parts.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats as sps

from clsr.study.analyse.drift import drift, drift_lines, mixed
from clsr.study.analyse.frame import study_name_and_uri
from clsr.study.analyse.runs import NoStudyRuns, Trial, load_trials, open_study_runs, pick_trials
from clsr.study.plan.fingerprint import digest
from clsr.study.record.reader import study_records
from clsr.study.stats.seeds import holm
from clsr.tracking import escape
from clsr.tracking.record_reader import finite, is_identity
from clsr.tracking.study_runs import resolve_tracking_uri

CONFIDENCE = 0.95
DEFAULT_METRIC = "test_sts_avg"
NOT_CONFIG = ("study.", "trainer.seed")  # labels and the seed: the seed pairs trials, it is no point
MAX_DIFFERENCES = 4  # parameters named per label whose configuration differs
COLUMNS = ("point", "seeds", "n", "mean_a", "mean_b", "diff", "ci_low", "ci_high", "p", "p_holm")


@dataclass(frozen=True)
class Record:
    """One side of a comparison: the trials of a study record (those the report counts), and its name."""

    trials: list[Trial]
    name: str
    study: str

    @classmethod
    def read(cls, study: str, tracking_uri: str | None, run_id: str | None) -> Record:
        name, file_uri = study_name_and_uri(study)
        client, parent = open_study_runs(name, resolve_tracking_uri(tracking_uri or file_uri), run_id)
        trials = load_trials(client, parent.info.run_id)
        chosen = [  # one trial per (ablation, point, seed), as clsr.results.load and the report pick them
            trial
            for ablation in dict.fromkeys(t.ablation for t in trials)
            for trial in pick_trials(t for t in trials if t.ablation == ablation).values()
        ]
        return cls(chosen, f"{name} (run {parent.info.run_id})", name)


@dataclass
class Comparison:
    """The paired table (one row per shared point) and the points only one side holds."""

    table: pd.DataFrame
    only_a: list[str] = field(default_factory=list)
    only_b: list[str] = field(default_factory=list)
    metric: str = DEFAULT_METRIC
    params_only_a: list[str] = field(default_factory=list)  # logged by A's runs only: not compared
    params_only_b: list[str] = field(default_factory=list)
    # a label both records hold with another configuration: the parameters that differ (A's, B's value)
    differs: dict[str, list[tuple[str, str, str]]] = field(default_factory=dict)
    drift: list[str] = field(default_factory=list)  # environment, code and data differences (drift_lines)


def previous_record(study_name: str, uri: str) -> str:
    """The record before the newest one of a study: A, when A and B are one study and no run is named."""
    client, _ = open_study_runs(study_name, uri)
    runs = study_records(client, study_name)  # leased first: B is the first, as the reader finds it
    if len(runs) < 2:
        raise NoStudyRuns(
            f"study {study_name!r} has one record at {uri}: name another with --run-a/--run-b, or compare "
            f"it with another study"
        )
    return runs[1].info.run_id


def config_key(trial: Trial, names: frozenset[str]) -> str:
    """The hash of a trial's resolved configuration: its parameters ``names``, as logged (MLflow's
    strings)."""
    return digest({k: v for k, v in trial.params.items() if k in names})


def param_names(record: Record, ignore: tuple[str, ...]) -> set[str]:
    """The parameters a record's runs logged, less the labels, the seed, ``ignore`` and where and on what
    data they ran (``env.*``, data hashes: named as drift, never a reason not to pair)."""
    skip = (*NOT_CONFIG, *ignore)
    return {k for t in record.trials for k in t.params if not k.startswith(skip) and not is_identity(k)}


def finished(record: Record, metric: str, names: frozenset[str]) -> dict[tuple[str, int], tuple[str, float]]:
    """(configuration, seed) -> (point label, metric) of each finished trial that logged the metric; a run
    that stands for identical points of several ablations counts once."""
    runs: dict[str, Trial] = {}
    for trial in record.trials:
        if trial.ok and finite(trial.metrics.get(metric)) and trial.seed is not None:
            runs.setdefault(trial.run_id, trial)
    return {
        (config_key(t, names), t.seed): (f"{t.ablation}[{t.point}]", t.metrics[metric]) for t in runs.values()
    }


def paired(a: list[float], b: list[float]) -> dict[str, float]:
    """Mean of b - a, its Student-t CI and the paired t-test's p (nan below two pairs or with no spread)."""
    diff = np.asarray(b) - np.asarray(a)
    row = {
        "n": len(diff),
        "mean_a": float(np.mean(a)),
        "mean_b": float(np.mean(b)),
        "diff": float(diff.mean()),
    }
    if len(diff) < 2 or np.ptp(diff) == 0:  # a t statistic needs a spread of the differences
        return row | {"ci_low": math.nan, "ci_high": math.nan, "p": math.nan}
    test = sps.ttest_rel(b, a)
    ci = test.confidence_interval(CONFIDENCE)
    return row | {"ci_low": float(ci.low), "ci_high": float(ci.high), "p": float(test.pvalue)}


def compare(a: Record, b: Record, metric: str = DEFAULT_METRIC, ignore: tuple[str, ...] = ()) -> Comparison:
    """Pair the finished trials of ``a`` and ``b`` by configuration and seed; one row per shared point."""
    # a parameter one record's runs have not logged at all (a field a newer clsr added) cannot tell
    # points apart: only the parameters both logged pair trials
    names_a, names_b = param_names(a, ignore), param_names(b, ignore)
    names = frozenset(names_a & names_b)
    left, right = finished(a, metric, names), finished(b, metric, names)
    if not left and not right:
        known = sorted({m for t in (*a.trials, *b.trials) for m in t.metrics if m.startswith("test_")})
        raise NoStudyRuns(
            f"--metric {metric}: no finished trial of either record logged it; logged: "
            f"{', '.join(known) or 'no test_ metric'}"
        )
    labels = {cfg: label for (cfg, _), (label, _) in left.items()}
    labels_b = {cfg: label for (cfg, _), (label, _) in right.items()}
    shared = {cfg for cfg, seed in left if (cfg, seed) in right}
    rows = []
    for cfg in (c for c in dict.fromkeys(c for c, _ in left) if c in shared):
        seeds = sorted(s for c, s in left if c == cfg and (c, s) in right)
        name = labels[cfg] + ("" if labels_b[cfg] == labels[cfg] else f" = B's {labels_b[cfg]}")
        values_a = [left[(cfg, s)][1] for s in seeds]
        values_b = [right[(cfg, s)][1] for s in seeds]
        rows.append({"point": name, "seeds": ",".join(map(str, seeds)), **paired(values_a, values_b)})
    table = pd.DataFrame(rows, columns=[*COLUMNS[:-1]])
    table["p_holm"] = holm(table["p"].tolist())  # the report's Holm: nan (no test) is no comparison
    only_a = sorted({label for cfg, label in labels.items() if cfg not in shared})
    only_b = sorted({label for cfg, label in labels_b.items() if cfg not in shared})
    differs = {
        label: differing(configuration(a, label, names), configuration(b, label, names))
        for label in sorted(set(only_a) & set(only_b))
    }
    only_a, only_b = [x for x in only_a if x not in differs], [x for x in only_b if x not in differs]
    return Comparison(
        table,
        only_a,
        only_b,
        metric,
        sorted(names_a - names),
        sorted(names_b - names),
        differs,
        record_drift(a, b),
    )


def record_drift(a: Record, b: Record) -> list[str]:
    """The drift between the records' trials, and within each record whose trials ran in several
    environments (its side of every row pools them)."""
    lines = drift_lines(drift(a.trials, b.trials))
    for side, record in (("A", a), ("B", b)):
        if several := mixed(record.trials):
            lines.append(f"{side}'s trials ran in {several}")
    return lines


def configuration(record: Record, label: str, names: frozenset[str]) -> dict[str, str]:
    """The compared parameters of the first trial of ``record`` whose label is ``label``."""
    trial = next(t for t in record.trials if f"{t.ablation}[{t.point}]" == label)
    return {k: v for k, v in trial.params.items() if k in names}


def differing(a: dict[str, str], b: dict[str, str]) -> list[tuple[str, str, str]]:
    """(parameter, A's value, B's value) of each parameter whose value differs ('-': not logged)."""
    return [(k, a.get(k, "-"), b.get(k, "-")) for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]


def render(comparison: Comparison, a: Record, b: Record) -> str:
    """The comparison as terminal text: the paired table, then the points only one record holds."""
    lines = [
        f"A: {a.name}",
        f"B: {b.name}",
        f"{comparison.metric}: B - A per point over the seeds both finished; {CONFIDENCE:.0%} CI (Student t), "
        f"paired t-test p, Holm-adjusted across points",
        *comparison.drift,
        "",
    ]
    if comparison.table.empty:
        lines.append("(no point with a seed both records finished)")
    else:
        with warnings.catch_warnings(), pd.option_context("display.width", 200, "display.max_columns", 20):
            warnings.simplefilter("ignore")
            lines.append(comparison.table.to_string(index=False, na_rep="-", float_format=_number))
    for side, points in (("A", comparison.only_a), ("B", comparison.only_b)):
        if points:
            lines.append(f"\nonly in {side} ({len(points)}): " + ", ".join(points))
    if comparison.differs:
        lines.append(
            f"\nin both, not paired ({len(comparison.differs)}): another configuration (--ignore <prefix> "
            f"pairs them where a difference does not matter), or no seed both finished:"
        )
        for label, changes in comparison.differs.items():
            shown = "; ".join(f"{k} {va} (A) / {vb} (B)" for k, va, vb in changes[:MAX_DIFFERENCES])
            more = f"; and {len(changes) - MAX_DIFFERENCES} more" if len(changes) > MAX_DIFFERENCES else ""
            lines.append(f"  {label}: {shown or 'the same configuration, no seed both finished'}{more}")
    for side, names in (("A", comparison.params_only_a), ("B", comparison.params_only_b)):
        if names:
            lines.append(f"\nparameters only {side}'s runs logged (not used to pair): " + ", ".join(names))
    return escape.terminal("\n".join(lines))  # labels and parameter names are the record's: shown, not obeyed


def _number(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 0.01 and value != 0 else f"{value:.4f}"


def compare_records(
    study_a: str,
    study_b: str,
    tracking_uri: str | None = None,
    tracking_uri_b: str | None = None,
    run_a: str | None = None,
    run_b: str | None = None,
    metric: str = DEFAULT_METRIC,
    ignore: tuple[str, ...] = (),
) -> tuple[Comparison, Record, Record]:
    """Read both records and compare them; one study without ``run_a``/``run_b`` compares its two newest
    records (A the earlier)."""
    b = Record.read(study_b, tracking_uri_b or tracking_uri, run_b)
    same_store = tracking_uri_b in (None, tracking_uri)
    if run_a is None and run_b is None and same_store and _same_study(study_a, study_b):
        run_a = previous_record(b.study, resolve_tracking_uri(_uri_of(study_b, tracking_uri)))
    a = Record.read(study_a, tracking_uri, run_a)
    return compare(a, b, metric, ignore), a, b


def _same_study(study_a: str, study_b: str) -> bool:
    return study_name_and_uri(study_a)[0] == study_name_and_uri(study_b)[0]


def _uri_of(study: str, tracking_uri: str | None) -> str | None:
    return tracking_uri or study_name_and_uri(study)[1]
