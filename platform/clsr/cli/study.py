"""``platform study ...``: run, resume, extend (``clsr.cli.study_extend``), sync, validate, report, plan, compare
and promote a study, reproduce one of its trials (``clsr.cli.study_reproduce``); write its JSON Schema and
its reference."""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

from clsr.cli.study_extend import extend_parser, refusal, request_of
from clsr.cli.study_plan import cmd_study_plan, plan_parser
from clsr.cli.study_reproduce import cmd_study_reproduce, reproduce_parser
from clsr.cli.study_stop import cmd_study_stop, stop_parser


def add_parsers(commands) -> None:
    """``platform study`` and its actions, in the order ``platform study --help`` lists them."""
    study = commands.add_parser(
        "study",
        help="run, resume, extend, sync, validate, report, plan, compare, promote a study or reproduce one of its trials",
    ).add_subparsers(dest="action", required=True)
    _run_parsers(study)
    _validate_parser(study)
    _report_parser(study)
    _compare_parser(study)
    _promote_parser(study)
    reproduce_parser(study)
    _schema_parsers(study)
    plan_parser(study)
    stop_parser(study)
    extend_parser(study)


def _run_parsers(study) -> None:
    """``study run``, ``study resume`` and ``study sync``: a study file, its overrides and its smoke run."""
    for action, text in (
        ("run", "run every trial of a study"),
        ("resume", "continue an interrupted study from its trials' checkpoints"),
        ("sync", "send what trials kept while MLflow was unreachable; close a study whose driver was killed"),
    ):
        p = study.add_parser(action, help=text)
        p.add_argument("study", help="study YAML file (studies/<name>.yaml)")
        p.add_argument(
            "--set",
            dest="overrides",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override a study value; model./data./trainer./method./eval. keys go to base",
        )
        p.add_argument("--smoke", action="store_true", help="apply the file's smoke: section (tiny, offline)")
        if action == "sync":
            continue
        p.add_argument("--yes", action="store_true", help="run a study of more than 2,000 trials")
        p.add_argument(
            "--verbose",
            action="store_true",
            help="show Ray's and Tune's own output (trial tables, worker logs) instead of writing it to "
            "<storage>/driver.log and showing a compact progress table",
        )
        if action == "run":
            p.add_argument(
                "--new",
                action="store_true",
                help="start another record of a study that already has one (else refused: report or resume it)",
            )
        if action == "resume":
            p.add_argument(
                "--allow-changes",
                action="store_true",
                help="resume an edited study: keep finished trials that did not change, run changed and "
                "added ones as a new wave, mark changed and removed ones superseded; an edited sampled "
                "ablation is searched again",
            )
            p.add_argument(
                "--or-run",
                action="store_true",
                help="start the study when MLflow has no earlier run of it (a requeued batch job that was "
                "stopped before its first record)",
            )


def _validate_parser(study) -> None:
    """``study validate``: study files or folders, checked without running."""
    validate = study.add_parser(
        "validate", help="check study files without running anything; print each one's number of trials"
    )
    validate.add_argument("studies", nargs="+", help="study files, or folders: every .yaml file in them")
    validate.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a study value, as for study run (applied to every file)",
    )
    validate.add_argument("--smoke", action="store_true", help="validate with the smoke: section applied")


def _report_parser(study) -> None:
    """``study report``: a study's tables from MLflow, by file or by name."""
    report = study.add_parser(
        "report",
        help="the study's tables from MLflow: mean ± std, 95%% CI and n over seeds beside the paper's numbers, "
        "paired t-tests against a reference row, effects (ANOVA, importance), plots; terminal, Markdown, CSV, HTML, JSON",
    )
    report.add_argument("study", nargs="?", help="study YAML file (or give --name)")
    report.add_argument(
        "--name", help="study name instead of a file: reads the study its parent run recorded"
    )
    report.add_argument("--smoke", action="store_true", help="the report of the study's --smoke run")
    report.add_argument(
        "--run", dest="run_id", help="the parent run id of another record of the study (default: the newest)"
    )
    report.add_argument("--out", default=None, help="output folder (default: reports/<study name>/)")
    report.add_argument(
        "--tracking-uri", default=None, help="MLflow (default: the study's, $MLFLOW_TRACKING_URI)"
    )
    report.add_argument(
        "--no-log", action="store_true", help="do not log the files on the study's parent run"
    )
    report.add_argument(
        "--format",
        choices=("text", "json"),
        default="text",
        help="what goes to stdout: the tables (text) or the report as JSON (json; messages go to stderr); "
        "report.json is written to the output folder either way",
    )


