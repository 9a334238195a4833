"""A validated study's plan: its points (grids and explicit points), each point's trials (one per
seed), the trial configuration of each, the stages of a staged study and the values its ``needs``
take from upstream trials, and the number of trials and distinct trials."""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import replace
from functools import cached_property
from typing import Any

from clsr.config.trial import TrialConfig
from clsr.methods import get_method
from clsr.study.plan.point import GridPoint
from clsr.study.spec.ablation import Ablation, Need
from clsr.study.spec.dotted import deep_merge, set_dotted
from clsr.study.spec.paths import absolute_in_dotted
from clsr.study.spec.schema import Outputs, Study

Resolve = Callable[[str | None, dict[str, Any], int], TrialConfig]  # (ablation, overrides, seed) -> config

# --- trial expansion ---------------------------------------------------------------------------


def point_label(overrides: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in overrides.items())


def grid_points(ablation: Ablation) -> list[GridPoint]:
    """Each point (``label``, ``overrides``, ``paper``; not yet tied to its ablation); grids are the cartesian product of their keys. A
    confirm ablation's: its explicit points only (its best configurations are known once its upstream
    ran: ``clsr.study.run.confirm``)."""
    if ablation.points or ablation.confirm is not None:
        return [
            GridPoint(
                p.label or point_label(p.set), absolute_in_dotted(p.set), _paper_value(p.paper, ablation)
            )
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
        points.append(GridPoint(label, overrides, _paper_value(paper, ablation)))
    return points


def study_grids(study: Study) -> dict[str, list[GridPoint]]:
    """Ablation -> its ``grid_points`` (none for a sampled ablation: its points are sampled)."""
    return {name: [] if a.space else grid_points(a) for name, a in study.ablations.items()}


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


def report_points(ablation: Ablation) -> list[GridPoint]:
    """The report's rows as points (``members``: the labels of the grid points averaged into each):
    ``grid_points`` itself unless the ablation has ``average_over``."""
    points = grid_points(ablation)
    if ablation.average_over is None:
        return [replace(p, members=(p.label,)) for p in points]
    rows: dict[str, GridPoint] = {}
    for p in points:
        label = report_label(ablation, p.overrides)
        row = rows.get(label) or GridPoint(label, _without_averaged(ablation, p.overrides), p.paper)
        rows[label] = replace(row, members=(*row.members, p.label))
    return list(rows.values())


def find_point(points: list[GridPoint], name: str | None) -> GridPoint | None:
    """The point ``name`` (a ``paper_choice`` or ``reference``) means: its label, the bare value of a
    one-key grid (``'256'``), or its ``key=value`` parts in any order, as study files write them."""
    if name is None:
        return None
    parts = set(name.split(", "))
    for point in points:
        values = list(point.overrides.values())
        short = str(values[0]) if len(values) == 1 else None
        if name in (point.label, short) or parts == set(point.label.split(", ")):
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
    Identical trials of different ablations run once (``clsr.study.plan.distinct``)."""
    return config_identity(resolve_trial(study, ablation, overrides, seed, outputs))


def config_identity(config: TrialConfig) -> str:
    """``trial_identity`` of a resolved configuration."""
    return _canonical(config.model_dump(mode="json"))


# --- each trial resolved once: the one cache, built by validation and owned by the plan --------------


def overrides_key(overrides: dict[str, Any]) -> str:
    """Equal only for the same overrides: their ``repr`` keeps key order and value types (``1``, ``1.0``
    and ``True`` differ, as do ``1`` and ``"1"``), which ``set_dotted`` applies in that order."""
    return repr(overrides)


class StudyDocuments:
    """Each trial document (with placeholders for upstream outputs) and its validated configuration,
    built once per (ablation, overrides, seed); ``grids``: each ablation's points, built once.

    The one resolution cache: ``load_documents`` validates a study with one and returns it, the command
    passes it on (``plan_study`` keeps it in the ``StudyPlan``), so everything it does afterwards (the
    plan, the source checks, the counts, the prices) reads the trials validation resolved instead of
    resolving them again. A document is read, never changed; the study is not changed after validation."""

    def __init__(self, study: Study):
        self.study = study
        self._docs: dict[tuple[str | None, str, int], dict[str, Any]] = {}
        self._configs: dict[tuple[str | None, str, int], TrialConfig] = {}

    @cached_property
    def grids(self) -> dict[str, list[GridPoint]]:
        """Ablation -> its ``grid_points`` (none for a sampled ablation)."""
        return study_grids(self.study)

    def counts(self) -> tuple[int, int]:
        """``count_trials`` of the study, from these grids and configurations."""
        return count_trials(self.study, self.grids, self.config)

    @staticmethod
    def _key(ablation: str | None, overrides: dict[str, Any], seed: int) -> tuple[str | None, str, int]:
        return ablation, overrides_key(overrides), seed

    def document(self, ablation: str | None, overrides: dict[str, Any], seed: int) -> dict[str, Any]:
        key = self._key(ablation, overrides, seed)
        if key not in self._docs:
            self._docs[key] = trial_document(self.study, ablation, overrides, seed)
        return self._docs[key]

    def config(self, ablation: str | None, overrides: dict[str, Any], seed: int) -> TrialConfig:
        key = self._key(ablation, overrides, seed)
        if key not in self._configs:
            self._configs[key] = TrialConfig.model_validate(self.document(ablation, overrides, seed))
        return self._configs[key]


def resolver(study: Study, resolve: Resolve | None = None) -> Resolve:
    """``resolve`` when given (the command's ``StudyDocuments.config``: the trials validation resolved),
    else a fresh ``StudyDocuments``' for this call."""
    return resolve if resolve is not None else StudyDocuments(study).config


# --- staged studies: ablations whose trials need upstream trials' outputs ----------------------------


class UpstreamMissing(LookupError):
    """A needed upstream trial has no output: it failed, was skipped, or has not run."""


def stages(study: Study) -> list[list[str]]:
    """Ablation names in waves, each needing only earlier waves (a study without needs: one wave); a
    confirm ablation comes after the sampled ablation it confirms."""
    remaining = {
        name: {n.ablation for n in a.needs.values()} | ({a.confirm.of} if a.confirm else set())
        for name, a in study.ablations.items()
    }
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


def experiments(study: Study) -> list[tuple[str, str | None, list[str]]]:
    """(Tune experiment name, sampled ablation or None, ablations it runs), in running order.

    A grid study is one experiment per stage (``grid``, then ``grid-stage2`` ... when ablations need
    others' trials); a sampled study is one experiment per sampled ablation, then one grid experiment
    per confirm ablation (its points are known once the sampled ones ran: ``clsr.study.run.waves.confirm_trials``).
    """
    if study.search.algorithm != "grid":
        sampled = [(name, name, [name]) for name, a in study.ablations.items() if a.space]
        return sampled + [(name, None, [name]) for name, a in study.ablations.items() if a.confirm]
    return [("grid" if n == 0 else f"grid-stage{n + 1}", None, wave) for n, wave in enumerate(stages(study))]


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
            label = need.point or points[0].label
            values[key] = _upstream_output(need, label, upstream_seed, outputs)
            continue
        mapping = {}
        for point in points:
            try:
                mapping[point.overrides[need.by]] = _upstream_output(
                    need, point.label, upstream_seed, outputs
                )
            except UpstreamMissing:
                continue
        values[key] = mapping
    return values


def upstream_points(study: Study, need: Need, overrides: dict[str, Any]) -> list[GridPoint]:
    """The upstream points a trial of point ``overrides`` may use: those that agree on the ``need.match``
    keys the point sets (every point sets them all: validation checks it; the ablation's base document,
    which has no point, sees every upstream point)."""
    points = grid_points(study.ablations[need.ablation])
    wanted = {k: overrides[k] for k in need.match if k in overrides}
    return [p for p in points if all(p.overrides.get(k) == v for k, v in wanted.items())]


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
        labels = [need.point or points[0].label] if need.by is None else [p.label for p in points]
        missing += [
            f"ablations.{need.ablation}[{label}] seed {upstream_seed}"
            for label in labels
            if (need.ablation, label, upstream_seed) not in outputs
        ]
    return missing


def ablation_trials(study: Study, ablation: str) -> int:
    """Trials of one ablation, counted without expanding it: points (or the product of the grid's list
    lengths) × seeds; a sampled ablation (space) runs ``search.num_samples`` configurations × seeds; a
    confirm ablation (its upstream's ``top_k`` best + its explicit points) × seeds."""
    spec = study.ablations[ablation]
    if spec.space:
        return study.search.num_samples * len(study.seeds_of(ablation))
    if spec.confirm is not None:
        return (spec.confirm.top_k + len(spec.points)) * len(study.seeds_of(ablation))
    points = len(spec.points) or math.prod(len(values) for values in spec.grid.values())
    return points * len(study.seeds_of(ablation))


def most_trials(study: Study, ablation: str) -> int:
    """Trials of one ablation at most: ``ablation_trials``, with an adaptive-seeds ablation's rows each
    at its ``max`` seeds (what the size limit and the notes count)."""
    planned = ablation_trials(study, ablation)
    spec = study.adaptive_of(ablation)
    return planned if spec is None else planned // spec.min * spec.max


def seed_notes(study: Study) -> list[str]:
    """``study validate``'s note per ablation with published numbers but one seed: its report rows
    get no confidence interval and no reproduction verdict; each adaptive-seeds ablation's bounds; and
    seed pruning's: its counts are the most a sampled ablation runs."""
    return (
        [
            f"ablations.{name}: 1 seed: no CI or verdict; give seeds: [42, 43, 44] (or more)"
            for name, spec in study.ablations.items()
            if len(study.seeds_of(name)) == 1
            and (spec.paper or any(p.paper is not None for p in spec.points))
        ]
        + adaptive_notes(study)
        + pruning_notes(study)
    )


def pruning_notes(study: Study) -> list[str]:
    rule = study.search.prune_seeds
    if rule is None:
        return []
    return [
        f"ablations.{name}: seed pruning: at most {ablation_trials(study, name)} trials; a configuration "
        f"worse than the best ({rule.test}, p < {rule.p:g}) stops after {rule.fewest_seeds()} or more of its "
        f"{len(study.seeds_of(name))} seeds"
        for name, spec in study.ablations.items()
        if spec.space
    ]


def adaptive_notes(study: Study) -> list[str]:
    """``study validate``'s note per adaptive-seeds ablation: its trials from min to max seeds a row."""
    notes = []
    for name in study.ablations:
        spec = study.adaptive_of(name)
        if spec is not None:
            notes.append(
                f"ablations.{name}: adaptive seeds: {ablation_trials(study, name)} to "
                f"{most_trials(study, name)} trials "
                f"(rows whose CI is wider than ±{spec.until_ci:g} or verdict inconclusive get more seeds)"
            )
    return notes


def planned_trials(study: Study) -> int:
    """Trials of the whole study, counted without expanding a grid."""
    return sum(ablation_trials(study, name) for name in study.ablations)


def count_trials(
    study: Study, grids: dict[str, list[GridPoint]] | None = None, resolve: Resolve | None = None
) -> tuple[int, int]:
    """(trials, distinct trials): a trial is (ablation, point, seed) of a grid/points ablation, plus
    ``search.num_samples`` × seeds per sampled ablation; distinct counts the different ``trial_identity``s (the
    same configuration in two ablations runs once). A staged trial counts with its upstream trials'
    placeholders, so two that would read the same checkpoint count twice. Resolves every point: call it
    on a validated study only (at most ``MAX_TRIALS`` trials). ``grids`` (ablation -> its
    ``grid_points``) and ``resolve`` (``resolve_trial`` of an ablation, overrides and seed): the study's
    documents (``clsr.study.plan.resolve.StudyDocuments``); by default resolved here."""
    total, sampled, identities = 0, 0, set()
    resolve = resolver(study, resolve)
    for name, ablation in study.ablations.items():
        if ablation.space:
            sampled += ablation_trials(study, name)
            continue
        if ablation.confirm is not None:  # its best configurations are not known yet: each counts
            sampled += ablation.confirm.top_k * len(study.seeds_of(name))
        for point in grid_points(ablation) if grids is None else grids[name]:
            for seed in study.seeds_of(name):
                total += 1
                identities.add(config_identity(resolve(name, point.overrides, seed)))
    return total + sampled, len(identities) + sampled


def _canonical(value: Any) -> str:
    """A text that is equal for equal configs, whatever the order of their keys."""
    if isinstance(value, dict):
        items = sorted((repr(k), _canonical(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_canonical(v) for v in value) + "]"
    return json.dumps(value, default=repr)


# --- what checkpoints take ------------------------------------------------------------------------


def checkpoint_lines(
    study: Study, grids: dict[str, list[GridPoint]] | None = None, resolve: Resolve | None = None
) -> list[str]:
    """``study plan``'s line on checkpoint bytes per trial, estimated from each model's parameter count
    (fp32): while a trial trains, its weights, the optimizer's moments (Adam's two; SGD's momentum) and
    the best weights; after the study, the weights and the best weights (``clsr.study.record.retention``), or
    all of it with ``keep_checkpoints: true``. Models whose size is unknown here are named instead.
    ``grids`` and ``resolve``: as ``count_trials`` takes them."""

    from clsr.study.plan.cost_model import known_parameters

    resolve = resolver(study, resolve)
    counts: dict[str, int | None] = {}
    largest = (0, 0)  # bytes while training, after the study
    total_after, unknown = 0, set()
    for name, ablation in study.ablations.items():
        dynamic = bool(ablation.space) or ablation.confirm is not None  # its base stands for its trials
        points = (
            [GridPoint("base", {}, {})]
            if dynamic
            else grid_points(ablation)
            if grids is None
            else grids[name]
        )
        per_point = ablation_trials(study, name) if dynamic else len(study.seeds_of(name))
        for point in points:
            first_seed = study.seeds_of(name)[0]
            trial = resolve(name, point.overrides, first_seed)
            model = trial.model.name if trial.model.type == "transformer" else None
            if model is not None and model not in counts:
                counts[model] = trained_parameters(model, trial.model.pooling) or known_parameters(model)
            params = counts.get(model) if model is not None else None
            if params is None:
                unknown.add(model or trial.model.type)
                continue
            moments = 1 if trial.trainer.optimizer == "sgd" else 2
            training, after = 4 * params * (2 + moments), 4 * params * 2
            largest = max(largest, (training, after))
            total_after += per_point * (training if study.keep_checkpoints else after)
    if largest == (0, 0):
        return [f"checkpoints: size unknown ({', '.join(sorted(unknown))}: no parameter count here)"]
    training, after = largest
    kept = (  # the best weights of a trial no later stage needs: its MLflow model (retention)
        "kept whole (keep_checkpoints: true)"
        if study.keep_checkpoints
        else "weights + best weights, the best as the trial's MLflow model where no later stage needs them"
    )
    lines = [
        f"checkpoint per trial: ~{human_bytes(training)} while it trains (fp32 weights, optimizer moments, "
        f"best weights), ~{human_bytes(training if study.keep_checkpoints else after)} once the study "
        f"finished ({kept}); ~{human_bytes(total_after)} for the study's {planned_trials(study)} trial(s)"
    ]
    if unknown:
        lines.append(f"  (not counted: {', '.join(sorted(unknown))}, no parameter count here)")
    return lines


def trained_parameters(model: str, pooling: str) -> int | None:
    """Parameters of a transformer encoder: the backbone built from its config on the meta device (no
    weights read, no memory), plus SimCSE's MLP of ``cls`` pooling; None when the config is not here."""
    import torch
    from transformers import AutoConfig, AutoModel

    from clsr.data.hub.model_registry import resolve_model_path

    try:
        config = AutoConfig.from_pretrained(resolve_model_path(model))
        with torch.device("meta"):
            try:
                backbone = AutoModel.from_config(config, add_pooling_layer=False)
            except TypeError:
                backbone = AutoModel.from_config(config)
    except Exception:  # offline without the model, an unknown architecture: the plan says so
        return None
    hidden = getattr(config, "hidden_size", 0)
    head = hidden * hidden + hidden if pooling == "cls" else 0
    return sum(p.numel() for p in backbone.parameters()) + head


def human_bytes(n: float) -> str:
    """``722 MB``, ``1.4 GB`` (decimal units, as ``du --si``)."""
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if n < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if n >= 100 or unit == "B" else f"{n:.1f} {unit}"
        n /= 1000
    raise AssertionError("unreachable")
