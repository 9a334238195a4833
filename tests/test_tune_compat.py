"""Each private touch of Ray Tune or Optuna in ``clsr.study.run.tune_compat`` held by a test: a new release
that moves one fails here, naming it.

Every sampler a study may name is pickled as Tune pickles its search algorithm into the experiment's
state (``ray.cloudpickle``, in ``tune.impl.tuner_internal``), then asked for configurations after
loading: a sampler that does not pickle failed a study after its first seconds (Optuna 5.1's NSGA-II)."""

from __future__ import annotations

import optuna
import pytest
from ray import cloudpickle

from clsr.study.run.tune_compat import PicklableNSGAIISampler
from clsr.study.spec.schema import SAMPLERS
from test_search import study_of, tune_config


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_survives_tunes_pickling_and_still_samples(tmp_path, sampler):
    study = study_of(tmp_path, search={"sampler": sampler})
    from clsr.study.run.runner import param_space

    repeater = tune_config(study, tmp_path).search_alg
    assert repeater.set_search_properties(study.metric, study.mode, param_space(study, "lr"))
    loaded = cloudpickle.loads(cloudpickle.dumps(repeater))
    configs = [loaded.suggest(f"t{i}") for i in range(6)]  # two configurations × three seeds
    rates = {c["point"]["overrides"]["trainer.lr"] for c in configs}
    assert len(rates) == 2 and all(1e-5 <= r <= 1e-4 for r in rates)
    assert [c["point"]["seed"] for c in configs] == [1, 2, 3] * 2


def test_nsga2_drops_its_lock_when_pickled_and_makes_a_new_one():
    """Optuna 5.1's ``BaseGASampler`` keeps ``_thread_lock``; the pickled state leaves it out, and a
    loaded sampler runs a whole first generation and the next one's selection (which takes the lock)."""
    sampler = PicklableNSGAIISampler(seed=3, population_size=4)
    assert PicklableNSGAIISampler._LOCK not in sampler.__getstate__()
    loaded = cloudpickle.loads(cloudpickle.dumps(sampler))
    study = optuna.create_study(sampler=loaded, directions=["maximize", "maximize"])
    study.optimize(lambda t: (t.suggest_float("x", 0, 1), -t.suggest_float("y", 0, 1)), n_trials=10)
    generations = {t.system_attrs.get("NSGAIISampler:generation") for t in study.trials}
    assert generations == {0, 1, 2}
    assert type(getattr(loaded, PicklableNSGAIISampler._LOCK)).__name__ == "lock"
