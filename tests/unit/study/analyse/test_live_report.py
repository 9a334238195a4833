"""The live report (issue 56): the curves' seed bands against SciPy, the partial mark and provisional
verdicts in every format, ended trials' histories read once, the refresh thread's partial then final
report on a real MLflow store's parent run, its errors a warning line, and ``report.live_every``
validated."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
import yaml
from mlflow.tracking import MlflowClient
from scipy import stats

from clsr.study.analyse.live import LiveReport
from clsr.study.analyse.plots import histories, seed_band
from clsr.study.analyse.render import render_html, render_json, render_markdown, render_text
from clsr.study.analyse.rows import build_report, mark_partial
from clsr.study.plan.load import load_study
from clsr.study.spec.schema import StudyError
from tests.unit.study.analyse.test_report import MAIN, STUDY, T01, T05, store  # noqa: F401 - the fixture

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


def test_ended_trials_histories_are_read_once_and_kept(store):  # noqa: F811
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
    assert len(reads) == 6 and set(kept) == {t.run_id for t in trials}
    again = histories(counting, trials, ["loss", "dev_stsb"], kept)
    assert len(reads) == 6  # ended: nothing read again
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
    assert doc["partial"] == {"finished": FINISHED, "planned": 30, "every": "5m", "text": report.partial.mark}

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
