"""The report's plots, as PNG files: per ablation the main metric against the ablated value (seeds as
dots, the mean with its CI, the paper's numbers), the learning curves of every point (training loss
and the dev score it selected on, from MLflow's metric histories: the mean over seeds with its CI band
per step), and the Pareto front of a study searched on several objectives. Figures are drawn on
matplotlib's Agg canvas, without pyplot's global state, so reports can be built in threads and on
servers.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from mlflow.tracking import MlflowClient
from scipy.stats import t as t_dist

from clsr.study.analyse.rows import AblationReport, Row
from clsr.study.analyse.runs import OK, Trial
from clsr.study.spec.schema import Study
from clsr.study.stats.seeds import CONFIDENCE
from clsr.tracking.escape import plot_label
from clsr.tracking.tags import OPENED_TAG


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
        ax.set_xlabel(plot_label(key))
        for xi in (xi for xi, row in zip(x, rows, strict=True) if row.paper_choice):
            ax.axvline(xi, ls=":", color="0.4", label="paper's choice", zorder=1)
        if min(x) > 0 and max(x) / min(x) >= 16:
            ax.set_xscale("log")
    else:
        ax.set_xticks(x, [plot_label(r.display_label + (" (paper)" if r.paper_choice else "")) for r in rows],
                      rotation=30 if len(rows) > 3 else 0, ha="right" if len(rows) > 3 else "center")  # fmt: skip
    ax.set_ylabel(plot_label(m))
    ax.set_title(plot_label(f"{ab.name}: {m} over seeds"))
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
    if front.near:
        near = np.array([front.values[label][:2] for label in front.near])
        ax.scatter(near[:, 0], near[:, 1], s=36, facecolors="none", edgecolors="tab:orange", zorder=4,
                   label="near the front (CIs overlap)")  # fmt: skip
    ax.set_xlabel(plot_label(f"{mx} ({'higher' if mode_x == 'max' else 'lower'} is better)"))
    ax.set_ylabel(plot_label(f"{my} ({'higher' if mode_y == 'max' else 'lower'} is better)"))
    ax.set_title(plot_label(f"{ab.name}: configurations, means over seeds"))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    return path


def dev_metric(ab: AblationReport, study: Study) -> str | None:
    """The dev score the trials selected on (``dev_stsb``/``dev_sickr``), for the learning curves."""
    present = {k for t in ab.trials for k in t.metrics}
    wanted = [m.removeprefix("best_") for m in (ab.main_metric, study.metric) if m.startswith("best_dev_")]
    return next((m for m in [*wanted, *sorted(present)] if m in present and m.startswith("dev_")), None)


Histories = dict[str, dict[str, np.ndarray]]  # run id -> metric -> (steps, values), sorted by step
KeptHistories = dict[tuple[str, str], dict[str, np.ndarray]]  # (run id, opening) -> metric -> history


def histories(
    client: MlflowClient, trials: list[Trial], keys: list[str], kept: KeptHistories | None = None
) -> Histories:
    """run id -> metric -> (steps, values), sorted by step, for the metrics each run logged. ``kept``: the
    histories of finished trials, kept across a live report's refreshes, read once and stored there under
    the run and its last opening (``OPENED_TAG``). Only finished ones: an interrupted or failed run is
    reopened when Tune resumes or retries its trial (a new opening, so a kept history is read again)."""
    out: Histories = {}
    for trial in trials:
        stamp = (trial.run_id, trial.tags.get(OPENED_TAG, ""))
        keep = kept is not None and trial.status == OK
        for key in keys:
            if key not in trial.metrics:
                continue
            if keep and key in kept.get(stamp, {}):
                out.setdefault(trial.run_id, {})[key] = kept[stamp][key]
                continue
            points = sorted((m.step, m.value) for m in client.get_metric_history(trial.run_id, key))
            out.setdefault(trial.run_id, {})[key] = np.array(points, dtype=float).reshape(-1, 2)
            if keep:
                kept.setdefault(stamp, {})[key] = out[trial.run_id][key]
    return out


@dataclass(frozen=True)
class SeedBand:
    """One point's curve over its seeds: per step the mean, its Student-t ``CONFIDENCE`` interval (nan
    where fewer than two seeds logged the step: no spread, no band) and how many seeds logged it."""

    steps: np.ndarray
    mean: np.ndarray
    low: np.ndarray
    high: np.ndarray
    n: np.ndarray


def seed_band(curves: list[np.ndarray]) -> SeedBand:
    """The mean and t-interval over seeds, step by step, of ``curves`` ((steps, values) arrays, one per
    seed); a value that is not finite (a diverged loss) counts as not logged."""
    steps = np.unique(np.concatenate([c[:, 0] for c in curves]))
    table = np.full((len(curves), len(steps)), np.nan)
    for i, curve in enumerate(curves):
        table[i, np.searchsorted(steps, curve[:, 0])] = curve[:, 1]
    table[~np.isfinite(table)] = np.nan
    n = np.sum(np.isfinite(table), axis=0)
    with warnings.catch_warnings(), np.errstate(invalid="ignore", divide="ignore"):
        warnings.simplefilter("ignore", RuntimeWarning)  # a step of one seed: no std, nan as wanted
        mean = np.nanmean(table, axis=0)
        half = t_dist.ppf((1 + CONFIDENCE) / 2, n - 1) * np.nanstd(table, axis=0, ddof=1) / np.sqrt(n)
    half = np.where(n >= 2, half, np.nan)
    return SeedBand(steps, mean, mean - half, mean + half, n)


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


def _series(curves: Histories, trial: Trial, key: str, windows: set[int]) -> np.ndarray | None:
    """The trial's (steps, values) of ``key`` as drawn: the loss as its running mean."""
    data = curves.get(trial.run_id, {}).get(key)
    if data is None or not len(data):
        return None
    values, window = _smooth(data[:, 1]) if key == "loss" else (data[:, 1], 1)
    windows.add(window)
    return np.column_stack([data[window - 1 :, 0], values])


