"""Random word vectors in word2vec's binary format for every word of the data sets under a folder:
GoogleNews' shape (300-d float32) for GPU timing runs where the 3.6 GB file cannot travel.

    python benchmarks/random_word2vec.py "$CLSR_DATA_DIR" /tmp/random-300.bin

Words follow GCLSR's rule (``clsr.encoders.word_vectors.words_of``), so every word a trial or its
evaluation looks up has a row: the step and the TextCNN are those of word2vec, only the table is
smaller. Timing only: the vectors mean nothing, and neither do the scores.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from clsr.encoders.word_vectors import words_of

# every file is read as text (SentEval's are .pos, .neg, .objective, .label, ...) except these
BINARY_SUFFIXES = {
    ".bin",
    ".npy",
    ".npz",
    ".gz",
    ".zip",
    ".parquet",
    ".arrow",
    ".model",
    ".pt",
    ".safetensors",
}


def vocabulary(folder: Path) -> list[str]:
    """The distinct words of every text file under ``folder``, in first-seen order."""
    seen: dict[str, None] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix not in BINARY_SUFFIXES):
        with open(path, encoding="utf-8", errors="replace") as lines:
            for line in lines:
                seen.update(dict.fromkeys(words_of(line)))
    return list(seen)


def write_word2vec_bin(words: list[str], path: Path, dim: int = 300, seed: int = 0) -> None:
    """``words`` with U(-0.25, 0.25) vectors in word2vec's binary format (as its C tool writes it: a
    newline after each vector, which gensim's ``load_word2vec_format(binary=True)`` skips)."""
    rng = np.random.default_rng(seed)
    with open(path, "wb") as out:
        out.write(f"{len(words)} {dim}\n".encode())
        for word in words:
            vector = rng.uniform(-0.25, 0.25, dim).astype("<f4")
            out.write(word.encode() + b" " + vector.tobytes() + b"\n")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("data_dir", type=Path, help="the data folder (CLSR_DATA_DIR)")
    parser.add_argument("out", type=Path, help="the .bin file to write")
    parser.add_argument("--dim", type=int, default=300)
    args = parser.parse_args()
    words = vocabulary(args.data_dir)
    write_word2vec_bin(words, args.out, args.dim)
    print(f"{args.out}: {len(words):,} words × {args.dim}")


if __name__ == "__main__":
    main()
