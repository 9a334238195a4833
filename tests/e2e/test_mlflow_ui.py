"""The MLflow UI in a real browser, over the store of the finished smoke study.

A module fixture starts ``mlflow server`` on 127.0.0.1 over the study's SQLite store; headless Chromium
(Debian's ``chromium`` package, driven by Playwright with ``executable_path``: Playwright's own browser
downloads are never used) opens the experiment's runs table, each trial's run page, the compare view of
the two trials and the parent run's artifacts, and checks that the trial runs and their metric values
are on the page. Every test keeps a screenshot named after what it shows in ``test-artifacts/mlflow_ui/``
(repo root, git-ignored) and in its ``tmp_path``; the screenshot is taken even when the test fails.

Skipped, with a message, only where no Chromium binary is found (``apt-get install chromium``;
``CLSR_CHROMIUM`` may name another Chromium or Chrome binary).
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest
from mlflow.tracking import MlflowClient
from playwright.sync_api import expect, sync_playwright

from clsr.cluster.ports import free_port
from clsr.study.record.runs_view import trials_url

REPO_ROOT = Path(__file__).resolve().parents[2]
ARTIFACTS = REPO_ROOT / "test-artifacts" / "mlflow_ui"
METRICS = ("test_stsb", "test_sts16", "test_sts_avg", "best_dev_stsb")  # checked for each trial
TIMEOUT_MS = 60_000  # the SPA's first render on a busy 2-core CI machine can take a while
SERVER_START_S = 180


def find_chromium() -> str | None:
    """The Chromium binary: ``CLSR_CHROMIUM``, else Debian's ``chromium`` (or another distribution's name)."""
    if os.environ.get("CLSR_CHROMIUM"):
        return shutil.which(os.environ["CLSR_CHROMIUM"])
    for name in ("chromium", "chromium-browser", "google-chrome-stable", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


CHROMIUM = find_chromium()
pytestmark = [
    pytest.mark.e2e,
    pytest.mark.parallel,
    pytest.mark.xdist_group("smoke_study"),  # they read the smoke study fixture: one test process
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="MLflow UI browser test: no Chromium binary found; install it with "
        "`apt-get install --no-install-recommends chromium` (Debian; .ci/run does this in CI) "
        "or set CLSR_CHROMIUM to a Chromium/Chrome binary",
    ),
]


def js_number(value: float) -> str:
    """A float as JavaScript's ``String(value)`` writes it (how the runs table and run page show metrics)."""
    if not math.isfinite(value):
        return {math.inf: "Infinity", -math.inf: "-Infinity"}.get(value, "NaN")
    if value == int(value) and abs(value) < 1e21:
        return str(int(value))
    if 1e-6 <= abs(value) < 1e21:  # shortest round-trip digits (as Python's repr), never in exponent form
        return format(Decimal(repr(value)), "f")
    mantissa, exponent = repr(value).split("e")
    return f"{mantissa}e{int(exponent):+d}"


def mlflow_format_metric(value: float) -> str:
    """``Utils.formatMetric`` of MLflow's UI: the rounding the compare view uses."""
    if value == 0:
        return "0"
    if abs(value) < 1e-3:
        return f"{value:.3e}".replace("e-0", "e-").replace("e+0", "e+")
    digits = 3 if abs(value) < 10 else 2 if abs(value) < 100 else 1
    scale = 10**digits
    return js_number(math.floor(value * scale + 0.5) / scale)  # Math.round: halves up


@pytest.fixture(scope="module")
def study(smoke_study):
    """The smoke study's experiment, parent run and trial runs, as MLflow stores them."""
    client = MlflowClient(smoke_study.uri)
    experiment = client.get_experiment_by_name("smoke")
    assert experiment is not None, "the smoke study logged no `smoke` experiment"
    runs = client.search_runs([experiment.experiment_id])
    parents = [r for r in runs if "clsr.study" in r.data.tags]
    children = sorted((r for r in runs if "mlflow.parentRunId" in r.data.tags), key=lambda r: r.info.run_name)
    assert len(parents) == 1 and len(children) == 2, [r.info.run_name for r in runs]
    for child in children:
        assert set(METRICS) <= set(child.data.metrics), (child.info.run_name, child.data.metrics)
    return experiment, parents[0], children


