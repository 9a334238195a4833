"""How a study's trials are run on Tune: the resources of each trial, the search that chooses points, the
scheduler that stops trials early, and how the report judges rows against the papers."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from clsr.study.spec.budget import wall_seconds
from clsr.study.spec.strict import MAX_TRIALS, Strict


class Resources(Strict):
    workers_per_trial: int = Field(
        1,
        ge=0,
        le=10_000,
        description="Ray Train workers (DDP processes) per trial; 0 runs the trial in its Tune process "
        "(Ray Train local mode: no worker-group start-up, for small single-device trials)",
    )
    cpus_per_worker: float = Field(1.0, gt=0, le=10_000)
    gpus_per_worker: float = Field(
        0.0, ge=0, le=1_024, description="fractions below 1 let small trials share a GPU"
    )

    @field_validator("gpus_per_worker")
    @classmethod
    def _whole_above_one(cls, gpus: float) -> float:
        if gpus > 1 and gpus != int(gpus):
            raise ValueError("more than one GPU per worker must be a whole number")
        return gpus

    @model_validator(mode="after")
    def _one_gpu_per_rank(self) -> Resources:
        # DDP ranks sharing a GPU: NCCL refuses two ranks on one device, and Ray would pack them there
        if 0 < self.gpus_per_worker < 1 and self.workers_per_trial > 1:
            raise ValueError(
                f"gpus_per_worker {self.gpus_per_worker:g} with workers_per_trial {self.workers_per_trial} "
                f"would put several DDP ranks on one GPU (NCCL refuses); use gpus_per_worker: 1 with several "
                f"workers, or workers_per_trial: 1 (or 0) to share GPUs between trials"
            )
        return self


SAMPLERS = ("tpe", "cmaes", "gp", "nsga2", "random")
MULTI_OBJECTIVE_SAMPLERS = ("tpe", "gp", "nsga2", "random")  # CmaEsSampler optimises one objective
SCHEDULERS = ("fifo", "asha", "hyperband", "median", "pbt")
GP_OPTUNA = (3, 6)  # optuna.samplers.GPSampler came with Optuna 3.6


PRUNE_TESTS = ("wilcoxon", "ttest")


def wilcoxon_min_seeds(p: float) -> int:
    """The fewest paired seeds at which a one-sided exact Wilcoxon signed-rank test can reach p below
    ``p``: its smallest p with n pairs is 2^-n (every pair on one side)."""
    n = 1
    while 0.5**n >= p:
        n += 1
    return n


class PruneSeeds(Strict):
    """Seed-aware early stopping of a sampled search: a configuration's seeds run one after another,
    and after each a one-sided paired test against the best configuration run on every seed so far
    stops it when it is worse (its later seeds never run)."""

    test: Literal["wilcoxon", "ttest"] = Field(
        description="wilcoxon: Optuna's WilcoxonPruner (signed-rank, no normality assumed; its smallest p "
        "with n seeds is 2^-n, so p 0.1 needs 4 seeds done and a 5th to save); ttest: a paired one-sided "
        "t-test (scipy.stats.ttest_rel), which can prune after 2 seeds but assumes roughly normal "
        "differences"
    )
    p: float = Field(0.1, gt=0, lt=1, description="a configuration is pruned when the test's p is below it")
    min_seeds: int = Field(
        2, ge=2, le=1_000, description="seeds a configuration runs before it may be pruned (at least 2)"
    )

    def fewest_seeds(self) -> int:
        """The seeds done before the test can prune at all."""
        return max(self.min_seeds, wilcoxon_min_seeds(self.p) if self.test == "wilcoxon" else 2)


class Search(Strict):
    """How points are chosen: every grid point, or ``num_samples`` configurations of each sampled
    ablation's space, each run once per seed (the searcher sees the mean over seeds)."""

    algorithm: Literal["grid", "random", "optuna"] = Field(
        "grid",
        description="grid: every point x seeds. random: Tune's random sampling; each sampled "
        "configuration runs with every seed (the same values). optuna: Optuna suggests a "
        "configuration, Tune's Repeater runs it once per seed and tells Optuna the mean over the seeds "
        "of the study's metric (a seed that reported none is left out of the mean)",
    )
    num_samples: int = Field(
        1,
        ge=1,
        le=MAX_TRIALS,
        description="configurations sampled per ablation for random/optuna (at most 100,000); each runs "
        "once per seed, so an ablation runs num_samples x seeds trials",
    )
    sampler: Literal["tpe", "cmaes", "gp", "nsga2", "random"] | None = Field(
        None,
        description="optuna: the Optuna sampler (tpe, cmaes, gp, nsga2, random; default tpe), seeded with "
        "the ablation's first seed; several objectives: tpe, gp, nsga2 or random",
    )
    n_startup_trials: int | None = Field(
        None,
        ge=0,
        le=MAX_TRIALS,
        description="optuna tpe/cmaes/gp: configurations sampled at random before the model guides "
        "(default: the sampler's own, 10)",
    )
    points_to_evaluate: list[dict[str, Any]] = Field(
        default_factory=list,
        description="configurations ({space key: value}) run first, before any sampled one; they count "
        "towards num_samples",
    )
    prune_seeds: PruneSeeds | None = Field(
        None,
        description="random/optuna with several seeds, one metric, scheduler fifo: run a configuration's "
        "seeds in turn and stop it once a paired test says it is worse than the best fully-run one "
        "(random then samples with Optuna's RandomSampler); pruned configurations are tagged "
        "clsr.pruned and left out of confirm",
    )

    @model_validator(mode="after")
    def _fits_algorithm(self) -> Search:
        if self.algorithm != "optuna" and self.sampler is not None:
            raise ValueError(
                f"search.sampler is for algorithm optuna (given algorithm: {self.algorithm}); allowed "
                f"samplers: {', '.join(SAMPLERS)}"
            )
        if self.n_startup_trials is not None and (self.sampler or "tpe") in ("random", "nsga2"):
            raise ValueError(
                "search.n_startup_trials is for optuna samplers tpe, cmaes, gp (given: "
                f"algorithm {self.algorithm}, sampler {self.sampler})"
            )
        if self.algorithm == "grid" and self.prune_seeds is not None:
            raise ValueError("search.prune_seeds is for algorithm random or optuna (given: grid)")
        if self.algorithm == "grid" and self.points_to_evaluate:
            raise ValueError("search.points_to_evaluate is for algorithm random or optuna (given: grid)")
        if self.sampler == "gp":
            check_gp_sampler()
        return self


