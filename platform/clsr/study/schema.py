"""Study files: the YAML schema, validated completely before Ray starts.

Every problem of a file is reported at once, each as ``<file>: <dotted.field>: <what is wrong>
(given: <value>)``, so a researcher fixes a study in one pass.
"""

from __future__ import annotations

import itertools
import json
import math
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from clsr.methods import METHODS, get_method
from clsr.study.dotted import deep_merge, set_dotted
from clsr.study.paths import absolute_in_dotted, absolute_in_sections
from clsr.study.yaml_safe import YAMLSafetyError, read_yaml_file
from clsr.suggest import did_you_mean
from clsr.train.config import MODEL_TYPES, Seed, TrialConfig, check_seed

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]*$"
SECTIONS = ("model", "data", "trainer", "method", "eval")
KNOWN_METRICS = (
    "best_dev_stsb", "best_dev_sickr", "dev_stsb", "dev_sickr", "loss_avg",
    "test_sts12", "test_sts13", "test_sts14", "test_sts15", "test_sts16", "test_stsb", "test_sickr",
    "test_sts_avg", "test_sts12_15_avg", "align", "uniform",
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


class Ablation(Strict):
    """One table of a paper: a grid, an explicit list of points, or a search space."""

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
    seeds: list[Seed] | None = Field(
        None, min_length=1, description="this ablation's seeds (default: the study's); 0 <= seed < 2**32"
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

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: list[int] | None) -> list[int] | None:
        if seeds is not None and len(set(seeds)) != len(seeds):
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


class Search(Strict):
    algorithm: Literal["grid", "random", "optuna"] = "grid"
    num_samples: int = Field(
        1, ge=1, le=MAX_TRIALS, description="samples per ablation for random/optuna (at most 100,000)"
    )


class Scheduler(Strict):
    type: Literal["fifo", "asha"] = "fifo"
    max_t: int | None = Field(
        None, ge=1, le=10**9, description="ASHA: most steps a trial may run (default: its max)"
    )
    grace_period: int = Field(1, ge=1, le=10**9, description="ASHA: steps before a trial may be stopped")
    reduction_factor: float = Field(2.0, gt=1)


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
        default_factory=lambda: [42], min_length=1, description="0 <= seed < 2**32, distinct"
    )
    metric: str = Field("best_dev_stsb", description="the trial result that ranks points and trials")
    mode: Literal["max", "min"] = Field("max", description="whether a higher metric is better")
    search: Search = Field(default_factory=Search)
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

    @field_validator("metric")
    @classmethod
    def _known_metric(cls, metric: str) -> str:
        if metric not in KNOWN_METRICS:
            raise ValueError(f"unknown metric {metric!r}; allowed: {', '.join(KNOWN_METRICS)}")
        return metric

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
            if sampling and not ablation.space:
                raise ValueError(
                    f"ablation {name!r}: search.algorithm {self.search.algorithm} needs a 'space'"
                )
            if not sampling and ablation.space:
                raise ValueError(f"ablation {name!r} has a 'space': set search.algorithm to random or optuna")
        if sampling and len(self.seeds) > 1:
            raise ValueError("random/optuna search samples one seed per trial: give a single seed")
        if self.scheduler.type == "asha" and self.metric not in STEP_METRICS:
            raise ValueError(
                f"scheduler asha stops trials on the metric at each evaluation, but {self.metric!r} is only "
                f"known when a trial ends: use one of {', '.join(STEP_METRICS)}, or scheduler fifo"
            )
        return self

    def seeds_of(self, ablation: str) -> list[int]:
        return self.ablations[ablation].seeds or self.seeds


# --- trial expansion ---------------------------------------------------------------------------


def point_label(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in overrides.items())


