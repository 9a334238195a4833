"""A study's budget: its arithmetic (what was spent, the next trial's projected cost, which limit it
would pass) against hand computations, and the ``budget:`` section refused in one line when bad."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import yaml
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient

from clsr.study.control.budget import (
    Spent,
    TrialTime,
    next_trial_s,
    over_budget,
    prior_seconds,
    spent,
    trial_times,
)
from clsr.study.plan.load import load_study
from clsr.study.spec.budget import wall_seconds
from clsr.study.spec.schema import StudyError
from clsr.tracking.study_runs import children, close_run, open_child_run, start_parent_run
from clsr.tracking.tags import EARLIER_S_TAG, OPENED_TAG, SUPERSEDED_TAG
from tests.support.stores import sqlite_uri
from tests.unit.study.spec.test_study_validation import GOOD, write


def study_with(tmp_path, **budget):
    return load_study(write(tmp_path, {**GOOD, "budget": budget}))


def test_spent_counts_every_trial_that_ran_and_the_failed_ones(tmp_path):
    trials = [
        TrialTime("finished", 600.0),
        TrialTime("finished", 1200.0),
        TrialTime("failed", 300.0),
        TrialTime("running", 900.0),
        TrialTime("skipped", 0.0),  # an upstream trial lost: it never ran
    ]
    used = spent(trials, elapsed_s=2000.0, gpus_per_trial=2.0)
    # (600 + 1200 + 300 + 900) s x 2 GPUs = 6000 GPU-seconds = 1.6667 GPU-hours
    assert used.gpu_hours == pytest.approx(3000 * 2 / 3600)
    assert used.failed == 1
    assert used.finished_s == (600.0, 1200.0)
    assert next_trial_s(used, prior_s=50.0) == 900.0  # the median finished trial
    assert next_trial_s(spent([], 0.0, 1.0), prior_s=50.0) == 50.0  # none finished: the plan's


def test_gpu_hours_stop_the_launch_that_would_pass_them(tmp_path):
    study = study_with(tmp_path, gpu_hours=2)
    # 1.5 GPU-hours spent; a next trial of 1,800 s on 1 GPU is 0.5 h: exactly the budget, allowed
    assert over_budget(study, Spent(0.0, 1.5, 0, ()), 1800.0, 1.0) is None
    why = over_budget(study, Spent(0.0, 1.5, 0, ()), 1801.0, 1.0)
    assert why == (
        "budget.gpu_hours 2: 1.50 GPU-hours spent + 0.50 projected for the next trial would pass it"
    )
    # CPU trials hold no GPU: never stopped by GPU-hours
    assert over_budget(study, Spent(0.0, 99.0, 0, ()), 1e6, 0.0) is None


def test_wall_counts_this_drivers_time_and_the_next_trial(tmp_path):
    study = study_with(tmp_path, wall="90m")
    assert study.budget.wall_s == 5400.0
    assert over_budget(study, Spent(4800.0, 0.0, 0, ()), 600.0, 0.0) is None  # 80 + 10 min: 90, allowed
    why = over_budget(study, Spent(4800.0, 0.0, 0, ()), 660.0, 0.0)
    assert why == "budget.wall 90m: 80.0 min run + 11.0 min projected for the next trial would pass it"


def test_max_failed_trials_stops_at_the_count(tmp_path):
    study = study_with(tmp_path, max_failed_trials=3, gpu_hours=100)
    assert over_budget(study, Spent(0.0, 0.0, 2, ()), 0.0, 1.0) is None
    assert over_budget(study, Spent(0.0, 0.0, 3, ()), 0.0, 1.0) == (
        "budget.max_failed_trials 3 reached: 3 trial(s) failed"
    )
    assert not load_study(write(tmp_path, GOOD)).budget.limited  # no budget: no limit


@pytest.mark.parametrize(("text", "seconds"), [("12h", 43200.0), ("90m", 5400.0), ("45s", 45.0),
                                               ("1.5d", 129600.0)])  # fmt: skip
def test_wall_units(text, seconds):
    assert wall_seconds(text) == seconds


@pytest.mark.parametrize(
    ("budget", "field", "fragment"),
    [
        ({"wall": "12 hours"}, "budget.wall", "a number and one unit of s, m, h, d (e.g. '12h', '90m')"),
        ({"wall": "0h"}, "budget.wall", "positive duration"),
        ({"wall": 3600}, "budget.wall", "one unit of s, m, h, d"),
        ({"gpu_hours": 0}, "budget.gpu_hours", "greater than 0"),
        ({"gpu_hours": -4}, "budget.gpu_hours", "greater than 0"),
        ({"max_failed_trials": 0}, "budget.max_failed_trials", "greater than or equal to 1"),
        ({"max_failed": 3}, "budget.max_failed", "did you mean 'max_failed_trials'?"),
    ],
)
def test_a_bad_budget_is_one_line_naming_file_field_and_allowed_values(tmp_path, budget, field, fragment):
    path = write(tmp_path, {**GOOD, "budget": budget})
    with pytest.raises(StudyError) as caught:
        load_study(path)
    assert len(caught.value.problems) == 1
    line = str(caught.value).splitlines()[1]
    assert line.startswith(f"  {path}: {field}")
    assert fragment in line


def test_the_budget_round_trips_through_yaml(tmp_path):
    study = study_with(tmp_path, gpu_hours=40, wall="12h", max_failed_trials=3)
    assert (study.budget.gpu_hours, study.budget.wall_s, study.budget.max_failed_trials) == (40.0, 43200.0, 3)
    assert yaml.safe_load(yaml.safe_dump(study.model_dump()))["budget"]["wall"] == "12h"


def test_the_prior_is_study_plans_mean_trial(tmp_path):
    from clsr.study.plan.projection import project

    study = study_with(tmp_path, gpu_hours=1)
    seconds, how = prior_seconds(study)
    plans = project(study, None, 1, "h100", progress=lambda _line: None).plans
    assert seconds == pytest.approx(sum(p.seconds for p in plans) / len(plans))
    assert seconds > 0 and "study plan's cost model" in how


DAY_MS = 86_400_000


def a_run(status, start_ms, end_ms, tags=None, metrics=None):
    info = SimpleNamespace(status=status, start_time=start_ms, end_time=end_ms)
    return SimpleNamespace(info=info, data=SimpleNamespace(tags=tags or {}, metrics=metrics or {}))


def test_a_trial_resumed_days_later_is_charged_its_attempts_not_the_days_between():
    now = 10 * DAY_MS
    resumed = {"clsr.status": "finished", OPENED_TAG: str(now - 120_000), EARLIER_S_TAG: "300.0"}
    runs = [
        a_run("FINISHED", 0, now, resumed, {"trial_wall_s": 100.0}),  # measured by the trial itself
        a_run("FINISHED", 0, now, {**resumed, "clsr.status": "failed"}),  # no measure: from its reopening
        a_run("RUNNING", 0, None, {OPENED_TAG: str(now - 60_000), EARLIER_S_TAG: "30.0"}),
        a_run("FINISHED", now - 50_000, now, {"clsr.status": "finished"}),  # an older record: its start
    ]
    assert trial_times(runs, now) == [
        TrialTime("finished", 400.0),
        TrialTime("failed", 420.0),
        TrialTime("running", 90.0),
        TrialTime("finished", 50.0),
    ]


def test_reopening_a_trials_run_sums_its_earlier_attempt(tmp_path):
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    parent = start_parent_run(client, "budget-test", str(tmp_path / "runs"), None)
    run_id = open_child_run(uri, parent, "t-0", "t-0", {}, {})
    close_run(uri, run_id, "failed", "boom")
    first = client.get_run(run_id)
    assert first.data.tags[OPENED_TAG] == str(first.info.start_time)
    assert open_child_run(uri, parent, "t-0", "t-0", {}, {}) == run_id  # Tune's retry
    reopened = client.get_run(run_id)
    attempt_s = (first.info.end_time - int(first.data.tags[OPENED_TAG])) / 1000
    assert float(reopened.data.tags[EARLIER_S_TAG]) == pytest.approx(attempt_s, abs=0.05)
    assert int(reopened.data.tags[OPENED_TAG]) >= first.info.end_time
    client.log_batch(run_id, metrics=[Metric("trial_wall_s", 7.0, 0, 0)])
    close_run(uri, run_id, "finished")
    [times] = trial_times(children(client, parent), 0)
    assert times.status == "finished"
    assert times.seconds == pytest.approx(float(reopened.data.tags[EARLIER_S_TAG]) + 7.0)


def test_a_superseded_runs_failure_is_not_counted_but_its_time_is():
    trials = [TrialTime("failed", 60.0, superseded=True), TrialTime("failed", 60.0)]
    used = spent(trials, 0.0, 1.0)
    assert used.failed == 1 and used.gpu_hours == pytest.approx(120 / 3600)
    superseded = a_run("FAILED", 1000, 2000, {"clsr.status": "failed", SUPERSEDED_TAG: "3"})
    assert trial_times([superseded], 2000) == [TrialTime("failed", 1.0, superseded=True)]
