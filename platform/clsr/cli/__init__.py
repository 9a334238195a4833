"""The ``platform`` command: run and resume studies, validate study files, evaluate encoders."""

from __future__ import annotations

import argparse
import contextlib
import shlex
import sys
import time
from pathlib import Path
from typing import NoReturn

from clsr.cluster.cli import add_cluster_parser, cmd_cluster
from clsr.tracking.secrets import mask_uri

GPU_KINDS = (
    "a100",
    "h100",
    "h200",
)  # clsr.study.plan.projection.GPUS (not imported here: the CLI starts fast)

EXAMPLES = """examples:
  platform study run studies/smoke.yaml
  platform study run studies/simcse_ablations.yaml --set trainer.max_steps=500 --set concurrency=4
  platform study run studies/gclsr_ablations.yaml --smoke
  platform study resume studies/smoke.yaml
  platform study resume studies/smoke.yaml --allow-changes
  platform study sync studies/smoke.yaml
  platform study validate studies/
  platform study schema --out studies/schema.json
  platform study report studies/smoke.yaml
  platform study report --name supmpn_ablations --out reports/supmpn
  platform study plan studies/gclsr_ablations.yaml --from gclsr_ablations-smoke --gpus 1 --gpu h100
  platform study plan studies/gclsr_ablations.yaml --probe --gpus 1 --gpu h100
  platform eval --model minilm --pooling mean --tasks sts
  platform eval --model minilm --tasks sts,transfer
  platform eval --model minilm --tasks mr,trec --transfer-mode fast --max-examples 1000
  platform eval --model minilm --pooling mean --tasks faq
  platform eval --model runs:/<run_id>/model --tasks sts
  platform bench train --method simcse_sup --batch 64 --length 32 --steps 50
  platform bench memory --batches 64,256,512 --chunk 16
  platform bench sts-eval --model minilm --tasks sts
  platform bench study --study studies/smoke.yaml       # bench: from a source checkout (benchmarks/)
  platform cluster up --workers 2     # a loopback cluster: Ray nodes, PostgreSQL, S3, MLflow
"""


DESCRIPTION = "clsr: run, resume and report contrastive sentence-representation studies; evaluate encoders."


