"""``platform study stop``: ask the running driver of a study (on any machine) to stop the study, or
one ablation of it, gracefully, through the record (``clsr.study.control.stop_request``)."""

from __future__ import annotations

import argparse
import sys


def stop_parser(study) -> None:
    stop = study.add_parser(
        "stop",
        help="ask a running study's driver, through MLflow, to stop the study (or one ablation) gracefully: "
        "no further trial starts, the running ones finish",
    )
    stop.add_argument("study", help="study YAML file (its name and tracking_uri find the record)")
    stop.add_argument("--ablation", default=None, help="stop this ablation only; the others go on")
    stop.add_argument("--smoke", action="store_true", help="stop the study's --smoke run (<name>-smoke)")
    stop.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")


def cmd_study_stop(args: argparse.Namespace) -> int:
    """0 when the request is recorded; 2 for a bad file or ablation, or no running record of the study."""
    from mlflow.tracking import MlflowClient

    from clsr.study.control.stop_request import request_stop
    from clsr.study.plan.load import load_study
    from clsr.study.record.reader import study_parent
    from clsr.study.spec.dotted import parse_override
    from clsr.study.spec.schema import StudyError
    from clsr.tracking.escape import terminal
    from clsr.tracking.study_runs import resolve_tracking_uri

    try:
        study = load_study(args.study, [parse_override(o) for o in args.overrides], smoke=args.smoke)
    except (StudyError, ValueError) as err:
        print(err, file=sys.stderr)
        return 2
    if args.ablation is not None and args.ablation not in study.ablations:
        print(
            f"{args.study}: --ablation: no ablation {args.ablation!r} (allowed: {', '.join(study.ablations)})",
            file=sys.stderr,
        )
        return 2
    client = MlflowClient(resolve_tracking_uri(study.tracking_uri))
    parent = study_parent(client, study.name)
    if parent is None or parent.info.status != "RUNNING":
        state = "no record" if parent is None else f"its record is {parent.info.status}"
        print(
            f"{args.study}: study {study.name!r} is not running ({state}); nothing to stop", file=sys.stderr
        )
        return 2
    value = request_stop(client, parent.info.run_id, args.ablation)
    what = f"ablation {args.ablation}" if args.ablation else "the whole study"
    print(
        f"asked study {study.name!r} (run {parent.info.run_id}) to stop {terminal(what)}; its driver reads the "
        f"request within a minute: no further trial starts, the running ones finish (clsr.stop_request={terminal(value)})"
    )
    return 0