def check_gp_sampler() -> None:
    """Optuna's GPSampler exists from 3.6 on; an older install is refused here, not in the first trial."""
    import optuna

    version = tuple(int(p) for p in re.findall(r"\d+", optuna.__version__)[:2])
    if version < GP_OPTUNA:
        raise ValueError(
            f"search.sampler gp needs optuna>=3.6 (installed: {optuna.__version__}); use tpe, cmaes or random"
        )


class Scheduler(Strict):
    """When trials are stopped early. fifo: never. asha, hyperband, median: on the study's metric at
    each evaluation (``step`` is the time axis). pbt is refused (see its message)."""

    type: Literal["fifo", "asha", "hyperband", "median", "pbt"] = Field(
        "fifo",
        description="fifo: none; asha: ASHAScheduler; hyperband: HyperBandScheduler; median: "
        "MedianStoppingRule; pbt: refused (trials cannot take another trial's checkpoint with a new "
        "config). Each stopped seed of a sampled configuration still counts in its mean",
    )
    max_t: int | None = Field(
        None,
        ge=1,
        le=10**9,
        description="asha, hyperband: most steps a trial may run (default: its trainer.max_steps)",
    )
    grace_period: int = Field(
        1, ge=1, le=10**9, description="asha, median: steps before a trial may be stopped"
    )
    reduction_factor: float = Field(2.0, gt=1, description="asha, hyperband: the halving rate (eta)")
    min_samples_required: int = Field(
        3, ge=1, le=MAX_TRIALS, description="median: trials reporting at a step before any is stopped"
    )

    @model_validator(mode="after")
    def _no_pbt(self) -> Scheduler:
        if self.type == "pbt":
            raise ValueError(
                "scheduler.type pbt is refused: a trial cannot continue from another trial's checkpoint "
                "with a new config (its MLflow run, parameters and Train checkpoint folder belong to one "
                "configuration); allowed: fifo, asha, hyperband, median"
            )
        return self


LIVE_EVERY_MIN_S = 10.0  # a live report refreshed more often would spend the driver on rebuilding it


class ReportOptions(Strict):
    """How ``platform study report`` judges the rows against the papers' numbers, and how often the
    running study's driver refreshes its partial report on the parent run."""

    tolerance: float = Field(
        0.5,
        gt=0,
        le=100,
        description="equivalence margin, in points of the metric (scores x 100): a row is reproduced when "
        "a two one-sided tests (TOST) p < 0.05 puts its mean over seeds within paper ± tolerance",
    )
    live_every: str | None = Field(
        "5m",
        description="while the study runs, the driver rebuilds the report from the trials finished so far "
        "and logs it on the parent run (report/, marked 'partial: n of m trials') at most this often and at "
        "each wave's end, e.g. '5m', '30s' (units s, m, h, d; at least 10s); the final report replaces it "
        "at the end; null: no live report",
    )

    @field_validator("live_every", mode="before")
    @classmethod
    def _interval(cls, every: object) -> object:
        if every is not None and wall_seconds(str(every)) < LIVE_EVERY_MIN_S:
            raise ValueError(
                f"should be at least {LIVE_EVERY_MIN_S:.0f}s (each refresh rebuilds and uploads the whole "
                f"report), e.g. '30s', '5m'; null: no live report"
            )
        return every

    @property
    def live_every_s(self) -> float | None:
        """``live_every`` in seconds; None: no live report."""
        return None if self.live_every is None else wall_seconds(self.live_every)
