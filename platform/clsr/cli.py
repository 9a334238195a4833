"""The ``platform`` command: run and resume studies, validate study files, evaluate encoders."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

EXAMPLES = """examples:
  platform study run studies/smoke.yaml
  platform study run studies/simcse_ablations.yaml --set trainer.max_steps=500 --set concurrency=4
  platform study run studies/gclsr_ablations.yaml --smoke
  platform study resume studies/smoke.yaml
  platform study validate studies/*.yaml
  platform eval --model minilm --pooling mean --tasks sts
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="platform",
        description=__doc__,
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    commands = parser.add_subparsers(dest="command", required=True)

    study = commands.add_parser("study", help="run, resume or validate a study file").add_subparsers(
        dest="action", required=True
    )
    for action, text in (("run", "run every trial of a study"), ("resume", "continue an interrupted study")):
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
    validate = study.add_parser("validate", help="check study files without running anything")
    validate.add_argument("studies", nargs="+")
    validate.add_argument("--smoke", action="store_true", help="validate with the smoke: section applied")

    ev = commands.add_parser("eval", help="evaluate an encoder on STS (SentEval 'all' setting)")
    ev.add_argument("--model", required=True, help="hub id, local folder, or 'minilm'")
    ev.add_argument("--pooling", default="mean", help="cls, cls_before_pooler, avg/mean, avg_first_last, ...")
    ev.add_argument("--tasks", default="sts", help="comma-separated: sts or sts12,...,sickr")
    ev.add_argument("--split", default="test", choices=["test", "dev"])
    ev.add_argument("--batch-size", type=int, default=128)
    ev.add_argument(
        "--data-dir", default=None, help="local data folder (default: $CLSR_DATA_DIR, else the hub)"
    )
    ev.add_argument("--mlflow", action="store_true", help="also log the scores as an MLflow run")
    ev.add_argument("--experiment", default="eval", help="MLflow experiment for --mlflow")

    commands.add_parser("env", help="print versions for bug reports")
    return parser


def _load(path: str, overrides: list[str], smoke: bool = False):
    from clsr.study.dotted import parse_override
    from clsr.study.schema import load_study

    return load_study(path, [parse_override(o) for o in overrides], smoke=smoke)


def cmd_study(args: argparse.Namespace) -> int:
    from clsr.study.schema import StudyError

    if args.action == "validate":
        failed = 0
        for path in args.studies:
            try:
                _load(path, [], smoke=args.smoke)
                print(f"ok  {path}")
            except StudyError as err:
                failed += 1
                print(err, file=sys.stderr)
        return 1 if failed else 0

    from clsr.study.runner import format_rows, run_study

    try:
        study = _load(args.study, args.overrides, smoke=args.smoke)
    except (StudyError, ValueError) as err:
        print(err, file=sys.stderr)
        return 2
    started = time.perf_counter()
    rows = run_study(study, Path(args.study).read_text(), resume=args.action == "resume")
    print(f"\nstudy {study.name!r}: {len(rows)} trial(s) in {time.perf_counter() - started:.0f} s\n")
    print(format_rows(rows))
    return 1 if any(r["status"] != "ok" for r in rows) else 0


def cmd_eval(args: argparse.Namespace) -> int:
    from clsr.encoders.transformer import ModelConfig, TransformerEncoder, load_tokenizer
    from clsr.eval.embed import transformer_embedder
    from clsr.eval.sts import evaluate_sts, format_table, summary_metrics

    started = time.perf_counter()
    encoder = TransformerEncoder(ModelConfig(name=args.model, pooling=args.pooling))
    embed = transformer_embedder(encoder, load_tokenizer(args.model), batch_size=args.batch_size)
    scores = evaluate_sts(embed, args.tasks.split(","), args.split, args.data_dir)
    elapsed = time.perf_counter() - started
    print(f"\n{args.model} ({args.pooling} pooling), Spearman × 100, {args.split} split, 'all' setting\n")
    print(format_table(scores))
    print(f"\n{sum(s.pairs for s in scores.values())} pairs in {elapsed:.1f} s")
    if args.mlflow:
        import mlflow

        from clsr.tracking.study_runs import resolve_tracking_uri

        mlflow.set_tracking_uri(resolve_tracking_uri(None))
        mlflow.set_experiment(args.experiment)
        with mlflow.start_run(run_name=f"eval {args.model}"):
            mlflow.log_params({"model": args.model, "pooling": args.pooling, "split": args.split})
            mlflow.log_metrics(summary_metrics(scores))
            mlflow.log_text(format_table(scores), "sts_table.txt")
        print(f"logged to MLflow experiment {args.experiment!r} at {mlflow.get_tracking_uri()}")
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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = {"study": cmd_study, "eval": cmd_eval, "env": cmd_env}[args.command]
    try:
        return handler(args)
    except KeyboardInterrupt:
        print(
            "\ninterrupted: `platform study resume <study.yaml>` continues where it stopped", file=sys.stderr
        )
        return 130
    except (ConnectionError, LookupError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
