"""Seed-aware early stopping of a sampled search (``search.prune_seeds``), as a Tune ``Searcher`` around
the study's Optuna searcher, and a Tune callback that records its decisions in MLflow.

Tune's ``Repeater`` hands out every seed of a configuration at once and tells the searcher the mean at
the end; early-stopping schedulers are unsafe there (Ray warns) because they stop single seeds. Here a
configuration's seeds run one after another instead (seed i+1 once seed i finished; other configurations
fill the concurrency meanwhile), and after each finished seed the paired test of
``clsr.study.stats.seed_pruning`` compares it with the best configuration run on every seed so far. A
pruned configuration's later seeds never run; the base searcher is told it was pruned (``OptunaSearch``
marks its trial PRUNED: a completion with no result), never a made-up mean. Hand-written because no
Tune or Optuna object runs the seeds of one configuration in turn and prunes between them.

State: plain data (``get_state``), which Tune's ``SearchGenerator`` saves with the experiment beside
the base searcher's own signed state, as it does for ``Repeater``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np
from ray.tune import Callback
from ray.tune.search import Searcher

from clsr.study.spec.tuning import PruneSeeds
from clsr.study.stats.seed_pruning import paired_prune
from clsr.tracking.escape import terminal
from clsr.tracking.secrets import mask_uri
from clsr.tracking.tags import PRUNED_TAG


@dataclass
class Configuration:
    """One sampled configuration: what the base searcher suggested and its seeds so far."""

    config: dict[str, Any]
    base_id: str  # the trial id the base searcher knows it by (its first seed's)
    trial_ids: list[str] = field(default_factory=list)  # each started seed's Tune trial, in seed order
    # each finished seed's metric, in seed order (nan: none; a rerun of that seed's trial replaces it)
    scores: list[float] = field(default_factory=list)
    pruned: str | None = None  # why, once pruned

    def waiting(self, seeds: int) -> bool:
        """Whether its next seed may start: the last one finished, more to run, not pruned."""
        return self.pruned is None and len(self.scores) == len(self.trial_ids) < seeds

    def done(self, seeds: int) -> bool:
        return self.pruned is not None or len(self.scores) == seeds


class SeedPruningSearcher(Searcher):
    """Runs each configuration of ``searcher`` once per seed, in turn, and prunes it between seeds."""

    def __init__(self, searcher: Searcher, seeds: list[int], rule: PruneSeeds, configurations: int):
        super().__init__(metric=searcher.metric, mode=searcher.mode)
        self.searcher = searcher  # Tune's SearchGenerator walks wrappers by this name to save the base
        self.seeds = list(seeds)
        self.rule = rule
        self.limit = configurations
        self.configurations: list[Configuration] = []

    def set_search_properties(self, metric, mode, config, **spec) -> bool:
        ok = self.searcher.set_search_properties(metric, mode, config, **spec)
        self._metric, self._mode = self.searcher.metric, self.searcher.mode
        return ok

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        waiting = next((c for c in self.configurations if c.waiting(len(self.seeds))), None)
        if waiting is None and len(self.configurations) < self.limit:
            config = self.searcher.suggest(trial_id)
            if not isinstance(config, dict):  # None (wait) or Searcher.FINISHED
                return config
            waiting = Configuration(config, trial_id)
            self.configurations.append(waiting)
        if waiting is None:
            done = all(c.done(len(self.seeds)) for c in self.configurations)
            return Searcher.FINISHED if done else None
        waiting.trial_ids.append(trial_id)
        point = dict(waiting.config.get("point", {}))
        point["seed"] = self.seeds[len(waiting.trial_ids) - 1]
        return {**waiting.config, "point": point}

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        owner = self._owner(trial_id)
        if owner is None:  # not ours
            return
        value = (result or {}).get(self.searcher.metric) if not error else None
        score = float(value) if isinstance(value, int | float) else float("nan")
        seed = owner.trial_ids.index(trial_id)  # seeds run in turn: scores[i] is trial_ids[i]'s
        if seed < len(owner.scores):  # told already: a seed errored, then run again (a resume's retry)
            if math.isnan(owner.scores[seed]):
                owner.scores[seed] = score  # its score now counts as the reference's, or in the test
                self._test(owner)
            return
        owner.scores.append(score)
        if len(owner.scores) == len(self.seeds):
            mean = float(np.nanmean(owner.scores)) if not np.all(np.isnan(owner.scores)) else None
            if mean is None:
                self.searcher.on_trial_complete(owner.base_id, error=True)
            else:
                self.searcher.on_trial_complete(owner.base_id, result={self.searcher.metric: mean})
            return
        self._test(owner)

    def _test(self, owner: Configuration) -> None:
        """Prune ``owner`` part-way through its seeds if the paired test says it is worse than the best."""
        best = self.best()
        if owner.done(len(self.seeds)) or best is None:
            return
        call = paired_prune(self.rule, owner.scores, best.scores, self.searcher.mode)
        if call.prune:
            owner.pruned = (
                f"{self.rule.test} p={call.p:.3g} < {self.rule.p:g} after {call.pairs} of "
                f"{len(self.seeds)} seeds, against sample {best.base_id}"
            )
            self.searcher.on_trial_complete(owner.base_id)  # OptunaSearch: no result, no error: PRUNED

    def best(self) -> Configuration | None:
        """The best configuration run on every seed with a score on each (its mean by the study's mode), or
        None: one whose seed errored could be no reference (the test needs every seed's score), and would
        turn pruning off for the rest of the search if it stayed the best."""
        full = [
            c
            for c in self.configurations
            if c.pruned is None and len(c.scores) == len(self.seeds) and np.all(np.isfinite(c.scores))
        ]
        if not full:
            return None
        sign = 1 if self.searcher.mode == "max" else -1
        return max(full, key=lambda c: sign * float(np.nanmean(c.scores)))

    def pruned(self) -> list[Configuration]:
        return [c for c in self.configurations if c.pruned is not None]

    def saved_trials(self) -> int:
        """Seeds the pruned configurations did not run."""
        return sum(len(self.seeds) - len(c.trial_ids) for c in self.pruned())

    def summary(self, experiment: str) -> str:
        seeds = len(self.seeds)
        return (
            f"{experiment}: seed pruning stopped {len(self.pruned())} of {len(self.configurations)} "
            f"configurations ({self.rule.test}, p < {self.rule.p:g}); {self.saved_trials()} of "
            f"{len(self.configurations) * seeds} trials saved"
        )

    def _owner(self, trial_id: str) -> Configuration | None:
        return next((c for c in self.configurations if trial_id in c.trial_ids), None)

    def get_state(self) -> dict[str, Any]:
        return {"configurations": [asdict(c) for c in self.configurations]}

    def set_state(self, state: dict[str, Any]) -> None:
        self.configurations = [Configuration(**c) for c in state["configurations"]]


class PruneRecorder(Callback):
    """Tags each finished seed's MLflow run of a pruned configuration with ``clsr.pruned`` (why), once a
    seed's completion made the searcher prune it (Tune tells the searcher before its callbacks). A
    resumed driver tags them all again (the same value): a driver killed between the two loses none.
    A failed write at a completion is a warning, tried again at the next one (an exception in a Tune
    callback would mark the finished trial errored); at the experiment's end, which Tune reaches on a
    restored finished experiment too, every untagged run is tried again with a client that waits out a
    store briefly away, so the last completion's tags are not left to chance."""

    def __init__(self, searcher: SeedPruningSearcher, tracking_uri: str, parent_run_id: str):
        self.searcher = searcher
        self.tracking_uri = tracking_uri
        self.parent_run_id = parent_run_id
        self.tagged: set[str] = set()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "tagged": set()}  # a restored driver tags again

    def on_trial_complete(self, iteration: int, trials: list, trial, **info) -> None:
        from mlflow import MlflowClient

        self._tag_pruned(trials, MlflowClient(self.tracking_uri))

    def on_experiment_end(self, trials: list, **info) -> None:
        from clsr.tracking.patient import PatientClient

        self._tag_pruned(trials, PatientClient(self.tracking_uri))

    def _tag_pruned(self, trials: list, client) -> None:
        by_id = {t.trial_id: t for t in trials}
        for configuration in self.searcher.pruned():
            for trial_id in configuration.trial_ids:
                if trial_id not in self.tagged and trial_id in by_id:
                    try:
                        self._tag(client, by_id[trial_id], configuration.pruned or "")
                    except Exception as err:  # the tracking server away: tried again later
                        why = terminal(mask_uri(str(err))[:200])
                        print(f"warning: seed pruning: {trial_id} not tagged yet: {why}")
                        return
                    self.tagged.add(trial_id)

    def _tag(self, client, trial, reason: str) -> None:
        from clsr.study.plan.fingerprint import trial_key
        from clsr.tracking.study_runs import trial_run

        point = trial.config.get("point", {})
        key = trial_key(point.get("ablation", ""), f"sample {trial.trial_id}", point.get("seed", ""))
        run = trial_run(client, self.parent_run_id, key)
        if run is not None:
            client.set_tag(run.info.run_id, PRUNED_TAG, reason)
