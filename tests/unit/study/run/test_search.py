"""A study's search and scheduler sections as the Ray Tune and Optuna objects they build, the refusals
of combinations that mean nothing, and Tune's Repeater telling Optuna the mean over a configuration's
seeds (read back from the Optuna study itself)."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import optuna
import pytest
import yaml

from clsr.study.plan.load import load_study
from clsr.study.plan.resolve import ablation_trials, count_trials, seed_notes
from clsr.study.run.trial import StudyContext
from clsr.study.spec.schema import StudyError

SAMPLED = {
    "name": "s",
    "method": "simcse_unsup",
    "base": {"model": {"name": "minilm"}, "trainer": {"batch_size": 16, "max_steps": 20}},
    "seeds": [1, 2, 3],
    "search": {"algorithm": "optuna", "num_samples": 4},
    "ablations": {
        "lr": {
            "space": {
                "trainer.lr": {"loguniform": [1e-5, 1e-4]},
                "trainer.batch_size": {"choice": [16, 32]},
            }
        }
    },
}


def study_of(tmp_path: Path, **changes):
    doc = copy.deepcopy(SAMPLED)
    for key, value in changes.items():
        doc[key] = value if not isinstance(value, dict) else {**doc.get(key, {}), **value}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(doc))
    return load_study(path)


def tune_config(study, tmp_path: Path, ablation: str | None = "lr"):
    from clsr.study.run.experiment import build_tuner
    from clsr.study.run.tune_compat import tuner_tune_config

    ctx = StudyContext(study, "sqlite:///x.db", "parent", str(tmp_path))
    return tuner_tune_config(build_tuner(study, ctx, ablation, restore=False))


@pytest.mark.parametrize(
    ("sampler", "kind"),
    [
        ("tpe", optuna.samplers.TPESampler),
        ("cmaes", optuna.samplers.CmaEsSampler),
        ("gp", optuna.samplers.GPSampler),
        ("random", optuna.samplers.RandomSampler),
    ],
)
def test_optuna_sampler_repeated_over_the_seeds(tmp_path, sampler, kind):
    from ray.tune.search.optuna import OptunaSearch

    from clsr.study.run.search import SeedRepeater

    startup = {} if sampler == "random" else {"n_startup_trials": 3}
    study = study_of(tmp_path, search={"sampler": sampler, **startup})
    config = tune_config(study, tmp_path)
    repeater = config.search_alg
    assert isinstance(repeater, SeedRepeater) and repeater.repeat == 3 and repeater.seeds == [1, 2, 3]
    assert isinstance(repeater.searcher, OptunaSearch) and type(repeater.searcher._sampler) is kind
    assert config.num_samples == 4 * 3  # Repeater counts every repeat: configurations × seeds
    if startup:
        assert repeater.searcher._sampler._n_startup_trials == 3
    assert ablation_trials(study, "lr") == 12 and count_trials(study) == (12, 12)


def test_one_seed_keeps_plain_optuna_and_points_to_evaluate_are_enqueued(tmp_path):
    from ray.tune.search.optuna import OptunaSearch

    point = {"trainer.lr": 3e-5, "trainer.batch_size": 32}
    study = study_of(tmp_path, seeds=[7], search={"points_to_evaluate": [point]})
    config = tune_config(study, tmp_path)
    assert isinstance(config.search_alg, OptunaSearch) and config.num_samples == 4
    assert config.search_alg._points_to_evaluate == [
        {"point/overrides/trainer.lr": 3e-5, "point/overrides/trainer.batch_size": 32}
    ]


def test_random_search_runs_each_sample_with_every_seed(tmp_path):
    from ray.tune.search.basic_variant import BasicVariantGenerator

    from clsr.study.run.experiment import param_space

    point = {"trainer.lr": 3e-5}
    study = study_of(tmp_path, search={"algorithm": "random", "points_to_evaluate": [point]}, concurrency=2)
    config = tune_config(study, tmp_path)
    generator = config.search_alg
    assert isinstance(generator, BasicVariantGenerator) and generator._constant_grid_search
    assert generator._points_to_evaluate == [{"point": {"overrides": point}}]
    assert generator.max_concurrent == 2 and config.num_samples == 4  # each sample × the seed grid
    assert param_space(study, "lr")["point"]["seed"] == {"grid_search": [1, 2, 3]}


def test_random_variants_share_sampled_values_across_seeds(tmp_path):
    """Tune's own variant generation: each sample's seeds carry the same sampled values."""
    from ray.tune.search.variant_generator import generate_variants

    from clsr.study.run.experiment import param_space

    study = study_of(tmp_path, search={"algorithm": "random"})
    spec = {"config": param_space(study, "lr")}
    variants = [v["config"]["point"] for _, v in generate_variants(spec, constant_grid_search=True)]
    assert [v["seed"] for v in variants] == [1, 2, 3]
    assert len({repr(v["overrides"]) for v in variants}) == 1


@pytest.mark.parametrize(
    ("kind", "cls", "attrs"),
    [
        ("asha", "AsyncHyperBandScheduler", {"_time_attr": "step", "_max_t": 20}),
        ("hyperband", "HyperBandScheduler", {"_time_attr": "step", "_max_t_attr": 20, "_eta": 3.0}),
        (
            "median",
            "MedianStoppingRule",
            {"_time_attr": "step", "_grace_period": 2, "_min_samples_required": 4},
        ),
    ],
)
def test_schedulers_stop_on_the_optimiser_step(tmp_path, kind, cls, attrs):
    scheduler = {"type": kind, "grace_period": 2, "reduction_factor": 3.0, "min_samples_required": 4}
    study = study_of(tmp_path, scheduler=scheduler)
    built = tune_config(study, tmp_path).scheduler
    assert type(built).__name__ == cls
    assert {a: getattr(built, a) for a in attrs} == attrs


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"search": {"algorithm": "random", "sampler": "tpe"}}, "search.sampler is for algorithm optuna"),
        ({"search": {"sampler": "random", "n_startup_trials": 3}}, "n_startup_trials is for optuna samplers"),
        ({"search": {"sampler": "annealing"}}, "'tpe', 'cmaes', 'gp', 'nsga2' or 'random'"),
        ({"search": {"points_to_evaluate": [{"trainer.epochs": 1}]}}, "keys ['trainer.epochs'] are not in"),
        ({"scheduler": {"type": "pbt"}}, "pbt is refused"),
        ({"scheduler": {"type": "median"}, "metric": "test_sts_avg"}, "scheduler median stops trials"),
        ({"scheduler": {"type": "hyperband"}, "metric": "test_stsb"}, "scheduler hyperband stops trials"),
        ({"scheduler": {"type": "cosine"}}, "'fifo', 'asha', 'hyperband', 'median' or 'pbt'"),
    ],
)
def test_meaningless_combinations_are_refused_in_one_line(tmp_path, changes, fragment):
    with pytest.raises(StudyError) as caught:
        study_of(tmp_path, **changes)
    assert len(caught.value.problems) == 1 and fragment in caught.value.problems[0]
    assert "study.yaml" in str(caught.value)


def test_cmaes_needs_a_numeric_dimension(tmp_path):
    doc = copy.deepcopy(SAMPLED)
    doc["ablations"]["lr"]["space"] = {"trainer.batch_size": {"choice": [16, 32]}}
    doc["search"]["sampler"] = "cmaes"
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(StudyError, match="cmaes samples numbers.*use tpe, gp or random"):
        load_study(path)


def test_gp_refused_on_an_optuna_older_than_3_6(monkeypatch):
    from clsr.study.spec.tuning import Search

    monkeypatch.setattr(optuna, "__version__", "3.5.0")
    with pytest.raises(ValueError, match=r"gp needs optuna>=3.6 \(installed: 3.5.0\)"):
        Search(algorithm="optuna", sampler="gp")


def test_one_seed_with_published_numbers_is_noted(tmp_path):
    path = tmp_path / "grid.yaml"
    doc = {
        "name": "g",
        "method": "simcse_unsup",
        "base": {"model": {"name": "minilm"}},
        "ablations": {
            "temp": {"grid": {"method.temperature": [0.05]}, "paper": {"0.05": 82.5}},
            "plain": {"grid": {"method.temperature": [0.1]}},
            "seeded": {"grid": {"method.temperature": [0.2]}, "paper": {"0.2": 80.0}, "seeds": [1, 2, 3]},
        },
    }
    path.write_text(yaml.safe_dump(doc))
    assert seed_notes(load_study(path)) == [
        "ablations.temp: 1 seed: no CI or verdict; give seeds: [42, 43, 44] (or more)"
    ]


def test_repeater_tells_optuna_the_mean_over_the_seeds():
    """Tune's Repeater (through SeedRepeater) with a real OptunaSearch: each configuration's three
    trials carry its seeds, and Optuna's own study records the mean of their metric."""
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    from clsr.study.run.search import SeedRepeater

    space = {"point": {"overrides": {"trainer.lr": tune.loguniform(1e-5, 1e-4)}, "seed": 1}}
    searcher = OptunaSearch(sampler=optuna.samplers.RandomSampler(seed=0))
    repeater = SeedRepeater(searcher, [1, 2, 3])
    assert repeater.set_search_properties("best_dev_stsb", "max", space)
    scores = {0: [70.0, 72.5, 74.0], 1: [60.0, 61.0, 65.5]}
    for config_no, values in scores.items():
        configs = [repeater.suggest(f"t{config_no}_{i}") for i in range(3)]
        assert [c["point"]["seed"] for c in configs] == [1, 2, 3]
        assert len({c["point"]["overrides"]["trainer.lr"] for c in configs}) == 1
        for i, value in enumerate(values):
            repeater.on_trial_complete(f"t{config_no}_{i}", {"best_dev_stsb": value})
    recorded = [t.value for t in searcher._ot_study.trials]
    assert recorded == pytest.approx([np.mean(scores[0]), np.mean(scores[1])])
    assert [t.state for t in searcher._ot_study.trials] == [optuna.trial.TrialState.COMPLETE] * 2


