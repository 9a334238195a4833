"""``platform data``: inspect training data."""

from __future__ import annotations

import argparse


def add_parsers(commands) -> None:
    """``platform data`` and its actions."""
    data = commands.add_parser("data", help="inspect training data").add_subparsers(
        dest="action", required=True
    )
    nli_stats = data.add_parser(
        "nli-stats", help="SupMPN Table 1 premise grouping statistics of the NLI pairs"
    )
    nli_stats.add_argument(
        "--data-dir", default=None, help="local data folder (default: $CLSR_DATA_DIR, else the hub)"
    )


def cmd_data(args: argparse.Namespace) -> int:
    from clsr.data.corpora import load_nli_pairs
    from clsr.data.sources import resolve_data_dir
    from clsr.data.supmpn_rows import format_table1, table1_statistics

    folder = resolve_data_dir(args.data_dir)  # explicit folder, else $CLSR_DATA_DIR, else the hub
    source = str(folder) if folder is not None else "the hub (SNLI + MultiNLI train)"
    print(format_table1(table1_statistics(load_nli_pairs(folder)), title=f"NLI pairs from {source}"))
    return 0