@contextlib.contextmanager
def serve_mlflow(uri: str, folder: Path, log_path: Path) -> Iterator[str]:
    """``mlflow server`` on 127.0.0.1 over the store at ``uri``; yields its base URL once healthy; stopped
    after. Its artifact root and working folder: ``folder``."""
    port = free_port()
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", uri,
        "--default-artifact-root", str(folder / "mlruns"),
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    # No background job runner (7 extra processes, for GenAI features): a lighter, quicker start.
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    with open(log_path, "w") as log:
        # cwd: the study's folder, so nothing the server writes (./mlartifacts) lands in the repo;
        # its own session: the server, its uvicorn worker and their children stop together.
        server = subprocess.Popen(
            cmd, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
    try:
        deadline = time.monotonic() + SERVER_START_S
        while True:
            if server.poll() is not None:
                pytest.fail(f"mlflow server exited with {server.returncode}:\n{log_path.read_text()[-3000:]}")
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/health", timeout=5) as response:
                if response.status == 200:
                    break
            if time.monotonic() > deadline:
                pytest.fail(
                    f"mlflow server not healthy after {SERVER_START_S}s:\n{log_path.read_text()[-3000:]}"
                )
            time.sleep(0.5)
        yield url
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=30)


@pytest.fixture(scope="module")
def mlflow_ui(smoke_study, tmp_path_factory):
    """``mlflow server`` on 127.0.0.1 over the smoke study's store; yields its base URL; stopped after."""
    log_path = tmp_path_factory.mktemp("mlflow-server") / "server.log"
    with serve_mlflow(smoke_study.uri, smoke_study.folder, log_path) as url:
        yield url


@pytest.fixture(scope="module")
def browser():
    expect.set_options(timeout=TIMEOUT_MS)
    with sync_playwright() as pw:
        # Playwright passes --no-sandbox (root in containers); small /dev/shm in containers: no shm.
        chromium = pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--disable-dev-shm-usage"]
        )
        yield chromium
        chromium.close()


def new_page(browser):
    """A page in a fresh context, as a first-time visitor who has already seen the assistant panel."""
    context = browser.new_context(viewport={"width": 1800, "height": 1000}, locale="en-US", timezone_id="UTC")
    # The UI opens its "MLflow Assistant" side panel on a first visit from localhost; as if already seen.
    context.add_init_script("localStorage.setItem('mlflow.assistant.fab.autoOpenedOnFirstLoad_v1', 'true')")
    context.set_default_timeout(TIMEOUT_MS)
    return context.new_page()


@pytest.fixture
def page(browser):
    page = new_page(browser)
    yield page
    page.context.close()


@contextlib.contextmanager
def screenshot(page, name: str, tmp_path: Path):
    """Runs the block, then saves ``<name>.png`` (the state it ended in, also on failure) in both places."""
    try:
        yield
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        png = page.screenshot(full_page=True)
        for folder in (ARTIFACTS, tmp_path):
            (folder / f"{name}.png").write_bytes(png)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.=-]+", "_", name)


def test_runs_table_shows_trials_and_metrics(mlflow_ui, study, page, tmp_path):
    """The experiment's runs table: the parent row, expanded, lists both trials with their metric values."""
    experiment, parent, children = study
    exp_id = experiment.experiment_id
    with screenshot(page, "experiment_runs_table", tmp_path):
        page.goto(f"{mlflow_ui}/#/experiments/{exp_id}/runs?workflowType=machine_learning")
        expect(page.get_by_text("smoke", exact=True).first).to_be_visible()
        run_name_col = '[col-id="attributes.`Run Name`"]'
        parent_row = page.locator(f'[role="row"][row-id="{parent.info.run_id}"]')
        expect(parent_row.locator(run_name_col)).to_contain_text("smoke")
        parent_row.locator(f"{run_name_col} button").first.click()  # expand: the trials are nested under it
        for child in children:
            row = page.locator(f'[role="row"][row-id="{child.info.run_id}"]')
            expect(row.locator(run_name_col)).to_contain_text(child.info.run_name)

        # Metric and parameter columns are off by default: switch some on in "Columns" (found through its
        # search box: the list of columns scrolls), and some attribute columns off to make room.
        page.get_by_role("button", name="Columns", exact=True).click()
        search = page.get_by_placeholder("Search columns")
        tree = page.get_by_test_id("column-selector-tree")
        for column in (*METRICS, "method.temperature", "Dataset", "Source", "Models"):
            search.fill(column)
            # the search marks the match (<strong>) in every name holding it, the parent's "<metric> mean -
            # <ablation> - <point>" too: click the entry whose whole name is the column
            tree.locator(f"xpath=.//*[not(self::strong)][normalize-space(.)='{column}']").first.click()
        search.fill("")
        page.keyboard.press("Escape")
        # Wider run names, for the screenshot: drag the column's resize handle (by its left half; its right
        # half lies under the next header).
        handle = page.locator(f".ag-header-cell{run_name_col} .ag-header-cell-resize")
        if box := handle.bounding_box():
            x, y = box["x"] + 1, box["y"] + box["height"] / 2
            page.mouse.move(x, y)
            page.mouse.down()
            page.mouse.move(x + 200, y, steps=20)
            page.mouse.up()
        header = page.locator(".ag-header")
        for metric in METRICS:
            expect(header.get_by_text(metric, exact=True).first).to_be_visible()
        for child in children:
            row = page.locator(f'[role="row"][row-id="{child.info.run_id}"]')
            for metric in METRICS:
                cell = row.locator(f'[col-id="metrics.`{metric}`"]')
                expect(cell).to_have_text(js_number(child.data.metrics[metric]))
            expect(row.locator('[col-id="params.`method.temperature`"]')).to_have_text(
                child.data.params["method.temperature"]
            )