def test_points_to_evaluate_come_first_from_both_searchers(tmp_path):
    """The configured points reach the trials' config (point.overrides) before any sampled one."""
    from ray.tune.search.variant_generator import _get_preset_variants

    from clsr.study.run.experiment import _search_alg, param_space

    point = {"trainer.lr": 3e-5, "trainer.batch_size": 32}
    study = study_of(tmp_path, search={"points_to_evaluate": [point]})
    repeater = _search_alg(study, "lr")
    assert repeater.set_search_properties("best_dev_stsb", "max", param_space(study, "lr"))
    first = [repeater.suggest(f"t{i}") for i in range(3)]
    assert [c["point"]["overrides"] for c in first] == [point] * 3
    assert [c["point"]["seed"] for c in first] == [1, 2, 3]
    assert repeater.suggest("t3")["point"]["overrides"] != point  # then Optuna samples

    study = study_of(tmp_path, search={"algorithm": "random", "points_to_evaluate": [point]})
    spec = {"config": param_space(study, "lr")}
    preset = _search_alg(study, "lr")._points_to_evaluate[0]
    variants = [
        v["config"]["point"] for _, v in _get_preset_variants(spec, preset, constant_grid_search=True)
    ]
    assert [v["overrides"] for v in variants] == [point] * 3 and [v["seed"] for v in variants] == [1, 2, 3]


