"""One trial rebuilt from its study's record alone (``platform study reproduce``, issue 55): the child run
found by its id, or by study, point and seed; its configuration rebuilt from the parent's ``resolved.yaml``
(the ablation's base trial document, which keeps explicit nulls such as ``--set trainer.max_grad_norm=null``,
then the point's overrides and the seed, as ``clsr.study.plan.resolve.trial_document`` builds it); and the
rebuilt configuration checked against the trial's own logged params, each difference named (a method file
edited since, a field a newer clsr added). Read through the one trusted reader: nothing a colleague wrote
makes it raise anything but ``NotReproducible``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mlflow.exceptions import MlflowException
from mlflow.tracking import MlflowClient
from pydantic import ValidationError

from clsr.config.methods import method_source
from clsr.config.trial import TrialConfig
from clsr.study.analyse.runs import NoStudyRuns, open_study_runs, recorded_summary
from clsr.study.spec.dotted import set_dotted
from clsr.study.spec.schema import Study
from clsr.tracking.escape import visible
from clsr.tracking.record_reader import tag_int
from clsr.tracking.secrets import mask_uri
from clsr.tracking.study_runs import MAX_PARAM_LENGTH, SUPERSEDED_TAG, children, flatten

PARENT = "mlflow.parentRunId"
UNRECORDED = "-"
METHOD_HASH = "method.sha256"  # the method file's hash: an edit since the trial is drift, not another trial


class NotReproducible(LookupError):
    """The trial cannot be rebuilt from the record: no such run, not a trial, or a kind not rebuilt yet."""


@dataclass(frozen=True)
class RecordedTrial:
    """A trial as its record holds it, and its configuration rebuilt from that record. ``differences``:
    (param, the trial's logged value, the rebuilt one) where the two disagree."""

    run_id: str
    parent_run_id: str
    experiment_id: str
    study: Study
    ablation: str
    label: str
    seed: int
    config: TrialConfig
    params: dict[str, str]
    metrics: dict[str, float]
    tags: dict[str, str]
    differences: tuple[tuple[str, str, str], ...] = ()


def find_trial_run(client: MlflowClient, uri: str, target: str, point: str | None, seed: int | None):
    """The trial's child run: ``target`` a run id (no point, no seed), else a study name whose newest
    record holds one trial of ``point`` (its label, as the run's ``clsr.point`` tag holds it) and ``seed``."""
    if point is None and seed is None:
        try:
            return client.get_run(target)
        except MlflowException:
            raise NotReproducible(f"no MLflow run {visible(target)[:100]!r} at {mask_uri(uri)}") from None
    if point is None or seed is None:
        raise NotReproducible("give a child run id, or a study with both --point and --seed")
    try:
        client, parent = open_study_runs(target, uri)
    except NoStudyRuns as err:
        raise NotReproducible(str(err)) from None
    trials = [
        r
        for r in children(client, parent.info.run_id)
        if "clsr.ablation" in r.data.tags and SUPERSEDED_TAG not in r.data.tags
    ]
    found = [
        r
        for r in trials
        if r.data.tags.get("clsr.point") == point and r.data.tags.get("clsr.seed") == str(seed)
    ]
    if not found:
        labels = sorted({visible(r.data.tags.get("clsr.point", "?"))[:100] for r in trials})
        raise NotReproducible(
            f"study {target!r} has no trial of point {visible(point)!r} with seed {seed}; its points: "
            + (", ".join(labels) or "none")
        )
    finished = [r for r in found if r.data.tags.get("clsr.status") == "finished"]
    return sorted(finished or found, key=lambda r: r.info.start_time or 0)[-1]


def rebuild(client: MlflowClient, run: Any, folder: Path) -> RecordedTrial:
    """The trial of child run ``run`` rebuilt from its parent's record (``folder``: where the record's
    files are read)."""
    tags = dict(run.data.tags)
    run_id = run.info.run_id
    parent_id, ablation, label = tags.get(PARENT), tags.get("clsr.ablation"), tags.get("clsr.point")
    seed = tag_int(tags, "clsr.seed", run_id)
    if not parent_id or not ablation or label is None or seed is None:
        raise NotReproducible(
            f"MLflow run {run_id} is no study trial (it lacks its parent run, or a clsr.ablation, "
            f"clsr.point or clsr.seed tag)"
        )
    try:
        study, recorded = recorded_summary(client, parent_id, folder)
    except NoStudyRuns as err:
        raise NotReproducible(str(err)) from None
    document = trial_document_of(study, recorded, ablation, label, seed)
    try:
        config = TrialConfig.model_validate(document)
    except ValidationError as err:
        raise NotReproducible(
            f"the recorded configuration of {visible(label)[:100]} does not validate here: "
            f"{visible(str(err.errors()[0]['msg']))[:300]}"
        ) from None
    params = {str(k): str(v) for k, v in run.data.params.items()}
    return RecordedTrial(
        run_id=run_id,
        parent_run_id=parent_id,
        experiment_id=run.info.experiment_id,
        study=study,
        ablation=ablation,
        label=label,
        seed=seed,
        config=config,
        params=params,
        metrics=dict(run.data.metrics),
        tags=tags,
        differences=tuple(config_differences(config, params)),
    )


def trial_document_of(
    study: Study, recorded: dict[str, Any], ablation: str, label: str, seed: int
) -> dict[str, Any]:
    """The trial's document from ``resolved.yaml``: its ablation's base trial (``base_trials``), the
    point's overrides (``points``), its seed."""
    spec = study.ablations.get(ablation)
    if spec is None:
        raise NotReproducible(f"the record's study has no ablation {visible(ablation)[:100]!r}")
    if spec.needs:
        raise NotReproducible(
            f"ablation {ablation!r} is staged (needs: upstream trials' outputs): its trials are not "
            f"reproduced yet"
        )
    base, points = _under(recorded, "base_trials", ablation), _under(recorded, "points", ablation)
    if not isinstance(base, dict) or not isinstance(points, list):
        kind = "sampled" if points == "sampled" else "not recorded"
        raise NotReproducible(
            f"the record holds no base trial and grid points of ablation {ablation!r} ({kind}): a sampled "
            f"trial's point is not reproduced yet"
        )
    found = [p for p in points if isinstance(p, dict) and p.get("label") == label]
    overrides = found[0].get("overrides") if found else None
    if not isinstance(overrides, dict):
        raise NotReproducible(f"the record holds no point {visible(label)[:100]!r} of ablation {ablation!r}")
    document = base
    try:
        for key, value in overrides.items():
            document = set_dotted(document, str(key), value)
        return set_dotted(document, "trainer.seed", seed)
    except (TypeError, ValueError, AttributeError) as err:  # a section that is no mapping
        raise NotReproducible(f"the record's point {visible(label)[:100]!r} does not apply: {err}") from None


def _under(recorded: dict[str, Any], section: str, ablation: str) -> Any:
    """``recorded[section][ablation]``, or None when either is missing or no mapping."""
    found = recorded.get(section)
    return found.get(ablation) if isinstance(found, dict) else None


def changed_params(recorded: RecordedTrial) -> list[str]:
    """The params whose rebuilt value differs from the trial's logged one, the method file's hash aside:
    the rebuild is another configuration than the one that trained (an edited resume changed it, and
    ``resolved.yaml`` holds the first attempt's), so a rerun of it reproduces nothing."""
    return [key for key, _, _ in recorded.differences if key != METHOD_HASH]


def config_differences(config: TrialConfig, params: dict[str, str]) -> list[tuple[str, str, str]]:
    """(param, the trial's logged value, the rebuilt one) for each configuration param that differs,
    the method's source (its file's hash) included; a param the trial did not log shows ``-``."""
    rebuilt = config.model_dump()
    rebuilt["method"] |= {
        k: v for k, v in method_source(config.method["name"]).params().items() if k not in rebuilt["method"]
    }
    found = []
    for key, value in flatten(rebuilt).items():
        here = mask_uri(str(value))[:MAX_PARAM_LENGTH]
        logged = params.get(key, UNRECORDED)
        if logged != here:
            found.append((key, logged, here))
    return found
