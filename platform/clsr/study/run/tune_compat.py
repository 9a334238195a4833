"""Every touch of a private part of Ray (Tune, Train, core) or Optuna, in one place, each marked with the
version it was written for and held by a test (``tests/unit/study/run/test_tune_compat.py``).

Written by hand because neither library offers these as public API; keeping them here means a new
Ray or Optuna release breaks one module, whose tests say which touch moved. A study run starts with
:func:`check_stack`, which refuses a Ray outside ``SUPPORTED_RAY`` (the versions the Ray touches below were
checked against) or an MLflow outside ``SUPPORTED_MLFLOW`` in one line. Each Ray touch was written against
Ray 2.60 and compared with the source of Ray 2.59 and 2.57 (2.57's files are the same as 2.60's for every
touch; ``.ci/run`` runs the tests on 2.57 too): the same unless its docstring says otherwise.

* ``tuner_run_config`` (Ray 2.60): ``Tuner._local_tuner`` (a ``ray.tune.impl.tuner_internal.TunerInternal``;
  None under Ray client) and its ``get_run_config()``, the very ``RunConfig`` that ``fit`` runs with.
  ``tuner_tune_config``: its ``_tune_config`` (the tests read what a study's Tuner was built with).
* ``repeats_trial``, ``report_repeat`` (Ray 2.60): ``Repeater._trial_id_to_group`` and its private
  ``_TrialGroup`` (``report``, ``finished_reporting``, ``scores``, ``primary_trial_id``): how several
  objectives' scores are gathered over a configuration's seeds.
* ``saved_latest_checkpoint``, ``forget_checkpoints`` (Ray 2.60): a trial's saved run metadata in the
  experiment state (``ray.tune.trainable.metadata._TrainingRunMetadata``) and its checkpoint manager's
  private lists (``ray.train._internal.checkpoint_manager._CheckpointManager``).
* ``autoscaler_events``, ``route_worker_output``, ``route_ray_messages`` (Ray 2.60): the driver's
  handling of its workers' output and Ray's messages (``ray._private.worker``).
* ``add_completed_trial``, ``optuna_trials`` (Ray 2.60): ``OptunaSearch._ot_study`` and ``_space``: a finished
  configuration of several objectives added to Optuna as a completed trial (Tune's ``add_evaluated_point``
  passes its one value as Optuna's ``value``, which a multi-objective study refuses); the Optuna study's
  trials read back (what an extension's sampler was given).
* ``HEAD_NODE_RESOURCE`` (Ray 2.60): the head node's built-in resource
  (``ray._common.constants.HEAD_NODE_RESOURCE_NAME``).
* ``PicklableNSGAIISampler`` (Optuna 5.1): the genetic samplers' base class (``optuna.samplers._ga``) holds a
  ``threading.Lock`` in ``_thread_lock`` since 5.1, so the sampler no longer pickles, and Tune pickles
  its search algorithm (with the sampler inside ``OptunaSearch``) into the experiment's state before the
  first trial. The subclass below drops the lock from its pickled state and makes a new one on load;
  it keeps Optuna's own trial attribute names (``NSGAIISampler:generation``), which
  ``BaseGASampler.__init_subclass__`` would otherwise derive from the subclass's name. Optuna 4.2 (the
  lowest supported) has neither the lock nor the base class (its key is the module's ``nsga2:generation``):
  there the subclass changes nothing.

Public or developer API used as documented is not listed (``TrialProgressCallback``, ``Repeater``'s
``get_state``/``set_state``, ``RAY_AIR_NEW_OUTPUT``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import optuna

# --- the supported Ray and MLflow ---

SUPPORTED_RAY = ">=2.57,<2.61"  # as pyproject.toml's ray requirement
SUPPORTED_RAY_NAME = "2.57 to 2.60"
RAY_EXTRAS = "ray[default,tune,train]"
# MLflow has no private touch; the range is the one CI tests (its lower bound in .ci/lowest.txt)
SUPPORTED_MLFLOW = ">=3.15,<3.19"  # as pyproject.toml's mlflow requirement
SUPPORTED_MLFLOW_NAME = "3.15 to 3.18"
MLFLOW_EXTRAS = "mlflow[auth]"


class UnsupportedRay(RuntimeError):
    """The installed Ray (or MLflow) is outside the range this platform was checked against."""


def _refuse_outside(name: str, installed: str, supported: str, shown: str, extras: str) -> None:
    from packaging.specifiers import SpecifierSet
    from packaging.version import InvalidVersion, Version

    try:
        ok = Version(installed) in SpecifierSet(supported)
    except InvalidVersion:
        ok = False
    if not ok:
        raise UnsupportedRay(
            f'clsr supports {name} {shown} (installed: {installed}): pip install "{extras}{supported}"'
        )


def check_ray(installed: str | None = None) -> None:
    """Refuse, in one line, a Ray outside ``SUPPORTED_RAY`` (``installed``: ``ray.__version__``)."""
    if installed is None:
        import ray

        installed = ray.__version__
    _refuse_outside("Ray", installed, SUPPORTED_RAY, SUPPORTED_RAY_NAME, RAY_EXTRAS)


def check_mlflow(installed: str | None = None) -> None:
    """Refuse, in one line, an MLflow outside ``SUPPORTED_MLFLOW`` (``installed``: ``mlflow.__version__``)."""
    if installed is None:
        import mlflow

        installed = mlflow.__version__
    _refuse_outside("MLflow", installed, SUPPORTED_MLFLOW, SUPPORTED_MLFLOW_NAME, MLFLOW_EXTRAS)


def check_stack() -> None:
    """The start-up check of a study run: Ray, then MLflow, each refused in one line when unsupported."""
    check_ray()
    check_mlflow()


# --- Tuner ---


def tuner_run_config(tuner) -> Any | None:
    """The ``RunConfig`` a Tuner's ``fit`` will run with, to be changed in place; None under Ray client
    (the Tuner then runs in a remote actor). A restored Tuner's is the one Tune read from its saved
    ``tuner.pkl``. Touches ``Tuner._local_tuner`` and ``TunerInternal.get_run_config`` (Ray 2.60)."""
    internal = getattr(tuner, "_local_tuner", None)
    return None if internal is None else internal.get_run_config()


def tuner_tune_config(tuner) -> Any | None:
    """The ``TuneConfig`` a Tuner was built with; None under Ray client. Touches ``Tuner._local_tuner``
    and ``TunerInternal._tune_config`` (Ray 2.60)."""
    internal = getattr(tuner, "_local_tuner", None)
    return None if internal is None else internal._tune_config


# --- Repeater ---


def repeats_trial(repeater, trial_id: str) -> bool:
    """Whether ``repeater`` (a ``Repeater``) handed out ``trial_id`` (Repeater's own ``on_trial_complete``
    raises KeyError for any other). Touches ``Repeater._trial_id_to_group`` (Ray 2.60)."""
    return trial_id in repeater._trial_id_to_group


def report_repeat(repeater, trial_id: str, score: Any) -> tuple[str, list[Any]] | None:
    """Record one repeat's ``score`` (any value but None: a list of several objectives' values) in its
    configuration's group; once every repeat of it has reported: (the trial id the searcher knows the
    configuration by, every repeat's score), else None. Touches ``Repeater._trial_id_to_group`` and
    ``ray.tune.search.repeater._TrialGroup``'s ``report``, ``finished_reporting``, ``scores`` and
    ``primary_trial_id`` (Ray 2.60).

    Ray 2.57 to 2.59's ``Repeater.suggest`` differs (public, not touched here): it wraps a finished
    searcher's ``Searcher.FINISHED`` in a group and fails an assertion, where 2.60 returns it. No searcher
    a study uses returns FINISHED (``OptunaSearch`` and the grid never do), so no version branch."""
    group = repeater._trial_id_to_group[trial_id]
    group.report(trial_id, score)
    return (group.primary_trial_id, group.scores()) if group.finished_reporting() else None


# --- a trial's saved run metadata (the experiment state's trial_data) ---


def saved_latest_checkpoint(run_metadata: str):
    """The latest checkpoint (a ``ray.tune.Checkpoint``) a trial's saved run metadata names, or None.
    ``run_metadata``: the second item of a trial's entry in the experiment state's ``trial_data``.
    Touches ``ray.tune.trainable.metadata._TrainingRunMetadata.from_json_state``, its
    ``checkpoint_manager`` and ``_CheckpointManager._latest_checkpoint_result`` (Ray 2.60)."""
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    manager = _TrainingRunMetadata.from_json_state(run_metadata).checkpoint_manager
    latest = manager._latest_checkpoint_result if manager is not None else None
    return latest.checkpoint if latest is not None else None


def forget_checkpoints(run_metadata: str) -> str:
    """A trial's saved run metadata with no checkpoint in it (its restore then starts the trial over),
    as Tune writes it. Touches ``_TrainingRunMetadata`` (``from_json_state``, ``get_json_state``, and
    its cached JSON, renewed only when one of its attributes is set) and ``_CheckpointManager``'s
    ``_latest_checkpoint_result`` and ``_checkpoint_results`` (Ray 2.60)."""
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    metadata = _TrainingRunMetadata.from_json_state(run_metadata)
    manager = metadata.checkpoint_manager
    if manager is None:
        return run_metadata
    manager._latest_checkpoint_result = None
    manager._checkpoint_results = []
    metadata.checkpoint_manager = manager  # setting an attribute drops the cached JSON
    return metadata.get_json_state()


# --- the driver's output (ray._private.worker) ---

RAY_PRINTER = "ray_print_logs"  # the handler ray.init(log_to_driver=True) adds, Ray 2.60
OUR_PRINTER = "clsr_driver_log"


def autoscaler_events(lines: list[str]) -> list[str]:
    """Of the autoscaler's output lines, those Ray itself would print on the driver (all of them where
    this Ray has no such filter). Touches ``ray._private.worker.filter_autoscaler_events`` (Ray 2.60)."""
    try:
        from ray._private.worker import filter_autoscaler_events
    except ImportError:
        return list(lines)
    return list(filter_autoscaler_events(lines))


def route_worker_output(handler: Callable[[dict[str, Any]], None]) -> bool:
    """After ``ray.init(log_to_driver=True)``: the workers' output batches to ``handler`` instead of
    Ray's printer; False where this Ray has no such dispatcher. Touches
    ``ray._private.worker.global_worker_stdstream_dispatcher`` and the name of Ray's own handler on it,
    ``"ray_print_logs"`` (Ray 2.60)."""
    try:
        from ray._private.worker import global_worker_stdstream_dispatcher as dispatcher
    except ImportError:
        return False
    dispatcher.remove_handler(RAY_PRINTER)
    dispatcher.remove_handler(OUR_PRINTER)
    dispatcher.add_handler(OUR_PRINTER, handler)
    return True


def route_ray_messages(handler: Callable[..., None]) -> bool:
    """The messages Ray pushes to the driver (a worker killed for memory, the raylet's warnings) to
    ``handler(data, ignore_prefix=...)`` instead of the terminal; False where this Ray has no such
    function. Touches ``ray._private.worker.print_to_stdstream``, which the driver's listener of Ray's
    error messages calls by its module-global name (Ray 2.60)."""
    import ray._private.worker as ray_worker

    if not hasattr(ray_worker, "print_to_stdstream"):
        return False
    ray_worker.print_to_stdstream = handler
    return True


def add_completed_trial(searcher, parameters: dict[str, Any], values: list[float]) -> None:
    """A configuration of several objectives told to ``OptunaSearch``'s Optuna study as a completed trial,
    as Tune's ``add_evaluated_point`` does for one. Touches ``OptunaSearch._ot_study`` and ``_space``
    (Ray 2.60)."""
    trial = optuna.trial.create_trial(
        state=optuna.trial.TrialState.COMPLETE,
        values=values,
        params=parameters,
        distributions=searcher._space,
    )
    searcher._ot_study.add_trial(trial)


def optuna_trials(searcher) -> list[optuna.trial.FrozenTrial]:
    """The trials of ``OptunaSearch``'s Optuna study (given and sampled). Touches ``_ot_study`` (Ray 2.60)."""
    return searcher._ot_study.get_trials(deepcopy=False)


# --- scheduling ---

# Ray's built-in resource of the head node (ray._common.constants.HEAD_NODE_RESOURCE_NAME, Ray 2.60)
HEAD_NODE_RESOURCE = "node:__internal_head__"


# --- Optuna ---


class PicklableNSGAIISampler(optuna.samplers.NSGAIISampler):
    """Optuna's NSGA-II sampler, unchanged but for pickling: its lock is left out and made anew."""

    _LOCK = "_thread_lock"  # optuna.samplers._ga._base.BaseGASampler.__init__, Optuna 5.1

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop(self._LOCK, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        setattr(self, self._LOCK, threading.Lock())  # an Optuna before 5.1 simply never reads it


# BaseGASampler.__init_subclass__ (Optuna 5.1) names a subclass's trial attributes after the subclass
for _key in ("_GENERATION_KEY", "_PARENT_CACHE_KEY_PREFIX"):
    if hasattr(optuna.samplers.NSGAIISampler, _key):
        setattr(PicklableNSGAIISampler, _key, getattr(optuna.samplers.NSGAIISampler, _key))
