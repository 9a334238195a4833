"""Study files: the YAML schema as pydantic models (what each key may hold) and the error a study
file's problems are reported with. Reading a file and checking a study as a whole is
``clsr.study.plan.load``; turning it into points, trials, stages and needs is ``clsr.study.plan.resolve``.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from clsr.config.trial import Seed
from clsr.methods import get_method
from clsr.study.spec.ablation import Ablation, AdaptiveSeeds, Confirm
from clsr.study.spec.budget import Budget
from clsr.study.spec.notify import Notify, file_urls
from clsr.study.spec.paths import absolute_in_sections
from clsr.study.spec.strict import MAX_TRIALS, Strict
from clsr.study.spec.tuning import MULTI_OBJECTIVE_SAMPLERS, ReportOptions, Resources, Scheduler, Search
from clsr.tracking.secrets import mask_uri
from clsr.tracking.webhook import shown_url

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
CONFIRM_TRIALS = 2_000  # `study run`/`resume` of more trials asks for --yes
MAX_SHOWN = 200  # characters of a refused value shown in a problem line


class StudyError(ValueError):
    """A study file is invalid; ``problems`` holds one line per problem."""

    def __init__(self, source: str, problems: list[str]):
        self.source, self.problems = source, problems
        lines = "\n".join(f"  {source}: {p}" for p in problems)
        super().__init__(f"{len(problems)} problem(s) in study {source}:\n{lines}")


class Study(Strict):
    """A study file: the trials of one or more ablation tables, and how they run and are recorded."""

    name: str = Field(
        pattern=NAME_PATTERN, description="the MLflow experiment and parent run (letters, digits, _ . -)"
    )
    description: str | None = Field(None, description="one line for the parent run and the report")
    method: str = Field(
        description="the default method of the ablations: a built-in name (methods.md), ./file.py:Class "
        "(beside the study file), package.module:Class, or an installed clsr.methods entry point's name"
    )
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
        "test_transfer_avg], judges several objectives at once (search optuna or grid, scheduler fifo): "
        "Optuna's multi-objective sampler is told each, the report draws their Pareto front (a grid's: "
        "its points' means over seeds, those whose CIs reach the front marked near it), and the first "
        "ranks trials where one number is needed",
    )
    mode: Literal["max", "min"] | list[Literal["max", "min"]] = Field(
        "max", description="whether a higher metric is better; with several metrics one mode, or one each"
    )
    _several: list[tuple[str, str]] | None = PrivateAttr(None)  # (metric, mode) when several
    search: Search = Field(default_factory=Search)
    report: ReportOptions = Field(
        default_factory=ReportOptions,
        description="how the report judges rows against the papers: `tolerance` (default 0.5, points of "
        "the metric), the equivalence margin of each row's reproduction verdict; and `live_every` "
        "(default '5m'), how often the running study's partial report on its parent run is refreshed",
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
        "loads, its last and best weights (about 2x the trained weights instead of 4x; the best only as "
        "its MLflow model where no ablation needs: it)",
    )
    budget: Budget = Field(
        default_factory=Budget,
        description="limits on what the study spends: gpu_hours, wall (e.g. '12h') and max_failed_trials; "
        "past one, the driver launches no more trials and closes the record stopped, with the reason",
    )
    notify: Notify | None = Field(
        None,
        description="a webhook told when a trial fails, the study ends and its verdicts are ready: {url: "
        "https://..., on: [failed, finished, verdicts]} (Slack-compatible JSON, a `text` field); a "
        "failing webhook is a warning line, never the study's failure. The URL is a credential: put it "
        "in the file (not --set, which is argv), readable by you only; it is masked everywhere it "
        "would be shown and never sent to trials",
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
        if self.search.algorithm not in ("optuna", "grid"):
            raise ValueError(
                f"metric [{names}]: several objectives need search.algorithm optuna (its multi-objective "
                f"samplers) or grid (the report's Pareto front of the points; given: {self.search.algorithm})"
            )
        if self.scheduler.type != "fifo":
            raise ValueError(
                f"metric [{names}]: scheduler {self.scheduler.type} stops trials on one metric; several "
                f"objectives need scheduler fifo"
            )
        if (
            self.search.algorithm == "optuna"
            and (self.search.sampler or "tpe") not in MULTI_OBJECTIVE_SAMPLERS
        ):
            raise ValueError(
                f"metric [{names}]: search.sampler {self.search.sampler} optimises one objective; allowed "
                f"with several: {', '.join(MULTI_OBJECTIVE_SAMPLERS)}"
            )

    def masked(self, text: str) -> str:
        """``text`` (the study file's, an error) with this study's secrets shown masked: the notify URL
        (whose secret is its path, which ``mask_uri`` cannot see), then what ``mask_uri`` masks. The URLs
        are read from ``text`` itself too: ``--set notify=null`` leaves this study without one."""
        urls = file_urls(text) + ([self.notify.url.get_secret_value()] if self.notify is not None else [])
        for url in sorted(set(urls), key=len, reverse=True):  # a URL that holds another: the longer first
            text = text.replace(url, shown_url(url))
        return mask_uri(text)

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
        if self.search.prune_seeds is not None:
            self._check_prune_seeds()
        return self

    def _check_prune_seeds(self) -> None:
        """Pruning compares one metric over seeds run to the end: each sampled ablation needs more seeds
        than the test needs before it can prune (else pruning never saves one)."""
        rule = self.search.prune_seeds
        if len(self.objectives) > 1 or self.scheduler.type != "fifo":
            raise ValueError(
                "search.prune_seeds: needs one metric and scheduler fifo (given: "
                f"{len(self.objectives)} metric(s), scheduler {self.scheduler.type})"
            )
        fewest = rule.fewest_seeds()
        for name, ablation in self.ablations.items():
            if ablation.space and len(self.seeds_of(name)) <= fewest:
                raise ValueError(
                    f"search.prune_seeds: test {rule.test} with p {rule.p:g} and min_seeds {rule.min_seeds} "
                    f"prunes after {fewest} seeds, so ablation {name!r} needs at least {fewest + 1} seeds "
                    f"(given: {len(self.seeds_of(name))}); add seeds"
                    + (", raise p, or use test ttest" if rule.test == "wilcoxon" else " or lower min_seeds")
                )

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
