"""Study files read and checked completely before Ray starts: every problem of a file is reported at
once, each as ``<file>: <dotted.field>: <what is wrong> (given: <value>)``, so a researcher fixes a
study in one pass (the schema itself: ``clsr.study.spec.schema``; the plan: ``clsr.study.plan.resolve``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from clsr.config.trial import MODEL_TYPES, TrialConfig
from clsr.methods import get_method
from clsr.study.plan.point import GridPoint
from clsr.study.plan.resolve import (
    StudyDocuments,
    find_point,
    grid_points,
    most_trials,
    report_points,
    stages,
    upstream_points,
)
from clsr.study.spec.ablation import Ablation, Need
from clsr.study.spec.dotted import deep_merge, set_dotted
from clsr.study.spec.paths import absolute_method_files
from clsr.study.spec.schema import MAX_SHOWN, SECTIONS, Study, StudyError
from clsr.study.spec.strict import MAX_TRIALS
from clsr.study.spec.yaml_safe import YAMLSafetyError, read_yaml_file
from clsr.suggest import did_you_mean


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
    labels = [p.label for p in points]
    problems += _check_match(name, ablation, where, need, points)
    if need.match:  # the choice below is made among one point's matching upstream points
        points = upstream_points(study, need, grid_points(ablation)[0].overrides) or points
        labels = [p.label for p in points]
    if need.by is not None and any(need.by not in p.overrides for p in points):
        keys = sorted({k for p in points for k in p.overrides})
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
    name: str, ablation: Ablation, where: str, need: Need, upstream: list[GridPoint]
) -> list[str]:
    """Each match key is set by every point on both sides, and every point finds an upstream point."""
    if not need.match:
        return []
    if ablation.space:
        return [f"{where}.match: a sampled ablation (space) has no points to match (given: {need.match})"]
    for side, points in (("ablation", grid_points(ablation)), (need.ablation, upstream)):
        unset = [k for k in need.match if any(k not in p.overrides for p in points)]
        if unset:
            keys = sorted({k for p in points for k in p.overrides})
            return [f"{where}.match: {unset} not set by every point of {side!r} (allowed: {keys})"]
    for point in grid_points(ablation):
        values = {k: point.overrides[k] for k in need.match}
        if not any(all(p.overrides[k] == v for k, v in values.items()) for p in upstream):
            return [f"{where}.match: no point of {need.ablation!r} has {values} (the point {point.label!r})"]
    return []


# --- trial counts ----------------------------------------------------------------------------------


def _check_size(study: Study) -> list[str]:
    """Refuse a study of more than ``MAX_TRIALS`` trials before any of its grids is expanded; an
    adaptive-seeds ablation counts at its ``max`` seeds a row."""
    counts = sorted(((most_trials(study, n), n) for n in study.ablations), reverse=True)
    total = sum(count for count, _ in counts)
    if total <= MAX_TRIALS:
        return []
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
        secret = parts[:1] == ["notify"]  # may be the URL (a bare string too): its own message masks it
        hidden = e["type"] == "missing" or isinstance(given, dict) or secret
        shown = "" if hidden else f" (given: {_shown(given)})"
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


def _check_trials(study: Study, documents: StudyDocuments) -> list[str]:
    """Resolve every grid point (and each sampled ablation's base), so a bad value fails now and not in
    trial 37. A problem the study's base gives every trial is reported once, as ``base.<field>``; one
    the base has but the ablations fix (e.g. a field ``needs`` fills) is not a problem. The trials are
    resolved through ``documents``, which ``load_documents`` returns: what the command does next (the
    plan, the checks, the counts) reads them instead of resolving them again."""
    problems: list[str] = _check_references(study)
    resolve = documents.config
    per_trial: list[tuple[str, str]] = []  # (where, rest): where + rest is the line
    for name, ablation in study.ablations.items():
        keys = list(ablation.grid) + [k for p in ablation.points for k in p.set] + list(ablation.space)
        bad_keys = [k for k in dict.fromkeys(keys) if _check_dotted_key(k)]
        problems += [f"ablations.{name}: key {k!r} {_check_dotted_key(k)}" for k in bad_keys]
        if bad_keys:
            continue
        points = documents.grids[name] if not ablation.space else [GridPoint("space", {}, {})]
        seed = study.seeds_of(name)[0]
        for point in points:
            where = f"ablations.{name}[{point.label}]"
            problems += _label_problems(where, point.label)
            found = _format_pydantic_or_none(
                lambda point=point, name=name, seed=seed: resolve(name, point.overrides, seed),
                f"{where}.",
                TrialConfig,
            )
            per_trial += [(where, p.removeprefix(where)) for p in found]
            if not found:
                trial = resolve(name, point.overrides, seed)
                per_trial += [
                    (where, rest) for rest in _metric_problems(study, trial) + _device_problems(study, trial)
                ]
    base = _format_pydantic_or_none(lambda: resolve(None, {}, study.seeds[0]), "base.", TrialConfig)
    shared = [p.removeprefix("base") for p in base]
    shared = [p for p in shared if any(p == rest for _, rest in per_trial)]
    return (
        problems
        + [f"base{p}" for p in shared]
        + [where + rest for where, rest in per_trial if rest not in shared]
    )


def _label_problems(where: str, label: str) -> list[str]:
    """A point's label goes into its trials' ids, which MLflow finds again by a quoted search string
    (``clsr.tracking.study_runs.quoted``): one quote kind is fine, both are not."""
    if "'" in label and '"' in label:
        return [
            f"{where}: the point's label holds both ' and \", which MLflow's search cannot quote: set a "
            f"label without one of them (points: [{{label: ..., set: ...}}]), or rename the value"
        ]
    return []


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
    """Each objective must be a result the trial reports: a dev-set metric needs that dev set scored,
    ``test_transfer_avg`` the transfer tasks in the final evaluation."""
    return [line for metric, _ in study.objectives for line in _one_metric_problems(metric, trial)]


def _one_metric_problems(metric: str, trial: TrialConfig) -> list[str]:
    if metric == "test_transfer_avg":
        from clsr.data.transfer import TRANSFER_TASKS

        tasks = trial.eval.tasks
        if "transfer" in tasks or len(set(tasks) & set(TRANSFER_TASKS)) > 1:
            return []
        return [
            f": metric {metric!r} needs eval.tasks to include 'transfer' (or two transfer tasks; the trial "
            f"evaluates {tasks}); add it, or choose a metric the trial reports"
        ]
    dev_task = metric.removeprefix("best_").removeprefix("dev_")
    if not metric.removeprefix("best_").startswith("dev_"):
        return []
    dev_tasks = trial.eval.dev_tasks
    if dev_task in dev_tasks:
        return []
    return [
        f": metric {metric!r} needs eval.dev_tasks to include {dev_task!r} (the trial scores "
        f"{dev_tasks or 'no dev set'}); add it, or set the study's metric to one the trial reports"
    ]


def _check_references(study: Study) -> list[str]:
    """Every ``reference`` names a point of its ablation, so the report's paired tests have a baseline;
    every ``fidelity`` exact / stand_in / stand_in_setting label names a report row, so its line describes a row that runs."""
    problems = []
    for name, ablation in study.ablations.items():
        fidelity = ablation.fidelity
        named = [("reference", ablation.reference)] if ablation.reference is not None else []
        if fidelity is not None:
            named += [("fidelity.exact", label) for label in fidelity.exact]
            named += [("fidelity.stand_in", label) for label in fidelity.stand_in]
            named += [("fidelity.stand_in_setting", label) for label in fidelity.stand_in_setting]
        problems += _missing_points(name, ablation, named)
    return problems


def _missing_points(name: str, ablation: Ablation, named: list[tuple[str, str]]) -> list[str]:
    """``(field, label)`` pairs whose label is no report row of the ablation, one line per field."""
    points = [] if ablation.space else report_points(ablation)
    given: dict[str, list[str]] = {}
    for field, label in named:
        if ablation.space or find_point(points, label) is None:
            given.setdefault(field, []).append(label)
    # reference names one row; the fidelity fields list theirs
    shown = {f: labels[0] if f == "reference" else labels for f, labels in given.items()}
    if ablation.space:  # sampled: no fixed rows to name
        return [
            f"ablations.{name}.{f}: a sampled ablation (space) has no points to name (given: {v!r})"
            for f, v in shown.items()
        ]
    allowed = [p.label for p in points]
    return [
        f"ablations.{name}.{f}: no such point (given: {v!r}; allowed: {allowed})" for f, v in shown.items()
    ]


def _check_raw_base(raw: dict[str, Any]) -> list[str]:
    """Base-config problems of a study whose top level is invalid too, so one run lists both."""
    method, base = raw.get("method"), raw.get("base", {})
    try:
        get_method(method)
    except ValueError:  # the method's own line says why
        return []
    if not isinstance(base, dict):
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
    return load_documents(path, overrides, smoke).study


def load_documents(
    path: str | Path, overrides: list[tuple[str, Any]] = (), smoke: bool = False
) -> StudyDocuments:
    """``load_study``'s study with the trials validation resolved (the one cache, ``StudyDocuments``):
    what a command that goes on to plan, check or count the study passes on."""
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
    return documents_from_dict(raw, str(path), path.parent, overrides)


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
        _drop_replaced_fidelity(merged["ablations"], smoke.get("ablations"))
    merged["name"] = f"{raw.get('name', 'study')}-smoke"
    merged.setdefault("skip_unavailable", True)
    return merged


def _drop_replaced_fidelity(ablations: dict[str, Any], smoked: Any) -> None:
    """An ablation whose rows the smoke section replaces (grid, points or space) is no longer the
    paper's table: its ``fidelity`` (labels of the full rows) is dropped unless the smoke section sets one."""
    for name, body in (smoked or {}).items() if isinstance(smoked, dict) else ():
        replaced = isinstance(body, dict) and any(k in body for k in ("grid", "points", "space"))
        if replaced and "fidelity" not in body and isinstance(ablations.get(name), dict):
            ablations[name] = {**ablations[name], "fidelity": None}


def study_from_dict(
    raw: dict[str, Any], source: str, study_dir: Path, overrides: list[tuple[str, Any]] = ()
) -> Study:
    return documents_from_dict(raw, source, study_dir, overrides).study


def documents_from_dict(
    raw: dict[str, Any], source: str, study_dir: Path, overrides: list[tuple[str, Any]] = ()
) -> StudyDocuments:
    for key, value in overrides:
        if key == "notify.url" or (key == "notify" and value is not None):  # argv: anyone's to read
            raise StudyError(source, [f"--set {key}: the webhook URL is a credential; give notify in the "
                                      f"study file, not on the command line (--set notify=null turns it off)"])  # fmt: skip
        raw = set_dotted(raw, f"base.{key}" if key.split(".")[0] in SECTIONS else key, value)
    raw, problems = resolve_from_files(raw, study_dir)
    raw = absolute_method_files(raw, study_dir)
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
    documents = StudyDocuments(study)
    problems += _check_trials(study, documents)
    if problems:
        raise StudyError(source, problems)
    return documents
