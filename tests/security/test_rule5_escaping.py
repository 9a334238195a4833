"""Rule 5: whatever is read from the record is escaped for where it is written. A colleague writes a
point label, an error, a tag, a param or a metric name holding a spreadsheet formula, a Markdown pipe
and line break, HTML, a terminal escape (an OSC 52 clipboard write) or mathtext; the report's CSV,
Markdown, HTML, terminal text and plots, and compare's and promote's lines, carry it inert. Property
tests feed arbitrary strings through every renderer and the record's reader: nothing raises."""

from __future__ import annotations

import csv
import io
import math
import re
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mlflow.entities import Metric, Param, Run, RunData, RunInfo, RunTag
from mlflow.tracking import MlflowClient

from clsr.cli import main
from clsr.study.analyse.plots import _figure
from clsr.study.analyse.promote import best
from clsr.study.analyse.render import (
    csv_rows,
    html_table,
    markdown_table,
    render_html,
    render_markdown,
    render_text,
    text_table,
)
from clsr.study.analyse.report import report_study
from clsr.study.analyse.rows import build_report, paper_from_tags
from clsr.study.analyse.runs import Trial
from clsr.study.analyse.tables import Table
from clsr.study.plan.distinct import also_of
from clsr.study.plan.load import load_study
from clsr.tracking import escape
from clsr.tracking.record_reader import finite, prefixed_floats, tag_float, tag_int
from clsr.tracking.study_runs import close_run, open_child_run, start_parent_run
from clsr.tracking.tags import run_labels
from tests.support.stores import sqlite_uri

NAME = "sec5"
STUDY = {
    "name": NAME,
    "method": "simcse_unsup",
    "base": {"model": {"name": "minilm"}},
    "seeds": [1],
    "metric": "test_sts_avg",
    "ablations": {"temperature": {"grid": {"method.temperature": [0.05]}}},
}
OSC52 = "\x1b]52;c;ZXZpbA==\x07"
LABEL = f"=HYPERLINK(\"http://evil\")|a\nb<script>alert(1)</script>{OSC52}$x^$"
ERROR = "Traceback\nValueError: @SUM(A1)|<img src=x onerror=alert(1)>\x1b[2J\r"
NASTY = [LABEL, ERROR, OSC52, "=1+1", "+cmd", "-2+3", "@x", "\tx", "\rx", "a|b", "x\\|y", "<b>", "$", "\u202e"]
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")
FORMULA = ("=", "+", "-", "@", "\t", "\r")
# arbitrary text, the known attacks mixed in
TEXT = st.one_of(st.text(max_size=40), st.sampled_from(NASTY), st.builds("".join, st.lists(st.sampled_from(NASTY))))
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def _unescaped_pipes(line: str) -> int:
    return len(re.findall(r"\|", re.sub(r"\\.", "", line)))


def md_tables_hold(md: str) -> None:
    """Every Markdown table keeps one column count on every line (no pipe or line break of a value
    splits a cell), and no raw HTML of a value is left."""
    blocks, current = [], []
    for line in md.split("\n"):
        if line.startswith("|"):
            current.append(line)
        elif current:
            blocks, current = [*blocks, current], []
    for block in [*blocks, current] if current else blocks:
        assert len({_unescaped_pipes(line) for line in block}) == 1, block
    assert "<script" not in md and "<img src=x" not in md and not CONTROL.search(md)


def csv_cells_hold(text: str) -> None:
    for row in csv.reader(io.StringIO(text)):
        for cell in row:
            try:
                float(cell)
            except ValueError:
                assert not cell.startswith(FORMULA), cell


def child(client, uri, parent, label, value, status="finished", error=None) -> str:
    trial_id = f"temperature[{label}] seed=1"
    tags = {"clsr.ablation": "temperature", "clsr.point": label, "clsr.seed": 1, "clsr.device": LABEL}
    run_id = open_child_run(uri, parent, trial_id, "t", tags, {"method": {"temperature": LABEL}})
    # MLflow refuses most characters in a metric's name; a leading "-" it takes
    metrics = [Metric("test_sts_avg", value, int(time.time() * 1000), 1), Metric("-2-1", 1.0, 0, 1)]
    client.log_batch(run_id, metrics=metrics)
    close_run(uri, run_id, status, error)
    return run_id


@pytest.fixture(scope="module")
def record(tmp_path_factory):
    """A study's record on a real SQLite store where a colleague wrote labels, errors and names."""
    tmp = tmp_path_factory.mktemp("rule5")
    uri = sqlite_uri(tmp / "mlflow.db")
    study_file = tmp / f"{NAME}.yaml"
    study_file.write_text(yaml.safe_dump({**STUDY, "tracking_uri": uri}, sort_keys=False))
    client = MlflowClient(uri)
    parent = start_parent_run(client, NAME, str(tmp / "runs"), None)
    child(client, uri, parent, "method.temperature=0.05", 80.0)
    child(client, uri, parent, LABEL, 70.0)  # a point the study file does not have: its label is shown
    child(client, uri, parent, LABEL + "2", 60.0, "failed", ERROR)
    client.set_terminated(parent)
    study = load_study(study_file, [])
    report = build_report(study, client, parent, uri)
    return {"uri": uri, "client": client, "parent": parent, "study": study, "file": study_file, "tmp": tmp,
            "report": report}  # fmt: skip


def test_the_reports_files_and_terminal_text_carry_the_records_values_inert(record):
    report, files = report_study(record["study"], record["tmp"] / "out", record["uri"], log=False)
    by_name = {f.name: f.read_text() for f in files if f.suffix != ".png"}
    assert "HYPERLINK" in by_name["report.csv"]  # the label is there, as text
    csv_cells_hold(by_name["report.csv"])
    md_tables_hold(by_name["report.md"])
    html = by_name["report.html"]
    assert "&lt;script&gt;" in html and "<script" not in html and "<img src=x" not in html
    assert not CONTROL.search(html)
    text = render_text(report)
    assert "\\x1b]52" in text and not CONTROL.search(text)  # shown, never obeyed