def _compare_parser(study) -> None:
    """``study compare`` (docs/compare-and-promote.md)."""
    compare = study.add_parser(
        "compare",
        help="pair the trials two study records share (configuration and seed): B - A of a metric per point, "
        "95%% CI, paired t-test, Holm-adjusted p",
    )
    compare.add_argument(
        "a", help="study file or name (A); the same study as B compares its two newest records"
    )
    compare.add_argument("b", help="study file or name (B)")
    compare.add_argument("--run-a", default=None, help="A's parent run id (default: the newest record)")
    compare.add_argument("--run-b", default=None, help="B's parent run id (default: the newest record)")
    compare.add_argument(
        "--tracking-uri", default=None, help="MLflow (default: the study file's, $MLFLOW_TRACKING_URI)"
    )
    compare.add_argument("--tracking-uri-b", default=None, help="B's MLflow, when not A's")
    compare.add_argument(
        "--metric", default="test_sts_avg", help="the metric compared (default test_sts_avg)"
    )
    compare.add_argument(
        "--ignore", action="append", default=[], metavar="PARAM",
        help="a parameter (or prefix, e.g. data.data_dir) that may differ between paired trials (repeatable)",
    )  # fmt: skip


def _promote_parser(study) -> None:
    """``study promote`` (docs/compare-and-promote.md)."""
    promote = study.add_parser(
        "promote",
        help="register the best finished trial's model in MLflow's Model Registry (models:/<name>/<v>)",
    )
    promote.add_argument("study", help="study file or name")
    promote.add_argument("--ablation", default=None, help="only this ablation's trials")
    promote.add_argument(
        "--point", default=None, help="only this point's trials (its label, as the report shows it)"
    )
    promote.add_argument("--name", default=None, help="registered model name (default: the study's name)")
    promote.add_argument(
        "--run", dest="run_id", default=None, help="the study's parent run id (default: the newest)"
    )
    promote.add_argument(
        "--tracking-uri", default=None, help="MLflow (default: the study file's, $MLFLOW_TRACKING_URI)"
    )


def _schema_parsers(study) -> None:
    """``study schema`` and ``study reference``: the generated docs of a study file."""
    schema = study.add_parser(
        "schema",
        help="write the JSON Schema of a study file (for editors: # yaml-language-server: $schema=...)",
    )
    schema.add_argument("--out", default=None, help="file to write (default: print it)")
    reference = study.add_parser(
        "reference", help="write the study-file reference (Markdown, every key with its default)"
    )
    reference.add_argument("--out", default=None, help="file to write (default: print it)")


def _load(path: str, overrides: list[str], smoke: bool = False):
    return _load_documents(path, overrides, smoke).study


def _load_documents(path: str, overrides: list[str], smoke: bool = False):
    """The study with the trials validation resolved (``StudyDocuments``), for a command that goes on."""
    from clsr.study.plan.load import load_documents
    from clsr.study.spec.dotted import parse_override

    return load_documents(path, [parse_override(o) for o in overrides], smoke=smoke)


def _validate_summary(valid: int, needs_hub: list[str], failed: int) -> str:
    """One line after validating several files: how many are fine, which only need the hub, how many fail."""
    parts = [f"{valid} valid"]
    if needs_hub:
        names = ", ".join(Path(p).name for p in needs_hub)
        parts.append(
            f"{len(needs_hub)} need hub models or sets that are not in your cache: {names} — run once with "
            f"the hub reachable, or add --set skip_unavailable=true"
        )
    if failed:
        parts.append(f"{failed} invalid (above)")
    return "; ".join(parts)