def plot_curves(
    ab: AblationReport, study: Study, client: MlflowClient, path: Path, kept: KeptHistories | None = None
) -> Path | None:
    """Training loss and the dev score against the step: a colour per point, its finished seeds' mean
    with a band of its 95% CI per step (a point with one finished seed: its line; an ``average_over``
    row: over its folds' runs), dashed lines for trials that did not finish; steps on whole numbers,
    the loss on a log axis where it spans two decades or more. ``kept``: finished trials' histories
    across refreshes (``histories``)."""
    from matplotlib import colormaps
    from matplotlib.ticker import MaxNLocator

    dev = dev_metric(ab, study)
    keys = ["loss"] + ([dev] if dev else [])
    curves = histories(client, ab.trials, keys, kept)
    if not curves:
        return None
    fig, axes = _figure(12.0, 4.2, len(keys))
    colours = colormaps["tab10" if len(ab.rows) <= 10 else "tab20"]
    windows, drawn = {1}, {key: [] for key in keys}
    for i, row in enumerate(ab.rows):
        colour, label = colours(i % colours.N), plot_label(row.label)
        for ax, key in zip(axes, keys, strict=True):
            done = [s for t in row.runs() if t.ok and (s := _series(curves, t, key, windows)) is not None]
            if done:
                band = seed_band(done)
                marker = "o" if key != "loss" and len(band.steps) < 30 else None
                ax.plot(band.steps, band.mean, color=colour, lw=1.2, marker=marker, ms=3, label=label)
                ax.fill_between(band.steps, band.low, band.high, color=colour, alpha=0.2, lw=0)
                drawn[key].append(band.mean)
                label = None
            for trial in (t for t in row.runs() if not t.ok):
                if (series := _series(curves, trial, key, windows)) is not None:
                    ax.plot(series[:, 0], series[:, 1], color=colour, lw=1.0, ls="--", label=label)
                    drawn[key].append(series[:, 1])
                    label = None
    smoothed = f" (running mean of {max(windows)} steps)" if max(windows) > 1 else ""
    for ax, key in zip(axes, keys, strict=True):
        ax.set_xlabel("step")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole: no tick at 4.5
        log = key == "loss" and spans_decades(drawn[key])
        if log:
            ax.set_yscale("log")
        ax.set_ylabel(plot_label(key + (" (log scale)" if log else "")))
        ax.set_title(plot_label(f"{key}{smoothed if key == 'loss' else ''}"))
        ax.grid(alpha=0.3)
    handles = [h for ax in axes for h in ax.get_legend_handles_labels()[0]]
    fig.legend(handles=handles, loc="outside lower center", fontsize=7, ncol=min(4, max(1, len(handles))))
    fig.suptitle(
        f"{ab.name}: learning curves, mean over finished seeds with its {CONFIDENCE:.0%} CI band "
        "(dashed: trial did not finish)"
    )
    fig.savefig(path, dpi=110)
    return path