def test_the_studys_view_shows_the_trials_with_its_metric_and_params(
    mlflow_ui, smoke_study, study, page, tmp_path
):
    """The README's URL (the study's shared view): both trials, best first, with the study's metric and the
    parameter its ablation varies as columns, no click needed; neither the parent nor the lease run listed.
    The default runs table does not list the lease run either (let go, it is deleted)."""
    from mlflow.entities import ViewType

    experiment, parent, children = study
    leases = MlflowClient(smoke_study.uri).search_runs(
        [experiment.experiment_id], "tags.`clsr.role` = 'lease'", ViewType.ALL
    )
    assert len(leases) == 1 and leases[0].info.lifecycle_stage == "deleted"
    ranked = sorted(children, key=lambda c: -c.data.metrics["best_dev_stsb"])
    with screenshot(page, "study_trials_view", tmp_path):
        page.goto(trials_url(mlflow_ui, experiment.experiment_id))
        rows = page.locator(".ag-center-cols-container [role='row']")
        expect(rows).to_have_count(len(children))
        for position, child in enumerate(ranked):
            row = page.locator(f'.ag-center-cols-container [role="row"][row-id="{child.info.run_id}"]')
            expect(row).to_have_attribute("row-index", str(position))
            expect(row.locator('[col-id="metrics.`best_dev_stsb`"]')).to_have_text(
                js_number(child.data.metrics["best_dev_stsb"])
            )
            expect(row.locator('[col-id="params.`method.temperature`"]')).to_have_text(
                child.data.params["method.temperature"]
            )
        header = page.locator(".ag-header")
        for column in ("best_dev_stsb", "method.temperature"):
            expect(header.get_by_text(column, exact=True).first).to_be_visible()
    page = page.context.new_page()  # a fresh page: the shared view's state stays with the one above
    with screenshot(page, "experiment_runs_default", tmp_path):
        page.goto(f"{mlflow_ui}/#/experiments/{experiment.experiment_id}/runs?workflowType=machine_learning")
        expect(page.locator(f'[role="row"][row-id="{parent.info.run_id}"]').first).to_be_visible()
        expect(
            page.get_by_text(f"{1 + len(children)} matching runs")
        ).to_be_visible()  # the lease not among them
        expect(page.locator(f'[role="row"][row-id="{leases[0].info.run_id}"]')).to_have_count(0)


def test_trial_run_pages_show_metrics(mlflow_ui, study, page, tmp_path):
    """Each trial's run page: its name, its metric count, the checked metrics' values, its parameter, its parent."""
    experiment, parent, children = study
    for child in children:
        name = f"run_page_{_safe(child.info.run_name.replace('/', '__'))}"
        with screenshot(page, name, tmp_path):
            page.goto(f"{mlflow_ui}/#/experiments/{experiment.experiment_id}/runs/{child.info.run_id}")
            expect(page.get_by_role("heading", name=child.info.run_name)).to_be_visible()
            expect(page.get_by_text(f"Metrics ({len(child.data.metrics)})", exact=True)).to_be_visible()
            # The metrics and parameters tables scroll: each name is looked up through the table's search box.
            search_metrics = page.get_by_placeholder("Search metrics")
            for metric in METRICS:
                search_metrics.fill(metric)
                row = page.get_by_role("row").filter(has=page.get_by_role("cell", name=metric, exact=True))
                expect(row.get_by_role("cell").nth(1)).to_have_text(js_number(child.data.metrics[metric]))
            search_metrics.fill("")
            page.get_by_placeholder("Search parameters").fill("method.temperature")
            param = page.get_by_role("row").filter(has=page.get_by_role("cell", name="method.temperature"))
            expect(param.get_by_role("cell").nth(1)).to_have_text(child.data.params["method.temperature"])
            parent_link = page.locator(f'a[href$="/runs/{parent.info.run_id}"]')  # "Parent run: smoke"
            expect(parent_link.first).to_be_visible()


