"""The tags a study's MLflow runs carry, and the reading of a run's labels from them: no MLflow import,
so planning a study (``study plan --probe``, deduplication) runs where MLflow is not installed."""

from __future__ import annotations

import json

PARENT_TAG, STORAGE_TAG, TRIAL_TAG = "clsr.study", "clsr.storage", "clsr.trial_id"
SUPERSEDED_TAG = "clsr.superseded"  # a trial's run that an edited resume replaced (kept, not reported)
FINGERPRINT_TAG = "clsr.fingerprint"  # sha-256 over every resolved trial (clsr.study.plan.fingerprint)
TIMED_OUT_ATTEMPT_TAG = "clsr.timed_out_attempt"  # the lease generation in which a trial timed out
CHECKPOINT_TAG = "clsr.checkpoint"  # a finished trial's last checkpoint (local path or URI)
ALSO_TAG = "clsr.also"  # the other [ablation, point] pairs a run of identical trials stands for (JSON)
OPENED_TAG = "clsr.opened_ms"  # when a trial's run was last (re)opened, ms since the epoch
EARLIER_S_TAG = "clsr.earlier_attempts_s"  # seconds its run was open before it was reopened
PRUNED_TAG = "clsr.pruned"  # a seed of a configuration seed pruning stopped: why, with the test's p


def last_error_line(tags: dict[str, str]) -> str:
    """The last line of a run's ``clsr.error`` (the exception), or ''."""
    lines = [line.strip() for line in tags.get("clsr.error", "").splitlines() if line.strip()]
    return lines[-1] if lines else ""


def run_labels(tags: dict[str, str]) -> list[tuple[str, str]]:
    """Every (ablation, point) a child run stands for: its own, then those in ``clsr.also``."""
    labels = [(tags["clsr.ablation"], tags.get("clsr.point", ""))] if "clsr.ablation" in tags else []
    try:
        also = json.loads(tags.get(ALSO_TAG) or "[]")
    except json.JSONDecodeError:
        also = []  # a hand-edited tag: the run still stands for its own point
    pairs = [pair for pair in also if isinstance(pair, list) and len(pair) == 2]
    return labels + [(a, p) for a, p in pairs if isinstance(a, str) and isinstance(p, str)]
