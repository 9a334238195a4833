"""``platform bench``: handed to the source checkout's benchmarks (benchmarks/clsr_bench, not in the wheel)."""

from __future__ import annotations

import argparse


def add_parsers(commands) -> None:
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
