"""Study files: the YAML schema as pydantic models (what each key may hold) and the error a study
file's problems are reported with. Reading a file and checking a study as a whole is
``clsr.study.plan.load``; turning it into points, trials, stages and needs is ``clsr.study.plan.resolve``.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from clsr.config.trial import Seed, check_seed
from clsr.methods import get_method
from clsr.study.spec.paths import absolute_in_sections

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
SECTIONS = ("model", "data", "trainer", "method", "eval")
KNOWN_METRICS = (
    "best_dev_stsb", "best_dev_sickr", "dev_stsb", "dev_sickr", "loss_avg",
    "test_sts12", "test_sts13", "test_sts14", "test_sts15", "test_sts16", "test_stsb", "test_sickr",
    "test_sts_avg", "test_sts12_15_avg", "test_transfer_avg", "align", "uniform",
)  # fmt: skip
# reported at every evaluation (what ASHA compares); the others only when a trial ends
STEP_METRICS = ("best_dev_stsb", "best_dev_sickr", "dev_stsb", "dev_sickr", "loss_avg")
Outputs = dict[
    tuple[str, str, int], str
]  # staged studies: (ablation, point label, seed) -> output (a checkpoint URI)
MAX_TRIALS = 100_000  # a study with more trials is refused before any grid is expanded
CONFIRM_TRIALS = 2_000  # `study run`/`resume` of more trials asks for --yes
MAX_SHOWN = 200  # characters of a refused value shown in a problem line


class StudyError(ValueError):
    """A study file is invalid; ``problems`` holds one line per problem."""

    def __init__(self, source: str, problems: list[str]):
        self.source, self.problems = source, problems
        lines = "\n".join(f"  {source}: {p}" for p in problems)
        super().__init__(f"{len(problems)} problem(s) in study {source}:\n{lines}")


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True, allow_inf_nan=False)


class Distribution(Strict):
    """One sampled hyperparameter for ``random``/``optuna`` search: exactly one of the fields."""

    uniform: tuple[float, float] | None = None
    loguniform: tuple[float, float] | None = None
    randint: tuple[int, int] | None = None
    choice: list[Any] | None = None

    @model_validator(mode="after")
    def _exactly_one(self) -> Distribution:
        given = [k for k, v in self.model_dump().items() if v is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of uniform, loguniform, randint, choice (given: {given or 'none'})"
            )
        bounds = self.uniform or self.loguniform or self.randint
        if bounds and bounds[0] >= bounds[1]:
            raise ValueError(f"lower bound must be below upper bound (given: {list(bounds)})")
        if self.loguniform and self.loguniform[0] <= 0:
            raise ValueError("loguniform bounds must be positive")
        if self.choice and any(isinstance(c, float) and not math.isfinite(c) for c in self.choice):
            raise ValueError(f"choice values must be finite numbers (given: {self.choice})")
        return self


class Point(Strict):
    label: str | None = None
    set: dict[str, Any] = Field(min_length=1, description="dotted.key: value overrides of this point")
    paper: float | dict[str, float] | None = Field(None, description="published number(s) for this point")


class Need(Strict):
    """Where one field of an ablation's trials comes from: the finished trials of an upstream ablation.

    ``by`` set: the field gets a mapping ``{upstream value of <by>: that point's output}`` over the
    upstream points (RCL: ``{φ: entropy-model checkpoint}``). ``by`` unset: the field gets one output,
    of the upstream ablation's only point or of the point labelled ``point``. ``match`` first narrows
    the upstream points to those that set its keys as the trial's own point does (a per-fold chain).
    """

    ablation: str = Field(description="the upstream ablation (grid or points) of the same study")
    by: str | None = Field(None, description="upstream dotted key whose values become the mapping's keys")
    point: str | None = Field(None, description="label of the one upstream point (when it has several)")
    seed: Literal["same"] | int = Field(
        "same", description="same: the upstream trial of the trial's own seed; a number: that seed's"
    )
    output: Literal["checkpoint"] = Field(
        "checkpoint", description="what is filled in: the upstream trial's last checkpoint folder (URI)"
    )
    match: list[str] = Field(
        default_factory=list,
        description="grid keys the upstream point must share with the trial's own point (data.train, "
        "data.fold: the upstream trial of the same FAQ set and fold); the others are chosen as above",
    )

    @field_validator("seed")
    @classmethod
    def _seed_range(cls, seed: str | int) -> str | int:
        return seed if seed == "same" else check_seed(seed)

    @model_validator(mode="after")
    def _by_or_point(self) -> Need:
        if self.by is not None and self.point is not None:
            raise ValueError(
                "give 'by' (a mapping over the upstream points) or 'point' (one of them), not both"
            )
        return self


class Fidelity(Strict):
    """How a table's rows relate to the paper's: one line each in the report."""

    exact: list[str] = Field(default_factory=list, description="row labels run as the paper ran them")
    stand_in: dict[str, str] = Field(
        default_factory=dict,
        description="row label -> what stands in for the paper's data or setting, and why",
    )
    not_expressible: dict[str, str] = Field(
        default_factory=dict, description="paper row -> why it has no row here"
    )


class Confirm(Strict):
    """Tune, then confirm: rerun a sampled ablation's best configurations over this ablation's seeds."""

    of: str = Field(description="the sampled ablation (one with a space) of the same study")
    top_k: int = Field(
        3,
        ge=1,
        le=100,
        description="how many of its best configurations (mean over seeds of the metric; several "
        "objectives: by Pareto front, then the first metric)",
    )


class AdaptiveSeeds(Strict):
    """Adaptive seeds: every row runs ``min`` seeds, then rows still too uncertain get one more seed per
    round, up to ``max`` (``clsr.study.run.adaptive``)."""

    min: int = Field(ge=2, le=100, description="seeds every row runs first")
    max: int = Field(le=100, description="at most this many seeds per row (>= min)")
    until_ci: float = Field(
        gt=0,
        description="the widest allowed half-width of a row's 95 % CI, in points of its main metric; a row "
        "with a paper number also gets seeds while its verdict is inconclusive",
    )
    first: Seed = Field(1, description="seeds are first, first+1, ... first+max-1")

    @model_validator(mode="after")
    def _max_at_least_min(self) -> AdaptiveSeeds:
        if self.max < self.min:
            raise ValueError(f"max: at least min ({self.min}) (given: {self.max})")
        check_seed(self.first + self.max - 1)  # the pool's last seed
        return self

    @property
    def pool(self) -> list[int]:
        """Every seed a row may run, in order."""
        return [self.first + n for n in range(self.max)]


class Ablation(Strict):
    """One table of a paper: a grid, an explicit list of points, a search space, or a confirmation of
    a sampled ablation's best configurations (``confirm``; explicit ``points`` run beside them)."""

    table: str | None = Field(None, description="the paper table it reproduces, e.g. 'SimCSE Table 3'")
    description: str | None = None
    method: str | None = Field(None, description="method of this ablation's trials (default: the study's)")
    base: dict[str, Any] = Field(
        default_factory=dict, description="overrides of the study base for this ablation"
    )
    from_file: str | None = Field(None, alias="from", description="a file under search_spaces/ to start from")
    grid: dict[str, list[Any]] = Field(default_factory=dict)
    points: list[Point] = Field(default_factory=list)
    space: dict[str, Distribution] = Field(default_factory=dict)
    paper_metric: str = Field("dev_stsb", description="the metric the published numbers are")
    paper: dict[str, float | dict[str, float]] = Field(
        default_factory=dict, description="published number(s) per grid point label (per report row)"
    )
    paper_choice: str | None = Field(None, description="label of the row the paper chose")
    reference: str | None = Field(
        None,
        description="label of the row the report tests the others against (paired t-test over seeds); "
        "default: paper_choice, else the first point",
    )
    seeds: list[Seed] | AdaptiveSeeds | None = Field(
        None,
        description="this ablation's seeds (default: the study's); 0 <= seed < 2**32; or adaptive, "
        "{min: 3, max: 10, until_ci: 0.5}: more seeds, round by round, only to rows whose CI is wider "
        "than ±until_ci or whose verdict is inconclusive, up to max",
    )
    needs: dict[str, Need] = Field(
        default_factory=dict,
        description="dotted.key -> upstream ablation whose finished trials fill it (a staged study)",
    )
    average_over: str | None = Field(
        None,
        description="a grid key whose values are parts of one measurement (data.fold: the folds of a "
        "k-fold protocol): the report shows one row per value of the other keys, each seed's value the "
        "mean over this key's points; paper, reference and paper_choice name those rows",
    )
    fidelity: Fidelity | None = Field(
        None,
        description="which rows are exact reproductions (exact: labels), which run on stand-in data or "
        "settings (stand_in: label -> why) and which paper rows have no row here (not_expressible: "
        "paper row -> why); the report prints one line each",
    )
    confirm: Confirm | None = Field(
        None,
        description="rerun the top_k best configurations of the sampled ablation `of` (and this "
        "ablation's points, e.g. the paper's) over this ablation's seeds; the report tests them",
    )

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int] | AdaptiveSeeds | None) -> list[int] | AdaptiveSeeds | None:
        if isinstance(seeds, list) and not seeds:
            raise ValueError("at least one seed")
        if isinstance(seeds, list) and len(set(seeds)) != len(seeds):
            raise ValueError("seeds must be distinct")
        return seeds

    @field_validator("grid")
    @classmethod
    def _non_empty_lists(cls, grid: dict[str, list[Any]]) -> dict[str, list[Any]]:
        empty = [k for k, v in grid.items() if not v]
        if empty:
            raise ValueError(f"grid keys need at least one value (empty: {empty})")
        return grid

    @field_validator("method")
    @classmethod
    def _known_method(cls, method: str | None) -> str | None:
        if method is not None:
            get_method(method)
        return method

    @model_validator(mode="after")
    def _one_kind(self) -> Ablation:
        kinds = [k for k in ("grid", "points", "space") if getattr(self, k)]
        if self.confirm is not None:  # its points are optional: its rows come from the upstream's best
            others = [k for k in kinds if k != "points"]
            if others:
                raise ValueError(
                    f"confirm: a confirm ablation takes points only, not {', '.join(others)} (its "
                    f"configurations come from ablation {self.confirm.of!r}'s best)"
                )
            return self
        if len(kinds) != 1:
            raise ValueError(
                f"an ablation needs exactly one of grid, points, space (given: {kinds or 'none'})"
            )
        return self

    @model_validator(mode="after")
    def _average_over_a_grid_key(self) -> Ablation:
        if self.average_over is not None and self.average_over not in self.grid:
            raise ValueError(
                f"average_over names a key of the ablation's grid (given: {self.average_over!r}; "
                f"allowed: {list(self.grid)})"
            )
        return self


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


