"""Benchmark: the SentEval transfer tasks with all-MiniLM-L6-v2 (``minilm``, mean pooling) or a fixed
bag-of-words embedding, for one or several classifiers.

    CLSR_DATA_DIR=../shared/data python benchmarks/transfer_eval.py                 # paper protocol
    CLSR_DATA_DIR=../shared/data python benchmarks/transfer_eval.py --mode fast     # SimCSE's fasttest
    CLSR_DATA_DIR=../shared/data python benchmarks/transfer_eval.py --max-examples 2000 --tasks mr,trec
    # the stacked fits on a GPU (eval.transfer_device: auto) against two CPU processes:
    CLSR_DATA_DIR=../shared/data python benchmarks/transfer_eval.py --embedding bow --tasks mr,cr --fit-device cuda
    # the three classifiers on TREC with hashed unigrams+bigrams (no model, a few CPU minutes):
    CLSR_DATA_DIR=../shared/data python benchmarks/transfer_eval.py --embedding bow --tasks trec \
        --classifiers senteval_pytorch,liblinear,lbfgs

Protocol: methods.md §8.2 (see ``clsr.eval.transfer``). Prints, per classifier, the papers' table
(MR CR SUBJ MPQA SST TREC MRPC Avg.), then per task the rows used, the chosen C / weight decay, the
number of classifier fits and the wall time of embedding and of the classifier, and the total.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

from clsr.config.model import ModelConfig
from clsr.encoders.embed import transformer_embedder
from clsr.encoders.transformer import TransformerEncoder, load_tokenizer
from clsr.eval.transfer import (
    CLASSIFIERS,
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
    parser.add_argument(
        "--embedding",
        default="model",
        choices=["model", "bow"],
        help="bow: binary unigrams+bigrams hashed to 1,024 columns, L2-normalised (nothing fitted)",
    )
    parser.add_argument(
        "--classifiers", default="senteval_pytorch", help=f"comma-separated, from {', '.join(CLASSIFIERS)}"
    )
    parser.add_argument("--pooling", default="mean")
    parser.add_argument("--tasks", default="transfer", help="comma-separated: transfer or mr,cr,...")
    parser.add_argument("--mode", default="test", choices=["test", "fast"])
    parser.add_argument("--max-examples", type=int, default=None, help="stratified cap per split")
    parser.add_argument("--n-jobs", type=int, default=None, help="classifier processes (default: auto)")
    parser.add_argument(
        "--fit-device",
        default="cpu",
        help="where senteval_pytorch's fits run: cpu (processes, the default) or cuda (stacked, in this "
        "process: eval.transfer_device auto)",
    )
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--data-dir", default=None, help="default: $CLSR_DATA_DIR, else the hub")
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"
    n_jobs = args.n_jobs or default_n_jobs()
    name = "bag of words (hashed)" if args.embedding == "bow" else f"{args.model} ({args.pooling} pooling)"
    print(
        f"transfer benchmark: {name} on {device}, mode {args.mode}, "
        f"max_examples {args.max_examples}, "
        + ("fits on cuda" if args.fit_device.startswith("cuda") else f"{n_jobs} classifier process(es)")
    )
    started = time.perf_counter()
    if args.embedding == "bow":
        from sklearn.feature_extraction.text import HashingVectorizer

        hashing = HashingVectorizer(n_features=1024, ngram_range=(1, 2), alternate_sign=False, binary=True)

        def embed(sentences: list[str]) -> np.ndarray:
            return hashing.transform(sentences).toarray()
    else:
        encoder = TransformerEncoder(ModelConfig(name=args.model, pooling=args.pooling))
        if torch.cuda.is_available():
            encoder = encoder.cuda()
        embed = transformer_embedder(encoder, load_tokenizer(args.model), batch_size=args.batch_size)
    print(f"embedder ready in {time.perf_counter() - started:.1f} s\n")

    def progress(score: TransferScore) -> None:
        print(
            f"  {score.classifier:<16} {DISPLAY_NAMES[score.task]:<5} acc {score.acc:6.2f}  "
            f"embed {score.embed_seconds:6.1f} s  classifier {score.classify_seconds:6.1f} s",
            flush=True,
        )

    for classifier in args.classifiers.split(","):
        started = time.perf_counter()
        scores = evaluate_transfer(
            embed,
            args.tasks.split(","),
            args.data_dir,
            mode=args.mode,
            max_examples=args.max_examples,
            n_jobs=n_jobs,
            on_task=progress,
            classifier=classifier,
            device=args.fit_device,
        )
        report(scores, f"{name}, {classifier}, mode {args.mode}", time.perf_counter() - started)


def report(scores: dict[str, TransferScore], title: str, total: float) -> None:
    print(f"\n{title}: SentEval transfer accuracy × 100\n")
    print(format_transfer_table(scores))
    if "mrpc" in scores:
        print(f"\nMRPC F1: {scores['mrpc'].f1:.2f}")
    print(
        f"\n{'task':<5} {'rows':>22} {'C / decay chosen':>24} {'fits':>5} {'embed s':>8} {'classif. s':>10}"
    )
    for task, s in scores.items():
        rows = "/".join(str(n) for n in s.sizes.values())
        chosen = ", ".join(f"{c:g}" for c in sorted(set(s.chosen_c)))
        print(
            f"{DISPLAY_NAMES[task]:<5} {rows:>22} {chosen:>24} {s.fits:>5} "
            f"{s.embed_seconds:>8.1f} {s.classify_seconds:>10.1f}"
        )
    embed_total = sum(s.embed_seconds for s in scores.values())
    classify_total = sum(s.classify_seconds for s in scores.values())
    print(
        f"\nembedding {embed_total:.1f} s + classifiers {classify_total:.1f} s; "
        f"total {total:.1f} s including data reading\n"
    )


if __name__ == "__main__":
    main()
