"""``platform eval``: an encoder on STS, the SentEval transfer tasks, FAQ retrieval and your own sets."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_parsers(commands) -> None:
    """``platform eval`` and its options."""
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


def cmd_eval(args: argparse.Namespace) -> int:
    """``platform eval``: 0 with each group's table printed (and logged with --mlflow), 2 for a bad option."""
    from clsr.encoders.export import load_model, make_embedder, pooling_of
    from clsr.eval.suite import SuiteSettings, SuiteTasks, evaluate_suite
    from clsr.eval.transfer import expand_transfer_tasks

    if (chosen := _chosen_tasks(args)) is None:
        return 2
    custom, sts_tasks, transfer_tasks, faq_tasks, device = chosen
    started = time.perf_counter()
    encoder, pipeline = load_model(args.model, pooling=args.pooling)
    args.pooling = pooling_of(encoder)  # an exported model's own pooling when --pooling is left out
    pooled = args.pooling if args.pooling.startswith("sentence-transformers") else f"{args.pooling} pooling"
    encoder.to(device)
    embed = make_embedder(encoder, pipeline, batch_size=args.batch_size, precision=args.precision)
    tables: dict[str, str] = {}
    printers = {"sts": _print_sts, "transfer": _print_transfer, "faq": _print_faq}
    printers["custom"] = lambda *group: _print_custom(*group, tasks=len(custom))

    def on_group(name: str, scores, metrics: dict, seconds: float) -> None:
        if name == "sts":  # the STS time counts from the model's loading
            seconds = time.perf_counter() - started
        tables[f"{name}_table.txt"] = printers[name](args, pooled, scores, seconds)

    settings = SuiteSettings(
        data_dir=args.data_dir,
        split=args.split,  # dev scores are not test scores: dev_<task>
        transfer_mode=args.transfer_mode,
        transfer_classifier=args.transfer_classifier,
        transfer_max_examples=args.max_examples,
        faq_max_queries=args.max_queries,
    )
    tasks = SuiteTasks(sts_tasks, transfer_tasks, faq_tasks, custom)
    progress = _transfer_progress(len(expand_transfer_tasks(transfer_tasks))) if transfer_tasks else None
    metrics = evaluate_suite(embed, tasks, settings, on_group=on_group, on_transfer_task=progress)
    if args.mlflow:
        _log_to_mlflow(
            args, device, metrics, tables, custom, transfer=bool(transfer_tasks), faq=bool(faq_tasks)
        )
    return 0


def _chosen_tasks(args: argparse.Namespace):
    """``(custom, sts, transfer, faq, device)`` from the options (``args.tasks`` filled in when left out);
    None when one is refused, said on stderr."""
    from clsr.data.tasks import split_eval_tasks
    from clsr.encoders.precision import resolve_device

    try:
        custom = _custom_tasks(args.custom)
    except ValueError as err:
        print(f"error: --custom {args.custom}: {err}", file=sys.stderr)
        return None
    args.tasks = args.tasks if args.tasks is not None else (",".join(custom) or "sts")
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    custom = {t: custom[t] for t in names if t in custom}
    try:
        sts_tasks, transfer_tasks, faq_tasks = split_eval_tasks([t for t in names if t not in custom])
    except ValueError as err:
        print(f"error: --tasks: {err}", file=sys.stderr)
        return None
    for flag, value in (("--max-examples", args.max_examples), ("--max-queries", args.max_queries)):
        if value is not None and value < 1:
            print(f"error: {flag} must be at least 1", file=sys.stderr)
            return None
    try:
        device = resolve_device(args.device)
    except (ValueError, RuntimeError) as err:  # RuntimeError: torch's own words for a malformed device
        print(f"error: --device: {err}", file=sys.stderr)
        return None
    return custom, sts_tasks, transfer_tasks, faq_tasks, device


def _print_sts(args: argparse.Namespace, pooled: str, scores, seconds: float) -> str:
    """STS: the printed table."""
    from clsr.eval.sts import format_table

    table = format_table(scores)
    print(f"\n{args.model} ({pooled}), Spearman × 100, {args.split} split, 'all' setting\n")
    print(table)
    print(f"\n{sum(s.pairs for s in scores.values())} pairs in {seconds:.1f} s")
    return table


def _print_transfer(args: argparse.Namespace, pooled: str, transfer, seconds: float) -> str:
    """The SentEval transfer tasks: the printed table (a line per task was printed as it ended)."""
    from clsr.eval.transfer import format_transfer_table

    table = format_transfer_table(transfer)
    capped = f", at most {args.max_examples} rows per split" if args.max_examples else ""
    print(f"\n{args.model} ({pooled}), SentEval transfer accuracy × 100, {args.transfer_mode} mode{capped}\n")
    print(table)
    f1 = f"MRPC F1 {transfer['mrpc'].f1:.2f}; " if "mrpc" in transfer else ""
    embedding = sum(s.embed_seconds for s in transfer.values())
    print(f"\n{f1}{len(transfer)} task(s) in {seconds:.1f} s ({embedding:.1f} s embedding)")
    return table


def _print_faq(args: argparse.Namespace, pooled: str, faq, seconds: float) -> str:
    """FAQ retrieval: the printed table."""
    from clsr.eval.faq import format_faq_table

    table = format_faq_table(faq)
    capped = f", at most {args.max_queries} queries" if args.max_queries else ""
    print(
        f"\n{args.model} ({pooled}), FAQ retrieval × 100, cosine ranking of the whole "
        f"collection, mean over {len(next(iter(faq.values())).folds)} query folds{capped}\n"
    )
    print(table)
    sizes = "; ".join(f"{name}: {s.queries} queries, {s.candidates} FAQ items" for name, s in faq.items())
    embedding = sum(s.embed_seconds for s in faq.values())
    print(f"\n{sizes}; {len(faq)} data set(s) in {seconds:.1f} s ({embedding:.1f} s embedding)")
    return table


def _print_custom(args: argparse.Namespace, pooled: str, scores: dict, seconds: float, tasks: int) -> str:
    """Your own evaluation sets (--custom): the printed table."""
    table = "\n".join(f"{k.removeprefix('test_'):<28} {v:7.2f}" for k, v in scores.items())
    print(f"\n{args.model} ({pooled}), your evaluation sets × 100\n")
    print(table)
    print(f"\n{tasks} task(s) in {seconds:.1f} s")
    return table


def _log_to_mlflow(
    args: argparse.Namespace, device, metrics: dict, tables: dict, custom: dict, *, transfer: bool, faq: bool
) -> None:
    """--mlflow: the options, the scores and the tables as a run of ``args.experiment``; the transfer and
    FAQ options only when those tasks were evaluated."""
    import mlflow

    from clsr.encoders.precision import resolved_precision
    from clsr.tracking.study_runs import resolve_tracking_uri

    mlflow.set_tracking_uri(resolve_tracking_uri(None))
    mlflow.set_experiment(args.experiment)
    with mlflow.start_run(run_name=f"eval {args.model}"):
        params = {"model": args.model, "pooling": args.pooling, "split": args.split, "tasks": args.tasks}
        params |= {"device": str(device), "precision": resolved_precision(args.precision, device)}
        if transfer:
            params |= {"transfer_mode": args.transfer_mode, "max_examples": args.max_examples}
            params |= {"transfer_classifier": args.transfer_classifier}
        if faq:
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


def _custom_tasks(path: str | None) -> dict:
    """``{name: CustomTask}`` from a --custom YAML file (read safely: duplicate keys refused)."""
    if path is None:
        return {}
    from pydantic import ValidationError

    from clsr.config.custom_task import CustomTask, check_name
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
