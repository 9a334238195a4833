"""The live report (issue 56): the curves' seed bands against SciPy, the partial mark and provisional
verdicts in every format, finished trials' histories read once (an interrupted one's again as it
resumes; the final report's all again), the refresh thread's partial then final report on a real MLflow
store's parent run, a stopped study's report marked stopped, its errors a warning line, the planned
trials with `study extend`'s rounds, and ``report.live_every`` validated (10 s at least)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from mlflow.entities import Metric
from mlflow.tracking import MlflowClient
from scipy import stats

from clsr.study.analyse import live as live_module
from clsr.study.analyse.live import LiveReport
from clsr.study.analyse.plots import histories, seed_band
from clsr.study.analyse.render import render_html, render_json, render_markdown, render_text
from clsr.study.analyse.report import write_report
from clsr.study.analyse.rows import build_report, mark_partial
from clsr.study.analyse.runs import load_trials
from clsr.study.control.console import Console
from clsr.study.control.interrupt import Interrupts
from clsr.study.control.watch import StudyWatch
from clsr.study.plan.load import load_study
from clsr.study.record.lease import Lease
from clsr.study.run import waves as waves_module
from clsr.study.run.waves import _end_study
from clsr.study.spec.schema import StudyError
from clsr.tracking.study_runs import close_run, open_child_run, start_parent_run
from tests.support.stores import sqlite_uri
from tests.unit.study.analyse.test_report import (  # noqa: F401 - the fixture
    MAIN,
    NAME,
    STUDY,
    T01,
    T05,
    add_trial,
    store,
    trial_metrics,
)

FINISHED = sum(len(seeds) for seeds in MAIN.values())  # the store's finished trials, one per (point, seed)


def test_the_seed_band_is_the_student_t_interval_over_seeds_per_step():
    seeds = [
        np.array([[1, 1.0], [2, 0.8], [3, 0.5]]),
        np.array([[1, 1.2], [2, 0.7], [3, 0.4], [4, 0.3]]),
        np.array([[1, 0.9], [2, np.nan], [3, 0.6]]),  # a value that is not finite is not logged
    ]
    band = seed_band(seeds)
    assert band.steps.tolist() == [1, 2, 3, 4] and band.n.tolist() == [3, 2, 3, 1]
    for i, values in enumerate([[1.0, 1.2, 0.9], [0.8, 0.7], [0.5, 0.4, 0.6]]):
        low, high = stats.t.interval(0.95, len(values) - 1, loc=np.mean(values), scale=stats.sem(values))
        assert band.mean[i] == pytest.approx(np.mean(values))
        assert (band.low[i], band.high[i]) == (pytest.approx(low), pytest.approx(high))
    assert band.mean[3] == 0.3 and np.isnan(band.low[3]) and np.isnan(band.high[3])  # one seed: no band
    one = seed_band([np.array([[5, 2.0], [10, 1.0]])])
    assert one.mean.tolist() == [2.0, 1.0] and np.isnan(one.low).all()


def test_finished_trials_histories_are_read_once_and_kept(store):  # noqa: F811
    client = store["client"]
    report = build_report(load_study(store["study_file"]), client, store["parent"], store["uri"])
    trials = [t for ab in report.ablations for t in ab.trials][:3]
    reads = []

    class Counting(MlflowClient):
        def get_metric_history(self, run_id, key):
            reads.append((run_id, key))
            return super().get_metric_history(run_id, key)

    kept = {}
    counting = Counting(store["uri"])
    first = histories(counting, trials, ["loss", "dev_stsb"], kept)
    assert all(t.ok for t in trials)
    assert len(reads) == 6 and {run_id for run_id, _ in kept} == {t.run_id for t in trials}
    again = histories(counting, trials, ["loss", "dev_stsb"], kept)
    assert len(reads) == 6  # finished: nothing read again
    assert all(np.array_equal(first[r][k], again[r][k]) for r in first for k in first[r])


def partial_study(store, tmp_path: Path, seeds: list[int]):  # noqa: F811
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({**STUDY, "seeds": seeds, "tracking_uri": store["uri"]}, sort_keys=False))
    return load_study(path)


def test_a_partial_report_is_marked_in_every_format_and_its_unsettled_verdicts_provisional(
    store,  # noqa: F811
    tmp_path,
):
    study = load_study(store["study_file"])
    report = build_report(study, store["client"], store["parent"], store["uri"])
    mark_partial(report, 30, "5m")
    assert report.partial.finished == FINISHED and report.partial.mark == f"partial: {FINISHED} of 30 trials"
    temperature = {r.label: r for r in report.ablations[0].rows}
    # every planned seed of these rows ended (0.1's third failed): their verdicts stand
    assert not temperature[T05].verdicts["test_sts_avg"].provisional
    assert not temperature[T01].verdicts["test_sts_avg"].provisional
    md, page = render_markdown(report, {}), render_html(report, {})
    assert md.startswith(f"# Study report (partial: {FINISHED} of 30 trials): {STUDY['name']}")
    assert f"**partial: {FINISHED} of 30 trials** finished; the study is running" in md
    assert f'<p class="partial">partial: {FINISHED} of 30 trials finished;' in page
    assert f"<title>Study report (partial: {FINISHED} of 30 trials)" in page
    assert f"partial: {FINISHED} of 30 trials finished" in render_text(report)
    doc = json.loads(render_json(report))
    assert doc["partial"] == {
        "finished": FINISHED, "planned": 30, "every": "5m", "stopped_by": None, "text": report.partial.mark
    }  # fmt: skip

    # a fourth seed planned: every row still waits for one, so every verdict is provisional
    waiting = build_report(partial_study(store, tmp_path, [1, 2, 3, 4]), store["client"], store["parent"], store["uri"])  # fmt: skip
    mark_partial(waiting, 2, "30s")
    assert waiting.partial.planned == sum(
        len(r.runs()) for ab in waiting.ablations for r in ab.rows
    )  # not below
    judged = [v for ab in waiting.ablations for r in ab.rows for v in r.verdicts.values()]
    assert judged and all(v.provisional and v.short.startswith("provisional: ") for v in judged)
    cell = json.loads(render_json(waiting))["ablations"][0]["rows"][0]["metrics"]["test_sts_avg"]["verdict"]
    assert cell["provisional"] is True and cell["text"].startswith("provisional: ")

    final = build_report(study, store["client"], store["parent"], store["uri"])  # the report as it ended
    assert "partial:" not in render_markdown(final, {}) and "partial:" not in render_html(final, {})
    assert json.loads(render_json(final))["partial"] is None


def logged_report(client: MlflowClient, run_id: str, folder: Path) -> dict:
    return json.loads(Path(client.download_artifacts(run_id, "report/report.json", str(folder))).read_text())


def test_the_thread_logs_a_partial_report_then_the_final_one_on_the_parent_run(store, tmp_path, monkeypatch):  # noqa: F811
    monkeypatch.chdir(store["folder"])
    client, parent = store["client"], store["parent"]
    study = partial_study(store, tmp_path, [1, 2, 3])
    study.report.live_every = "1h"  # only the wave's end refreshes it here
    live = LiveReport.of(study, store["uri"], parent, 40, lambda: True)
    live.wave_ended()
    deadline = time.monotonic() + 120
    while live.refreshes == 0:  # the thread's refresh, on its own schedule
        assert time.monotonic() < deadline, "no partial report logged"
        time.sleep(0.05)
    partial = logged_report(client, parent, tmp_path / "partial")
    assert partial["partial"]["text"] == f"partial: {FINISHED} of 40 trials"
    live.finish()
    assert not live._thread.is_alive()
    assert logged_report(client, parent, tmp_path / "final")["partial"] is None
    names = {a.path for a in client.list_artifacts(parent, "report")}
    assert {"report/report.md", "report/report.html", "report/temperature_curves.png"} <= names


def test_a_refresh_that_fails_is_a_warning_and_another_drivers_record_is_not_written(store, capsys):  # noqa: F811
    study = load_study(store["study_file"])
    broken = LiveReport(study, store["uri"], "no-such-run", 4, lambda: True)
    assert broken.refresh(partial=True) is False
    assert capsys.readouterr().out.startswith("warning: live report not refreshed (")
    taken = LiveReport(study, store["uri"], store["parent"], 4, lambda: False)
    assert taken.refresh(partial=True) is False and taken.refreshes == 0
    off = LiveReport.of(study.model_copy(update={"report": study.report.model_copy(update={"live_every": None})}),
                        store["uri"], store["parent"], 4, lambda: True)  # fmt: skip
    off.wave_ended()
    off.finish()  # turned off: no thread, nothing written, returns at once
    assert not off._thread.is_alive() and off.refreshes == 0


@pytest.mark.parametrize("every", ["soon", "0s", "-5m", 10])
def test_live_every_is_a_positive_duration_or_null(tmp_path, every):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({**STUDY, "report": {"live_every": every}}, sort_keys=False))
    with pytest.raises(StudyError) as err:
        load_study(path)
    line = next(x for x in str(err.value).splitlines() if "report.live_every" in x)
    assert "should be a positive duration: a number and one unit of s, m, h, d" in line


@pytest.mark.parametrize("every", ["0.001s", "9s", "0.1m"])
def test_live_every_below_ten_seconds_is_refused_in_one_line_naming_the_file(tmp_path, every):
    """Finding 7: each refresh rebuilds and uploads the whole report; '0.001s' would spin the driver."""
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump({**STUDY, "report": {"live_every": every}}, sort_keys=False))
    with pytest.raises(StudyError) as err:
        load_study(path)
    line = next(x for x in str(err.value).splitlines() if "report.live_every" in x)
    assert str(path) in str(err.value) and "should be at least 10s" in line
    path.write_text(yaml.safe_dump({**STUDY, "report": {"live_every": "10s"}}, sort_keys=False))
    assert load_study(path).report.live_every_s == 10


def test_live_every_defaults_to_five_minutes_and_null_turns_it_off(tmp_path):
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(STUDY, sort_keys=False))
    assert load_study(path).report.live_every_s == 300
    path.write_text(yaml.safe_dump({**STUDY, "report": {"live_every": None}}, sort_keys=False))
    assert load_study(path).report.live_every_s is None
    path.write_text(yaml.safe_dump({**STUDY, "report": {"live_every": "90s"}}, sort_keys=False))
    assert load_study(path).report.live_every_s == 90


def test_the_planned_trials_are_the_plans_runnable_ones_and_each_searchs_samples():
    from clsr.study.analyse.live import planned_trials
    from clsr.study.plan.load import load_documents
    from clsr.study.plan.study_plan import plan_study

    smoke = load_documents("studies/smoke.yaml")
    assert planned_trials(plan_study(smoke.study, smoke)) == smoke.counts()[0] == 2
    tuning = load_documents("studies/simcse_tuning.yaml")
    plan = plan_study(tuning.study, tuning)
    searched = tuning.study.search.num_samples * len(tuning.study.seeds_of("lr_batch"))
    confirmed = tuning.study.ablations["confirmed"].confirm.top_k * len(tuning.study.seeds_of("confirmed"))
    assert (searched, confirmed) == (32, 15)
    assert planned_trials(plan) == len(plan.trials) + searched + confirmed  # the paper row: plan.trials
    assert {t.ablation for t in plan.trials} <= {"confirmed"}


def test_the_planned_trials_add_the_current_searchs_extend_rounds():
    """Finding 6a: during `study extend` m counts the round's samples x seeds (it read 32 of 35 before)."""
    from clsr.study.analyse.live import planned_trials
    from clsr.study.plan.load import load_documents
    from clsr.study.plan.study_plan import plan_study
    from clsr.study.record.extension import ExtensionRound

    tuning = load_documents("studies/simcse_tuning.yaml")
    plan = plan_study(tuning.study, tuning)
    before = planned_trials(plan)
    rounds = [ExtensionRound("lr_batch", 4, 1, 2), ExtensionRound("lr_batch", 3, 2, 5)]
    assert planned_trials(plan, rounds) == before + (4 + 3) * 2  # 2 seeds a configuration
    # searched again by attempt 3: the round of attempt 2 extended the old search, not the one run now
    assert planned_trials(plan, rounds, {"lr_batch": 3}) == before + 3 * 2
    assert planned_trials(plan, [ExtensionRound("gone", 4, 1, 2)]) == before  # no such ablation now