def _compare_metric_values(page, metric: str) -> list[str]:
    """The values in the compare view's metrics grid on the row of ``metric``, one per run (left to right).

    The names and the values are two virtualized grids that scroll together: rows outside the visible
    window are not rendered, so the values grid is scrolled until the metric's row is there; a value
    belongs to the row whose name is at the same height.
    """
    section = page.locator(".du-bois-light-collapse-content-box").filter(
        has=page.get_by_role("switch", name="Metrics - Show diff only")
    )
    names, values = section.get_by_role("grid").nth(0), section.get_by_role("grid").nth(1)
    expect(values).to_be_visible()
    link = names.get_by_role("link", name=metric, exact=True)  # metric names link to their charts
    values.evaluate("grid => { grid.scrollTop = 0; }")
    for _ in range(200):
        if link.count():
            break
        values.evaluate("grid => { grid.scrollTop += grid.clientHeight / 2; }")
        page.wait_for_timeout(50)  # a frame for the grid to render the rows scrolled in
    expect(link).to_be_visible()
    row = link.bounding_box()
    cells = [values.locator("span").nth(i) for i in range(values.locator("span").count())]
    boxes = [(cell.bounding_box(), cell) for cell in cells]
    in_row = sorted(
        (
            (box["x"], cell.inner_text())
            for box, cell in boxes
            if box and abs(box["y"] - row["y"]) < row["height"]
        ),
    )
    return [text for _, text in in_row]


def test_compare_view_shows_both_trials(mlflow_ui, study, page, tmp_path):
    """The compare view of the two trials: both names, and each metric with both values as the UI rounds them."""
    experiment, _, children = study
    ids = ",".join(f'"{c.info.run_id}"' for c in children)
    with screenshot(page, "compare_trials", tmp_path):
        page.goto(f'{mlflow_ui}/#/compare-runs?runs=[{ids}]&experiments=["{experiment.experiment_id}"]')
        expect(page.get_by_text("Comparing 2 Runs from 1 Experiment")).to_be_visible()
        run_ids = page.locator("tr", has_text="Run ID:").locator(".data-value")
        expect(run_ids).to_have_text([c.info.run_id for c in children])  # columns in the URL's order
        names = page.locator("tr", has_text="Run Name:").locator(".data-value")
        expect(names).to_have_text([c.info.run_name for c in children])
        for metric in METRICS:
            expected = [mlflow_format_metric(c.data.metrics[metric]) for c in children]
            assert _compare_metric_values(page, metric) == expected, metric
        # The screenshot: the run names, the parameter that differs, the metrics.
        page.get_by_role("switch", name="Parameters - Show diff only").click()
        page.get_by_text("Run details", exact=True).evaluate("e => e.scrollIntoView({block: 'start'})")


def test_parent_run_artifacts(mlflow_ui, smoke_study, study, page, tmp_path):
    """The study's parent run: its artifacts (the study YAMLs) are listed and served, and it carries
    what the study found (each point's mean) and its shape as params."""
    experiment, parent, _ = study
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    assert any(key.startswith("best_dev_stsb mean - ") for key in parent.data.metrics), parent.data.metrics
    assert parent.data.params["study.metric"] == "best_dev_stsb"
    study_yaml = MlflowClient(smoke_study.uri).download_artifacts(
        parent.info.run_id, "study.yaml", str(tmp_path)
    )
    lines = [line.strip() for line in Path(study_yaml).read_text().splitlines()]
    line = max((line for line in lines if line[:1].isalpha()), key=len)  # a long line that is not a comment
    with screenshot(page, "parent_run_artifacts", tmp_path):
        page.goto(f"{mlflow_ui}/#/experiments/{experiment.experiment_id}/runs/{parent.info.run_id}")
        expect(page.get_by_text(f"Metrics ({len(parent.data.metrics)})", exact=True)).to_be_visible()
        page.goto(f"{mlflow_ui}/#/experiments/{experiment.experiment_id}/runs/{parent.info.run_id}/artifacts")
        expect(page.get_by_role("heading", name=parent.info.run_name, exact=True)).to_be_visible()
        for artifact in ("study.yaml", "resolved.yaml"):
            expect(page.get_by_text(artifact, exact=True).first).to_be_visible()
        page.get_by_text("study.yaml", exact=True).first.click()
        expect(page.locator("body")).to_contain_text(line)  # the file's text, served by the server
