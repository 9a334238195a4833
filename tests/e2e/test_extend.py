"""``platform study extend`` through the real command, Ray Tune, Optuna and MLflow: a finished Optuna search
of two configurations gets two more as its own Tune experiment, whose Optuna study was given the two
finished ones first (read back from the searcher state the extension saved); stopped halfway and resumed,
the record holds each trial once."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from clsr.study.analyse.rows import build_report
from clsr.study.plan.load import load_study
from clsr.tracking.study_runs import TRIAL_TAG
from tests.e2e.test_e2e import platform_cmd, runs_of
from tests.e2e.test_record import run, wait_for
from tests.e2e.test_resilience import run_in_process

pytestmark = [pytest.mark.e2e, pytest.mark.parallel, pytest.mark.minutes(2.5)]

SPACE = {"lr": {"space": {"trainer.lr": {"loguniform": [1.0e-5, 1.0e-3]}}}}


def saved_optuna_trials(experiment: Path):
    """The Optuna trials of an experiment's saved searcher state, verified as a resume verifies it."""
    from clsr.study.run.search import SignedOptunaSearch
    from clsr.study.run.tune_compat import optuna_trials

    (state,) = sorted(experiment.glob("searcher-state-*.pkl"))[-1:]
    searcher = SignedOptunaSearch()
    searcher.restore(str(state))
    return optuna_trials(searcher)


def finished(children) -> list:
    return [run for run in children if run.data.tags.get("clsr.status") == "finished"]


def test_extend_adds_samples_once_each_through_a_kill_and_optuna_is_given_the_finished_ones(tmp_path):
    """Two configurations searched; ``study extend --samples 2``, one trial at a time, stopped (SIGTERM)
    once the first added trial finished and the second opened; ``study resume`` runs only the second."""
    trainer = {"max_steps": 2, "eval_steps": 2, "log_every": 1}
    search = {"algorithm": "optuna", "num_samples": 2, "n_startup_trials": 2}
    study_file, uri, _ = run_in_process(tmp_path, "extend", trainer, SPACE, search=search)
    _, _, before = runs_of(uri, "extend")
    assert len(finished(before)) == 2
    one_at_a_time = ("--set", "concurrency=1")
    extend = ("study", "extend", str(study_file), "--ablation", "lr", "--samples", "2", *one_at_a_time)
    proc = platform_cmd(*extend, cwd=tmp_path, uri=uri, start_new_session=True)

    def second_added_trial_opened() -> bool:
        children = runs_of(uri, "extend")[2]
        return len(children) == 4 and len(finished(children)) == 3

    wait_for(second_added_trial_opened, proc, "the second added trial")
    os.killpg(proc.pid, signal.SIGTERM)
    output, _ = proc.communicate(timeout=300)
    assert "the sampler is given 2 finished configuration(s) (2 run(s)); 0 finished run(s) outside" in output
    _, (parent,), stopped = runs_of(uri, "extend")
    assert parent.info.status == "KILLED" and len(finished(stopped)) == 3, output[-3000:]
    code, output = run("study", "resume", str(study_file), *one_at_a_time, tmp_path=tmp_path, uri=uri)
    assert code == 0, output[-3000:]
    assert "the sampler is given" not in output  # the extension restored as Tune saved it, not started again

    client, (parent,), children = runs_of(uri, "extend")
    assert parent.info.status == "FINISHED"
    keys = [run.data.tags[TRIAL_TAG] for run in children]
    assert len(children) == 4 and len(set(keys)) == 4 and len(finished(children)) == 4  # two added, once each
    assert {r.info.run_id for r in finished(stopped)} < {r.info.run_id for r in children}

    (experiment,) = (tmp_path / "runs").glob("extend-*/lr-x1")  # the extension's own Tune experiment
    trials = saved_optuna_trials(experiment)
    metric = load_study(study_file).metric
    given = sorted((t.params["point/overrides/trainer.lr"], t.value) for t in trials[:2])
    recorded = sorted((float(r.data.params["trainer.lr"]), r.data.metrics[metric]) for r in before)
    assert given == pytest.approx(recorded)  # the finished configurations and their scores, first
    assert len(trials) == 4 and all(t.state.name == "COMPLETE" for t in trials)
    new = {float(r.data.params["trainer.lr"]) for r in children} - {lr for lr, _ in recorded}
    assert len(new) == 2  # new configurations, not the first ones again

    (lr,) = build_report(load_study(study_file), client, parent.info.run_id, uri).ablations
    assert len(lr.rows) == 4  # the report counts the extension with the search
