"""The seed-pruning searcher around a real OptunaSearch: seeds in turn, pruning between them, Optuna told
PRUNED, its state through Tune's own save and restore, and the spec's one-line refusals."""

from __future__ import annotations

import optuna
import pytest
from ray import tune

from clsr.study.control.seed_pruning import SeedPruningSearcher
from clsr.study.run.search import SignedOptunaSearch
from clsr.study.spec.tuning import PruneSeeds

SPACE = {"point": {"overrides": {"trainer.lr": tune.choice([1e-5, 1e-4])}, "seed": 1}}
METRIC = "best_dev_stsb"


def searcher(rule=None, configurations=3) -> SeedPruningSearcher:
    base = SignedOptunaSearch(sampler=optuna.samplers.RandomSampler(seed=0))
    built = SeedPruningSearcher(base, [1, 2, 3], rule or PruneSeeds(test="ttest", p=0.1), configurations)
    assert built.set_search_properties(METRIC, "max", SPACE)
    return built


def test_seeds_run_in_turn_and_a_worse_configuration_is_pruned():
    s = searcher()
    first = s.suggest("a1")
    second = s.suggest("b1")  # a1 still running: a new configuration fills the slot
    assert [first["point"]["seed"], second["point"]["seed"]] == [1, 1]
    s.on_trial_complete("a1", {METRIC: 70.0})
    assert s.suggest("a2")["point"]["seed"] == 2  # a's next seed before any new configuration
    assert s.suggest("a2b") is not None and len(s.configurations) == 3
    assert s.suggest("none") is None  # every configuration waits on a running seed; no more to sample
    s.on_trial_complete("a2", {METRIC: 72.0})
    assert s.suggest("a3")["point"]["overrides"] == first["point"]["overrides"]
    s.on_trial_complete("a3", {METRIC: 71.0})
    s.on_trial_complete("b1", {METRIC: 60.0})  # one seed: below min_seeds, no test
    assert s.pruned() == []
    s.on_trial_complete("a2b", {METRIC: 71.5})
    s.suggest("b2")
    s.on_trial_complete("b2", {METRIC: 61.5})
    (pruned,) = s.pruned()
    assert pruned.trial_ids == ["b1", "b2"] and pruned.pruned.startswith("ttest p=")
    assert s.saved_trials() == 1
    states = [t.state for t in s.searcher._ot_study.trials]
    assert states[:2] == [optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED]
    assert s.searcher._ot_study.trials[0].value == pytest.approx(71.0)
    assert "1 of 3 configurations" in s.summary("lr") and "1 of 9 trials saved" in s.summary("lr")
    s.suggest("c2")
    s.on_trial_complete("c2", {METRIC: 73.0})
    s.suggest("c3")
    assert s.suggest("wait") is None  # c3 runs
    s.on_trial_complete("c3", {METRIC: 72.0})
    assert s.suggest("end") == SeedPruningSearcher.FINISHED


def test_state_survives_tunes_save_and_restore(tmp_path, monkeypatch):
    from ray.tune.search.search_generator import SearchGenerator

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    before = searcher()
    for trial, value in (("a1", 70.0), ("a2", 72.0), ("a3", 71.0)):
        before.suggest(trial)
        before.on_trial_complete(trial, {METRIC: value})
    before.suggest("b1")
    before.on_trial_complete("b1", {METRIC: 60.0})
    before.suggest("b2")  # running when the driver stops
    SearchGenerator(before).save_to_dir(str(tmp_path), "s1")
    after = searcher()
    SearchGenerator(after).restore_from_dir(str(tmp_path))
    after.on_trial_complete("b2", {METRIC: 61.0})
    assert [c.trial_ids for c in after.pruned()] == [["b1", "b2"]]
    assert after.get_state() != before.get_state()
    assert [t.state for t in after.searcher._ot_study.trials][1] == optuna.trial.TrialState.PRUNED