def _parser() -> argparse.ArgumentParser:
    import clsr

    parser = argparse.ArgumentParser(
        prog="platform",
        description=DESCRIPTION,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"platform (clsr) {clsr.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    study = commands.add_parser(
        "study", help="run, resume, sync, validate, report, plan, compare or promote a study"
    ).add_subparsers(dest="action", required=True)
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

    _compare_and_promote_parsers(study)
    schema = study.add_parser(
        "schema",
        help="write the JSON Schema of a study file (for editors: # yaml-language-server: $schema=...)",
    )
    schema.add_argument("--out", default=None, help="file to write (default: print it)")
    reference = study.add_parser(
        "reference", help="write the study-file reference (Markdown, every key with its default)"
    )
    reference.add_argument("--out", default=None, help="file to write (default: print it)")

    plan = study.add_parser(
        "plan",
        help="project the study's wall time, GPU-hours and cost on N GPUs from the per-phase costs of "
        "trials that ran (its own, or another study's: --from)",
    )
    plan.add_argument("study", help="study YAML file")
    plan.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    plan.add_argument("--smoke", action="store_true", help="plan the file's smoke: run")
    plan.add_argument(
        "--from", dest="measured", default=None, metavar="STUDY",
        help="the recorded study whose trials give the per-phase costs (default: this study's name)",
    )  # fmt: skip
    plan.add_argument(
        "--probe", action="store_true",
        help="measure the costs here instead: run short copies of one trial at once, as many as share a GPU "
        "(no Ray, no MLflow)",
    )  # fmt: skip
    plan.add_argument(
        "--probe-ablation", action="append", default=None, metavar="ABLATION",
        help="an ablation whose first point is probed (repeatable; the first prices the ablations not "
        "probed; default: the study's first)",
    )  # fmt: skip
    plan.add_argument(
        "--probe-copies", type=int, default=None, help="copies run at once (default: 1 / gpus_per_worker)"
    )
    plan.add_argument(
        "--probe-steps", type=int, default=None, help="steps per copy (default: two evaluation intervals)"
    )
    plan.add_argument("--gpus", type=int, default=1, help="GPUs the study gets (default 1)")
    plan.add_argument("--gpu", choices=sorted(GPU_KINDS), default="h100", help="GPU kind (default h100)")
    plan.add_argument(
        "--gpu-speedup", type=float, default=None,
        help="how many times faster the GPU runs steps and evaluations than the measured device "
        "(default: an assumption per GPU kind, printed; 1 when measured on that GPU)",
    )  # fmt: skip
    plan.add_argument("--price", type=float, default=None, help="USD per GPU-hour (default: printed)")
    plan.add_argument(
        "--tracking-uri", default=None, help="MLflow (default: the study's, $MLFLOW_TRACKING_URI)"
    )

    ev = commands.add_parser(
        "eval",
        help="evaluate an encoder on STS (SentEval 'all' setting), the SentEval transfer tasks and/or FAQ retrieval",
    )
    ev.add_argument(
        "--model",
        required=True,
        help="a trial's model: runs:/<run_id>/model, models:/..., a run id or an exported folder; "
        "or a hub id, local folder, or 'minilm'",
    )
    ev.add_argument(
        "--pooling",
        default=None,
        help="cls, cls_before_pooler, avg/mean, avg_first_last, ... (default: an exported model's own, else mean)",
    )
    ev.add_argument(
        "--tasks",
        default=None,
        help="comma-separated groups or tasks: sts, transfer, faq, sts12,...,sickr, mr,cr,subj,mpqa,sst2,trec,mrpc, "
        "stackfaq,faqir,cough ('faq' skips FAQ sets whose files are missing), or --custom names "
        "(default: sts, or every --custom task)",
    )
    ev.add_argument(
        "--custom",
        default=None,
        metavar="FILE",
        help="a YAML file of your own evaluation sets, {name: {type: sts|retrieval|classification, path: ..., "
        "...}} as a study's eval.custom (docs/evaluation.md)",
    )
    ev.add_argument(
        "--split", default="test", choices=["test", "dev"], help="STS split (transfer: own protocol)"
    )
    ev.add_argument(
        "--transfer-mode",
        default="test",
        choices=["test", "fast"],
        help="transfer tasks: test = SentEval's 10-fold protocol; fast = SimCSE's fasttest (5 folds)",
    )
    ev.add_argument(
        "--transfer-classifier",
        default="senteval_pytorch",
        choices=["senteval_pytorch", "liblinear", "lbfgs"],
        help="transfer tasks: SentEval's PyTorch logistic regression (SimCSE's setting), liblinear, or L-BFGS",
    )
    ev.add_argument(
        "--max-examples", type=int, default=None, help="transfer tasks: stratified subsample of each split"
    )
    ev.add_argument(
        "--max-queries", type=int, default=None, help="FAQ retrieval: seeded subsample of the queries"
    )
    ev.add_argument("--batch-size", type=int, default=128)
    ev.add_argument(
        "--device",
        default="auto",
        help="auto (the GPU when one is visible, else the CPU), cpu, cuda or cuda:N",
    )
    ev.add_argument(
        "--precision",
        default="auto",
        choices=["auto", "fp32", "bf16", "fp16"],
        help="autocast of the forward pass: auto = bf16 on a GPU that has it, else fp32 (a trial's own "
        "evaluation uses its trainer.precision)",
    )
    ev.add_argument(
        "--data-dir", default=None, help="local data folder (default: $CLSR_DATA_DIR, else the hub)"
    )
    ev.add_argument("--mlflow", action="store_true", help="also log the scores as an MLflow run")
    ev.add_argument("--experiment", default="eval", help="MLflow experiment for --mlflow")

    data = commands.add_parser("data", help="inspect training data").add_subparsers(
        dest="action", required=True
    )
    nli_stats = data.add_parser(
        "nli-stats", help="SupMPN Table 1 premise grouping statistics of the NLI pairs"
    )
    nli_stats.add_argument(
        "--data-dir", default=None, help="local data folder (default: $CLSR_DATA_DIR, else the hub)"
    )

    commands.add_parser("env", help="print versions for bug reports")
    # listed here; main() hands `platform bench ...` to the checkout's clsr_bench.cli, which parses the rest
    commands.add_parser(
        "bench",
        help="benchmarks that print figures: training throughput, memory, STS eval, a study (from a source "
        "checkout: benchmarks/clsr_bench)",
        add_help=False,
    )
    add_cluster_parser(commands)
    return parser


