"""A study record's attempts: what each driver of an edited resume recorded (``study[-vN].yaml``,
``fingerprint[-vN].json``), and the runs an edit superseded (kept in MLflow, left out of reports).
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

from clsr.study.plan.distinct import also_of
from clsr.study.plan.fingerprint import Changes, changed_searches, compare, overall
from clsr.study.spec.schema import Study
from clsr.tracking.study_runs import (
    ALSO_TAG,
    FINGERPRINT_TAG,
    SUPERSEDED_TAG,
    TRIAL_TAG,
    children,
)


def attempt_artifacts(client, parent_run_id: str, stem: str, suffix: str) -> dict[int, str]:
    """Attempt -> artifact name of what each attempt recorded as ``<stem><suffix>`` (the first) or
    ``<stem>-vN<suffix>`` (an edited resume's), e.g. ``study.yaml``, ``fingerprint-v3.json``."""
    pattern = re.compile(rf"{re.escape(stem)}(?:-v([0-9]+))?{re.escape(suffix)}")
    found = {}
    for artifact in client.list_artifacts(parent_run_id):
        if match := pattern.fullmatch(artifact.path):
            found[int(match.group(1) or 1)] = artifact.path
    return dict(sorted(found.items()))


def recorded_study_file(client, parent_run_id: str) -> str:
    """The artifact holding the study file the record was last run with."""
    files = attempt_artifacts(client, parent_run_id, "study", ".yaml")
    return files[max(files)] if files else "study.yaml"


def recorded_fingerprint(client, parent_run_id: str) -> dict[str, str]:
    """The latest fingerprint a study's parent run recorded (``fingerprint[-vN].json``)."""
    names = attempt_artifacts(client, parent_run_id, "fingerprint", ".json")
    return mlflow_artifacts_json(client, parent_run_id, names[max(names)]) if names else {}


def mlflow_artifacts_json(client, run_id: str, path: str) -> dict[str, Any]:

    with tempfile.TemporaryDirectory() as tmp:
        return json.loads(Path(client.download_artifacts(run_id, path, tmp)).read_text())


def current_runs(client, parent_run_id: str) -> list[tuple[str, dict[str, str]]]:
    return [
        (r.info.run_id, r.data.tags)
        for r in children(client, parent_run_id)
        if SUPERSEDED_TAG not in r.data.tags
    ]


def supersede(
    client,
    parent_run_id: str,
    keys: frozenset[str],
    attempt: int,
    searches: frozenset[str] = frozenset(),
    chosen: frozenset[str] = frozenset(),
) -> frozenset[str]:
    """Mark superseded (kept in MLflow, left out of reports) the runs of changed and removed trials, every
    run of the sampled ablations ``searches`` (searched again), and the ``chosen`` runs (a confirm
    ablation's best points of such a search). A run of identical trials whose other point changed keeps
    its own and stops standing for that one. Returns the trial keys of the ``chosen`` runs: their old
    experiment must not run them again."""
    chosen_keys = set()
    for run in children(client, parent_run_id):
        tags = run.data.tags
        if SUPERSEDED_TAG in tags:
            continue
        if tags.get(TRIAL_TAG) in keys or tags.get("clsr.ablation") in searches or run.info.run_id in chosen:
            client.set_tag(run.info.run_id, SUPERSEDED_TAG, f"v{attempt}")
            if run.info.run_id in chosen and tags.get(TRIAL_TAG):
                chosen_keys.add(tags[TRIAL_TAG])
            continue
        also = also_of(tags)
        kept = [list(pair) for pair, key in also if key not in keys]
        if len(kept) < len(also):
            client.set_tag(run.info.run_id, ALSO_TAG, json.dumps(kept, ensure_ascii=False))
    return frozenset(chosen_keys)


def superseded_at(client, parent_run_id: str) -> dict[str, int]:
    """Trial key -> the latest attempt whose edited resume superseded a run of it (``clsr.superseded:
    vN``). Only decides which trials an older Tune experiment leaves to a newer one; a malformed tag is
    ignored."""
    at: dict[str, int] = {}
    for run in children(client, parent_run_id):
        key, mark = run.data.tags.get(TRIAL_TAG), run.data.tags.get(SUPERSEDED_TAG, "")
        if key and (version := re.fullmatch(r"v([0-9]{1,6})", mark)):
            at[key] = max(at.get(key, 0), int(version.group(1)))
    return at


def search_versions(client, parent_run_id: str) -> dict[str, int]:
    """Sampled ablation -> the attempt whose edited resume started its current search (its Tune experiment
    is ``<ablation>-v<attempt>``); a search never edited is not listed. Read from the fingerprints each
    attempt recorded (``fingerprint.json``, ``fingerprint-vN.json``), never from a tag."""
    names = attempt_artifacts(client, parent_run_id, "fingerprint", ".json")
    if len(names) < 2:  # never resumed edited
        return {}
    extensions = recorded_extensions(client, parent_run_id)  # an extension narrows its ablation's search
    searched: dict[str, int] = {}
    before: dict[str, str] = {}
    previous = 0
    for version, name in names.items():
        now = mlflow_artifacts_json(client, parent_run_id, name)
        if before:
            # this attempt's extension, or one whose driver was killed before it recorded its edit (the
            # resume after it recorded that edit)
            narrowed = {
                a for a, at, edited in extensions
                if at == version or (edited and at not in names and previous < at < version)
            }  # fmt: skip
            again = changed_searches(before, compare(before, now))
            searched |= dict.fromkeys([a for a in again if a not in narrowed], version)
        before, previous = now, version
    return searched


def recorded_extensions(client, parent_run_id: str) -> list[tuple[str, int, bool]]:
    """(ablation, attempt, whether its file was edited) of each ``study extend`` the record holds
    (``extend-vN.json``)."""
    found = []
    for version, name in attempt_artifacts(client, parent_run_id, "extend", ".json").items():
        entry = mlflow_artifacts_json(client, parent_run_id, name)
        if isinstance(entry, dict) and isinstance(ablation := entry.get("ablation"), str):
            found.append((ablation, version, entry.get("edited") is True))
    return found


def pending_extensions(client, parent_run_id: str) -> frozenset[str]:
    """The ablations of edited extensions recorded after the latest fingerprint: their driver was killed
    before it recorded the edit, which the next resume records as theirs (the search narrowed, not started
    again beside the old one)."""
    latest = max(attempt_artifacts(client, parent_run_id, "fingerprint", ".json"), default=0)
    return frozenset(
        a for a, at, edited in recorded_extensions(client, parent_run_id) if edited and at > latest
    )


def record_edit(
    client,
    study: Study,
    study_text: str,
    parent_run_id: str,
    recorded: dict[str, str],
    current: dict[str, str],
    changes: Changes,
    attempt: int,
    extending: frozenset[str] = frozenset(),
) -> frozenset[str]:
    """An edited resume's attempt, recorded (``extending``: sampled ablations this attempt extends, whose
    edited space narrows their search rather than starting it again): the changed and removed trials' runs (and an edited search's,
    with the points confirmations took from it) superseded, its fingerprint and study file kept as
    ``-v<attempt>``. Returns the trial keys old experiments must not run (their new versions run in a
    new wave); none when nothing changed."""
    if not changes:
        return frozenset()
    searched_again = [name for name in changed_searches(recorded, changes) if name not in extending]
    # the best points a confirm ablation took from an edited search are chosen again from the new one
    confirming = {
        n: a.confirm.of for n, a in study.ablations.items() if a.confirm and a.confirm.of in searched_again
    }
    skip = frozenset(changes.changed + changes.removed)
    chosen = [
        run_id for run_id, tags in current_runs(client, parent_run_id)
        if tags.get("clsr.ablation") in confirming and tags.get(TRIAL_TAG) not in current
    ]  # fmt: skip
    skip |= supersede(client, parent_run_id, skip, attempt, frozenset(searched_again), frozenset(chosen))
    client.set_tag(parent_run_id, FINGERPRINT_TAG, overall(current))
    client.log_dict(parent_run_id, current, f"fingerprint-v{attempt}.json")
    client.log_text(parent_run_id, study.masked(study_text), f"study-v{attempt}.yaml")
    print("resuming an edited study:\n  " + "\n  ".join(changes.describe()))
    for name in searched_again:
        also = [c for c, of in confirming.items() if of == name]
        print(
            f"ablations.{name} (sampled) changed: searched again as Tune experiment {name}-v{attempt}; "
            f"its earlier runs{' and the best points ' + ', '.join(also) + ' took from it' if also else ''} "
            f"are marked superseded"
        )
    return skip