def test_a_seed_that_reported_nothing_is_left_out_of_the_mean_and_prunes_nothing():
    s = searcher()
    for trial, value in (("a1", 70.0), ("a2", None), ("a3", 72.0)):
        s.suggest(trial)
        s.on_trial_complete(trial, {METRIC: value} if value else None, error=value is None)
    assert s.searcher._ot_study.trials[0].value == pytest.approx(71.0)
    s.suggest("b1")
    s.on_trial_complete("b1", {METRIC: 10.0})
    s.suggest("b2")
    s.on_trial_complete("b2", {METRIC: 11.0})
    assert s.pruned() == []  # the best has a seed with no score: no test (as WilcoxonPruner)


def run_seeds(s: SeedPruningSearcher, *seeds: tuple[str, float | None]) -> None:
    """Suggest and complete each (trial id, score) in turn; None: the seed errored."""
    for trial, value in seeds:
        s.suggest(trial)
        s.on_trial_complete(trial, {METRIC: value} if value is not None else None, error=value is None)


def test_a_best_configuration_with_an_errored_seed_does_not_turn_pruning_off():
    """The best mean so far has a seed with no score: the best configuration with every seed's score is
    the reference, and a clearly worse configuration is pruned against it."""
    s = searcher(configurations=3)
    run_seeds(s, ("a1", 90.0), ("a2", None), ("a3", 92.0), ("c1", 65.0), ("c2", 66.0), ("c3", 67.0))
    run_seeds(s, ("b1", 10.0), ("b2", 11.0))
    assert s.best().base_id == "c1"
    (pruned,) = s.pruned()
    assert pruned.trial_ids == ["b1", "b2"] and pruned.pruned.endswith("against sample c1")


def test_an_errored_seed_run_again_replaces_its_missing_score():
    """A seed recorded errored and run again (a resume retries it under the same trial id): its score
    replaces the nan, so its configuration becomes the reference and the next one can be pruned."""
    s = searcher(configurations=2)
    run_seeds(s, ("a1", 70.0), ("a2", None), ("a3", 72.0))
    assert s.best() is None
    s.on_trial_complete("a2", {METRIC: 71.0})
    assert s.configurations[0].scores == [70.0, 71.0, 72.0] and s.best().base_id == "a1"
    s.on_trial_complete("a2", {METRIC: 10.0})  # a score already there is never replaced
    assert s.configurations[0].scores == [70.0, 71.0, 72.0]
    run_seeds(s, ("b1", 60.0), ("b2", 61.0))
    assert [c.trial_ids for c in s.pruned()] == [["b1", "b2"]]


@pytest.mark.parametrize(
    ("seeds", "prune", "changes", "fragment"),
    [
        (
            [1, 2, 3],
            {"test": "wilcoxon", "p": 0.1},
            {},
            "prunes after 4 seeds, so ablation 'lr' needs at least 5",
        ),
        ([1, 2], {"test": "ttest"}, {}, "needs at least 3 seeds (given: 2)"),
        ([1, 2, 3], {"test": "ttest"}, {"metric": ["best_dev_stsb", "loss_avg"]}, "needs one metric"),
        (
            [1, 2, 3],
            {"test": "ttest"},
            {"scheduler": {"type": "asha"}, "metric": "loss_avg"},
            "scheduler fifo",
        ),
        ([1, 2, 3], {"test": "t"}, {}, "wilcoxon"),
        ([1, 2, 3], {"test": "ttest", "p": 1.5}, {}, "less than 1"),
        ([1, 2, 3], {"test": "ttest", "min_seeds": 1}, {}, "greater than or equal to 2"),
    ],
)
def test_bad_prune_seeds_are_refused_in_one_line(tmp_path, seeds, prune, changes, fragment):
    from clsr.study.spec.schema import StudyError
    from tests.unit.study.run.test_search import study_of

    with pytest.raises(StudyError) as err:
        study_of(tmp_path, seeds=seeds, search={"prune_seeds": prune}, **changes)
    assert str(err.value).startswith("1 problem(s)") and fragment in str(err.value)