def _load(path: str, overrides: list[str], smoke: bool = False):
    from clsr.study.plan.load import load_study
    from clsr.study.spec.dotted import parse_override

    return load_study(path, [parse_override(o) for o in overrides], smoke=smoke)


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


def _transfer_progress(total: int):
    """One line per finished transfer task: a 7-task evaluation takes minutes on a CPU."""
    done = [0]

    def say(score) -> None:
        done[0] += 1
        print(
            f"  [{done[0]}/{total}] {score.task}: {score.acc:.2f} (embedding {score.embed_seconds:.0f} s, "
            f"{score.fits} classifier fits {score.classify_seconds:.0f} s)",
            flush=True,
        )

    return say


def cmd_study(args: argparse.Namespace) -> int:
    if args.action == "validate":
        from clsr.study.plan.load import load_study
        from clsr.study.plan.resolve import StudyDocuments, seed_notes
        from clsr.study.plan.sources import NeedsHub, require_sources
        from clsr.study.spec.dotted import parse_override

        try:
            overrides = [parse_override(o) for o in args.overrides]
        except ValueError as err:
            print(f"error: {err}", file=sys.stderr)
            return 2
        failed, needs_hub, paths = 0, [], _expand_folders(args.studies)
        for path in paths:
            try:
                study = load_study(path, overrides, smoke=args.smoke)
                # the trials validation resolved: the checks and counts share them
                documents = StudyDocuments.of(study)
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
        if len(paths) > 1:
            print(_validate_summary(len(paths) - failed - len(needs_hub), needs_hub, failed))
        return 1 if failed or needs_hub else 0
    if args.action in ("compare", "promote"):
        return _cmd_compare_or_promote(args)
    if args.action == "report":
        return cmd_study_report(args)
    if args.action in ("schema", "reference"):
        from clsr.study.spec.json_schema import schema_text
        from clsr.study.spec.reference import reference_markdown

        text = schema_text() if args.action == "schema" else reference_markdown()
        if args.out:
            Path(args.out).write_text(text)
            print(f"wrote {args.out}")
        else:
            print(text, end="")
        return 0
    if args.action == "sync":
        return cmd_study_sync(args)
    if args.action == "plan":
        return cmd_study_plan(args)
    from clsr.study.control.driver_link import is_child
    from clsr.study.run.supervise import supervise

    if not is_child():  # the driver runs as a child: whatever ends it, the record gets closed
        return supervise(args.argv)  # the child validates: this process stays light (no torch)
    from clsr.study.spec.schema import StudyError  # imports the methods, hence torch

    try:
        study = _load(args.study, args.overrides, smoke=args.smoke)
    except (StudyError, ValueError) as err:
        print(err, file=sys.stderr)
        return 2
    from clsr.study.plan.resolve import planned_trials
    from clsr.study.spec.schema import CONFIRM_TRIALS

    if (trials := planned_trials(study)) > CONFIRM_TRIALS and not args.yes:
        print(
            f"error: {args.study}: {trials:,} trials, more than {CONFIRM_TRIALS:,}; pass --yes to run them",
            file=sys.stderr,
        )
        return 2
    from clsr.study.control.driver_link import tell
    from clsr.study.record.parent import NoEarlierRun, format_rows
    from clsr.study.run.runner import run_study
    from clsr.study.run.supervise import how_to_continue

    started = time.perf_counter()
    resume = args.action == "resume"
    study_text = Path(args.study).read_text(errors="replace")
    again = shlex.join(
        ["platform", "study", "resume", args.study, *(f for o in args.overrides for f in ("--set", o))]
        + ["--smoke"] * args.smoke
        + ["--yes"] * args.yes
    )
    tell(resume_with=again)  # the supervisor says it if this driver ends before it can
    try:
        outcome = run_study(
            study,
            study_text,
            resume=resume,
            allow_changes=resume and args.allow_changes,
            new=not resume and args.new,
            verbose=args.verbose,
        )
    except NoEarlierRun:
        if not (resume and args.or_run):
            raise
        print(f"no earlier run of study {study.name!r} to resume: starting it (--or-run)")
        outcome = run_study(study, study_text, verbose=args.verbose)
    rows = outcome.rows
    print(f"\nstudy {study.name!r}: {len(rows)} trial(s) in {time.perf_counter() - started:.0f} s\n")
    print(format_rows(rows))
    if outcome.pending_records:
        print(
            f"\nthe MLflow server stayed unreachable: {outcome.pending_records} trial run(s) keep their "
            f"writes in the study's storage; `platform study sync {args.study}` sends them",
            file=sys.stderr,
        )
        tell(told=True)  # the way on is the sync, not a resume
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
        tell(told=True)
        return outcome.exit_code
    return 1 if any(r["status"] not in ("finished", "stopped") for r in rows) else 0


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


