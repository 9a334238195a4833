"""What a study's trials read, checked before anything starts: every trial's ``model.name``,
``data.train`` and ``eval.custom`` files (``study validate``, and ``study run`` before Ray starts), so a typo never reaches a
retried worker. Only names, files' headers and the hub's metadata are read, never weights or rows."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clsr.data.external import data_source_problem
from clsr.data.hub.model_registry import model_source_problem
from clsr.eval.custom import source_problems as custom_task_problems
from clsr.methods import get_method
from clsr.study.plan.point import GridPoint
from clsr.study.plan.resolve import Resolve, StudyDocuments, resolver
from clsr.study.spec.schema import Study, StudyError

MAX_PLACES = 3  # points named per problem line; the rest counted


@dataclass
class SourceReport:
    """Problems (never runnable as written) and unavailable points (runnable elsewhere: hub ids offline),
    each ``{message: [where, ...]}`` so one bad base value is one line, not one per point."""

    problems: dict[str, list[str]] = field(default_factory=dict)
    unavailable: dict[str, list[str]] = field(default_factory=dict)
    notes: dict[str, list[str]] = field(default_factory=dict)  # runnable, but worth a word

    def lines(self, which: str) -> list[str]:
        found = {"problems": self.problems, "unavailable": self.unavailable, "notes": self.notes}[which]
        return [f"{_places(wheres)}: {message}" for message, wheres in found.items()]


def _places(wheres: list[str]) -> str:
    shown = ", ".join(wheres[:MAX_PLACES])
    return shown + (f" (and {len(wheres) - MAX_PLACES} more points)" if len(wheres) > MAX_PLACES else "")


def trial_source_problems(trial: Any) -> tuple[list[str], list[str]]:
    """``(problems, unavailable)`` of one resolved ``TrialConfig``."""
    method_cls = get_method(trial.method["name"])
    method = method_cls(method_cls.Config(**trial.method))
    fewer = [
        f"with method.{option}: {str(value).lower()} it needs only {list(columns)}"
        for option, value, columns in method.fewer_columns()
    ]
    checks = [data_source_problem(trial.data, method.required_columns(), fewer)]
    if method_cls.encoder_type == "transformer":
        checks.append(_model_check(trial.model.name))
    problems = [p for p, _ in checks if p]
    unavailable = [u for _, u in checks if u]
    for name, task in trial.eval.custom_tasks().items():  # the user's evaluation sets: headers only
        problems += custom_task_problems(name, task)
    return problems + _hub_dev_problems(trial), unavailable


def _hub_dev_problems(trial: Any) -> list[str]:
    """Dev sets the hub does not publish (SICK-R's), when the trial reads from the hub (no data_dir)."""
    from clsr.data.hub.manifest import NotInManifest, require_listed
    from clsr.data.sources import DataUnavailableError, resolve_data_dir
    from clsr.data.sts import HUB_IDS, HUB_SPLITS, pair_file

    try:
        if resolve_data_dir(trial.data.data_dir) is not None:
            return []
    except DataUnavailableError as err:
        return [str(err)]
    problems = []
    for task in (t for t in trial.eval.dev_tasks if t in HUB_IDS):
        try:
            require_listed(HUB_IDS[task], [HUB_SPLITS["dev"]])
        except NotInManifest as err:
            problems.append(
                f"eval.dev_tasks {task}: no data folder is set, so it would come from the hub, but {err}. "
                f"Set CLSR_DATA_DIR (or data.data_dir) to a folder holding {pair_file(task, 'dev')}, or "
                f"select on stsb (eval.dev_tasks: [stsb], select_on: stsb)"
            )
    return problems


def trial_source_notes(trial: Any) -> list[str]:
    """A sentence-transformers model trained with a pooling other than its own (model.pooling set, or a
    method's default): said, with how to use its own, since its published scores assume its own."""
    from clsr.data.hub.st_modules import NotSentenceTransformers, own_modules, own_pooling

    if get_method(trial.method["name"]).encoder_type != "transformer" or any(_model_check(trial.model.name)):
        return []
    try:
        modules = own_modules(trial.model.name)
    except NotSentenceTransformers:
        return []
    try:
        own = own_pooling(trial.model.name)
    except NotSentenceTransformers:
        own = None
    if own == trial.model.pooling:
        return []
    use = "model.pooling: auto uses its own" if own else "clsr cannot train with all of them"
    return [
        f"model.name {trial.model.name} is a sentence-transformers model ({', '.join(modules)}); "
        f"model.pooling {trial.model.pooling} trains it with clsr's pooler instead ({use})"
    ]


def embedded_notes(trial: Any) -> list[str]:
    """The package's embedded sample will serve the trial's data: said, with how to get the full sets."""
    from clsr.data.embedded import served_note

    tasks = [*trial.eval.tasks, *trial.eval.dev_tasks]
    note = None if trial.data.external() else served_note(trial.data.data_dir, trial.data.train, tasks)
    return [note] if note else []


def attention_notes(trial: Any, on_gpu: bool) -> list[str]:
    """What ``model.attention: auto`` will run (chosen where the model loads: the same rule here)."""
    from clsr.data.hub.model_registry import model_type
    from clsr.encoders.transformer import choose_attention

    if getattr(trial.model, "attention", None) != "auto":
        return []
    kind = model_type(trial.model.name)
    chosen = choose_attention("auto", kind, on_gpu)
    where = "GPU" if on_gpu else "CPU"
    what = "sdpa_packed" if chosen else "transformers' default (padded)"
    return [f"model.attention auto: {what} on {where} trials ({trial.model.name}: {kind or 'type unknown'})"]


_MODEL_CHECKS: dict[tuple[str, str, str], tuple[str | None, str | None]] = {}


def _model_check(name: str) -> tuple[str | None, str | None]:
    """One check per name and offline setting in this process (a grid repeats its model many times)."""
    from clsr.data.hub.model_registry import hub_cache, offline

    key = (name, str(offline()), str(hub_cache()))
    if key not in _MODEL_CHECKS:
        _MODEL_CHECKS[key] = model_source_problem(name)
    return _MODEL_CHECKS[key]


def check_sources(
    study: Study, grids: dict[str, list[GridPoint]] | None = None, resolve: Resolve | None = None
) -> SourceReport:
    """The data folder, then every grid point's trial (a sampled ablation's base trial), first seed.
    ``grids`` (ablation -> its ``grid_points``) and ``resolve`` (``resolve_trial`` of an ablation,
    overrides and seed): the command's documents (``clsr.study.plan.resolve.StudyDocuments``), which
    validation resolved; by default resolved here."""
    from clsr.data.sources import data_folder_problem

    if grids is None:
        grids = StudyDocuments(study).grids
    resolve = resolver(study, resolve)
    report = SourceReport()
    if problem := data_folder_problem((study.base.get("data") or {}).get("data_dir")):
        report.problems[problem] = ["base.data"]
        return report  # every trial would say the same
    for name, ablation in study.ablations.items():
        points = grids[name] if not ablation.space else [GridPoint("base", {}, {})]
        for point in points:
            trial = resolve(name, point.overrides, study.seeds_of(name)[0])
            problems, unavailable = trial_source_problems(trial)
            where = f"ablations.{name}[{point.label}]"
            on_gpu = study.resources.gpus_per_worker > 0
            notes = (
                []
                if problems or unavailable
                else trial_source_notes(trial) + attention_notes(trial, on_gpu) + embedded_notes(trial)
            )
            for message in notes:
                report.notes.setdefault(message, []).append(where)
            for message in problems:
                report.problems.setdefault(message, []).append(where)
            for message in unavailable:
                report.unavailable.setdefault(message, []).append(where)
    return report


def require_sources(
    study: Study,
    source: str,
    grids: dict[str, list[GridPoint]] | None = None,
    resolve: Resolve | None = None,
) -> SourceReport:
    """The report, or StudyError naming every problem (and every unavailable point unless the study
    skips those: ``skip_unavailable``). ``grids`` and ``resolve``: as ``check_sources`` takes them."""
    report = check_sources(study, grids, resolve)
    lines = report.lines("problems")
    if report.unavailable and not study.skip_unavailable:
        lines += report.lines("unavailable")
        lines.append(
            "fix the above, or set skip_unavailable: true (--set skip_unavailable=true) to run the rest"
        )
    if lines:
        raise (NeedsHub if not report.problems else StudyError)(source, lines)
    return report


class NeedsHub(StudyError):
    """A study that is right as written but names hub models or sets this machine cannot reach now."""