def small_store(tmp_path: Path, monkeypatch) -> tuple[str, MlflowClient, str, Path]:
    """A real MLflow store of its own (its runs reopened and closed here): a parent and its study file."""
    monkeypatch.chdir(tmp_path)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    parent = start_parent_run(client, NAME, str(tmp_path / "runs"), "live report test")
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump({**STUDY, "tracking_uri": uri}, sort_keys=False))
    return uri, client, parent, study_file


def log_loss(client: MlflowClient, run_id: str, steps: range) -> None:
    now = int(time.time() * 1000)
    client.log_batch(run_id, metrics=[Metric("loss", 1.0 / s, now, s) for s in steps])


def test_an_interrupted_runs_history_is_read_again_once_its_trial_resumes(tmp_path, monkeypatch):
    """Finding 1: a run closed interrupted (a takeover) and reopened when its trial resumes logs more:
    a refresh that read it interrupted must not keep its short curve for every later refresh."""
    uri, client, parent, study_file = small_store(tmp_path, monkeypatch)
    tags = {"clsr.method": "simcse_unsup", "clsr.ablation": "temperature", "clsr.point": T05, "clsr.seed": 1}
    run_id = open_child_run(uri, parent, "temperature[0.05] seed=1", "t/seed=1", tags, {"x": 1})
    log_loss(client, run_id, range(1, 3))
    close_run(uri, run_id, "interrupted")
    kept = {}
    (trial,) = load_trials(client, parent)
    assert histories(client, [trial], ["loss"], kept)[run_id]["loss"][:, 0].tolist() == [1, 2]
    time.sleep(0.01)  # the reopening's ms stamp differs from the first opening's
    assert open_child_run(uri, parent, "temperature[0.05] seed=1", "t/seed=1", tags, {"x": 1}) == run_id
    log_loss(client, run_id, range(3, 6))
    client.log_metric(run_id, "test_sts_avg", 76.0)
    close_run(uri, run_id, "finished")
    (trial,) = load_trials(client, parent)
    again = histories(client, [trial], ["loss"], kept)[run_id]["loss"]
    assert again[:, 0].tolist() == [1, 2, 3, 4, 5] and again[:, 1].tolist() == [1.0 / s for s in range(1, 6)]
    assert [k[0] for k in kept] == [run_id]  # only the finished opening is kept
    reads = []

    class Counting(MlflowClient):
        def get_metric_history(self, run_id, key):
            reads.append((run_id, key))
            return super().get_metric_history(run_id, key)

    assert histories(Counting(uri), [trial], ["loss"], kept)[run_id]["loss"].shape == (5, 2)
    assert reads == []  # finished: read once, kept