def cmd_study_plan(args: argparse.Namespace) -> int:
    """``platform study plan``: 0 with the projection printed, 2 for a bad file or nothing measured."""
    from clsr.study.plan.projection import NoMeasurements, project, render
    from clsr.study.spec.schema import StudyError

    if args.probe and args.measured:
        print(
            "error: --probe measures here; --from reads a recorded study: give one of them", file=sys.stderr
        )
        return 2
    from clsr.study.plan.resolve import StudyDocuments

    try:
        study = _load(args.study, args.overrides, smoke=args.smoke)
        documents = StudyDocuments.of(study)  # the trials validation resolved: probe, prices, checkpoints
        measured = _probed(args, study, documents) if args.probe else _recorded(args, study)
        projection = project(
            study, measured, args.gpus, args.gpu, args.gpu_speedup, args.price,
            grids=documents.grids, resolve=documents.config,
        )  # fmt: skip
    except (StudyError, NoMeasurements, ValueError) as err:
        print(err if isinstance(err, StudyError) else f"error: {err}", file=sys.stderr)
        return 2
    print(render(projection, args.gpu, args.gpus))
    from clsr.study.plan.resolve import checkpoint_lines

    print("\n".join(checkpoint_lines(study, documents.grids, documents.config)))
    return 0


def _probed(args: argparse.Namespace, study, documents):
    """Unit costs measured here by short probe trials (no Ray, no MLflow: a lone GPU box can run it),
    of the trials ``documents`` (the study's ``StudyDocuments``) resolved."""
    from clsr.study.plan.probe import probe

    return probe(
        study, args.probe_copies, args.probe_ablation, args.probe_steps,
        grids=documents.grids, resolve=documents.config,
    )  # fmt: skip


def _recorded(args: argparse.Namespace, study):
    """Unit costs of a recorded study's finished trials, read from MLflow."""
    from clsr.study.analyse.report import NoStudyRuns, open_study_runs
    from clsr.study.plan.projection import NoMeasurements, measure
    from clsr.tracking.study_runs import children, resolve_tracking_uri

    measured_name = args.measured or study.name
    uri = resolve_tracking_uri(args.tracking_uri or study.tracking_uri)
    try:
        client, parent = open_study_runs(measured_name, uri)
    except NoStudyRuns as err:
        raise NoMeasurements(str(err)) from err
    return measure(children(client, parent.info.run_id), measured_name)


