"""One table of a paper as a study file gives it (``Ablation``), and what its trials take from elsewhere:
upstream outputs (``Need``), the paper's rows (``Fidelity``), a sampled ablation's best (``Confirm``) and
seeds added round by round (``AdaptiveSeeds``)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from clsr.config.trial import Seed, check_seed
from clsr.methods import get_method
from clsr.study.spec.space import Distribution, Point
from clsr.study.spec.strict import Strict


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
        description="row label -> what data stands in for the paper's, and why (the report adds the rows "
        "its trials read, their data.train.rows)",
    )
    stand_in_setting: dict[str, str] = Field(
        default_factory=dict,
        description="row label -> which setting (checkpoint, hyperparameter, procedure) is ours or borrowed "
        "rather than the paper's, and why; a row may be in stand_in too",
    )
    not_expressible: dict[str, str] = Field(
        default_factory=dict, description="paper row -> why it has no row here"
    )


class Tolerance(Strict):
    """A table's equivalence margin for the reproduction verdicts, with where the number comes from."""

    points: float = Field(
        gt=0,
        le=100,
        description="the margin in points of the metric (scores x 100): reproduced when TOST puts the mean "
        "over seeds within paper ± points",
    )
    source: str = Field(
        min_length=1,
        description="where the margin comes from, e.g. the paper's or its authors' spread across seeds",
    )

    @field_validator("points", mode="before")
    @classmethod
    def _points_range(cls, points: Any) -> Any:
        if isinstance(points, int | float) and not isinstance(points, bool) and not 0 < points <= 100:
            raise ValueError("allowed: points of the metric, 0 < points <= 100")
        return points


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
        description="which rows are exact reproductions (exact: labels), which run on stand-in data "
        "(stand_in: label -> why) or settings (stand_in_setting: label -> why) and which paper rows have "
        "no row here (not_expressible: paper row -> why); the report prints one line each",
    )
    tolerance: Tolerance | None = Field(
        None,
        description="this table's verdict margin with its source, {points: 2.0, source: '...'} (default: "
        "the study's report.tolerance); the report prints both",
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

    @field_validator("tolerance", mode="before")
    @classmethod
    def _tolerance_mapping(cls, tolerance: Any) -> Any:
        if tolerance is not None and not isinstance(tolerance, dict | Tolerance):
            raise ValueError("allowed: {points: <0 < points <= 100>, source: <where the margin comes from>}")
        return tolerance

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