def test_the_final_report_reads_every_history_again(store, tmp_path, monkeypatch):  # noqa: F811
    """Finding 1: the final report is built without the refreshes' kept histories."""
    monkeypatch.chdir(store["folder"])
    study = partial_study(store, tmp_path, [1, 2, 3])
    given = []

    def spy(report, client, out, kept=None):
        given.append(kept)
        return write_report(report, client, out, kept)

    monkeypatch.setattr(live_module, "write_report", spy)
    live = LiveReport(study, store["uri"], store["parent"], 40, lambda: True)
    assert live.refresh(partial=True) and live.refresh(partial=False)
    assert given[0] is live._kept and live._kept and given[1] is None


def ended_live_report(uri: str, parent: str, study_file: Path) -> LiveReport:
    study = load_study(study_file)
    study.report.live_every = "1h"  # only the test's refresh and the study's end write it
    live = LiveReport.of(study, uri, parent, 7, lambda: True)
    assert live.refresh(partial=True)  # a partial report logged while it ran
    return live


def end_study(uri, client, parent, study_file, live: LiveReport, interrupts: Interrupts, status="FINISHED"):
    study = load_study(study_file)
    lease = Lease(uri, parent, study.name)
    lease.take_first()
    watch = StudyWatch(study, uri, parent, interrupts)
    try:
        storage = str(Path.cwd() / "runs")  # the small store's folder: no kept writes to replay
        return _end_study(
            study, client, uri, parent, storage, lease, interrupts, watch, Console(), live, status
        )
    finally:
        lease.release()