def test_compare_and_promote_print_no_control_character(record, capsys):
    assert main(["study", "compare", str(record["file"]), str(record["file"]), "--run-a", record["parent"],
                 "--run-b", record["parent"]]) == 0  # fmt: skip
    assert main(["study", "promote", str(record["file"])]) == 2  # no model logged: refused
    out = capsys.readouterr()
    assert "\\x1b]52" in out.out and not CONTROL.search(out.out)
    assert not CONTROL.search(out.err)


@FAST
@given(text=TEXT)
def test_every_escape_holds_for_any_text(text):
    assert not CONTROL.search(escape.terminal(text)) and "\r" not in escape.terminal(text)
    assert not re.search("[\x00-\x1f\x7f-\x9f]", escape.visible(text))
    cell = escape.csv_cell(text)
    assert not cell.startswith(FORMULA)
    md = escape.markdown(text)
    assert "\n" not in md and "\r" not in md and _unescaped_pipes(md) == 0
    assert "<" not in md.replace("<br>", "") and not CONTROL.search(md)
    html = escape.html_text(text)
    assert "<" not in html and '"' not in html and not CONTROL.search(html)
    assert _unescaped_dollars(escape.plot_label(text)) == 0


def _unescaped_dollars(label: str) -> int:
    return len(re.findall(r"\$", re.sub(r"\\.", "", label)))


@FAST
@given(header=st.lists(TEXT, min_size=1, max_size=3, unique_by=escape.visible), cells=st.lists(st.lists(TEXT, max_size=3), max_size=3))
def test_every_table_renderer_holds_for_any_cell(header, cells):
    table = Table("t", header, [[cells[i % len(cells)] if cells else [] for i in range(len(header))]])
    md_tables_hold(markdown_table(table))
    html = html_table(table)
    assert "<script" not in html and "<img src=x" not in html and not CONTROL.search(html)
    assert not CONTROL.search(text_table(table))


@FAST
@given(label=TEXT, note=TEXT)
def test_the_whole_report_holds_for_any_label(record, label, note):
    report = record["report"]
    report.notes = [note]
    for ab in report.ablations:
        for row in ab.rows:
            row.label = label
    md_tables_hold(render_markdown(report, {}))
    html = render_html(report, {})
    assert "<script" not in html and "<img src=x" not in html and not CONTROL.search(html)
    assert not CONTROL.search(render_text(report))
    for row in csv_rows(report):
        for value in row.values():
            assert not (isinstance(value, str) and value.startswith(FORMULA)), value


@settings(max_examples=25, deadline=None)
@given(label=TEXT)
def test_any_plot_label_draws(label):
    fig, (ax,) = _figure(3.0, 2.0)
    ax.plot([0, 1], [0, 1], label=escape.plot_label(label))
    ax.set_title(escape.plot_label(label))
    ax.set_xticks([0, 1], [escape.plot_label(label), "x"])
    ax.legend()
    fig.savefig(io.BytesIO(), format="png")  # mathtext would raise on a stray $ or \frac


TAGS = st.dictionaries(st.one_of(TEXT, st.sampled_from(["clsr.seed", "clsr.paper.x", "clsr.also"])), TEXT)


@FAST
@given(tags=TAGS, params=st.dictionaries(TEXT, TEXT, max_size=4),
       metrics=st.dictionaries(TEXT, st.floats(allow_nan=True, allow_infinity=True), max_size=4))  # fmt: skip
def test_the_reader_never_raises_on_any_tag_param_or_metric(tags, params, metrics, capsys):
    tags = {**tags, "clsr.ablation": tags.get("clsr.ablation", "a")}
    info = RunInfo("r1", "0", "u", "FINISHED", 0, 1, "active", run_name="r")
    data = RunData(
        metrics=[Metric(k, v, 0, 0) for k, v in metrics.items()],
        params=[Param(k, v) for k, v in params.items()],
        tags=[RunTag(k, v) for k, v in tags.items()],
    )
    trial = Trial.from_run(Run(info, data))
    assert trial.seed is None or isinstance(trial.seed, int)
    assert all(math.isfinite(v) for v in paper_from_tags([trial]).values())
    tag_int(tags, "clsr.seed"), tag_float(tags, "clsr.paper.x"), prefixed_floats(tags, "")
    run_labels(tags), also_of(tags)
    scored = [Trial.from_run(Run(RunInfo(f"r{i}", "0", "u", "FINISHED", i, i, "active"), RunData(
        metrics=[Metric("m", v, 0, 0)], tags=[RunTag("clsr.ablation", "a")]))) for i, v in enumerate(metrics.values())]  # fmt: skip
    ranked = [t for t in scored if finite(t.metrics["m"])]
    if ranked:
        study = type("S", (), {"metric": "m", "mode": "max", "name": "s"})()
        assert best(scored, study).metrics["m"] == max(t.metrics["m"] for t in ranked)
    assert not CONTROL.search(capsys.readouterr().err.replace("\n", ""))


def test_sbatch_refuses_a_line_break_in_out_as_in_every_other_argument(tmp_path, capsys):
    smoke = Path(__file__).resolve().parents[2] / "studies" / "smoke.yaml"
    out = tmp_path / "job.sbatch\n#SBATCH --uid=0"  # echoed into the script's header
    assert main(["cluster", "sbatch", str(smoke), "--out", str(out)]) == 2
    assert not out.exists() and not list(tmp_path.iterdir())
    assert "no line breaks" in capsys.readouterr().err