def test_a_restored_repeater_still_averages_a_configuration_begun_before(tmp_path, monkeypatch):
    """Tune saves the searcher with the experiment (its SearchGenerator, as the driver does); a resumed
    study's SeedRepeater knows which trials form each configuration, so the seeds finished after the
    resume still enter Optuna's mean."""
    from ray import tune
    from ray.tune.search.search_generator import SearchGenerator

    from clsr.study.run.search import SeedRepeater, SignedOptunaSearch

    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    space = {"point": {"overrides": {"trainer.lr": tune.loguniform(1e-5, 1e-4)}, "seed": 1}}

    def repeater() -> SeedRepeater:
        built = SeedRepeater(SignedOptunaSearch(sampler=optuna.samplers.RandomSampler(seed=0)), [1, 2])
        assert built.set_search_properties("best_dev_stsb", "max", space)
        return built

    before = repeater()
    first = [before.suggest("a"), before.suggest("b")]
    before.on_trial_complete("a", {"best_dev_stsb": 70.0})
    SearchGenerator(before).save_to_dir(str(tmp_path), "s1")
    after = repeater()
    SearchGenerator(after).restore_from_dir(str(tmp_path))
    after.on_trial_complete("b", {"best_dev_stsb": 75.0})
    after.on_trial_complete("never-suggested", {"best_dev_stsb": 1.0})  # ignored, not a KeyError
    (trial,) = after.searcher._ot_study.trials
    assert trial.value == pytest.approx(72.5)
    assert trial.params["point/overrides/trainer.lr"] == first[0]["point"]["overrides"]["trainer.lr"]


# --- several objectives (issue 38 item 4) ------------------------------------------------------------


