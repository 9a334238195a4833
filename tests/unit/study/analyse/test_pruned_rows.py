"""A sampled configuration that seed pruning stopped shows in the report as pruned, with its seeds so far."""

from __future__ import annotations

from clsr.study.analyse.rows import Row
from clsr.study.analyse.runs import Trial
from clsr.tracking.tags import PRUNED_TAG

WHY = "ttest p=0.031 < 0.1 after 2 of 3 seeds, against sample 1a2b3_00000"


def trial(seed: int, tags: dict[str, str]) -> Trial:
    return Trial(f"r{seed}", "lr", "trainer.lr=1e-12", seed, "finished", {"loss_avg": 4.0 + seed}, tags, 0)


def test_a_pruned_configuration_is_labelled_with_its_seeds_and_a_full_one_is_not():
    pruned = Row("trainer.lr=1e-12", {}, {}, [], {s: trial(s, {PRUNED_TAG: WHY}) for s in (1, 2)})
    full = Row("trainer.lr=0.005", {}, {}, [], {s: trial(s, {}) for s in (1, 2, 3)})
    assert pruned.pruned == WHY and pruned.display_label == "trainer.lr=1e-12 (pruned after 2 seeds)"
    assert full.pruned is None and full.display_label == "trainer.lr=0.005"
