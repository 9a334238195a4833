"""``platform study reproduce``: its options, and the command that rebuilds one trial from its study's
record, checks this machine against it, trains it again in this process and reports the two runs side by
side (``clsr.study.reproduce``; docs/compare-and-promote.md)."""

from __future__ import annotations

import argparse
import sys


def reproduce_parser(study) -> None:
    """``study reproduce``: a child run id, or a study with its point and seed."""
    p = study.add_parser(
        "reproduce",
        help="rebuild one trial from the record alone, check this machine's environment and data against "
        "it, train it again here and report its metrics beside the original's (bitwise equal, within a "
        "tolerance, different), logged as a new MLflow run tagged clsr.reproduction_of",
    )
    p.add_argument(
        "run", help="the trial's child run id, or a study file or name (then give --point and --seed)"
    )
    p.add_argument("--point", default=None, help="the trial's point label, as its clsr.point tag holds it")
    p.add_argument("--seed", type=int, default=None, help="the trial's seed")
    p.add_argument("--tracking-uri", default=None, help="MLflow (default: $MLFLOW_TRACKING_URI)")
    p.add_argument(
        "--check-only",
        action="store_true",
        help="only check this machine's environment, code and data against the record (seconds: nothing "
        "trained, nothing written to MLflow); exit 1 when they differ",
    )
    p.add_argument(
        "--log-model",
        action="store_true",
        help="log the reproduction's model as the trial did (default: not; the weights' hash is compared)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="rerun even when the rebuilt configuration differs from the trial's logged params (beyond "
        "its method file's hash); without it that exits 2",
    )
    p.add_argument(
        "--rtol", type=float, default=1e-6, help="relative tolerance of 'within tolerance' (default 1e-6)"
    )
    p.add_argument(
        "--atol", type=float, default=1e-9, help="absolute tolerance of 'within tolerance' (default 1e-9)"
    )


def cmd_study_reproduce(args: argparse.Namespace) -> int:
    """0 when the reproduction's results are bitwise equal or within the tolerance (``--check-only``: when
    nothing drifted), 1 when they differ, one of the original's is missing or nothing could be compared,
    2 when the trial cannot be rebuilt from the record (or, without ``--force``, the rebuild differs from
    the trial's logged configuration)."""
    from clsr.study.analyse.reproduce import FAILED, render
    from clsr.study.analyse.reproduction import NotReproducible
    from clsr.study.reproduce import UnsentWrites, reproduce
    from clsr.study.spec.schema import StudyError
    from clsr.tracking.escape import terminal

    try:
        done = reproduce(
            args.run, args.point, args.seed, args.tracking_uri, args.rtol, args.atol,
            say=lambda line: print(terminal(line), flush=True), check_only=args.check_only, log_model=args.log_model,
            force=args.force,
        )  # fmt: skip
    except NotReproducible as err:
        print(f"error: {terminal(str(err))}", file=sys.stderr)
        return 2
    except StudyError as err:  # a study file that does not load
        print(err, file=sys.stderr)
        return 2
    except UnsentWrites as err:  # the rerun's results did not all reach MLflow: nothing to compare
        print(f"error: {terminal(str(err))}", file=sys.stderr)
        return 1
    if done.comparison is None:
        print("drift found: a rerun here may not reproduce the trial" if done.drift else "no drift found")
        return 1 if done.drift else 0
    print(render(done.comparison))
    print(f"logged as MLflow run {done.run_id} (tag clsr.reproduction_of={done.recorded.run_id})")
    return 1 if done.comparison.verdict in FAILED else 0