def grid_points(ablation: Ablation) -> list[dict[str, Any]]:
    """Each point: ``{"label", "overrides", "paper"}``; grids are the cartesian product of their keys."""
    if ablation.points:
        return [
            {
                "label": p.label or point_label(p.set),
                "overrides": absolute_in_dotted(p.set),
                "paper": _paper_value(p.paper, ablation),
            }
            for p in ablation.points
        ]
    keys = list(ablation.grid)
    points = []
    for values in itertools.product(*(ablation.grid[k] for k in keys)):
        overrides = dict(zip(keys, values, strict=True))
        label = point_label(overrides)
        # a fold of an averaged ablation carries its row's numbers (the trial's clsr.paper.* tags)
        row_label = report_label(ablation, overrides) if ablation.average_over else label
        paper = ablation.paper.get(row_label, ablation.paper.get(_short(row_label, overrides, ablation)))
        overrides = absolute_in_dotted(overrides)  # local paths: trials run in other folders
        points.append({"label": label, "overrides": overrides, "paper": _paper_value(paper, ablation)})
    return points


def _without_averaged(ablation: Ablation, overrides: dict[str, Any]) -> dict[str, Any]:
    """A point's overrides without its ``average_over`` key: the report row's own."""
    return {k: v for k, v in overrides.items() if k != ablation.average_over}


def _short(label: str, overrides: dict[str, Any], ablation: Ablation) -> str:
    """The bare value of a one-key point (``'256'``): how study files name such rows."""
    rest = list(_without_averaged(ablation, overrides).values())
    return str(rest[0]) if len(rest) == 1 else label


def report_label(ablation: Ablation, overrides: dict[str, Any]) -> str:
    """The report row a point belongs to: its own label, or with ``average_over`` the label of the
    other keys (``mean over <key>`` when the grid has no other key)."""
    if ablation.average_over is None:
        return point_label(overrides)
    rest = _without_averaged(ablation, overrides)
    return point_label(rest) if rest else f"mean over {ablation.average_over}"


def report_points(ablation: Ablation) -> list[dict[str, Any]]:
    """The report's rows as points (``label``, ``overrides``, ``paper``, ``members``: the labels of
    the grid points averaged into it): ``grid_points`` itself unless the ablation has ``average_over``."""
    points = grid_points(ablation)
    if ablation.average_over is None:
        return [{**p, "members": [p["label"]]} for p in points]
    rows: dict[str, dict[str, Any]] = {}
    for p in points:
        label, rest = report_label(ablation, p["overrides"]), _without_averaged(ablation, p["overrides"])
        row = rows.setdefault(label, {"label": label, "overrides": rest, "paper": p["paper"], "members": []})
        row["members"].append(p["label"])
    return list(rows.values())


def find_point(points: list[dict[str, Any]], name: str | None) -> dict[str, Any] | None:
    """The point ``name`` (a ``paper_choice`` or ``reference``) means: its label, the bare value of a
    one-key grid (``'256'``), or its ``key=value`` parts in any order, as study files write them."""
    if name is None:
        return None
    parts = set(name.split(", "))
    for point in points:
        values = list(point["overrides"].values())
        short = str(values[0]) if len(values) == 1 else None
        if name in (point["label"], short) or parts == set(point["label"].split(", ")):
            return point
    return None


def _paper_value(value: float | dict[str, float] | None, ablation: Ablation) -> dict[str, float]:
    if value is None:
        return {}
    return value if isinstance(value, dict) else {ablation.paper_metric: value}


def trial_document(
    study: Study, ablation: str | None, overrides: dict[str, Any], seed: int, outputs: Outputs | None = None
) -> dict[str, Any]:
    """The nested trial config: method paper defaults < study base < ablation base < point < seed, then
    what ``needs`` fills from upstream trials (``outputs``; placeholders when None, for validation)."""
    spec = study.ablations[ablation] if ablation else None
    method = (spec.method if spec else None) or study.method
    doc = deep_merge(get_method(method).paper_defaults, study.base)
    doc = deep_merge(doc, spec.base if spec else {})
    doc = set_dotted(doc, "method.name", method)
    for key, value in overrides.items():
        doc = set_dotted(doc, key, value)
    if spec is not None:
        for key, value in need_values(study, ablation, seed, outputs, overrides).items():
            doc = set_dotted(doc, key, value)
    return set_dotted(doc, "trainer.seed", seed)


def resolve_trial(
    study: Study, ablation: str | None, overrides: dict[str, Any], seed: int, outputs: Outputs | None = None
) -> TrialConfig:
    return TrialConfig.model_validate(trial_document(study, ablation, overrides, seed, outputs))


