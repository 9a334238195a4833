"""A validated study's resolved plan, built once (``plan_study``) and passed as given to what runs it:
its points (each grid's, checked: runnable here, or unavailable and why), every trial of the runnable
points with its resolved configuration, the waves it runs in, and its fingerprint.

Each trial document is built once (``clsr.study.plan.resolve.StudyDocuments``, the one cache): validation
(``load_documents``) resolves each point's first seed and returns the documents, the plan keeps them and adds
the other seeds; the source checks (``clsr.study.plan.sources``), the fingerprint (``clsr.study.plan.fingerprint``) and the
trials' configurations all read the same ones. A staged trial (its ablation ``needs`` upstream trials' outputs) has no
configuration in the plan: it resolves only once those outputs exist (``clsr.study.run.waves.ready_trials``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from clsr.config.trial import TrialConfig
from clsr.study.plan.fingerprint import fingerprint, trial_key
from clsr.study.plan.point import GridPoint
from clsr.study.plan.resolve import Resolve, StudyDocuments, experiments, point_label, resolver
from clsr.study.spec.schema import Study, StudyError


@dataclass(frozen=True)
class TrialSpec:
    """One trial, typed from the plan to the trial: its point (``label`` None for a sampled trial, named by
    its Tune trial id), seed, the points of identical trials it also stands for (``also``: ``(ablation,
    label)``, ``clsr.study.plan.distinct``), and its resolved ``config``; None for a trial the plan could
    not resolve (a staged one: its upstream outputs are not known yet; a confirmed configuration, an
    adaptive round's seed, a sampled ablation's base): the runner resolves it."""

    ablation: str
    label: str | None
    overrides: dict[str, Any]
    paper: dict[str, float]
    seed: int
    config: TrialConfig | None = None
    also: tuple[tuple[str, str], ...] = ()

    @property
    def key(self) -> str:
        return trial_key(self.ablation, self.label or point_label(self.overrides), self.seed)


@dataclass(frozen=True)
class StudyPlan:
    """``points``: the runnable points (each tied to its ablation), in study order;
    ``unavailable``: ``ablations.<name>[<point>]: why`` per point that cannot run here; ``trials``: the
    runnable points × their ablation's seeds; ``waves``: ``(Tune experiment, sampled ablation or None,
    ablations)`` in running order; ``fingerprint``: trial key -> hash (what a resume compares);
    ``documents``: the one resolution cache, validation's (``load_documents``)."""

    study: Study
    points: tuple[GridPoint, ...]
    unavailable: tuple[str, ...]
    trials: tuple[TrialSpec, ...]
    waves: tuple[tuple[str, str | None, list[str]], ...]
    fingerprint: dict[str, str]
    documents: StudyDocuments = field(repr=False, compare=False)

    @property
    def methods(self) -> list[str]:
        """Every method reference the study's trials name (its own, its ablations', points' ``method.name``)."""
        named = [self.study.method, *(a.method for a in self.study.ablations.values())]
        named += [p.overrides.get("method.name") for p in self.points]
        named += [t.config.method["name"] for t in self.trials if t.config is not None]
        return sorted({m for m in named if isinstance(m, str)})

    def wave_trials(self, wave: list[str]) -> list[TrialSpec]:
        """The trials of the ablations in ``wave``, in plan order."""
        return [t for t in self.trials if t.ablation in wave]


def plan_study(study: Study, documents: StudyDocuments | None = None) -> StudyPlan:
    """The plan of a validated study; StudyError when a point can never run as written (its sources:
    ``clsr.study.plan.sources``). Unavailable points are listed, not refused: ``runner.refuse_unavailable``
    decides (``skip_unavailable``). ``documents``: those validation resolved (``load_documents``), else
    resolved here."""
    docs = documents if documents is not None and documents.study is study else StudyDocuments(study)
    grids = docs.grids
    prints = fingerprint(study, grids, docs.document)
    points, unavailable = check_points(study, grids, docs.config)
    staged = {name for name, a in study.ablations.items() if a.needs}  # resolved once upstream ran
    trials = tuple(
        TrialSpec(
            p.ablation,
            p.label,
            p.overrides,
            p.paper,
            seed,
            None if p.ablation in staged else _config(docs, p, seed),
        )
        for p in points
        for seed in study.seeds_of(p.ablation)
    )
    waves = tuple(experiments(study))
    return StudyPlan(study, tuple(points), tuple(unavailable), trials, waves, prints, docs)


def _config(docs: StudyDocuments, point: GridPoint, seed: int) -> TrialConfig:
    """A point's configuration with ``seed``; validation checked the first seed only, so another one
    that does not validate is a StudyError naming the trial, before anything starts."""
    try:
        return docs.config(point.ablation, point.overrides, seed)
    except ValidationError as err:
        where = trial_key(point.ablation, point.label, seed)
        raise StudyError(docs.study.name, [f"{where}: {err.errors()[0]['msg']}"]) from None


def check_points(
    study: Study, grids: dict[str, list[GridPoint]] | None = None, resolve: Resolve | None = None
) -> tuple[list[GridPoint], list[str]]:
    """Every grid point, and why each point that cannot run here can't (its model or data is not here,
    or its method says so); StudyError when a point can never run as written (``clsr.study.plan.sources``).
    ``grids`` and ``resolve``: the plan's points and configurations (default: resolved here)."""
    from clsr.methods import build_method
    from clsr.study.plan.sources import check_sources, trial_source_problems

    if grids is None:
        grids = StudyDocuments(study).grids
    resolve = resolver(study, resolve)
    report = check_sources(study, grids, resolve)
    if report.problems:
        raise StudyError(study.name, report.lines("problems"))
    points, unavailable = [], []
    for name in study.ablations:
        grid = grids[name]
        if not grid:  # sampled, or confirming only: its base trial stands for the points to come
            base = resolve(name, {}, study.seeds_of(name)[0])
            unavailable += [f"ablations.{name}[base]: {why}" for why in trial_source_problems(base)[1]]
            continue
        for point in grid:
            trial = resolve(name, point.overrides, study.seeds_of(name)[0])
            missing = trial_source_problems(trial)[1]
            why = missing[0] if missing else build_method(trial).unavailable(trial)
            if why:
                unavailable.append(f"ablations.{name}[{point.label}]: {why}")
            else:
                points.append(point.of(name))
    return points, unavailable