class ReportOptions(Strict):
    """How ``platform study report`` judges the rows against the papers' numbers."""

    tolerance: float = Field(
        0.5,
        gt=0,
        le=100,
        description="equivalence margin, in points of the metric (scores x 100): a row is reproduced when "
        "a two one-sided tests (TOST) p < 0.05 puts its mean over seeds within paper ± tolerance",
    )


class Study(Strict):
    """A study file: the trials of one or more ablation tables, and how they run and are recorded."""

    name: str = Field(
        pattern=NAME_PATTERN, description="the MLflow experiment and parent run (letters, digits, _ . -)"
    )
    description: str | None = Field(None, description="one line for the parent run and the report")
    method: str = Field(description="the default method of the ablations (methods.md)")
    base: dict[str, Any] = Field(
        default_factory=dict,
        description="the trial every point starts from: model, data, trainer, method and eval sections "
        "over the method's paper defaults",
    )
    ablations: dict[str, Ablation] = Field(min_length=1, description="the tables, by name")
    seeds: list[Seed] = Field(
        default_factory=lambda: [42],
        min_length=1,
        description="0 <= seed < 2**32, distinct. Every grid point, and every sampled configuration of "
        "random/optuna search, runs once per seed. The default stays one seed, [42], so a quick study "
        "stays quick; the report needs at least 2 for a confidence interval and a verdict, and "
        "`study validate` notes an ablation with published numbers and one seed: give 3 (e.g. "
        "[42, 43, 44]) where a report is wanted",
    )
    metric: str | list[str] = Field(
        "best_dev_stsb",
        description="the trial result that ranks points and trials; a list, e.g. [best_dev_stsb, "
        "test_transfer_avg], searches several objectives at once (optuna, scheduler fifo): Optuna's "
        "multi-objective sampler is told each, the report draws their Pareto front, and the first ranks "
        "trials where one number is needed",
    )
    mode: Literal["max", "min"] | list[Literal["max", "min"]] = Field(
        "max", description="whether a higher metric is better; with several metrics one mode, or one each"
    )
    _several: list[tuple[str, str]] | None = PrivateAttr(None)  # (metric, mode) when several
    search: Search = Field(default_factory=Search)
    report: ReportOptions = Field(
        default_factory=ReportOptions,
        description="how the report judges rows against the papers: `tolerance` (default 0.5, points of "
        "the metric), the equivalence margin of each row's reproduction verdict",
    )
    scheduler: Scheduler = Field(default_factory=Scheduler)
    resources: Resources = Field(default_factory=Resources)
    concurrency: int | None = Field(
        None, ge=1, le=MAX_TRIALS, description="most trials running at once (default: as fit)"
    )
    max_failures: int = Field(
        1, ge=0, le=1_000, description="retries of a crashed trial from its last checkpoint"
    )
    storage_path: str = Field("runs", description="local folder or s3://bucket/prefix for Ray results")
    tracking_uri: str | None = Field(
        None, description="MLflow; default $MLFLOW_TRACKING_URI or sqlite:///mlflow.db"
    )
    system_metrics_interval_s: float | None = Field(
        10.0,
        gt=0,
        description="sample CPU, memory and GPU utilisation into each trial's MLflow run every N seconds "
        "(MLflow system metrics; GPUs need nvidia-ml-py); null: off",
    )
    smoke: dict[str, Any] | None = Field(
        None, description="overrides that --smoke applies: one seed, few steps, small dimensions"
    )
    skip_unavailable: bool = Field(
        False, description="skip points that cannot run here (hub-only models offline) instead of failing"
    )
    trial_timeout_s: float | None = Field(
        None,
        gt=0,
        le=10**7,
        description="stop a trial that runs longer than this (recorded timed_out; the others go on; a "
        "resume continues it from its last checkpoint); null: no limit",
    )
    study_timeout_s: float | None = Field(
        None,
        gt=0,
        le=10**8,
        description="stop the whole study after this long, as Ctrl-C does (exit code 124; resumable)",
    )
    keep_checkpoints: bool = Field(
        False,
        description="keep every finished trial's whole checkpoint (optimizer, scheduler and random "
        "states) once the study has finished; false: each finished trial keeps only what a later study "
        "loads, its last and best weights (about 2x the trained weights instead of 4x)",
    )
    tracking_wait_s: float = Field(
        900.0,
        ge=0,
        le=10**6,
        description="at the study's end, how long to wait for an unreachable MLflow server to take what "
        "trials kept for it; after that `platform study sync` sends it",
    )

    @field_validator("method")
    @classmethod
    def _known_method(cls, method: str) -> str:
        get_method(method)
        return method

    @field_validator("metric", mode="before")
    @classmethod
    def _known_metric(cls, metric: Any) -> Any:
        for name in metric if isinstance(metric, list) else [metric]:
            if name not in KNOWN_METRICS:
                raise ValueError(f"unknown metric {name!r}; allowed: {', '.join(KNOWN_METRICS)}")
        return metric

    @field_validator("mode", mode="before")
    @classmethod
    def _known_mode(cls, mode: Any) -> Any:  # one line for a bad mode, not one per form it may take
        for name in mode if isinstance(mode, list) else [mode]:
            if name not in ("max", "min"):
                raise ValueError("should be 'max' or 'min', or a list of them (one per metric)")
        return mode

    @model_validator(mode="after")
    def _objectives(self) -> Study:
        """A list of metrics: several objectives, kept apart; ``metric``/``mode`` become the first, the
        one every single-number use (ranking, progress, promote) reads."""
        if isinstance(self.metric, str) and isinstance(self.mode, str):
            return self
        metrics = [self.metric] if isinstance(self.metric, str) else list(self.metric)
        modes = [self.mode] * len(metrics) if isinstance(self.mode, str) else list(self.mode)
        if len(modes) != len(metrics):
            raise ValueError(
                f"mode: give one mode, or one per metric ({len(metrics)} metrics, {len(modes)} modes)"
            )
        if len(set(metrics)) != len(metrics):
            raise ValueError(f"metric: each objective once (given: {metrics})")
        self._several = list(zip(metrics, modes, strict=True))
        self.metric, self.mode = metrics[0], modes[0]
        if len(metrics) > 1:
            self._check_several()
        return self

    def _check_several(self) -> None:
        names = ", ".join(m for m, _ in self._several)
        if self.search.algorithm != "optuna":
            raise ValueError(
                f"metric [{names}]: several objectives need search.algorithm optuna (its multi-objective "
                f"samplers; given: {self.search.algorithm})"
            )
        if self.scheduler.type != "fifo":
            raise ValueError(
                f"metric [{names}]: scheduler {self.scheduler.type} stops trials on one metric; several "
                f"objectives need scheduler fifo"
            )
        if (self.search.sampler or "tpe") not in MULTI_OBJECTIVE_SAMPLERS:
            raise ValueError(
                f"metric [{names}]: search.sampler {self.search.sampler} optimises one objective; allowed "
                f"with several: {', '.join(MULTI_OBJECTIVE_SAMPLERS)}"
            )

    @property
    def objectives(self) -> list[tuple[str, str]]:
        """(metric, mode) of each objective: one, unless ``metric`` was given as a list."""
        return self._several or [(self.metric, self.mode)]

    @field_validator("seeds")
    @classmethod
    def _unique_seeds(cls, seeds: list[int]) -> list[int]:
        if len(set(seeds)) != len(seeds):
            raise ValueError("seeds must be distinct")
        return seeds

    @field_validator("ablations")
    @classmethod
    def _ablation_names(cls, ablations: dict[str, Ablation]) -> dict[str, Ablation]:
        bad = [n for n in ablations if not re.match(NAME_PATTERN, n)]
        if bad:
            raise ValueError(f"ablation names may hold letters, digits, '_', '.', '-' only (given: {bad})")
        # the names of the Tune experiments the runner makes of an ablation (an edited resume's, an
        # adaptive round's) and of the grid's stages: an ablation named so would share their folder
        taken = [n for n in ablations if re.fullmatch(r"grid|grid-stage[0-9]+|.+-(v|seeds)[0-9]+", n)]
        if taken:
            raise ValueError(
                f"ablation names may not be 'grid', 'grid-stage<N>' or end in '-v<N>' or '-seeds<N>', the "
                f"names of the study's Tune experiments (given: {taken})"
            )
        return ablations

    @model_validator(mode="after")
    def _absolute_paths(self) -> Study:
        """Relative local paths of the bases made absolute here, where the study is loaded (trials run
        in other folders); grid and point values are made absolute in ``grid_points``, after their
        labels are taken, so labels and ``paper:`` keys stay as written."""
        self.base = absolute_in_sections(self.base)
        for ablation in self.ablations.values():
            ablation.base = absolute_in_sections(ablation.base)
        return self

    @model_validator(mode="after")
    def _search_matches_ablations(self) -> Study:
        sampling = self.search.algorithm != "grid"
        for name, ablation in self.ablations.items():
            if ablation.confirm is not None:
                self._check_confirm(name, ablation.confirm)
                continue
            if sampling and not ablation.space:
                raise ValueError(
                    f"ablation {name!r}: search.algorithm {self.search.algorithm} needs a 'space'"
                )
            if not sampling and ablation.space:
                raise ValueError(f"ablation {name!r} has a 'space': set search.algorithm to random or optuna")
        early = self.scheduler.type in ("asha", "hyperband", "median")
        if early and self.metric not in STEP_METRICS:
            raise ValueError(
                f"scheduler {self.scheduler.type} stops trials on the metric at each evaluation, but "
                f"{self.metric!r} is only known when a trial ends: use one of {', '.join(STEP_METRICS)}, "
                f"or scheduler fifo"
            )
        if sampling:
            self._check_space_fits_search()
        return self

    def _check_confirm(self, name: str, confirm: Confirm) -> None:
        """A confirm ablation reruns a sampled ablation's best: only in a sampled study, of one of its
        sampled ablations, and at most as many configurations as it samples."""
        if self.search.algorithm == "grid":
            raise ValueError(
                f"ablations.{name}.confirm: confirms a sampled ablation's best configurations; needs "
                f"search.algorithm random or optuna (given: grid)"
            )
        sampled = [n for n, a in self.ablations.items() if a.space]
        if confirm.of not in sampled:
            raise ValueError(
                f"ablations.{name}.confirm.of: names a sampled ablation (one with a space) of this study "
                f"(given: {confirm.of!r}; allowed: {sampled})"
            )
        if confirm.top_k > self.search.num_samples:
            raise ValueError(
                f"ablations.{name}.confirm.top_k: at most search.num_samples "
                f"({self.search.num_samples}) configurations are sampled (given: {confirm.top_k})"
            )

    def _check_space_fits_search(self) -> None:
        for name, ablation in self.ablations.items():
            if ablation.confirm is not None:  # no space of its own
                continue
            keys = list(ablation.space)
            for n, point in enumerate(self.search.points_to_evaluate):
                unknown = [k for k in point if k not in ablation.space]
                if unknown:
                    raise ValueError(
                        f"search.points_to_evaluate[{n}]: keys {unknown} are not in ablations.{name}.space "
                        f"(allowed: {keys})"
                    )
            numeric = [k for k, d in ablation.space.items() if d.choice is None]
            if self.search.sampler == "cmaes" and not numeric:
                raise ValueError(
                    f"search.sampler cmaes samples numbers, but ablations.{name}.space is all 'choice' "
                    f"({keys}); use tpe, gp or random"
                )

    def seeds_of(self, ablation: str) -> list[int]:
        """The ablation's seeds; adaptive: the first ``min`` (what every row runs)."""
        seeds = self.ablations[ablation].seeds
        if isinstance(seeds, AdaptiveSeeds):
            return seeds.pool[: seeds.min]
        return seeds or self.seeds

    def adaptive_of(self, ablation: str) -> AdaptiveSeeds | None:
        seeds = self.ablations[ablation].seeds
        return seeds if isinstance(seeds, AdaptiveSeeds) else None

    @model_validator(mode="after")
    def _adaptive_on_plain_grids(self) -> Study:
        """Adaptive seeds add trials after a wave: only to an ablation no other trial depends on, and whose
        rows are known (not sampled, not confirmed, not staged: downstream trials take fixed seeds)."""
        needed = {need.ablation for a in self.ablations.values() for need in a.needs.values()}
        for name, ablation in self.ablations.items():
            if not isinstance(ablation.seeds, AdaptiveSeeds):
                continue
            why = (
                "a sampled ablation (space)" if ablation.space
                else "a confirm ablation (confirm)" if ablation.confirm is not None
                else "an ablation with needs" if ablation.needs
                else "an ablation that another ablation needs" if name in needed
                else None
            )  # fmt: skip
            if why:
                raise ValueError(
                    f"ablations.{name}.seeds: adaptive seeds are for grid/points ablations; not on {why} "
                    f"(give a list of seeds)"
                )
        return self


def typed_value(dist: Distribution, text: str) -> Any:
    """A parameter as MLflow logged it (``str`` of the value) back to its distribution's type: the
    ``choice`` option whose ``str()`` is the text (exactly), an int for randint, else a float.
    ValueError when it is none of them."""
    if dist.choice is not None:
        for option in dist.choice:
            if str(option) == text:
                return option
        raise ValueError(f"{text!r} is none of the choices {dist.choice}")
    return int(text) if dist.randint else float(text)