def cmd_study(args: argparse.Namespace) -> int:
    """``platform study <action>``: the action's command (run, resume and extend share one)."""
    actions = {
        "validate": cmd_study_validate,
        "compare": _cmd_compare_or_promote,
        "promote": _cmd_compare_or_promote,
        "report": cmd_study_report,
        "schema": cmd_study_schema,
        "reference": cmd_study_schema,
        "sync": cmd_study_sync,
        "plan": cmd_study_plan,
        "stop": cmd_study_stop,
        "reproduce": cmd_study_reproduce,
    }
    return actions.get(args.action, cmd_study_run)(args)


def cmd_study_validate(args: argparse.Namespace) -> int:
    """``platform study validate``: 0 when every file is valid, 1 when one is not or needs the hub, 2 for a
    bad override."""
    from clsr.study.plan.load import load_documents
    from clsr.study.plan.resolve import seed_notes
    from clsr.study.plan.sources import NeedsHub, require_sources
    from clsr.study.run.resources import no_gpu_note
    from clsr.study.spec.dotted import parse_override

    try:
        overrides = [parse_override(o) for o in args.overrides]
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    failed, needs_hub, paths = 0, [], _expand_folders(args.studies)
    for path in paths:
        try:
            # the trials validation resolved: the checks and counts share them
            documents = load_documents(path, overrides, smoke=args.smoke)
            study = documents.study
            # every model.name and data.train is here
            sources = require_sources(study, path, documents.grids, documents.config)
        except NeedsHub as err:  # right as written; the hub is out of reach here
            needs_hub.append(path)
            print(err, file=sys.stderr)
            continue
        except ValueError as err:  # a StudyError, or an override that does not fit the file
            failed += 1
            print(err, file=sys.stderr)
            continue
        trials, distinct = documents.counts()
        print(f"ok  {path}: {trials} trial{'s' if trials != 1 else ''} ({distinct} distinct)")
        for line in sources.lines("unavailable"):  # skip_unavailable: true
            print(f"    skipped when run here: {line.splitlines()[0]}")
        for line in sources.lines("notes"):
            print(f"    note: {line}")
        for line in seed_notes(study):
            print(f"    note: {line}")
        if gpu_note := no_gpu_note(study):
            print(f"    warning: {gpu_note}")
    if len(paths) > 1:
        print(_validate_summary(len(paths) - failed - len(needs_hub), needs_hub, failed))
    return 1 if failed or needs_hub else 0


def cmd_study_schema(args: argparse.Namespace) -> int:
    """``platform study schema`` / ``study reference``: the generated text, printed or written."""
    from clsr.study.spec.json_schema import schema_text
    from clsr.study.spec.reference import reference_markdown

    text = schema_text() if args.action == "schema" else reference_markdown()
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")
    else:
        print(text, end="")
    return 0


def cmd_study_run(args: argparse.Namespace) -> int:
    """``platform study run`` / ``study resume``: this process supervises; its driver child loads the study,
    runs it and tells how it ended."""
    from clsr.study.control.driver_link import DriverLink
    from clsr.study.run.supervise import supervise

    link = DriverLink.from_environment()  # read once, here, and out of os.environ for Ray's processes
    if (problem := refusal(args)) is not None:  # study extend's count: before the driver starts
        print(problem, file=sys.stderr)
        return 2
    if not link.is_child:  # the driver runs as a child: whatever ends it, the record gets closed
        return supervise(args.argv)  # the child validates: this process stays light (no torch)
    from clsr.study.spec.schema import StudyError  # imports the methods, hence torch

    try:
        documents = _load_documents(args.study, args.overrides, smoke=args.smoke)  # the plan's cache
        study = documents.study
        problem = refusal(args, study)  # study extend: its ablation and record
    except (StudyError, ValueError) as err:
        print(err, file=sys.stderr)
        return 2
    if problem is not None:
        print(problem, file=sys.stderr)
        return 2
    from clsr.study.plan.resolve import planned_trials
    from clsr.study.spec.schema import CONFIRM_TRIALS

    if (trials := planned_trials(study)) > CONFIRM_TRIALS and not args.yes:
        print(
            f"error: {args.study}: {trials:,} trials, more than {CONFIRM_TRIALS:,}; pass --yes to run them",
            file=sys.stderr,
        )
        return 2
    return _run_study(args, study, link, documents)