def test_several_objectives_reach_optunas_multi_objective_study(tmp_path):
    """``metric`` and ``mode`` as lists: Optuna's study has one direction per objective, Tune's config
    none (it takes one metric), and the first objective is what single-number uses read."""
    study = study_of(
        tmp_path,
        base=copy.deepcopy(SAMPLED["base"]) | {"eval": {"tasks": ["sts", "transfer"]}},
        metric=["best_dev_stsb", "test_transfer_avg"],
        mode=["max", "max"],
        search={"sampler": "nsga2"},
    )
    assert study.objectives == [("best_dev_stsb", "max"), ("test_transfer_avg", "max")]
    assert (study.metric, study.mode) == ("best_dev_stsb", "max")
    config = tune_config(study, tmp_path)
    assert config.metric is None and config.mode is None
    repeater = config.search_alg
    from clsr.study.run.experiment import param_space

    assert repeater.set_search_properties(None, None, param_space(study, "lr"))
    ot_study = repeater.searcher._ot_study
    assert ot_study.directions == [optuna.study.StudyDirection.MAXIMIZE] * 2
    assert isinstance(ot_study.sampler, optuna.samplers.NSGAIISampler)
    assert load_study_again(study).objectives == [("best_dev_stsb", "max")]  # trials get the first


def load_study_again(study):
    from clsr.study.spec.schema import Study

    return Study.model_validate(study.model_dump(by_alias=True))


def test_each_objective_is_averaged_over_the_seeds_apart():
    """Repeater averages one metric; with several, each objective's mean over a configuration's seeds
    reaches Optuna (read back from its study), and its Pareto front is Optuna's own ``best_trials``."""
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    from clsr.study.run.search import SeedRepeater

    metrics = ["best_dev_stsb", "test_transfer_avg"]
    space = {"point": {"overrides": {"trainer.lr": tune.loguniform(1e-5, 1e-4)}, "seed": 1}}
    searcher = OptunaSearch(
        sampler=optuna.samplers.RandomSampler(seed=0), metric=metrics, mode=["max", "max"]
    )
    repeater = SeedRepeater(searcher, [1, 2])
    assert repeater.set_search_properties(None, None, space)
    scores = {
        0: [(80.0, 84.0), (82.0, 85.0)],
        1: [(83.0, 80.0), (85.0, 81.0)],
        2: [(79.0, 82.0), (np.nan, 83.0)],
    }
    for config_no, values in scores.items():
        for i in range(len(values)):
            repeater.suggest(f"t{config_no}_{i}")
        for i, (sts, transfer) in enumerate(values):
            result = {"test_transfer_avg": transfer} | ({} if np.isnan(sts) else {"best_dev_stsb": sts})
            repeater.on_trial_complete(f"t{config_no}_{i}", result)
    recorded = [t.values for t in searcher._ot_study.trials]
    assert recorded == [pytest.approx([81.0, 84.5]), pytest.approx([84.0, 80.5]), pytest.approx([79.0, 82.5])]
    front = sorted(t.number for t in searcher._ot_study.best_trials)
    assert front == [0, 1]  # the third is dominated by the first on both


@pytest.mark.parametrize(
    ("changes", "fragment"),
    [
        ({"metric": ["best_dev_stsb", "test_sts_avg"], "mode": ["max"]}, "one mode, or one per metric"),
        ({"metric": ["best_dev_stsb", "best_dev_stsb"]}, "each objective once"),
        (
            {"metric": ["best_dev_stsb", "test_sts_avg"], "search": {"algorithm": "random"}},
            "need search.algorithm optuna",
        ),
        ({"metric": ["best_dev_stsb", "test_sts_avg"], "scheduler": {"type": "asha"}}, "need scheduler fifo"),
        (
            {"metric": ["best_dev_stsb", "test_sts_avg"], "search": {"sampler": "cmaes"}},
            "cmaes optimises one objective",
        ),
        ({"metric": ["best_dev_stsb", "test_nope"]}, "unknown metric 'test_nope'"),
        ({"search": {"sampler": "nsga2", "n_startup_trials": 3}}, "n_startup_trials is for optuna samplers"),
    ],
)
def test_several_objectives_refuse_what_cannot_hold_them(tmp_path, changes, fragment):
    with pytest.raises(StudyError, match=fragment):
        study_of(tmp_path, **changes)


def test_an_objective_the_trials_do_not_report_is_refused(tmp_path):
    """test_transfer_avg is only reported by trials whose final evaluation has the transfer tasks."""
    metric = ["best_dev_stsb", "test_transfer_avg"]
    with pytest.raises(StudyError, match="'test_transfer_avg' needs eval.tasks to include 'transfer'"):
        study_of(tmp_path, metric=metric)
    base = copy.deepcopy(SAMPLED["base"]) | {"eval": {"tasks": ["sts", "transfer"]}}
    assert study_of(tmp_path, metric=metric, base=base).objectives[1] == ("test_transfer_avg", "max")
