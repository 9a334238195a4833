"""Each private touch of Ray or Optuna in ``clsr.study.run.tune_compat`` held by a test: a new release
that moves one fails here, naming it. Each runs against the installed Ray (no cluster is started).

Every sampler a study may name is pickled as Tune pickles its search algorithm into the experiment's
state (``ray.cloudpickle``, in ``tune.impl.tuner_internal``), then asked for configurations after
loading: a sampler that does not pickle failed a study after its first seconds (Optuna 5.1's NSGA-II)."""

from __future__ import annotations

import inspect
import json
import re
import tomllib
from pathlib import Path

import mlflow
import optuna
import pytest
import ray
from ray import cloudpickle

from clsr.study.run import tune_compat
from clsr.study.run.tune_compat import (
    PicklableNSGAIISampler,
    UnsupportedRay,
    check_ray,
    check_stack,
    forget_checkpoints,
    repeats_trial,
    report_repeat,
    saved_latest_checkpoint,
    tuner_run_config,
    tuner_tune_config,
)
from clsr.study.spec.tuning import SAMPLERS
from tests.unit.study.run.test_search import study_of, tune_config
from tests.unit.study.run.test_tune_state import state_with_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[4]


# --- the supported Ray ---


def test_the_installed_ray_and_mlflow_are_supported_and_the_ranges_are_pyprojects():
    check_stack()
    pins = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"{tune_compat.RAY_EXTRAS}{tune_compat.SUPPORTED_RAY}" in pins
    assert f"{tune_compat.MLFLOW_EXTRAS}{tune_compat.SUPPORTED_MLFLOW}" in pins
    for supported, name in [
        (tune_compat.SUPPORTED_RAY, tune_compat.SUPPORTED_RAY_NAME),
        (tune_compat.SUPPORTED_MLFLOW, tune_compat.SUPPORTED_MLFLOW_NAME),
    ]:
        major, low, high = re.match(r">=(\d+)\.(\d+),<\1\.(\d+)$", supported).groups()
        assert name == f"{major}.{low} to {major}.{int(high) - 1}"


@pytest.mark.parametrize("version", ["2.56.1", "2.61.0", "3.0.0.dev0", "not-a-version"])
def test_an_unsupported_ray_is_refused_in_one_line(monkeypatch, version):
    monkeypatch.setattr(ray, "__version__", version)
    with pytest.raises(UnsupportedRay) as refused:
        check_ray()
    assert str(refused.value) == (
        f"clsr supports Ray 2.57 to 2.60 (installed: {version}): "
        'pip install "ray[default,tune,train]>=2.57,<2.61"'
    )


@pytest.mark.parametrize("version", ["3.14.0", "3.19.0"])
def test_an_unsupported_mlflow_is_refused_in_one_line(monkeypatch, version):
    monkeypatch.setattr(mlflow, "__version__", version)
    with pytest.raises(UnsupportedRay) as refused:
        check_stack()
    assert str(refused.value) == (
        f'clsr supports MLflow 3.15 to 3.18 (installed: {version}): pip install "mlflow[auth]>=3.15,<3.19"'
    )


@pytest.mark.parametrize("version", ["2.57.0", "2.60.0"])
def test_both_ends_of_the_ray_range_are_accepted(version):
    check_ray(version)


def test_a_study_run_refuses_an_unsupported_ray_before_it_starts_anything(tmp_path, monkeypatch):
    from clsr.study.control.console import Console
    from clsr.study.run import runner

    monkeypatch.setattr(ray, "__version__", "2.55.0")
    monkeypatch.setattr(runner, "_run_study", lambda *a: pytest.fail("the study started"))
    with pytest.raises(UnsupportedRay, match=r"^clsr supports Ray 2\.57 to 2\.60 \(installed: 2\.55\.0\)"):
        runner.run_study(study_of(tmp_path), "", verbose=False, console=(console := Console()))
    assert console.quiet is None and not ray.is_initialized()


# --- Tuner ---


