"""Which ablated keys matter, with uncertainty: the report's effects tables.

A grid ablation over two or more keys with seeds as replicates gets an n-way ANOVA (statsmodels'
``ols`` + ``anova_lm``, type II sums of squares, all interactions), and each term's partial eta squared
SS_term / (SS_term + SS_residual) with a 95 % percentile bootstrap interval from
``scipy.stats.bootstrap``: every cell (one combination of the keys) is one sample, so the seeds are
resampled within cells and the design stays as planned. A sampled ablation (random/optuna search) gets
Optuna's fANOVA parameter importance over its finished trials, rebuilt as an in-memory Optuna study.
Only the glue is written here (cells to a DataFrame, a formula, the study's distributions to Optuna's):
the statistics are the libraries'.
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from clsr.study.spec.space import typed_value

CONFIDENCE = 0.95
N_RESAMPLES = 499  # percentile ends; each resample refits (~10 ms), so 499 keeps a grid to seconds
BOOTSTRAP = "scipy.stats.bootstrap, percentile, 499 resamples of the seeds within each cell, seed 0"
ANOVA = "statsmodels ols + anova_lm(typ=2), all interactions, seeds as replicates"
IMPORTANCE = "optuna.importance.get_param_importances, FanovaImportanceEvaluator(seed=0)"
RESIDUAL = "Residual"


@dataclass
class Term:
    """One row of the ANOVA table with its partial eta squared and the bootstrap interval."""

    term: str  # the ablated keys, joined by " x " for an interaction
    sum_sq: float
    df: float
    f: float
    p_value: float
    partial_eta_sq: float
    ci_low: float = math.nan
    ci_high: float = math.nan


@dataclass
class Effects:
    """An ablation's effects: ``kind`` anova / importance / skipped (``reason`` says why)."""

    kind: str
    method: str = ""
    terms: list[Term] = field(default_factory=list)
    importances: dict[str, float] = field(default_factory=dict)
    residual_df: float = math.nan
    reason: str = ""


def skipped(reason: str) -> Effects:
    return Effects("skipped", reason=reason)


# --- grids: ANOVA ------------------------------------------------------------------------------------


def grid_frame(cells: Sequence[tuple[dict[str, Any], Sequence[float]]]) -> pd.DataFrame:
    """One row per replicate: the keys (as strings: levels are categories) and ``y``."""
    records = [{**{k: str(v) for k, v in keys.items()}, "y": float(y)} for keys, ys in cells for y in ys]
    return pd.DataFrame.from_records(records)


def factors_of(cells: Sequence[tuple[dict[str, Any], Sequence[float]]]) -> list[str]:
    """The keys every cell sets that take two or more values (a constant key is no factor)."""
    if not cells:
        return []
    shared = set.intersection(*(set(keys) for keys, _ in cells))
    order = list(cells[0][0])
    return [k for k in order if k in shared and len({repr(keys[k]) for keys, _ in cells}) > 1]


def why_not_anova(df: pd.DataFrame, factors: list[str]) -> str:
    """'' when the grid can be analysed, else the one-line reason."""
    if len(factors) < 2:
        return f"no two-way ANOVA: the grid varies {len(factors)} key(s), it needs 2 or more"
    if df.empty:
        return "no ANOVA: no finished trials"
    sizes = df.groupby(factors).size()
    full = math.prod(df[f].nunique() for f in factors)
    if len(sizes) < full:
        return (
            f"no ANOVA: {full - len(sizes)} of the {full} combinations of {', '.join(factors)} have no "
            f"finished trial (not planned, or not finished)"
        )
    if (sizes < 2).all():
        return "no ANOVA: no replicates (one seed per cell), so no residual to test against"
    return ""


def formula(n: int) -> str:
    """``y ~ C(f0) * C(f1) * ...``: keys are renamed f0.. because dotted names are no formula terms."""
    return "y ~ " + " * ".join(f"C(f{i})" for i in range(n))


def fit(df: pd.DataFrame, factors: list[str]) -> Any:
    """The OLS fit of the full factorial model (statsmodels' formula API)."""
    from statsmodels.formula.api import ols

    renamed = df.rename(columns={f: f"f{i}" for i, f in enumerate(factors)})
    return ols(formula(len(factors)), data=renamed).fit()


def anova_of(fitted: Any, factors: list[str]) -> pd.DataFrame:
    """statsmodels' type II ANOVA table, its terms renamed to the keys (``a x b`` for interactions)."""
    from statsmodels.stats.anova import anova_lm

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # a perfect fit (no within-cell spread) warns of a zero division
        table = anova_lm(fitted, typ=2)
    names = {f"C(f{i})": f for i, f in enumerate(factors)}
    table.index = [" x ".join(names.get(part, part) for part in str(t).split(":")) for t in table.index]
    return table


def anova_table(df: pd.DataFrame, factors: list[str]) -> pd.DataFrame:
    """The type II ANOVA table of ``y`` on the keys and all their interactions."""
    return anova_of(fit(df, factors), factors)


def partial_eta_squared(table: pd.DataFrame) -> dict[str, float]:
    """SS_term / (SS_term + SS_residual) for every term of an ANOVA table."""
    residual = float(table.loc[RESIDUAL, "sum_sq"])
    return {
        str(t): float(ss / (ss + residual)) if ss + residual > 0 else math.nan
        for t, ss in table["sum_sq"].items()
        if t != RESIDUAL
    }


def refit(fitted: Any, y: np.ndarray) -> Any:
    """The same formula model fitted to new responses: resampling within cells keeps the design (the
    cells and their sizes), so the design matrix and its term layout are reused instead of re-parsing
    the formula per resample (statsmodels' formula parsing dominates the cost)."""
    model = copy.copy(fitted.model)
    model.endog = model.wendog = y
    return model.fit()