def test_a_study_its_budget_stopped_keeps_its_report_marked_stopped(tmp_path, monkeypatch):
    """Finding 6c: the report as a stopped study ends says how many of its trials it ran, and why it
    stopped; it does not replace the partial one with an unmarked final one."""
    uri, client, parent, study_file = small_store(tmp_path, monkeypatch)
    add_trial(client, uri, parent, "temperature", T05, 1, metrics=trial_metrics("temperature", 1, 76.1))
    add_trial(client, uri, parent, "temperature", T05, 2, metrics=trial_metrics("temperature", 2, 75.5))
    live = ended_live_report(uri, parent, study_file)
    interrupts = Interrupts()
    interrupts.stop_for("budget")  # as the watch asks when the next trial would pass the budget
    outcome = end_study(uri, client, parent, study_file, live, interrupts, status="KILLED")
    assert outcome.stopped_by == "budget" and not live._thread.is_alive()
    assert client.get_run(parent).data.tags["clsr.status"] == "stopped"
    logged = logged_report(client, parent, tmp_path / "stopped")
    assert logged["partial"] == {
        "finished": 2, "planned": 7, "every": "1h", "stopped_by": "budget", "text": "stopped: 2 of 7 trials"
    }  # fmt: skip
    md = Path(client.download_artifacts(parent, "report/report.md", str(tmp_path / "md"))).read_text()
    assert md.startswith(f"# Study report (stopped: 2 of 7 trials): {NAME}")
    assert "the study was stopped by its budget before it ran all it planned" in md