def _compare_and_promote_parsers(study) -> None:
    """``study compare`` and ``study promote`` (docs/compare-and-promote.md)."""
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


def _cmd_compare_or_promote(args: argparse.Namespace) -> int:
    """``study compare`` / ``study promote``: 0 when done, 2 for a bad file, no runs, or a refusal."""
    import tempfile

    from clsr.study.analyse.frame import study_name_and_uri
    from clsr.study.analyse.report import NoStudyRuns, study_by_name
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

    from clsr.study.analyse.report import (
        NoStudyRuns,
        record_lines,
        render_json,
        render_text,
        report_study,
        study_by_name,
    )
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


def cmd_eval(args: argparse.Namespace) -> int:
    from clsr.encoders.export import load_model, make_embedder, pooling_of
    from clsr.encoders.precision import resolve_device, resolved_precision
    from clsr.eval.sts import evaluate_sts, format_table, summary_metrics
    from clsr.eval.transfer import (
        evaluate_transfer,
        expand_transfer_tasks,
        format_transfer_table,
        split_eval_tasks,
        transfer_summary_metrics,
    )

    try:
        custom = _custom_tasks(args.custom)
    except ValueError as err:
        print(f"error: --custom {args.custom}: {err}", file=sys.stderr)
        return 2
    args.tasks = args.tasks if args.tasks is not None else (",".join(custom) or "sts")
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    custom = {t: custom[t] for t in names if t in custom}
    try:
        sts_tasks, transfer_tasks, faq_tasks = split_eval_tasks([t for t in names if t not in custom])
    except ValueError as err:
        print(f"error: --tasks: {err}", file=sys.stderr)
        return 2
    for flag, value in (("--max-examples", args.max_examples), ("--max-queries", args.max_queries)):
        if value is not None and value < 1:
            print(f"error: {flag} must be at least 1", file=sys.stderr)
            return 2
    try:
        device = resolve_device(args.device)
    except (ValueError, RuntimeError) as err:  # RuntimeError: torch's own words for a malformed device
        print(f"error: --device: {err}", file=sys.stderr)
        return 2
    started = time.perf_counter()
    encoder, pipeline = load_model(args.model, pooling=args.pooling)
    args.pooling = pooling_of(encoder)  # an exported model's own pooling when --pooling is left out
    pooled = args.pooling if args.pooling.startswith("sentence-transformers") else f"{args.pooling} pooling"
    encoder.to(device)
    embed = make_embedder(encoder, pipeline, batch_size=args.batch_size, precision=args.precision)
    metrics: dict[str, float] = {}
    tables: dict[str, str] = {}
    if sts_tasks:
        scores = evaluate_sts(embed, sts_tasks, args.split, args.data_dir)
        elapsed = time.perf_counter() - started
        tables["sts_table.txt"] = format_table(scores)
        metrics |= summary_metrics(scores, prefix=f"{args.split}_")  # dev scores are not test scores
        print(f"\n{args.model} ({pooled}), Spearman × 100, {args.split} split, 'all' setting\n")
        print(tables["sts_table.txt"])
        print(f"\n{sum(s.pairs for s in scores.values())} pairs in {elapsed:.1f} s")
    if transfer_tasks:
        started = time.perf_counter()
        transfer = evaluate_transfer(
            embed,
            transfer_tasks,
            args.data_dir,
            mode=args.transfer_mode,
            max_examples=args.max_examples,
            classifier=args.transfer_classifier,
            on_task=_transfer_progress(len(expand_transfer_tasks(transfer_tasks))),
        )
        elapsed = time.perf_counter() - started
        tables["transfer_table.txt"] = format_transfer_table(transfer)
        metrics |= transfer_summary_metrics(transfer)
        capped = f", at most {args.max_examples} rows per split" if args.max_examples else ""
        print(
            f"\n{args.model} ({pooled}), SentEval transfer accuracy × 100, "
            f"{args.transfer_mode} mode{capped}\n"
        )
        print(tables["transfer_table.txt"])
        f1 = f"MRPC F1 {transfer['mrpc'].f1:.2f}; " if "mrpc" in transfer else ""
        embedding = sum(s.embed_seconds for s in transfer.values())
        print(f"\n{f1}{len(transfer)} task(s) in {elapsed:.1f} s ({embedding:.1f} s embedding)")
    if faq_tasks:
        from clsr.eval.faq import evaluate_faq, faq_summary_metrics, format_faq_table

        started = time.perf_counter()
        faq = evaluate_faq(embed, faq_tasks, args.data_dir, max_queries=args.max_queries)
        elapsed = time.perf_counter() - started
        tables["faq_table.txt"] = format_faq_table(faq)
        metrics |= faq_summary_metrics(faq)
        capped = f", at most {args.max_queries} queries" if args.max_queries else ""
        print(
            f"\n{args.model} ({pooled}), FAQ retrieval × 100, cosine ranking of the whole "
            f"collection, mean over {len(next(iter(faq.values())).folds)} query folds{capped}\n"
        )
        print(tables["faq_table.txt"])
        sizes = "; ".join(f"{name}: {s.queries} queries, {s.candidates} FAQ items" for name, s in faq.items())
        embedding = sum(s.embed_seconds for s in faq.values())
        print(f"\n{sizes}; {len(faq)} data set(s) in {elapsed:.1f} s ({embedding:.1f} s embedding)")
    if custom:
        from clsr.eval.custom import ClassifierSettings, evaluate_custom

        started = time.perf_counter()
        fits = ClassifierSettings(args.transfer_mode, args.transfer_classifier)
        scores = evaluate_custom(embed, custom, fits)
        metrics |= scores
        tables["custom_table.txt"] = "\n".join(
            f"{k.removeprefix('test_'):<28} {v:7.2f}" for k, v in scores.items()
        )
        print(f"\n{args.model} ({pooled}), your evaluation sets × 100\n")
        print(tables["custom_table.txt"])
        print(f"\n{len(custom)} task(s) in {time.perf_counter() - started:.1f} s")
    if args.mlflow:
        import mlflow

        from clsr.tracking.study_runs import resolve_tracking_uri

        mlflow.set_tracking_uri(resolve_tracking_uri(None))
        mlflow.set_experiment(args.experiment)
        with mlflow.start_run(run_name=f"eval {args.model}"):
            params = {"model": args.model, "pooling": args.pooling, "split": args.split, "tasks": args.tasks}
            params |= {"device": str(device), "precision": resolved_precision(args.precision, device)}
            if transfer_tasks:
                params |= {"transfer_mode": args.transfer_mode, "max_examples": args.max_examples}
                params |= {"transfer_classifier": args.transfer_classifier}
            if faq_tasks:
                params |= {"max_queries": args.max_queries}
            for name, task in custom.items():  # where each of the user's sets came from
                params[f"custom.{name}"] = f"{task.type}: {task.path}" + (
                    f" + {task.corpus}" if task.corpus else ""
                )
            mlflow.log_params(params)
            mlflow.log_metrics(metrics)
            for name, table in tables.items():
                mlflow.log_text(table, name)
        print(f"logged to MLflow experiment {args.experiment!r} at {mlflow.get_tracking_uri()}")
    return 0


