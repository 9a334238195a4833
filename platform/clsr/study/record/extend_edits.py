"""The edits ``platform study extend`` refuses: any change since the record outside the extended ablation's
``space``. An extension continues its search in the setting it was sampled in; an edit of the search
settings, the seeds, another ablation or a method would search other ablations again (or run the
extended one under new settings), so it belongs to ``study resume --allow-changes``.

Read from the recorded fingerprint (``clsr.study.plan.fingerprint``), which hashes a sampled ablation's
base and space together: the base is told apart by hashing the base as it is now with the space the
record's study file gave (hand-written: nothing records the two apart).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from clsr.study.plan.fingerprint import (
    METHOD_ENTRY,
    STUDY_ENTRY,
    compare,
    digest,
    fingerprint,
    trial_key,
    with_method,
)
from clsr.study.plan.resolve import StudyDocuments
from clsr.study.record.attempts import recorded_fingerprint, recorded_study_file
from clsr.study.spec.schema import Study
from clsr.study.spec.space import Distribution
from clsr.study.spec.yaml_safe import read_yaml_file


def edited_outside_space(client, parent_run_id: str, study: Study, ablation: str) -> str | None:
    """The field of an edit since the record outside ``ablation``'s space, as a study file names it; None
    when there is none."""
    recorded = recorded_fingerprint(client, parent_run_id)
    changes = compare(recorded, fingerprint(study)) if recorded else None
    if not changes:
        return None
    if STUDY_ENTRY in changes.changed:
        return "metric, mode, scheduler or search"
    own = trial_key(ablation, "space", "")
    if any(key.startswith(own) for key in changes.added + changes.removed):
        return f"seeds (of ablations.{ablation})"
    if any(key.startswith(own) for key in changes.changed) and not same_base(
        client, parent_run_id, study, ablation, recorded
    ):
        return f"base (the study's or ablations.{ablation}.base)"
    for key in changes.added + changes.removed + changes.changed:
        if key.startswith(METHOD_ENTRY):
            return f"method {key.removeprefix(METHOD_ENTRY)} (its source)"
        if not key.startswith(own):
            return f"ablations.{key.partition('[')[0]}"
    return None


def same_base(client, parent_run_id: str, study: Study, ablation: str, recorded: dict[str, str]) -> bool:
    """Whether ``ablation``'s recorded entries hold for its base as it is now with the space it was recorded
    with; True when that space cannot be read inline from the recorded file (given by ``from:``)."""
    space = recorded_space(client, parent_run_id, ablation)
    if space is None:
        return True
    documents = StudyDocuments(study)
    for seed in study.seeds_of(ablation):
        doc = documents.document(ablation, {}, seed)
        if digest(with_method(doc, {"base": doc, "space": space})) != recorded.get(
            trial_key(ablation, "space", seed)
        ):
            return False
    return True


def recorded_space(client, parent_run_id: str, ablation: str) -> dict | None:
    """``ablation``'s space as the record's latest study file gave it inline (each distribution as the
    fingerprint dumps it); None when it is not there, comes from a file, or does not validate."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            path = client.download_artifacts(parent_run_id, recorded_study_file(client, parent_run_id), tmp)
            entry = (read_yaml_file(Path(path)).get("ablations") or {}).get(ablation) or {}
            if not isinstance(entry, dict) or "from" in entry or not isinstance(entry.get("space"), dict):
                return None
            return {key: Distribution.model_validate(d).model_dump() for key, d in entry["space"].items()}
        except (OSError, ValueError, AttributeError):
            return None