def _run_study(args: argparse.Namespace, study, link, documents=None) -> int:
    """The driver: the study run (or resumed) and its trials' table printed."""
    from clsr.study.control.console import Console
    from clsr.study.record.parent import NoEarlierRun
    from clsr.study.record.summary import format_rows
    from clsr.study.run.runner import run_study
    from clsr.study.spec.schema import StudyError
    from clsr.tracking.escape import terminal

    console = Console(link)  # this command's terminal: one quiet switch for both runs of --or-run

    started = time.perf_counter()
    resume = args.action in ("resume", "extend")  # an extension resumes the finished record
    study_text = Path(args.study).read_text(errors="replace")
    again = shlex.join(
        ["platform", "study", "resume", args.study, *(f for o in args.overrides for f in ("--set", o))]
        + ["--smoke"] * args.smoke
        + ["--yes"] * args.yes
    )
    link.tell(resume_with=again)  # the supervisor says it if this driver ends before it can
    try:
        outcome = run_study(
            study,
            study_text,
            resume=resume,
            allow_changes=resume and args.allow_changes,
            new=not resume and args.new,
            verbose=args.verbose,
            console=console,
            documents=documents,
            extend=request_of(args),
        )
    except NoEarlierRun:
        if not (resume and args.or_run):
            raise
        print(f"no earlier run of study {study.name!r} to resume: starting it (--or-run)")
        outcome = run_study(study, study_text, verbose=args.verbose, console=console, documents=documents)
    except StudyError as err:  # refused before anything was recorded (sources here, resources): no resume
        print(err, file=sys.stderr)
        return 1
    rows = outcome.rows
    print(f"\nstudy {study.name!r}: {len(rows)} trial(s) in {time.perf_counter() - started:.0f} s\n")
    print(terminal(format_rows(rows)))  # labels and errors from the record: shown, not obeyed
    return _ending(args, outcome, again, link)


def _ending(args: argparse.Namespace, outcome, again: str, link) -> int:
    """The run's exit code, with the way on told when it stopped early or kept trials' writes back."""
    from clsr.study.run.supervise import how_to_continue

    if outcome.pending_records:
        print(
            f"\nthe MLflow server stayed unreachable: {outcome.pending_records} trial run(s) keep their "
            f"writes in the study's storage; `platform study sync {args.study}` sends them",
            file=sys.stderr,
        )
        link.tell(told=True)  # the way on is the sync, not a resume
        return outcome.exit_code or 1
    if outcome.stopped_by == "lease_lost":
        print(
            "\nstopped: another driver took this study over while this one was paused or cut off; "
            "it holds the record now, and this driver wrote nothing more to it",
            file=sys.stderr,
        )
        return outcome.exit_code
    if outcome.stopped_by:
        print(how_to_continue(outcome.stopped_by, again), file=sys.stderr)
        link.tell(told=True)
        return outcome.exit_code
    return 1 if any(r["status"] not in ("finished", "stopped") for r in outcome.rows) else 0


def cmd_study_sync(args: argparse.Namespace) -> int:
    """``platform study sync``: what trials kept while MLflow was down, sent; a killed driver's study closed."""
    from clsr.study.record.parent import sync_study
    from clsr.study.spec.schema import StudyError

    try:
        study = _load(args.study, args.overrides, smoke=args.smoke)
    except (StudyError, ValueError) as err:
        print(err, file=sys.stderr)
        return 2
    left = sync_study(study)
    if left:
        print(f"error: {left} trial run(s) could not be sent; is the MLflow server up?", file=sys.stderr)
        return 1
    print(f"study {study.name!r}: MLflow holds every trial's record")
    return 0