def trial_identity(
    study: Study, ablation: str | None, overrides: dict[str, Any], seed: int, outputs: Outputs | None = None
) -> str:
    """Equal for trials that train the same thing: the validated config (pydantic fills every default
    and coerces types, so a point that writes out a default equals one that inherits it), seed included.
    Identical trials of different ablations run once (``clsr.study.distinct``)."""
    config = resolve_trial(study, ablation, overrides, seed, outputs).model_dump(mode="json")
    return _canonical(config)


# --- staged studies: ablations whose trials need upstream trials' outputs ----------------------------


class UpstreamMissing(LookupError):
    """A needed upstream trial has no output: it failed, was skipped, or has not run."""


def stages(study: Study) -> list[list[str]]:
    """Ablation names in waves, each needing only earlier waves (a study without needs: one wave)."""
    remaining = {name: {n.ablation for n in a.needs.values()} for name, a in study.ablations.items()}
    done: set[str] = set()
    waves: list[list[str]] = []
    while remaining:
        wave = [name for name, upstream in remaining.items() if upstream <= done]
        if not wave:
            raise ValueError(f"the needs of ablations {sorted(remaining)} form a cycle")
        waves.append(wave)
        done.update(wave)
        for name in wave:
            del remaining[name]
    return waves


def need_values(
    study: Study,
    ablation: str,
    seed: int,
    outputs: Outputs | None = None,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The values an ablation's ``needs`` fill for the trial of point ``overrides`` and ``seed``.

    A ``by`` mapping holds the upstream points that have an output (the method's own validation says
    when one it uses is missing); a single output that is missing raises ``UpstreamMissing``.
    """
    values: dict[str, Any] = {}
    for key, need in study.ablations[ablation].needs.items():
        upstream_seed = seed if need.seed == "same" else need.seed
        points = upstream_points(study, need, overrides or {})
        if need.by is None:
            label = need.point or points[0]["label"]
            values[key] = _upstream_output(need, label, upstream_seed, outputs)
            continue
        mapping = {}
        for point in points:
            try:
                mapping[point["overrides"][need.by]] = _upstream_output(
                    need, point["label"], upstream_seed, outputs
                )
            except UpstreamMissing:
                continue
        values[key] = mapping
    return values


def upstream_points(study: Study, need: Need, overrides: dict[str, Any]) -> list[dict[str, Any]]:
    """The upstream points a trial of point ``overrides`` may use: those that agree on the ``need.match``
    keys the point sets (every point sets them all: validation checks it; the ablation's base document,
    which has no point, sees every upstream point)."""
    points = grid_points(study.ablations[need.ablation])
    wanted = {k: overrides[k] for k in need.match if k in overrides}
    return [p for p in points if all(p["overrides"].get(k) == v for k, v in wanted.items())]


def _upstream_output(need: Need, label: str, seed: int, outputs: Outputs | None) -> str:
    if outputs is None:
        return f"<{need.output} of {need.ablation}[{label}] seed {seed}>"
    try:
        return outputs[(need.ablation, label, seed)]
    except KeyError:
        raise UpstreamMissing(
            f"ablations.{need.ablation}[{label}] seed {seed} has no finished trial with a {need.output}"
        ) from None


def missing_upstream(
    study: Study, ablation: str, seed: int, outputs: Outputs, overrides: dict[str, Any] | None = None
) -> list[str]:
    """Every upstream trial the trial of point ``overrides`` could use that has no output."""
    missing = []
    for need in study.ablations[ablation].needs.values():
        upstream_seed = seed if need.seed == "same" else need.seed
        points = upstream_points(study, need, overrides or {})
        labels = [need.point or points[0]["label"]] if need.by is None else [p["label"] for p in points]
        missing += [
            f"ablations.{need.ablation}[{label}] seed {upstream_seed}"
            for label in labels
            if (need.ablation, label, upstream_seed) not in outputs
        ]
    return missing


def _check_needs(study: Study) -> list[str]:
    """Every ``needs`` entry names a field, a grid/points upstream, a point key or label, and seeds it has."""
    problems: list[str] = []
    for name, ablation in study.ablations.items():
        for key, need in ablation.needs.items():
            problems += _check_need(study, name, key, need)
    if not problems:
        try:
            stages(study)
        except ValueError as err:
            problems.append(f"ablations: {err}; an ablation can only need ablations that do not need it")
    return problems


def _check_need(study: Study, name: str, key: str, need: Need) -> list[str]:
    where = f"ablations.{name}.needs.{key}"
    if why := _check_dotted_key(key):
        return [f"{where}: key {why}"]
    ablation = study.ablations[name]
    problems = []
    if key in ablation.grid or key in ablation.space or any(key in p.set for p in ablation.points):
        problems.append(f"{where}: the ablation's points set {key} too; leave it to needs")
    others = [n for n in study.ablations if n != name]
    upstream = study.ablations.get(need.ablation) if need.ablation != name else None
    if upstream is None:
        return problems + [
            f"{where}.ablation: no such other ablation (given: {need.ablation!r}; allowed: {others})"
        ]
    if upstream.space:
        return problems + [
            f"{where}.ablation: {need.ablation!r} is sampled (space); an upstream needs grid or points"
        ]
    points = grid_points(upstream)
    labels = [p["label"] for p in points]
    problems += _check_match(name, ablation, where, need, points)
    if need.match:  # the choice below is made among one point's matching upstream points
        points = upstream_points(study, need, grid_points(ablation)[0]["overrides"]) or points
        labels = [p["label"] for p in points]
    if need.by is not None and any(need.by not in p["overrides"] for p in points):
        keys = sorted({k for p in points for k in p["overrides"]})
        problems.append(
            f"{where}.by: not set by every point of {need.ablation!r} (given: {need.by!r}; allowed: {keys})"
        )
    if need.by is None and need.point is None and len(points) > 1:
        problems.append(
            f"{where}: {need.ablation!r} has {len(points)} points; name one with point: (allowed: {labels}) "
            f"or map them all with by: <key>"
        )
    if need.point is not None and need.point not in labels:
        problems.append(
            f"{where}.point: no such point of {need.ablation!r} (given: {need.point!r}; allowed: {labels})"
        )
    upstream_seeds = study.seeds_of(need.ablation)
    wanted = study.seeds_of(name) if need.seed == "same" else [need.seed]
    missing = [s for s in wanted if s not in upstream_seeds]
    if missing:
        problems.append(
            f"{where}.seed: {need.ablation!r} runs seeds {upstream_seeds}, not {missing}; give it those seeds "
            f"or use one of its seeds for every trial (seed: {upstream_seeds[0]})"
        )
    return problems


def _check_match(
    name: str, ablation: Ablation, where: str, need: Need, upstream: list[dict[str, Any]]
) -> list[str]:
    """Each match key is set by every point on both sides, and every point finds an upstream point."""
    if not need.match:
        return []
    if ablation.space:
        return [f"{where}.match: a sampled ablation (space) has no points to match (given: {need.match})"]
    for side, points in (("ablation", grid_points(ablation)), (need.ablation, upstream)):
        unset = [k for k in need.match if any(k not in p["overrides"] for p in points)]
        if unset:
            keys = sorted({k for p in points for k in p["overrides"]})
            return [f"{where}.match: {unset} not set by every point of {side!r} (allowed: {keys})"]
    for point in grid_points(ablation):
        values = {k: point["overrides"][k] for k in need.match}
        if not any(all(p["overrides"][k] == v for k, v in values.items()) for p in upstream):
            return [
                f"{where}.match: no point of {need.ablation!r} has {values} (the point {point['label']!r})"
            ]
    return []


# --- trial counts ----------------------------------------------------------------------------------


def ablation_trials(study: Study, ablation: str) -> int:
    """Trials of one ablation, counted without expanding it: points (or the product of the grid's list
    lengths) × seeds; a sampled ablation (space) runs ``search.num_samples``."""
    spec = study.ablations[ablation]
    if spec.space:
        return study.search.num_samples
    points = len(spec.points) or math.prod(len(values) for values in spec.grid.values())
    return points * len(study.seeds_of(ablation))


def planned_trials(study: Study) -> int:
    """Trials of the whole study, counted without expanding a grid."""
    return sum(ablation_trials(study, name) for name in study.ablations)


def count_trials(study: Study) -> tuple[int, int]:
    """(trials, distinct trials): a trial is (ablation, point, seed) of a grid/points ablation, plus
    ``search.num_samples`` per sampled ablation; distinct counts the different ``trial_identity``s (the
    same configuration in two ablations runs once). A staged trial counts with its upstream trials'
    placeholders, so two that would read the same checkpoint count twice. Resolves every point: call it
    on a validated study only (at most ``MAX_TRIALS`` trials)."""
    total, sampled, identities = 0, 0, set()
    for name, ablation in study.ablations.items():
        if ablation.space:
            sampled += study.search.num_samples
            continue
        for point in grid_points(ablation):
            for seed in study.seeds_of(name):
                total += 1
                identities.add(trial_identity(study, name, point["overrides"], seed))
    return total + sampled, len(identities) + sampled


def _canonical(value: Any) -> str:
    """A text that is equal for equal configs, whatever the order of their keys."""
    if isinstance(value, dict):
        items = sorted((repr(k), _canonical(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_canonical(v) for v in value) + "]"
    return json.dumps(value, default=repr)


def _check_size(study: Study) -> list[str]:
    """Refuse a study of more than ``MAX_TRIALS`` trials before any of its grids is expanded."""
    total = planned_trials(study)
    if total <= MAX_TRIALS:
        return []
    counts = sorted(((ablation_trials(study, n), n) for n in study.ablations), reverse=True)
    largest = ", ".join(f"{name}: {count:,}" for count, name in counts[:3])
    return [
        f"ablations: {total:,} trials ({largest}); a study may have at most {MAX_TRIALS:,}: use fewer "
        f"grid values or seeds, or split it into several studies"
    ]


# --- loading and validation --------------------------------------------------------------------


def _format_pydantic(
    err: ValidationError, prefix: str = "", root: type[BaseModel] | None = None
) -> list[str]:
    """One line per error; an unknown key gets the closest allowed name (``root``: the model validated)."""
    problems = []
    for e in err.errors():
        raw_loc = [p for p in e["loc"] if p not in ("function-after", "constrained-str")]
        parts = [str(p) for p in raw_loc]
        if parts[:1] == ["model"] and parts[1:2] and parts[1] in MODEL_TYPES:  # the union's tag
            parts.pop(1)
        loc = ".".join(parts)
        where = f"{prefix}{loc}" if loc else prefix.rstrip(".") or "(top level)"
        message = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            message = f"unknown key {parts[-1]!r}{did_you_mean(root, raw_loc)}"
        given = e.get("input")
        shown = "" if e["type"] == "missing" or isinstance(given, dict) else f" (given: {_shown(given)})"
        problems.append(f"{where}: {message}{shown}")
    return problems


def _shown(value: Any) -> str:
    """``repr(value)``, cut to ``MAX_SHOWN`` characters so a huge value cannot flood the terminal."""
    text = repr(value)
    return text if len(text) <= MAX_SHOWN else f"{text[:MAX_SHOWN]}... ({len(text):,} characters)"


def _check_dotted_key(key: str) -> str | None:
    section, _, rest = key.partition(".")
    if section not in SECTIONS or not rest:
        return f"must start with one of {', '.join(SECTIONS)} and name a field, e.g. trainer.lr"
    return None


def _check_trials(study: Study) -> list[str]:
    """Resolve every grid point (and each sampled ablation's base), so a bad value fails now and not in
    trial 37. A problem the study's base gives every trial is reported once, as ``base.<field>``; one
    the base has but the ablations fix (e.g. a field ``needs`` fills) is not a problem."""
    problems: list[str] = _check_references(study)
    per_trial: list[tuple[str, str]] = []  # (where, rest): where + rest is the line
    for name, ablation in study.ablations.items():
        keys = list(ablation.grid) + [k for p in ablation.points for k in p.set] + list(ablation.space)
        bad_keys = [k for k in dict.fromkeys(keys) if _check_dotted_key(k)]
        problems += [f"ablations.{name}: key {k!r} {_check_dotted_key(k)}" for k in bad_keys]
        if bad_keys:
            continue
        points = grid_points(ablation) if not ablation.space else [{"label": "space", "overrides": {}}]
        seed = study.seeds_of(name)[0]
        for point in points:
            where = f"ablations.{name}[{point['label']}]"
            found = _format_pydantic_or_none(
                lambda point=point, name=name, seed=seed: resolve_trial(
                    study, name, point["overrides"], seed
                ),
                f"{where}.",
                TrialConfig,
            )
            per_trial += [(where, p.removeprefix(where)) for p in found]
            if not found:
                trial = resolve_trial(study, name, point["overrides"], seed)
                per_trial += [
                    (where, rest) for rest in _metric_problems(study, trial) + _device_problems(study, trial)
                ]
    base = _format_pydantic_or_none(
        lambda: resolve_trial(study, None, {}, study.seeds[0]), "base.", TrialConfig
    )
    shared = [p.removeprefix("base") for p in base]
    shared = [p for p in shared if any(p == rest for _, rest in per_trial)]
    return (
        problems
        + [f"base{p}" for p in shared]
        + [where + rest for where, rest in per_trial if rest not in shared]
    )


def _device_problems(study: Study, trial: TrialConfig) -> list[str]:
    """A GPU-only setting in a study whose trials get no GPU fails now, not on the cluster."""
    if (
        getattr(trial.model, "attention", None) == "flash_attention_2"
        and study.resources.gpus_per_worker == 0
    ):
        return [
            ".model.attention: flash_attention_2 runs on CUDA GPUs only, and resources.gpus_per_worker is 0 "
            "(given: 'flash_attention_2'; allowed here: sdpa, eager); give the trials GPUs or use sdpa"
        ]
    return []


def _metric_problems(study: Study, trial: TrialConfig) -> list[str]:
    """A dev-set study metric needs that dev set scored by the trial (else no result carries it)."""
    dev_task = study.metric.removeprefix("best_").removeprefix("dev_")
    if not study.metric.removeprefix("best_").startswith("dev_"):
        return []
    dev_tasks = trial.eval.dev_tasks
    if dev_task in dev_tasks:
        return []
    return [
        f": metric {study.metric!r} needs eval.dev_tasks to include {dev_task!r} (the trial scores "
        f"{dev_tasks or 'no dev set'}); add it, or set the study's metric to one the trial reports"
    ]


def _check_references(study: Study) -> list[str]:
    """Every ``reference`` names a point of its ablation, so the report's paired tests have a baseline."""
    problems = []
    for name, ablation in study.ablations.items():
        if ablation.reference is None:
            continue
        where = f"ablations.{name}.reference"
        if ablation.space:
            problems.append(
                f"{where}: a sampled ablation (space) has no points to name (given: {ablation.reference!r})"
            )
            continue
        points = report_points(ablation)
        if find_point(points, ablation.reference) is None:
            labels = [p["label"] for p in points]
            problems.append(f"{where}: no such point (given: {ablation.reference!r}; allowed: {labels})")
    return problems


def _check_raw_base(raw: dict[str, Any]) -> list[str]:
    """Base-config problems of a study whose top level is invalid too, so one run lists both."""
    method, base = raw.get("method"), raw.get("base", {})
    if method not in METHODS or not isinstance(base, dict):
        return []
    doc = set_dotted(deep_merge(get_method(method).paper_defaults, base), "method.name", method)
    return _format_pydantic_or_none(lambda: TrialConfig.model_validate(doc), "base.", TrialConfig)


def _format_pydantic_or_none(build, prefix: str, root: type[BaseModel] | None = None) -> list[str]:
    try:
        build()
    except ValidationError as err:
        return _format_pydantic(err, prefix, root)
    except ValueError as err:
        return [f"{prefix.rstrip('.')}: {err}"]
    return []


def resolve_from_files(raw: dict[str, Any], study_dir: Path) -> tuple[dict[str, Any], list[str]]:
    """Merge each ablation's ``from:`` file (a path relative to the study file, or to the cwd)."""
    problems: list[str] = []
    ablations = raw.get("ablations")
    if not isinstance(ablations, dict):
        return raw, problems
    merged = dict(raw, ablations=dict(ablations))
    for name, body in ablations.items():
        if not isinstance(body, dict) or "from" not in body:
            continue
        candidates = [study_dir / body["from"], study_dir.parent / body["from"], Path.cwd() / body["from"]]
        found = next((p for p in candidates if p.is_file()), None)
        if found is None:
            problems.append(
                f"ablations.{name}.from: file not found (given: {body['from']!r}; looked in "
                f"{', '.join(str(c.parent) for c in candidates)})"
            )
            continue
        try:
            shared = read_yaml_file(found)
        except YAMLSafetyError as err:
            problems.append(f"ablations.{name}.from: {found}: {err}")
            continue
        if not isinstance(shared, dict | None):
            problems.append(
                f"ablations.{name}.from: {found}: the file must hold a mapping (grid:, points:, ...)"
            )
            continue
        shared = shared or {}
        merged["ablations"][name] = {
            **shared,
            **{k: v for k, v in body.items() if k != "from"},
            "from": body["from"],
        }
    return merged, problems


def study_files_in(folder: Path) -> list[Path]:
    """The study files of a folder (``*.yaml``, ``*.yml``; not its subfolders), in name order."""
    return sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def load_study(path: str | Path, overrides: list[tuple[str, Any]] = (), smoke: bool = False) -> Study:
    """Read, merge ``from:`` files, apply ``--smoke`` and ``--set``, validate everything, or raise StudyError."""
    path = Path(path)
    if path.is_dir():
        found = sorted(p.name for p in study_files_in(path))
        example = f" (it holds {', '.join(found[:3])}{', …' if len(found) > 3 else ''})" if found else ""
        raise StudyError(str(path), [f"a folder, not a study file: give one of its .yaml files{example}"])
    if not path.is_file():
        raise StudyError(str(path), ["file not found"])
    try:
        raw = read_yaml_file(path)
    except YAMLSafetyError as err:
        raise StudyError(str(path), [str(err)]) from None
    if not isinstance(raw, dict):
        raise StudyError(str(path), ["the file must hold a mapping (name:, method:, ablations:, ...)"])
    if smoke:
        raw = apply_smoke(raw, str(path))
    return study_from_dict(raw, str(path), path.parent, overrides)


def apply_smoke(raw: dict[str, Any], source: str) -> dict[str, Any]:
    """The study's ``smoke:`` section merged over it (``base`` deeply, other keys replaced; an ablation
    set to null there is left out of the smoke run).

    A smoke run gets its own name (``<name>-smoke``) so its MLflow parent run and Ray storage never mix
    with the real study's, and it skips points that cannot run here instead of failing.
    """
    smoke = raw.get("smoke")
    if not isinstance(smoke, dict) or not smoke:
        raise StudyError(
            source, ["--smoke needs a 'smoke:' section (e.g. seeds, base overrides) in the file"]
        )
    merged = deep_merge({k: v for k, v in raw.items() if k != "smoke"}, smoke)
    if isinstance(merged.get("ablations"), dict):  # `<ablation>: null` leaves it out of the smoke run
        merged["ablations"] = {k: v for k, v in merged["ablations"].items() if v is not None}
    merged["name"] = f"{raw.get('name', 'study')}-smoke"
    merged.setdefault("skip_unavailable", True)
    return merged


def study_from_dict(
    raw: dict[str, Any], source: str, study_dir: Path, overrides: list[tuple[str, Any]] = ()
) -> Study:
    for key, value in overrides:
        raw = set_dotted(raw, f"base.{key}" if key.split(".")[0] in SECTIONS else key, value)
    raw, problems = resolve_from_files(raw, study_dir)
    try:
        study = Study.model_validate(raw)
    except ValidationError as err:
        raise StudyError(
            source, problems + _format_pydantic(err, root=Study) + _check_raw_base(raw)
        ) from None
    if too_many := _check_size(study):  # before anything expands a grid
        raise StudyError(source, problems + too_many)
    problems += _check_needs(study)
    if problems:  # the trials' needs cannot be filled, not even with placeholders
        raise StudyError(source, problems)
    problems += _check_trials(study)
    if problems:
        raise StudyError(source, problems)
    return study
