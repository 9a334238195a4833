"""Promote a study's best finished trial to MLflow's Model Registry, where ``models:/<name>/<version>``
names it for ``platform eval --model`` and for anyone loading it with MLflow.

The model is what the trial logged on its own run as ``model/`` (``eval.log_model``: a
sentence-transformers folder, or GCLSR's TextCNN files). Those are plain files, not an MLflow flavour,
so the version is made with ``MlflowClient.create_model_version`` on the run's ``runs:/<id>/model``
(``mlflow.register_model`` in MLflow 3 only accepts a logged MLflow model). The version carries tags
saying what it is: study, ablation, point, the seeds of the point that finished, the trial's
fingerprint (its resolved configuration's hash) and the metric's value. Choosing the trial is the only
hand-written part: the study's ``metric`` and ``mode`` over the finished trials, optionally of one point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlflow.entities.model_registry import ModelVersion
from mlflow.exceptions import MlflowException

from clsr.study.analyse.runs import Trial, load_trials, open_study_runs
from clsr.study.plan.fingerprint import trial_key
from clsr.study.record.attempts import recorded_fingerprint
from clsr.study.spec.schema import Study
from clsr.tracking import escape
from clsr.tracking.record_reader import finite
from clsr.tracking.secrets import mask_uri


class PromoteRefused(LookupError):
    """No finished trial to promote, an ambiguous point, or a trial that logged no model."""


@dataclass(frozen=True)
class Promoted:
    version: ModelVersion
    trial: Trial
    tags: dict[str, str]

    def line(self) -> str:
        return escape.visible(
            f"registered models:/{self.version.name}/{self.version.version}: {self.tags['ablation']}"
            f"[{self.tags['point']}] seed {self.trial.seed} (run {self.trial.run_id}), "
            f"{self.tags['metric']} = {self.tags['metric_value']}"
        )


def candidates(trials: list[Trial], study: Study, ablation: str | None, point: str | None) -> list[Trial]:
    """The finished trials that logged the study's metric, of ``ablation``/``point`` when named."""
    if ablation is not None and ablation not in study.ablations:
        raise PromoteRefused(
            f"--ablation {ablation!r}: study {study.name!r} has no such ablation; it has "
            f"{', '.join(study.ablations)}"
        )
    done = [t for t in trials if t.ok and finite(t.metrics.get(study.metric))]  # NaN never wins
    if ablation is not None:
        done = [t for t in done if t.ablation == ablation]
    if point is not None:
        matching = [t for t in done if t.point == point]
        runs = {
            a: frozenset(t.run_id for t in matching if t.ablation == a)
            for a in {t.ablation for t in matching}
        }
        if len(set(runs.values())) > 1:  # one label in several ablations (the same runs there: identical)
            raise PromoteRefused(
                f"--point {point!r} is a point of ablations {', '.join(sorted(runs))}: give --ablation"
            )
        if not matching:
            points = sorted({f"{t.ablation}[{t.point}]" for t in done})
            raise PromoteRefused(
                f"--point {point!r}: no finished trial of study {study.name!r} at that point; finished "
                f"points: {', '.join(points) or 'none'}"
            )
        done = matching
    if not done:
        where = f" of ablation {ablation!r}" if ablation else ""
        raise PromoteRefused(
            f"study {study.name!r} has no finished trial{where} that logged its metric {study.metric!r}: "
            f"nothing to promote"
        )
    return done


def best(trials: list[Trial], study: Study) -> Trial:
    """The trial whose metric is best by the study's mode (the earlier one on a tie); a NaN or infinite
    value is no candidate (``max`` over NaN keeps whichever came first)."""
    sign = 1 if study.mode == "max" else -1
    ranked = [t for t in trials if finite(t.metrics.get(study.metric))]
    if not ranked:
        raise PromoteRefused(f"study {study.name!r}: no trial has a finite {study.metric!r} to rank")
    return max(reversed(ranked), key=lambda t: sign * t.metrics[study.metric])


def version_tags(
    study: Study, trial: Trial, finished: list[Trial], fingerprint: dict[str, str]
) -> dict[str, str]:
    seeds = sorted(
        {t.seed for t in finished if (t.ablation, t.point) == (trial.ablation, trial.point)} - {None}
    )
    key = trial_key(trial.ablation, trial.point, trial.seed) if trial.seed is not None else ""
    return {
        "study": study.name,
        "ablation": trial.ablation,
        "point": trial.point,
        "seed": str(trial.seed),
        "seeds": ",".join(map(str, seeds)),
        "fingerprint": fingerprint.get(key, "unknown"),
        "metric": study.metric,
        "metric_value": repr(trial.metrics[study.metric]),
        "run_id": trial.run_id,
    }


def promote(
    study: Study,
    uri: str,
    ablation: str | None = None,
    point: str | None = None,
    name: str | None = None,
    run_id: str | None = None,
) -> Promoted:
    """Register the best finished trial's ``model/`` as a new version of ``name`` (default: the study's
    name) in the registry of ``uri``."""
    client, parent = open_study_runs(study.name, uri, run_id)
    client = type(client)(uri, registry_uri=uri)  # the registry lives in the tracking store
    trials = load_trials(client, parent.info.run_id)
    chosen = best(candidates(trials, study, ablation, point), study)
    if not any(
        a.path == "model" or a.path.startswith("model/") for a in client.list_artifacts(chosen.run_id)
    ):
        raise PromoteRefused(
            f"the best trial {chosen.ablation}[{chosen.point}] seed {chosen.seed} (run {chosen.run_id}) "
            f"logged no model/ artifact (eval.log_model: false, or its export failed: tag clsr.model_error)"
        )
    finished = [t for t in trials if t.ok]
    tags = version_tags(study, chosen, finished, recorded_fingerprint(client, parent.info.run_id))
    name = name or study.name
    _ensure_registered(client, name, study)
    version = client.create_model_version(
        name,
        f"runs:/{chosen.run_id}/model",
        run_id=chosen.run_id,
        tags=tags,
        description=f"study {study.name}: {chosen.ablation}[{chosen.point}] seed {chosen.seed}, "
        f"{study.metric} = {chosen.metrics[study.metric]:.4f} (MLflow {mask_uri(uri)})",
    )
    return Promoted(version, chosen, tags)


def _ensure_registered(client: Any, name: str, study: Study) -> None:
    try:
        client.get_registered_model(name)
    except MlflowException:
        client.create_registered_model(name, description=f"models promoted from study {study.name}")