def test_quieting_a_tuner_changes_the_run_config_its_fit_runs_with(tmp_path, monkeypatch):
    """``quiet_tuner`` reaches the TunerInternal's RunConfig: the very object ``fit`` reads."""
    from ray import tune

    from clsr.study.run import experiment
    from clsr.study.run.progress import Progress
    from clsr.study.run.trial import StudyContext

    study = study_of(tmp_path)
    ctx = StudyContext(study, "sqlite:///x.db", "parent", str(tmp_path))
    tuner = experiment._build_tuner(study, ctx, "lr", restore=False)
    assert isinstance(tuner_tune_config(tuner), tune.TuneConfig)
    run_config = tuner_run_config(tuner)
    assert isinstance(run_config, tune.RunConfig) and run_config.verbose == 1
    experiment.quiet_tuner(tuner, study, "lr")
    assert tuner_run_config(tuner) is run_config and run_config.verbose == 0
    assert run_config.progress_reporter is None
    assert [type(c) for c in run_config.callbacks] == [Progress]
    assert tuner._local_tuner._run_config is run_config  # what TunerInternal.fit passes to Tune


def test_a_ray_client_tuner_has_no_local_config():
    class ClientTuner:  # Tuner under Ray client: _local_tuner None, the TunerInternal is a remote actor
        _local_tuner = None

    assert tuner_run_config(ClientTuner()) is None and tuner_tune_config(ClientTuner()) is None


# --- Repeater ---


def test_a_repeaters_groups_gather_each_repeats_scores_and_name_the_searchers_trial():
    from ray.tune.search import Repeater, Searcher

    class Counting(Searcher):
        def __init__(self):
            super().__init__(metric="m", mode="max")
            self.n = 0

        def suggest(self, trial_id):
            self.n += 1
            return {"x": self.n}

        def on_trial_complete(self, trial_id, result=None, error=False):
            pass

    repeater = Repeater(Counting(), repeat=2)
    assert [repeater.suggest(t)["x"] for t in ("a", "b", "c")] == [1, 1, 2]
    assert repeats_trial(repeater, "a") and repeats_trial(repeater, "c")
    assert not repeats_trial(repeater, "never-given")
    assert report_repeat(repeater, "b", [0.3, 2.0]) is None
    assert report_repeat(repeater, "c", [0.9, 1.0]) is None  # the next configuration's first repeat
    assert report_repeat(repeater, "a", [0.1, 4.0]) == ("a", [[0.1, 4.0], [0.3, 2.0]])


# --- a trial's saved run metadata ---


def test_a_trials_saved_checkpoint_is_read_and_forgotten_as_tunes_restore_reads_it(tmp_path):
    """Read back through Tune's own restore of a trial (``Trial.restore_run_metadata``)."""
    from ray.tune.experiment import Trial

    saved = tmp_path / "trial" / "checkpoint_000005"
    [[_, metadata]] = json.loads(state_with_checkpoint(saved))["trial_data"]
    restored = Trial("run_trial", stub=True, _setup_default_resource=False)
    restored.restore_run_metadata(metadata)
    latest = saved_latest_checkpoint(metadata)
    assert latest.path == restored.checkpoint.path == str(saved)

    forgotten = forget_checkpoints(metadata)
    restored.restore_run_metadata(forgotten)
    assert restored.checkpoint is None and saved_latest_checkpoint(forgotten) is None
    assert restored.run_metadata.checkpoint_manager.best_checkpoint_results == []
    assert json.loads(forgotten)["last_result"] == json.loads(metadata)["last_result"]  # the rest kept
    assert saved_latest_checkpoint("{}") is None and forget_checkpoints("{}") == "{}"  # no checkpoints


# --- the driver's output ---


def test_the_autoscalers_events_are_filtered_as_ray_prints_them(monkeypatch):
    import ray._private.worker as ray_worker
    import ray.autoscaler.v2.utils as autoscaler

    monkeypatch.setattr(autoscaler, "is_autoscaler_v2", lambda *a, **k: False)
    monkeypatch.setattr(ray_worker, "autoscaler_log_fyi_printed", True)  # Ray's tip, once a process
    lines = ["Resized to 3 CPUs.", "2026 INFO :event_summary:Adding 1 node(s) of type gpu."]
    assert tune_compat.autoscaler_events(lines) == ["Adding 1 node(s) of type gpu."]


