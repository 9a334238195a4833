"""Benchmark: GCLSR's default configuration on the local Wikipedia sentences, against the average of
the same word vectors (GCLSR Table 2's "Word2vec embeddings (avg.)" row).

    CLSR_DATA_DIR=../shared/data python benchmarks/gclsr_wiki.py                  # offline: MiniLM vectors
    python benchmarks/gclsr_wiki.py --vectors word2vec-google-news-300             # the paper's vectors (data folder)
    python benchmarks/gclsr_wiki.py --set trainer.epochs=2 --set model.filters=64  # a quicker look

Everything else is the paper's (methods.md §7): 10^4 sentences, batch 512, 20 epochs, SGD with
warm-up + cosine, PWVA + self-attention + groups of 16, model selection on STS-B dev. Prints the
7 STS test scores of both encoders, their averages, and the wall time of each stage.
"""

from __future__ import annotations

import argparse
import time

import torch

from clsr.config.trial import TrialConfig
from clsr.encoders.word_vectors import word_vector_average_embedder
from clsr.eval.sts import STS12_15, evaluate_sts, format_table
from clsr.methods import build_method
from clsr.methods.gclsr import GCLSR
from clsr.study.spec.dotted import parse_override, set_dotted
from clsr.train.loop import fit
from clsr.train.session import LocalSession


def trial_from_args(args: argparse.Namespace) -> TrialConfig:
    doc = {**GCLSR.paper_defaults, "method": {"name": "gclsr"}}
    doc = set_dotted(doc, "model.vectors", args.vectors)
    doc = set_dotted(doc, "eval.alignment_uniformity", False)
    for key, value in (parse_override(o) for o in args.overrides):
        doc = set_dotted(doc, key, value)
    return TrialConfig.model_validate(doc)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--vectors", default="minilm", help="named vectors, a file, or a transformer (minilm)"
    )
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    trial = trial_from_args(args)
    device = "cuda" if torch.cuda.is_available() else f"cpu ({torch.get_num_threads()} threads)"
    print(
        f"GCLSR benchmark on {device}: vectors {trial.model.vectors}, {trial.data.max_rows} sentences, "
        f"batch {trial.trainer.batch_size}, {trial.trainer.epochs:g} epochs"
    )

    started = time.perf_counter()
    method = build_method(trial)
    shared = method.prepare_shared(trial)
    table = shared.table
    print(
        f"word table: {len(table.words)} tokens x {table.dim} dims ({table.oov_words} without a vector), "
        f"{time.perf_counter() - started:.1f} s"
    )

    t0 = time.perf_counter()
    baseline = evaluate_sts(word_vector_average_embedder(table), ["sts"], "test", trial.data.data_dir)
    baseline_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    session = LocalSession()
    final = fit(trial, session, shared=shared)
    train_s = time.perf_counter() - t0
    trained = {t: final[f"test_{t}"] for t in baseline}

    print("\nAverage of word vectors (no training):")
    print(format_table(baseline))
    print(
        f"\nGCLSR (best STS-B dev checkpoint, step {final.get('best_step')}, dev {final.get('best_dev_stsb'):.2f}):"
    )
    print(" | ".join(f"{t}: {v:.2f}" for t, v in trained.items()))
    b_avg = sum(s.all for s in baseline.values()) / len(baseline)
    b_4 = sum(baseline[t].all for t in STS12_15) / 4
    print(f"\n{'':26}{'STS avg (7)':>12}{'STS12-15 avg':>14}")
    print(f"{'word-vector average':26}{b_avg:12.2f}{b_4:14.2f}")
    print(f"{'GCLSR trained':26}{final['test_sts_avg']:12.2f}{final['test_sts12_15_avg']:14.2f}")
    print(
        f"\nwall time: training + evaluation {train_s:.0f} s, baseline evaluation {baseline_s:.0f} s, "
        f"total {time.perf_counter() - started:.0f} s"
    )


if __name__ == "__main__":
    main()