def test_grid_refuses_and_a_sampled_study_builds_the_pruning_searcher(tmp_path):
    from clsr.study.plan.resolve import seed_notes
    from clsr.study.run.search import search_alg, seed_space, tune_samples
    from clsr.study.spec.schema import StudyError
    from tests.unit.study.run.test_search import study_of

    five = study_of(tmp_path, seeds=[1, 2, 3, 4, 5], search={"prune_seeds": {"test": "wilcoxon"}})
    assert five.search.prune_seeds.fewest_seeds() == 4  # 2^-4 < 0.1: the fifth seed is the one saved
    with pytest.raises(StudyError, match="prune_seeds is for algorithm random or optuna"):
        study_of(tmp_path, search={"algorithm": "grid", "prune_seeds": {"test": "ttest"}})
    for algorithm, sampler in (
        ("random", optuna.samplers.RandomSampler),
        ("optuna", optuna.samplers.TPESampler),
    ):
        study = study_of(tmp_path, search={"algorithm": algorithm, "prune_seeds": {"test": "ttest"}})
        built = search_alg(study, "lr")
        assert isinstance(built, SeedPruningSearcher) and isinstance(built.searcher._sampler, sampler)
        assert (built.limit, built.seeds) == (4, [1, 2, 3])
        assert (tune_samples(study, "lr"), seed_space(study, "lr")) == (12, 1)  # seeds: the searcher's
    assert seed_notes(study)[-1] == (
        "ablations.lr: seed pruning: at most 12 trials; a configuration worse than the best (ttest, p < 0.1) "
        "stops after 2 or more of its 3 seeds"
    )


def test_the_recorder_tags_each_seed_run_of_a_pruned_configuration_again_after_a_restore(tmp_path, capsys):
    """A real MLflow store: the runs of the pruned configuration's two seeds get clsr.pruned, the best
    configuration's do not; a recorder unpickled (as from Tune's saved Tuner) tags them again."""
    import pickle
    from types import SimpleNamespace

    from mlflow import MlflowClient

    from clsr.study.control.seed_pruning import PruneRecorder
    from clsr.study.plan.fingerprint import trial_key
    from clsr.tracking.study_runs import open_child_run
    from clsr.tracking.tags import PRUNED_TAG
    from tests.support.stores import sqlite_uri

    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    parent = client.create_run(client.create_experiment("p")).info.run_id
    s, trials, runs = searcher(), [], {}
    for trial_id, value in (("a1", 70.0), ("a2", 72.0), ("a3", 71.0), ("b1", 60.0), ("b2", 61.0)):
        config = s.suggest(trial_id)
        point = {**config["point"], "ablation": "lr"}
        trials.append(SimpleNamespace(trial_id=trial_id, config={"point": point}))
        key = trial_key("lr", f"sample {trial_id}", point["seed"])
        runs[trial_id] = open_child_run(uri, parent, key, key, {}, {})
        s.on_trial_complete(trial_id, {METRIC: value})
    away = PruneRecorder(s, uri, "no-such-parent")  # a failed write never raises into Tune's loop
    away.on_trial_complete(5, trials, trials[-1])
    assert "not tagged yet" in capsys.readouterr().out and away.tagged == set()
    recorder = PruneRecorder(s, uri, parent)
    recorder.on_trial_complete(5, trials, trials[-1])
    tags = {t: client.get_run(r).data.tags.get(PRUNED_TAG) for t, r in runs.items()}
    assert [t for t, why in tags.items() if why] == ["b1", "b2"] and tags["b1"].startswith("ttest p=")
    for trial_id in ("b1", "b2"):  # as if the driver died before it tagged them
        client.delete_tag(runs[trial_id], PRUNED_TAG)
    restored = pickle.loads(pickle.dumps(recorder))
    restored.on_trial_complete(6, trials, trials[-1])
    assert [t for t, r in runs.items() if PRUNED_TAG in client.get_run(r).data.tags] == ["b1", "b2"]