def _expand_folders(paths: list[str]) -> list[str]:
    """Each folder replaced by its study files (an empty one stays, so load_study says so)."""
    from clsr.study.plan.load import study_files_in

    expanded = []
    for path in paths:
        files = study_files_in(Path(path)) if Path(path).is_dir() else []
        expanded += [str(f) for f in files] or [path]
    return expanded


def _custom_tasks(path: str | None) -> dict:
    """``{name: CustomTask}`` from a --custom YAML file (read safely: duplicate keys refused)."""
    if path is None:
        return {}
    from pydantic import ValidationError

    from clsr.eval.custom import CustomTask, check_name
    from clsr.study.spec.yaml_safe import YAMLSafetyError, read_yaml_file

    try:
        raw = read_yaml_file(Path(path))
    except (OSError, YAMLSafetyError) as err:
        raise ValueError(str(err)) from None
    if not isinstance(raw, dict) or not raw:
        raise ValueError("the file must hold a mapping {name: {type: ..., path: ...}}")
    tasks = {}
    for name, spec in raw.items():
        try:
            tasks[check_name(str(name))] = CustomTask.model_validate(spec)
        except ValidationError as err:
            first = err.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise ValueError(f"{name}{'.' + where if where else ''}: {first['msg']}") from None
    return tasks


