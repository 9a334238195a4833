"""The ``platform`` command: run and resume studies, validate study files, evaluate encoders.

argparse only, one module per command: study, eval, data, method and env here, cluster in clsr.cluster.cli; bench,
handed to the source checkout, below. Each registers its parsers (``add_parsers``) and holds its ``cmd_*``
functions, which import what they run (torch, Ray, MLflow) only when called: importing this package stays
cheap."""

from __future__ import annotations

import argparse
import contextlib
import sys
from typing import NoReturn

from clsr.cli import data, env, method, study
from clsr.cli import eval as eval_command
from clsr.cluster.cli import add_cluster_parser, cmd_cluster
from clsr.tracking.escape import terminal
from clsr.tracking.secrets import mask_uri

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
  platform study reproduce smoke --point method.temperature=0.05 --seed 1
  platform eval --model minilm --pooling mean --tasks sts
  platform eval --model minilm --tasks sts,transfer
  platform eval --model minilm --tasks mr,trec --transfer-mode fast --max-examples 1000
  platform eval --model minilm --pooling mean --tasks faq
  platform eval --model runs:/<run_id>/model --tasks sts
  platform method new my_loss           # my_loss.py (a method of yours) and my_loss.yaml (a study of it)
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
    study.add_parsers(commands)
    eval_command.add_parsers(commands)
    data.add_parsers(commands)
    method.add_parsers(commands)
    env.add_parsers(commands)
    _add_bench_parser(commands)
    add_cluster_parser(commands)
    return parser


def _add_bench_parser(commands) -> None:
    """``platform bench`` listed in ``platform --help``; its own options are clsr_bench.cli's."""
    # listed here; main() hands `platform bench ...` to the checkout's clsr_bench.cli, which parses the rest
    commands.add_parser(
        "bench",
        help="benchmarks that print figures: training throughput, memory, STS eval, a study (from a source "
        "checkout: benchmarks/clsr_bench)",
        add_help=False,
    )


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
    handlers = {
        "study": study.cmd_study,
        "eval": eval_command.cmd_eval,
        "data": data.cmd_data,
        "method": method.cmd_method,
        "env": env.cmd_env,
        "bench": cmd_bench,
        "cluster": cmd_cluster,
    }
    handler = handlers[args.command]
    try:
        return handler(args)
    except KeyboardInterrupt:
        print(
            "\ninterrupted: `platform study resume <study.yaml>` continues where it stopped", file=sys.stderr
        )
        return 130
    except (ConnectionError, RuntimeError) as err:  # an unreachable server, LeaseHeld, StudyChanged, ...
        print(f"error: {terminal(mask_uri(str(err)))}", file=sys.stderr)  # it may quote the record
        return 2
    except LookupError as err:  # a missing earlier run, or a missing upstream output
        if isinstance(err, KeyError | IndexError):  # a bug, not a user error: keep the traceback
            raise
        print(f"error: {terminal(str(err))}", file=sys.stderr)
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