def test_the_final_report_is_written_even_when_closing_the_record_raises(tmp_path, monkeypatch):
    """Finding 6d: close_study raising (the record unreachable past patience) still ends the refresh
    thread and writes the report, marked stopped by an error; the error reaches the caller."""
    uri, client, parent, study_file = small_store(tmp_path, monkeypatch)
    add_trial(client, uri, parent, "temperature", T05, 1, metrics=trial_metrics("temperature", 1, 76.1))
    live = ended_live_report(uri, parent, study_file)

    def unreachable(*args, **kwargs):
        raise ConnectionError("tracking server unreachable")

    monkeypatch.setattr(waves_module, "close_study", unreachable)
    with pytest.raises(ConnectionError):
        end_study(uri, client, parent, study_file, live, Interrupts())
    assert not live._thread.is_alive()
    logged = logged_report(client, parent, tmp_path / "error")["partial"]
    assert (logged["stopped_by"], logged["text"]) == ("error", "stopped: 1 of 7 trials")


def test_a_study_that_ran_all_it_planned_ends_with_an_unmarked_report(tmp_path, monkeypatch):
    uri, client, parent, study_file = small_store(tmp_path, monkeypatch)
    add_trial(client, uri, parent, "temperature", T05, 1, metrics=trial_metrics("temperature", 1, 76.1))
    live = ended_live_report(uri, parent, study_file)
    outcome = end_study(uri, client, parent, study_file, live, Interrupts())
    assert outcome.stopped_by is None and client.get_run(parent).data.tags["clsr.status"] == "finished"
    assert logged_report(client, parent, tmp_path / "final")["partial"] is None
