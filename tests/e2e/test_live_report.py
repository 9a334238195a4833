"""The live report (issue 56) through Ray Tune and MLflow: a tiny study of two trials run one at a time,
its second trial held (its method waits for a file the test creates), so mid-study is a state, not a
moment. While it is held, the parent run carries the report of the first trial, marked "partial: 1 of 2
trials", and the MLflow UI shows it in a real browser (where Chromium is installed, as in
test_mlflow_ui.py); once the study ends, the final report has replaced it."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient

from tests.e2e.test_e2e import platform_cmd
from tests.e2e.test_resilience import tiny_study

pytestmark = [pytest.mark.e2e, pytest.mark.parallel, pytest.mark.minutes(1.5)]
MARK = "partial: 1 of 2 trials"
HELD_METHOD = """\
import os
import time

from clsr.methods.simcse_unsup import SimCSEUnsup

FIRST, GATE = {first!r}, {gate!r}


class HeldLoss(SimCSEUnsup):
    \"\"\"Unsupervised SimCSE whose second trial waits, before training, for the test's gate file.\"\"\"

    def prepare_rows(self, rows, pipeline, trial):
        try:
            os.close(os.open(FIRST, os.O_CREAT | os.O_EXCL))  # the first trial to get here goes on
        except FileExistsError:
            while not os.path.exists(GATE):
                time.sleep(0.2)
        return super().prepare_rows(rows, pipeline, trial)
"""


def report_json(client: MlflowClient, run_id: str, folder: Path) -> dict | None:
    """The parent run's report/report.json, or None while it has none."""
    if not any(a.path == "report/report.json" for a in client.list_artifacts(run_id, "report")):
        return None
    return json.loads(Path(client.download_artifacts(run_id, "report/report.json", str(folder))).read_text())


def wait_for_partial(proc, client: MlflowClient, tmp_path: Path) -> tuple[str, str, dict]:
    """The experiment id, parent run id and partial report once the report says the first trial
    finished (the second is held: nothing else can change it)."""
    reads = 0
    while True:
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        experiment = client.get_experiment_by_name("live")
        parents = (
            client.search_runs([experiment.experiment_id], "tags.`clsr.study` = 'live'") if experiment else []
        )
        if parents:
            reads += 1
            report = report_json(client, parents[0].info.run_id, tmp_path / f"read{reads}")
            if report is not None and (report["partial"] or {}).get("finished") == 1:
                return experiment.experiment_id, parents[0].info.run_id, report
        time.sleep(0.5)


def see_in_browser(url: str, experiment_id: str, parent_id: str, tmp_path: Path) -> None:
    """The parent run's artifact view in Chromium: report/report.md opened, the partial mark on the page."""
    from playwright.sync_api import expect, sync_playwright

    from tests.e2e.test_mlflow_ui import CHROMIUM, TIMEOUT_MS, new_page, screenshot

    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--disable-dev-shm-usage"]
        )
        page = new_page(browser)
        with screenshot(page, "parent_run_partial_report", tmp_path):
            page.goto(f"{url}/#/experiments/{experiment_id}/runs/{parent_id}/artifacts")
            page.get_by_text("report", exact=True).first.click()  # the folder
            page.get_by_text("report.md", exact=True).first.click()
            expect(page.locator("body")).to_contain_text(MARK)  # the file's text, served by the server
        browser.close()


def test_the_parent_run_carries_the_partial_report_mid_study_and_the_final_one_at_the_end(tmp_path):
    from tests.e2e.test_mlflow_ui import CHROMIUM, serve_mlflow

    first, gate = tmp_path / "first-trial", tmp_path / "gate"
    (tmp_path / "held.py").write_text(HELD_METHOD.format(first=str(first), gate=str(gate)))
    study_file, uri = tiny_study(
        tmp_path, "live", {"max_steps": 8, "eval_steps": 4, "log_every": 2}, {"lr": {"grid": {"trainer.lr": [3e-5]}}},
        method="./held.py:HeldLoss", seeds=[1, 2], concurrency=1, system_metrics_interval_s=None,
        resources={"workers_per_trial": 0, "cpus_per_worker": 1}, report={"live_every": "10s"},
    )  # fmt: skip
    proc = platform_cmd("study", "run", str(study_file), cwd=tmp_path, uri=uri)
    try:
        client = MlflowClient(uri)
        experiment_id, parent_id, partial = wait_for_partial(proc, client, tmp_path)
        assert partial["partial"] == {
            "finished": 1,
            "planned": 2,
            "every": "10s",
            "stopped_by": None,
            "text": MARK,
        }
        (row,) = partial["ablations"][0]["rows"]
        assert row["trials"].startswith("1/2 ok")  # the held trial: running, or not yet opened
        md = client.download_artifacts(parent_id, "report/report.md", str(tmp_path / "md"))
        assert f"**{MARK}** finished; the study is running" in Path(md).read_text()
        if CHROMIUM is not None:  # the MLflow UI over the same store, while the trial is held
            with serve_mlflow(uri, tmp_path, tmp_path / "server.log") as url:
                see_in_browser(url, experiment_id, parent_id, tmp_path)
    finally:
        gate.touch()  # the held trial goes on
        output, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, output[-3000:]

    final = report_json(client, parent_id, tmp_path / "final")
    assert final["partial"] is None
    (row,) = final["ablations"][0]["rows"]
    assert row["trials"] == "2/2 ok" and row["metrics"]
    md = Path(
        client.download_artifacts(parent_id, "report/report.md", str(tmp_path / "final-md"))
    ).read_text()
    assert "partial:" not in md and md.startswith("# Study report: live")
    names = {a.path for a in client.list_artifacts(parent_id, "report")}
    assert {"report/report.html", "report/lr_curves.png", "report/lr_main.png"} <= names
    if CHROMIUM is None:
        pytest.skip("checked through MLflow; the browser part needs Chromium (see test_mlflow_ui.py)")