def _cmd_compare_or_promote(args: argparse.Namespace) -> int:
    """``study compare`` / ``study promote``: 0 when done, 2 for a bad file, no runs, or a refusal."""
    import tempfile

    from clsr.study.analyse.frame import study_name_and_uri
    from clsr.study.analyse.report import study_by_name
    from clsr.study.analyse.runs import NoStudyRuns
    from clsr.study.spec.schema import StudyError
    from clsr.tracking.study_runs import resolve_tracking_uri

    try:
        if args.action == "compare":
            from clsr.study.analyse.compare import compare_records, render

            found = compare_records(
                args.a, args.b, args.tracking_uri, args.tracking_uri_b, args.run_a, args.run_b,
                args.metric, tuple(args.ignore),
            )  # fmt: skip
            print(render(*found))
            return 0
        from clsr.study.analyse.promote import promote

        name, file_uri = study_name_and_uri(args.study)
        uri = resolve_tracking_uri(args.tracking_uri or file_uri)
        if Path(args.study).is_file():
            study = _load(args.study, [])
        else:
            with tempfile.TemporaryDirectory() as tmp:
                study = study_by_name(name, uri, Path(tmp), args.run_id)
        print(promote(study, uri, args.ablation, args.point, args.name, args.run_id).line())
        return 0
    except (StudyError, NoStudyRuns) as err:
        print(f"error: {err}" if isinstance(err, NoStudyRuns) else err, file=sys.stderr)
        return 2


def cmd_study_report(args: argparse.Namespace) -> int:
    """``platform study report``: 0 when the report was written, 2 for a bad file or no runs found."""
    import tempfile

    from mlflow.tracking import MlflowClient

    from clsr.study.analyse.render import render_json, render_text
    from clsr.study.analyse.report import report_study, study_by_name
    from clsr.study.analyse.runs import NoStudyRuns, record_lines
    from clsr.study.spec.schema import StudyError
    from clsr.tracking.study_runs import resolve_tracking_uri

    if (args.study is None) == (args.name is None):
        print("error: give a study file or --name, not both", file=sys.stderr)
        return 2
    uri = args.tracking_uri
    try:
        if args.study is not None:
            study = _load(args.study, [], smoke=args.smoke)
        else:  # the store the run was found in, not the tracking_uri its study recorded
            uri = resolve_tracking_uri(uri)
            with tempfile.TemporaryDirectory() as tmp:
                name = f"{args.name}-smoke" if args.smoke else args.name
                study = study_by_name(name, uri, Path(tmp), args.run_id)
        out = Path(args.out) if args.out else None
        report, files = report_study(study, out, uri, log=not args.no_log, run_id=args.run_id)
    except (StudyError, NoStudyRuns) as err:
        print(f"error: {err}" if isinstance(err, NoStudyRuns) else err, file=sys.stderr)
        return 2
    as_json = args.format == "json"
    print(render_json(report) if as_json else render_text(report), end="" if as_json else "\n")
    say = sys.stderr if as_json else sys.stdout  # JSON on stdout stays parseable
    where = "" if args.no_log else f"; logged on run {report.parent_run_id} under report/"
    print(f"\nwrote {len(files)} file(s) to {files[0].parent}{where}", file=say)
    client = MlflowClient(resolve_tracking_uri(uri or study.tracking_uri))  # the report's own store
    if len(records := record_lines(client, study.name)) > 1:
        print(f"\nrecords of study {study.name!r}, newest first (--run <id> reports another):", file=say)
        print(
            "\n".join(
                f"  {line}{'  <- this report' if line.startswith(report.parent_run_id) else ''}"
                for line in records
            ),
            file=say,
        )
    return 0


def _expand_folders(paths: list[str]) -> list[str]:
    """Each folder replaced by its study files (an empty one stays, so load_study says so)."""
    from clsr.study.plan.load import study_files_in

    expanded = []
    for path in paths:
        files = study_files_in(Path(path)) if Path(path).is_dir() else []
        expanded += [str(f) for f in files] or [path]
    return expanded