def test_an_extension_round_of_a_pruned_search_prunes_its_own_samples_with_optuna_warm_started(tmp_path):
    from clsr.study.record.extension import ExtensionRound, WarmStart
    from clsr.study.run.experiment import param_space
    from clsr.study.run.search import search_alg, tune_samples
    from clsr.study.run.tune_compat import optuna_trials
    from tests.unit.study.run.test_search import study_of

    study = study_of(tmp_path, search={"algorithm": "optuna", "prune_seeds": {"test": "ttest"}})
    warm = WarmStart([{"trainer.lr": 2e-5, "trainer.batch_size": 16}], [0.7], 3, 0)
    built = search_alg(study, "lr", ExtensionRound("lr", 2, 1, 2), warm)
    assert (
        isinstance(built, SeedPruningSearcher) and built.limit == 2
    )  # the round's samples, not the search's
    assert tune_samples(study, "lr", 2) == 6
    built.set_search_properties("best_dev_stsb", "max", param_space(study, "lr"))
    (given,) = optuna_trials(built.searcher)
    assert given.state.name == "COMPLETE" and given.value == 0.7


def test_runs_left_untagged_at_the_last_completion_are_tagged_at_the_experiments_end(tmp_path, capsys):
    """The tag write failed at the experiment's last completion: Tune's experiment end (reached by a
    restored finished experiment too) tags them, read back from a real MLflow store; the failure's text
    reaches the terminal escaped."""
    from types import SimpleNamespace

    from mlflow import MlflowClient

    from clsr.study.control.seed_pruning import PruneRecorder
    from clsr.study.plan.fingerprint import trial_key
    from clsr.tracking.study_runs import open_child_run
    from clsr.tracking.tags import PRUNED_TAG
    from tests.support.stores import sqlite_uri

    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    parent = client.create_run(client.create_experiment("p")).info.run_id
    s, trials, runs = searcher(configurations=2), [], {}
    for trial_id, value in (("a1", 70.0), ("a2", 72.0), ("a3", 71.0), ("b1", 60.0), ("b2", 61.0)):
        point = {**s.suggest(trial_id)["point"], "ablation": "lr"}
        trials.append(SimpleNamespace(trial_id=trial_id, config={"point": point}))
        key = trial_key("lr", f"sample {trial_id}", point["seed"])
        runs[trial_id] = open_child_run(uri, parent, key, key, {}, {})
        s.on_trial_complete(trial_id, {METRIC: value})
    recorder = PruneRecorder(s, uri, parent)
    tag = recorder._tag
    recorder._tag = lambda *a: (_ for _ in ()).throw(RuntimeError("store away \x1b[2J"))
    recorder.on_trial_complete(5, trials, trials[-1])  # the last completion: the store is away
    out = capsys.readouterr().out
    assert "not tagged yet: store away \\x1b[2J" in out and "\x1b" not in out
    recorder._tag = tag
    recorder.on_experiment_end(trials)
    assert [t for t, r in runs.items() if PRUNED_TAG in client.get_run(r).data.tags] == ["b1", "b2"]


def test_the_records_of_studies_without_pruning_keep_their_fingerprint_and_turning_it_on_changes_it(tmp_path):
    """``prune_seeds`` enters the search's fingerprint only when set: the golden fingerprints of the shipped
    studies (tests/unit/study/plan/test_study_plan.py) hold, and an edit turning it on is a change."""
    from clsr.study.plan.fingerprint import STUDY_ENTRY
    from clsr.study.plan.study_plan import plan_study
    from tests.unit.study.run.test_search import study_of

    without = plan_study(study_of(tmp_path)).fingerprint[STUDY_ENTRY]
    pruned = plan_study(study_of(tmp_path, search={"prune_seeds": {"test": "ttest"}})).fingerprint[STUDY_ENTRY]
    assert without != pruned