def bootstrap_eta(df: pd.DataFrame, factors: list[str], seed: int = 0) -> dict[str, tuple[float, float]]:
    """Percentile intervals of every term's partial eta squared, resampling the replicates within cells
    (scipy.stats.bootstrap with one sample per cell)."""
    from scipy.stats import bootstrap

    base = fit(df, factors)
    where = list(df.groupby(factors, sort=True).indices.values())  # row positions of each cell
    samples = [df["y"].to_numpy()[rows] for rows in where]
    terms = [t for t in anova_of(base, factors).index if t != RESIDUAL]

    def statistic(*ys: np.ndarray) -> np.ndarray:
        y = np.empty(len(df))
        for rows, values in zip(where, ys, strict=True):
            y[rows] = values
        eta = partial_eta_squared(anova_of(refit(base, y), factors))
        return np.array([eta[t] for t in terms])

    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")  # a degenerate resample (all one value) gives a nan, not an error
        res = bootstrap(samples, statistic, n_resamples=N_RESAMPLES, method="percentile",
                        vectorized=False, confidence_level=CONFIDENCE, rng=np.random.default_rng(seed))  # fmt: skip
    low, high = np.atleast_1d(res.confidence_interval.low), np.atleast_1d(res.confidence_interval.high)
    return {t: (float(lo), float(hi)) for t, lo, hi in zip(terms, low, high, strict=True)}


def grid_effects(cells: Sequence[tuple[dict[str, Any], Sequence[float]]], seed: int = 0) -> Effects:
    """The ANOVA of a grid's cells (key values, the seeds' values), or why there is none."""
    factors = factors_of(cells)
    distinct = {tuple(repr(keys[f]) for f in factors) for keys, _ in cells}
    if len(factors) >= 2 and len(distinct) < len(cells):
        return skipped(f"no ANOVA: rows differ in keys besides {', '.join(factors) or 'none'} (not a grid)")
    df = grid_frame(cells) if factors else pd.DataFrame()
    if reason := why_not_anova(df, factors):
        return skipped(reason)
    try:
        return anova_effects(df, factors, seed)
    except (ValueError, np.linalg.LinAlgError) as err:  # a design statsmodels cannot fit: say so, go on
        return skipped(f"no ANOVA: {type(err).__name__}: {err}"[:200])


def anova_effects(df: pd.DataFrame, factors: list[str], seed: int) -> Effects:
    """The ANOVA table, partial eta squared and their bootstrap intervals of an analysable grid."""
    table = anova_table(df, factors)
    eta = partial_eta_squared(table)
    # scipy.stats.bootstrap needs two or more replicates in every sample (cell)
    replicated = bool((df.groupby(factors).size() >= 2).all())
    intervals = bootstrap_eta(df, factors, seed) if replicated else {t: (math.nan, math.nan) for t in eta}
    terms = [
        Term(
            str(t),
            float(r["sum_sq"]),
            float(r["df"]),
            float(r["F"]),
            float(r["PR(>F)"]),
            eta[str(t)],
            *intervals[str(t)],
        )  # fmt: skip
        for t, r in table.iterrows()
        if t != RESIDUAL
    ]
    return Effects("anova", f"{ANOVA}; partial eta² CI: {BOOTSTRAP}", terms,
                   residual_df=float(table.loc[RESIDUAL, "df"]))  # fmt: skip


# --- sampled ablations: Optuna importance ------------------------------------------------------------


def optuna_distribution(spec: Any) -> Any:
    """A study file's ``Distribution`` (uniform/loguniform/randint/choice) as Optuna's."""
    from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

    if spec.uniform:
        return FloatDistribution(*spec.uniform)
    if spec.loguniform:
        return FloatDistribution(*spec.loguniform, log=True)
    if spec.randint:
        return IntDistribution(*spec.randint)
    return CategoricalDistribution(spec.choice)


def coerce(spec: Any, text: str) -> Any:
    """A parameter as MLflow logged it (a string) back to a value of its distribution
    (``clsr.study.spec.space.typed_value``); a choice no longer in the space stays its text, which the
    importance then refuses with a line."""
    try:
        return typed_value(spec, text)
    except ValueError:
        return text


def importance_study(space: dict[str, Any], trials: Sequence[tuple[dict[str, Any], float]]):
    """An in-memory Optuna study of the finished trials (parameters, value); maximised, as scores are."""
    import optuna
    from optuna.trial import create_trial

    distributions = {k: optuna_distribution(v) for k, v in space.items()}
    study = optuna.create_study(direction="maximize")
    study.add_trials(
        [create_trial(params=p, distributions=distributions, value=v) for p, v in trials]
    )  # fmt: skip
    return study


def sampled_effects(
    space: dict[str, Any], trials: Sequence[tuple[dict[str, Any], float]], seed: int = 0
) -> Effects:
    """fANOVA importance of the sampled keys over ``trials`` (their parameters and main metric)."""
    import optuna
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances

    if len(space) < 2:
        return skipped(f"no parameter importance: {len(space)} sampled key(s), it needs 2 or more")
    if len(trials) < 2:
        return skipped(f"no parameter importance: {len(trials)} finished trial(s), it needs 2 or more")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:  # a logged value outside the file's distribution (the space was edited since): say so, go on
        study = importance_study(space, trials)
    except ValueError as err:
        return skipped(f"no parameter importance: {err}"[:200])
    importances = get_param_importances(study, evaluator=FanovaImportanceEvaluator(seed=seed))
    return Effects("importance", IMPORTANCE, importances={k: float(v) for k, v in importances.items()})
