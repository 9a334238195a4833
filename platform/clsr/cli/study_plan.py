"""``platform study plan``: its options, and the command that projects a study's wall time, GPU-hours
and cost (``clsr.study.plan.projection``) from a record (``--from``), a probe (``--probe``), or the cost
model (``clsr.study.plan.cost_model``) when neither has measured anything."""

from __future__ import annotations

import argparse
import sys

GPU_KINDS = (
    "a100",
    "h100",
    "h200",
)  # clsr.study.plan.projection.GPUS (not imported here: the CLI starts fast)


def plan_parser(study) -> None:
    """``study plan``: the projection's GPUs, prices and where its unit costs come from."""
    plan = study.add_parser(
        "plan",
        help="project the study's wall time, GPU-hours and cost on N GPUs: from the per-phase costs of "
        "trials that ran (its own, another study's: --from, or a probe's: --probe), else from the cost "
        "model (FLOPs over measured throughput)",
    )
    plan.add_argument("study", help="study YAML file")
    plan.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    plan.add_argument("--smoke", action="store_true", help="plan the file's smoke: run")
    plan.add_argument(
        "--from", dest="measured", default=None, metavar="STUDY",
        help="the recorded study whose trials give the per-phase costs (default: this study's own "
        "record if it has one, else the cost model); refused when its configuration differs",
    )  # fmt: skip
    plan.add_argument(
        "--allow-other-config", action="store_true",
        help="use --from's unit costs even when its trials ran another configuration (warned)",
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
    plan.add_argument(
        "--probe-limit", type=float, default=120.0, metavar="SECONDS",
        help="stop the probe after this long and price by the steps it timed (default 120)",
    )  # fmt: skip
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


def cmd_study_plan(args: argparse.Namespace) -> int:
    """``platform study plan``: 0 with the projection printed, 2 for a bad file or nothing measured."""
    from clsr.study.plan.projection import NoMeasurements, project, render
    from clsr.study.spec.schema import StudyError

    if args.probe and args.measured:
        print(
            "error: --probe measures here; --from reads a recorded study: give one of them", file=sys.stderr
        )
        return 2
    try:
        # the trials validation resolved: probe, prices, checkpoints
        documents = _load_documents(args.study, args.overrides, args.smoke)
        study = documents.study
        measured = _probed(args, study, documents) if args.probe else _recorded(args, study)
        warning = (
            None if measured is None or args.probe else _other_configuration(args, study, documents, measured)
        )
        projection = project(
            study, measured, args.gpus, args.gpu, args.gpu_speedup, args.price,
            grids=documents.grids, resolve=documents.config,
        )  # fmt: skip
    except (StudyError, NoMeasurements, ValueError) as err:
        print(err if isinstance(err, StudyError) else f"error: {err}", file=sys.stderr)
        return 2
    if warning:
        projection.assumptions.insert(0, warning)
        print(warning, file=sys.stderr)
    print(render(projection, args.gpu, args.gpus))
    from clsr.study.plan.resolve import checkpoint_lines

    print("\n".join(checkpoint_lines(study, documents.grids, documents.config)))
    return 0


def _probed(args: argparse.Namespace, study, documents):
    """Unit costs measured here by short probe trials (no Ray, no MLflow: a lone GPU box can run it),
    of the trials ``documents`` (the study's ``StudyDocuments``) resolved."""
    from clsr.study.plan.probe import ProbeIncomplete, probe

    try:
        return probe(
            study, args.probe_copies, args.probe_ablation, args.probe_steps,
            grids=documents.grids, resolve=documents.config, limit_s=args.probe_limit,
        )  # fmt: skip
    except ProbeIncomplete as err:
        print(f"{err}; projected by the cost model instead", file=sys.stderr)
        return None


def _other_configuration(args: argparse.Namespace, study, documents, measured) -> str | None:
    """A warning when the recorded trials ran another configuration than the study's and
    --allow-other-config was given; without it, ValueError naming the fields; None when they match."""
    from clsr.study.plan.record_match import differing_fields

    fields = differing_fields(study, measured, documents.grids, documents.config)
    if not fields:
        return None
    what = f"{measured.source} ran another configuration than study {study.name!r}: {'; '.join(fields)}"
    if not args.allow_other_config:
        raise ValueError(
            f"{what}; its unit costs would misprice this study: plan without --from (the cost model), "
            f"with --probe, or add --allow-other-config to use them anyway"
        )
    return f"WARNING: {what}; priced with its unit costs anyway (--allow-other-config)"


def _recorded(args: argparse.Namespace, study):
    """Unit costs of a recorded study's finished trials, read from MLflow; None (the cost model prices
    the study) when the study itself has none and no --from named another."""
    from clsr.study.analyse.runs import NoStudyRuns, open_study_runs
    from clsr.study.plan.projection import NoMeasurements, measure
    from clsr.tracking.study_runs import children, resolve_tracking_uri

    measured_name = args.measured or study.name
    uri = resolve_tracking_uri(args.tracking_uri or study.tracking_uri)
    try:
        client, parent = open_study_runs(measured_name, uri)
        return measure(children(client, parent.info.run_id), measured_name)
    except (NoStudyRuns, NoMeasurements) as err:
        if args.measured:  # asked for by name: its absence is an error
            raise NoMeasurements(str(err)) from err
    print(
        f"no finished trial of study {measured_name!r} recorded at {uri}: projected by the cost model "
        f"(FLOPs / measured throughput; --probe or --from <study> to measure)",
        file=sys.stderr,
    )
    return None


def _load_documents(path: str, overrides: list[str], smoke: bool):
    """The study with the trials validation resolved (``StudyDocuments``): probe, prices, checkpoints."""
    from clsr.study.plan.load import load_documents
    from clsr.study.spec.dotted import parse_override

    return load_documents(path, [parse_override(o) for o in overrides], smoke=smoke)