def test_the_workers_output_goes_to_the_handler_instead_of_rays_printer(monkeypatch):
    from ray._private.ray_logging import global_worker_stdstream_dispatcher as dispatcher

    monkeypatch.setattr(
        dispatcher, "handlers", [(tune_compat.RAY_PRINTER, lambda data: pytest.fail("printed"))]
    )
    got = []
    assert tune_compat.route_worker_output(got.append) and tune_compat.route_worker_output(got.append)
    batch = {"pid": 7, "lines": ["hello"], "is_err": False}
    dispatcher.emit(batch)
    assert got == [batch] and [name for name, _ in dispatcher.handlers] == [tune_compat.OUR_PRINTER]
    # ray.init(log_to_driver=True) adds Ray's printer under that name
    source = inspect.getsource(ray._private.worker.connect)
    assert re.search(rf'add_handler\(\s*"{tune_compat.RAY_PRINTER}"', source)


def test_rays_messages_to_the_driver_go_to_the_handler(monkeypatch):
    import ray._private.worker as ray_worker

    monkeypatch.setattr(ray_worker, "print_to_stdstream", ray_worker.print_to_stdstream)  # put back after
    got = []
    assert tune_compat.route_ray_messages(lambda data, ignore_prefix: got.append(data))
    ray_worker.print_to_stdstream({"lines": ["a worker was killed"], "pid": "raylet"}, ignore_prefix=False)
    assert got == [{"lines": ["a worker was killed"], "pid": "raylet"}]
    # the driver's listener calls it by its module-global name, so the replacement is what it calls
    assert "print_to_stdstream(" in inspect.getsource(ray_worker.listen_error_messages)


# --- scheduling ---


def test_the_head_nodes_resource_is_rays_and_a_train_trial_holds_a_share_of_it(tmp_path):
    from ray._common.constants import HEAD_NODE_RESOURCE_NAME

    from clsr.study.run.experiment import DRIVER_SHARE, trial_resources

    assert tune_compat.HEAD_NODE_RESOURCE == HEAD_NODE_RESOURCE_NAME
    study = study_of(tmp_path, resources={"workers_per_trial": 2})
    assert trial_resources(study) == {"cpu": 0, HEAD_NODE_RESOURCE_NAME: DRIVER_SHARE}


# --- Optuna ---


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_every_sampler_survives_tunes_pickling_and_still_samples(tmp_path, sampler):
    study = study_of(tmp_path, search={"sampler": sampler})
    from clsr.study.run.experiment import param_space

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
    # Optuna's own key: NSGAIISampler._GENERATION_KEY since BaseGASampler, a module constant in Optuna 4.2
    key = getattr(optuna.samplers.NSGAIISampler, "_GENERATION_KEY", "nsga2:generation")
    generations = {t.system_attrs.get(key) for t in study.trials}
    assert generations == {0, 1, 2}
    assert type(getattr(loaded, PicklableNSGAIISampler._LOCK)).__name__ == "lock"


def test_an_extensions_finished_configurations_of_several_objectives_are_completed_optuna_trials(tmp_path):
    """``add_completed_trial`` and ``optuna_trials``: a warm start of two objectives reaches Optuna's
    multi-objective study as completed trials with both values, the searcher still sampling after it."""
    from clsr.study.record.extension import ExtensionRound, WarmStart
    from clsr.study.run.experiment import param_space
    from clsr.study.run.search import search_alg
    from clsr.study.run.tune_compat import optuna_trials

    study = study_of(
        tmp_path, seeds=[1], metric=["best_dev_stsb", "test_sts_avg"], scheduler={"type": "fifo"}
    )
    warm = WarmStart([{"trainer.lr": 2e-5, "trainer.batch_size": 16}], [[0.7, 0.6]], 1, 0)
    searcher = search_alg(study, "lr", ExtensionRound("lr", 1, 1, 2), warm)
    searcher.set_search_properties(None, None, param_space(study, "lr"))
    (given,) = optuna_trials(searcher)
    assert given.state.name == "COMPLETE" and given.values == [0.7, 0.6]
    assert searcher.suggest("t1")["point"]["overrides"]["trainer.batch_size"] in (16, 32)
    assert len(optuna_trials(searcher)) == 2
