"""Benchmark: all-MiniLM-L6-v2 (``minilm``, mean pooling) on the seven SentEval transfer tasks.

    CLSR_DATA_DIR=../shared/data python benchmarks/transfer_eval.py                 # paper protocol
    CLSR_DATA_DIR=../shared/data python benchmarks/transfer_eval.py --mode fast     # 5 folds, small C grid
    CLSR_DATA_DIR=../shared/data python benchmarks/transfer_eval.py --max-examples 2000 --tasks mr,trec

Protocol: methods.md §8.2 with scikit-learn logistic regression (see ``clsr.eval.transfer``). Prints
the papers' table (MR CR SUBJ MPQA SST TREC MRPC Avg.), then per task the rows used, the chosen C,
the number of classifier fits and the wall time of embedding and of the classifier, and the total.
"""

from __future__ import annotations

import argparse
import time

import torch

from clsr.encoders.transformer import ModelConfig, TransformerEncoder, load_tokenizer
from clsr.eval.embed import transformer_embedder
from clsr.eval.transfer import (
    DISPLAY_NAMES,
    TransferScore,
    default_n_jobs,
    evaluate_transfer,
    format_transfer_table,
)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="minilm", help="hub id, local folder, or 'minilm'")
    parser.add_argument("--pooling", default="mean")
    parser.add_argument("--tasks", default="transfer", help="comma-separated: transfer or mr,cr,...")
    parser.add_argument("--mode", default="test", choices=["test", "fast"])
    parser.add_argument("--max-examples", type=int, default=None, help="stratified cap per split")
    parser.add_argument("--n-jobs", type=int, default=None, help="classifier processes (default: auto)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--data-dir", default=None, help="default: $CLSR_DATA_DIR, else the hub")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"
    n_jobs = args.n_jobs or default_n_jobs()
    print(
        f"transfer benchmark: {args.model} ({args.pooling} pooling) on {device}, mode {args.mode}, "
        f"max_examples {args.max_examples}, {n_jobs} classifier process(es)"
    )
    started = time.perf_counter()
    encoder = TransformerEncoder(ModelConfig(name=args.model, pooling=args.pooling))
    if torch.cuda.is_available():
        encoder = encoder.cuda()
    embed = transformer_embedder(encoder, load_tokenizer(args.model), batch_size=args.batch_size)
    loaded = time.perf_counter()
    print(f"model loaded in {loaded - started:.1f} s\n")

    def progress(score: TransferScore) -> None:
        print(
            f"  {DISPLAY_NAMES[score.task]:<5} acc {score.acc:6.2f}  embed {score.embed_seconds:6.1f} s  "
            f"classifier {score.classify_seconds:6.1f} s",
            flush=True,
        )

    scores = evaluate_transfer(
        embed,
        args.tasks.split(","),
        args.data_dir,
        mode=args.mode,
        max_examples=args.max_examples,
        n_jobs=n_jobs,
        on_task=progress,
    )
    total = time.perf_counter() - started

    print(f"\n{args.model} ({args.pooling} pooling), SentEval transfer accuracy × 100, mode {args.mode}\n")
    print(format_transfer_table(scores))
    if "mrpc" in scores:
        print(f"\nMRPC F1: {scores['mrpc'].f1:.2f}")
    print(f"\n{'task':<5} {'rows':>22} {'C chosen':>24} {'fits':>5} {'embed s':>8} {'classif. s':>10}")
    for task, s in scores.items():
        rows = "/".join(str(n) for n in s.sizes.values())
        cs = sorted(set(s.chosen_c))
        chosen = ", ".join(f"{c:g}" for c in cs)
        print(
            f"{DISPLAY_NAMES[task]:<5} {rows:>22} {chosen:>24} {s.fits:>5} "
            f"{s.embed_seconds:>8.1f} {s.classify_seconds:>10.1f}"
        )
    embed_total = sum(s.embed_seconds for s in scores.values())
    classify_total = sum(s.classify_seconds for s in scores.values())
    print(
        f"\nembedding {embed_total:.1f} s + classifiers {classify_total:.1f} s; "
        f"total {total:.1f} s including model load and data reading"
    )


if __name__ == "__main__":
    main()
