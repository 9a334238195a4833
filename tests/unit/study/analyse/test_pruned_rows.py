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


def test_a_pruned_configurations_unrun_seed_is_no_problem_and_leaves_no_row_incomplete():
    """The seed pruning never ran: not "missing (no run)" in problems(), not styled incomplete, not a
    seed the partial report waits for, and counted as skipped; a configuration short of a seed without
    pruning is still all three."""
    from types import SimpleNamespace

    from clsr.study.analyse.rows import mark_partial, skipped_by_pruning
    from clsr.study.analyse.tables import problems, row_class
    from clsr.study.stats.verdict import REPRODUCED, Verdict

    pruned = Row("trainer.lr=1e-12", {}, {}, [1, 2, 3], {s: trial(s, {PRUNED_TAG: WHY}) for s in (1, 2)})
    short = Row("trainer.lr=0.005", {}, {}, [1, 2, 3], {s: trial(s, {}) for s in (1, 2)})
    assert (pruned.missing(), pruned.skipped(), short.missing(), short.skipped()) == ([], [3], [3], [])
    assert problems(SimpleNamespace(rows=[pruned, short])) == ["trainer.lr=0.005 seed 3: missing (no run)"]
    assert "incomplete" not in row_class(pruned) and "incomplete" in row_class(short)
    assert pruned.trials_text() == "2/3 ok, 1 not run (pruned)" and short.trials_text() == "2/3 ok, 1 missing"
    verdict = Verdict(REPRODUCED, None, 0.01, 2, 5.0, 0.5)
    for row in (pruned, short):
        row.verdicts = {"loss_avg": verdict}
    study = SimpleNamespace(adaptive_of=lambda name: None, seeds_of=lambda name: [1, 2, 3])
    report = SimpleNamespace(study=study, ablations=[SimpleNamespace(name="lr", rows=[pruned, short])])
    assert skipped_by_pruning(report) == 1
    mark_partial(report, 6, "5m")
    assert not pruned.verdicts["loss_avg"].provisional and short.verdicts["loss_avg"].provisional
    assert (report.partial.finished, report.partial.planned) == (4, 5)  # 6 planned, 1 never to run
