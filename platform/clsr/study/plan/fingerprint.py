"""The resolved study as one fingerprint: what a resume compares before it continues anything.

Each trial is keyed by ``<ablation>[<point>] seed=<n>`` (a sampled ablation by its base and space) and
hashed over its fully resolved configuration, plus one entry for what decides which trials stop early
or how they are chosen (metric, mode, scheduler, search). A method from outside the package adds its
source's identity to each of its trials (``with_method``) and an entry of its own, which names the
file or distribution when a resume finds it changed. A confirm ablation is keyed by its spec and
base per seed, and by its explicit points: the configurations it confirms are known only once its
upstream ran, so they are not in the fingerprint (a resume picks the same ones from the same runs). An
adaptive-seeds ablation is keyed by its first ``min`` seeds, each entry hashed with its adaptive rule. Settings that do not change a trial's result
(resources, concurrency, time limits, storage, tracking) are left out, so a resume may change them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from clsr.config.methods import method_source
from clsr.study.plan.point import GridPoint
from clsr.study.plan.resolve import StudyDocuments
from clsr.study.spec.schema import Study

STUDY_ENTRY = "(study) metric, mode, scheduler, search"
METHOD_ENTRY = "(method) "  # + a method's reference: its source's identity, so a resume can name it


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def trial_key(ablation: str, label: str, seed: int | str) -> str:
    return f"{ablation}[{label}] seed={seed}"


def fingerprint(
    study: Study,
    grids: dict[str, list[GridPoint]] | None = None,
    document: Callable[[str, dict[str, Any], int], dict[str, Any]] | None = None,
) -> dict[str, str]:
    """trial key -> hash of its resolved configuration (and the study-wide entry). ``grids`` (ablation
    -> its ``grid_points``) and ``document`` (``trial_document`` of an ablation, overrides and seed):
    the study plan's, built once (``clsr.study.plan.study_plan``); by default the study's documents'
    (a fresh ``StudyDocuments``)."""
    if grids is None or document is None:
        documents = StudyDocuments(study)
        grids = documents.grids if grids is None else grids
        document = documents.document if document is None else document
    entries = {
        STUDY_ENTRY: digest(
            {
                "metric": study.metric,
                "mode": study.mode,
                "scheduler": study.scheduler.model_dump(),
                "search": search_entry(study),
            }
        )
    }
    for name, ablation in study.ablations.items():
        for seed in study.seeds_of(name):
            if ablation.space:
                doc = document(name, {}, seed)
                space = {k: d.model_dump() for k, d in ablation.space.items()}
                entries[trial_key(name, "space", seed)] = digest(
                    with_method(doc, {"base": doc, "space": space})
                )
                continue
            if ablation.confirm is not None:
                doc = document(name, {}, seed)
                confirm = ablation.confirm.model_dump()
                entries[trial_key(name, "confirm", seed)] = digest(
                    with_method(doc, {"base": doc, "confirm": confirm})
                )
            for point in grids[name]:
                doc = document(name, point.overrides, seed)
                adaptive = study.adaptive_of(name)  # its rule decides which seeds run beyond the first min
                value = {"doc": doc, "adaptive": adaptive.model_dump()} if adaptive else doc
                entries[trial_key(name, point.label, seed)] = digest(with_method(doc, value))
    return entries | method_entries(grids, study, document)


def search_entry(study: Study) -> dict[str, Any]:
    """The ``search`` section as fingerprinted: a key added since (``prune_seeds``) only when it is set,
    so the records of studies that do not use it resume unchanged."""
    unset = {"prune_seeds"} if study.search.prune_seeds is None else set()
    return study.search.model_dump(exclude=unset)


def method_entries(
    grids: dict[str, list[GridPoint]],
    study: Study,
    document: Callable[[str, dict[str, Any], int], dict[str, Any]],
) -> dict[str, str]:
    """``(method) <reference>`` -> its source's identity, for each method from outside the package the
    study's trials use (a built-in has none: the package's version decides it)."""
    references = set()
    for name in study.ablations:
        seed = study.seeds_of(name)[0]
        overrides = [point.overrides for point in grids[name]] or [{}]  # a search's or confirm's base
        references |= {document(name, each, seed)["method"]["name"] for each in overrides}
    identities = {ref: method_source(ref).identity() for ref in sorted(references)}
    return {METHOD_ENTRY + ref: digest(i) for ref, i in identities.items() if i is not None}


def with_method(doc: dict[str, Any], value: Any) -> Any:
    """A trial's hashed value with its method's source when the method is not built in (its file's SHA-256,
    or its distribution's name and version): an edited method file is a changed trial. A built-in
    method's trials hash as they always did."""
    identity = method_source(doc["method"]["name"]).identity()
    return value if identity is None else {"trial": value, "method": identity}


def overall(entries: dict[str, str]) -> str:
    return digest(entries)


@dataclass(frozen=True)
class Changes:
    added: list[str]
    removed: list[str]
    changed: list[str]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)

    def describe(self, limit: int = 20) -> list[str]:
        lines = [
            f"the method {key.removeprefix(METHOD_ENTRY)} changed (its file's SHA-256, or its distribution's "
            "version): its trials below run again"
            for key in self.changed if key.startswith(METHOD_ENTRY)
        ]  # fmt: skip
        trials = (self.added, self.removed, [k for k in self.changed if not k.startswith(METHOD_ENTRY)])
        for what, keys in zip(("added", "removed", "changed"), trials, strict=True):
            shown = ", ".join(keys[:limit]) + (
                f", ... ({len(keys) - limit} more)" if len(keys) > limit else ""
            )
            if keys:
                lines.append(f"{len(keys)} {what}: {shown}")
        return lines


def changed_searches(recorded: dict[str, str], changes: Changes) -> list[str]:
    """The sampled ablations that ran (in ``recorded``) and that an edited resume must search again: their
    base, space or seeds changed, they were removed, or the search settings changed (every one of them).
    Tune restores a search as it was sampled, so an edited one is a new search, not a continued one."""
    searched = trial_key("", "space", "")  # "[space] seed=": the keys of a sampled ablation's seeds
    ran = sorted({key.partition("[")[0] for key in recorded if searched in key})
    if STUDY_ENTRY in changes.changed:
        return ran
    touched = changes.added + changes.removed + changes.changed
    return [name for name in ran if any(key.startswith(trial_key(name, "space", "")) for key in touched)]


def compare(recorded: dict[str, str], current: dict[str, str]) -> Changes:
    return Changes(
        added=sorted(k for k in current if k not in recorded),
        removed=sorted(k for k in recorded if k not in current),
        changed=sorted(k for k in current if k in recorded and recorded[k] != current[k]),
    )
