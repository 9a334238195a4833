"""Study reports: the papers' tables rebuilt from a study's MLflow runs. ``platform study report
<study.yaml>`` (``report_study``) reads the child runs of the study's latest parent run
(``clsr.study.analyse.runs``) and, per ablation, puts each point's mean over seeds (std, Student-t 95 %
CI, n) beside the number the paper published with a reproduction verdict (``clsr.study.stats.verdict``),
tests every point against a reference point with a paired t-test over the seeds both ran, Holm-adjusted
over the ablation's rows (``clsr.study.stats.seeds``), shows every planned trial that did not finish
instead of averaging it away, marks rows that are one run in several ablations (``same as
<ablation>[<row>]``) and rows that only scored their starting model (evaluation only), and says which
ablated keys matter (``clsr.study.stats.effects``); the rows are built in ``clsr.study.analyse.rows``,
set as tables in ``clsr.study.analyse.tables``. This module writes the whole report: the Markdown,
CSV, JSON and self-contained HTML files (``clsr.study.analyse.render``) with the plots
(``clsr.study.analyse.plots``), also logged on the parent run under ``report/`` so the report travels
with the runs it was built from.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from mlflow.tracking import MlflowClient

from clsr.study.analyse.plots import KeptHistories, plot_curves, plot_main_metric, plot_pareto
from clsr.study.analyse.render import CSV_FIELDS, csv_rows, render_html, render_json, render_markdown
from clsr.study.analyse.rows import StudyReport, build_report
from clsr.study.analyse.runs import open_study_runs, study_from_run
from clsr.study.spec.schema import Study
from clsr.tracking.study_runs import resolve_tracking_uri


def write_report(
    report: StudyReport, client: MlflowClient, out: Path, kept: KeptHistories | None = None
) -> list[Path]:
    """report.md, report.csv, report.html, report.json and the PNGs under ``out``; returns the files
    written. ``kept``: the finished trials' metric histories, kept across a live report's refreshes."""
    out.mkdir(parents=True, exist_ok=True)
    images: dict[str, list[Path]] = {}
    for ab in report.ablations:
        made = [
            plot_main_metric(ab, out / f"{ab.name}_main.png"),
            plot_curves(ab, report.study, client, out / f"{ab.name}_curves.png", kept),
            plot_pareto(ab, out / f"{ab.name}_pareto.png"),
        ]
        images[ab.name] = [p for p in made if p is not None]
    md, html_path, csv_path = out / "report.md", out / "report.html", out / "report.csv"
    json_path = out / "report.json"
    md.write_text(render_markdown(report, images))
    html_path.write_text(render_html(report, images))
    pd.DataFrame(csv_rows(report), columns=list(CSV_FIELDS)).to_csv(csv_path, index=False)
    json_path.write_text(render_json(report))
    return [md, csv_path, html_path, json_path, *(p for paths in images.values() for p in paths)]


def log_report(client: MlflowClient, parent_run_id: str, files: list[Path]) -> None:
    """The files as artifacts of the parent run under ``report/``, next to study.yaml and resolved.yaml."""
    for path in files:
        client.log_artifact(parent_run_id, str(path), "report")


def report_study(
    study: Study,
    out: Path | None = None,
    tracking_uri: str | None = None,
    log: bool = True,
    run_id: str | None = None,
) -> tuple[StudyReport, list[Path]]:
    """Build, write and (unless ``log`` is False) log the report of a study's latest parent run (or of
    its parent run ``run_id``)."""
    uri = resolve_tracking_uri(tracking_uri or study.tracking_uri)
    client, parent = open_study_runs(study.name, uri, run_id)
    report = build_report(study, client, parent.info.run_id, uri)
    files = write_report(report, client, out or Path("reports") / study.name)
    if log:
        log_report(client, parent.info.run_id, files)
    return report, files


def study_by_name(name: str, tracking_uri: str | None, dst: Path, run_id: str | None = None) -> Study:
    """The study a parent run recorded, for a report by study name (no study file)."""
    uri = resolve_tracking_uri(tracking_uri)
    client, parent = open_study_runs(name, uri, run_id)
    return study_from_run(client, parent.info.run_id, dst)