def cmd_data(args: argparse.Namespace) -> int:
    from clsr.data.corpora import load_nli_pairs
    from clsr.data.sources import resolve_data_dir
    from clsr.data.supmpn_rows import format_table1, table1_statistics

    folder = resolve_data_dir(args.data_dir)  # explicit folder, else $CLSR_DATA_DIR, else the hub
    source = str(folder) if folder is not None else "the hub (SNLI + MultiNLI train)"
    print(format_table1(table1_statistics(load_nli_pairs(folder)), title=f"NLI pairs from {source}"))
    return 0


def cmd_env(_: argparse.Namespace) -> int:
    import importlib.metadata as md
    import platform as stdlib_platform

    import clsr

    print(f"clsr {clsr.__version__}  python {stdlib_platform.python_version()}  {stdlib_platform.platform()}")
    for name in ("torch", "ray", "transformers", "datasets", "mlflow", "optuna", "pydantic", "scikit-learn"):
        try:
            print(f"  {name} {md.version(name)}")
        except md.PackageNotFoundError:
            print(f"  {name} (not installed)")
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    """``platform bench ...``: the checkout's benchmarks (not in the wheel), imported only now."""
    from clsr.checkout import from_checkout

    bench = from_checkout("clsr_bench.cli", "platform bench", "bench")
    return 2 if bench is None else bench.main(args.argv[1:])


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # `platform bench`'s arguments are the checkout's (clsr_bench.cli), parsed there
    args = argparse.Namespace(command="bench") if argv[:1] == ["bench"] else _parser().parse_args(argv)
    args.argv = argv
    handlers = {"study": cmd_study, "eval": cmd_eval, "data": cmd_data, "env": cmd_env, "bench": cmd_bench}
    handler = (handlers | {"cluster": cmd_cluster})[args.command]
    try:
        return handler(args)
    except KeyboardInterrupt:
        print(
            "\ninterrupted: `platform study resume <study.yaml>` continues where it stopped", file=sys.stderr
        )
        return 130
    except (ConnectionError, RuntimeError) as err:  # an unreachable server, LeaseHeld, StudyChanged, ...
        print(f"error: {mask_uri(str(err))}", file=sys.stderr)
        return 2
    except LookupError as err:  # a missing earlier run, or a missing upstream output
        if isinstance(err, KeyError | IndexError):  # a bug, not a user error: keep the traceback
            raise
        print(f"error: {err}", file=sys.stderr)
        return 2


def run() -> NoReturn:
    """The ``platform`` command: ``main``, then ``exit_now``."""
    exit_now(main())


def exit_now(code: int | None) -> NoReturn:
    """Exit as the interpreter would, less its teardown: the other non-daemon threads joined and the
    ``atexit`` functions run (Ray's shutdown, logging's flush, MLflow's), the output flushed, then
    ``os._exit``. Python's own teardown of torch's, Ray's and MLflow's modules takes about 1.5 s on 2
    cores after the command is done, and a study's command waits for its driver child's."""
    import atexit
    import os
    import threading

    # what the interpreter runs at exit, in its order (CPython's own functions): threading's exit hooks
    # (idle thread pools told to stop) and the joins of non-daemon threads, then the atexit functions
    shutdown, exit_functions = getattr(threading, "_shutdown", None), getattr(atexit, "_run_exitfuncs", None)
    if shutdown is None or exit_functions is None:  # another Python: its own exit
        sys.exit(code)
    shutdown()
    exit_functions()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code or 0)

