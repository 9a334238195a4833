"""Rule 4: one trusted reader of the record. Every command that finds a study's parent run finds it here,
the way ``resume`` does (runs a driver leased first, then the newest one no driver leased).

Anyone who can write to the tracking server can tag a run with the study's name: such a run holds no
lease, so it is never taken for the study's record while a leased one exists. The parsers of its
values are ``clsr.tracking.record_reader`` (below every layer that reads the record).
"""

from __future__ import annotations

from clsr.study.record.lease import leased
from clsr.tracking.study_runs import FINGERPRINT_TAG, parent_runs


def _ranked(client, study_name: str, max_results: int) -> tuple[list, list]:
    every = parent_runs(client, study_name, max_results=max_results)
    taken = leased(client, every) if every else set()
    return [r for r in every if r.info.run_id in taken], [r for r in every if r.info.run_id not in taken]


def study_records(client, study_name: str, max_results: int = 1000) -> list:
    """The study's parent runs, the leased ones first (newest first), then those no driver leased."""
    held, unleased = _ranked(client, study_name, max_results)
    return held + unleased


def study_parent(client, study_name: str, fingerprint: str | None = None):
    """The study's record (None: it has none): the newest run a driver leased, preferring one whose
    fingerprint is ``fingerprint``; a run no driver leased only when none was (a record whose first
    driver stopped before taking its lease)."""
    held, unleased = _ranked(client, study_name, 1000)
    parents = held or unleased
    same = [r for r in parents if fingerprint and r.data.tags.get(FINGERPRINT_TAG) == fingerprint]
    return (same or parents or [None])[0]
