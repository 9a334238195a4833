"""Every touch of a private part of Ray Tune or Optuna, in one place, each marked with the version it
was written for and held by a test (``tests/test_tune_compat.py``).

Written by hand because neither library offers these as public API; keeping them here means a new
Ray or Optuna release breaks one module, whose tests say which touch moved.

* ``NSGAIISampler`` (Optuna 5.1): the genetic samplers' base class (``optuna.samplers._ga``) holds a
  ``threading.Lock`` in ``_thread_lock`` since 5.1, so the sampler no longer pickles, and Tune pickles
  its search algorithm (with the sampler inside ``OptunaSearch``) into the experiment's state before the
  first trial. The subclass below drops the lock from its pickled state and makes a new one on load;
  it keeps Optuna's own trial attribute names (``NSGAIISampler:generation``), which
  ``BaseGASampler.__init_subclass__`` would otherwise derive from the subclass's name.
"""

from __future__ import annotations

import threading
from typing import Any

import optuna


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
