"""Regenerate the embedded default data set (``platform/clsr/data/embedded/``) from the shared data folder.

    CLSR_DATA_DIR=../shared/data python benchmarks/build_embedded_data.py

Deterministic: a fixed seed picks the rows, and the gzip headers carry no time or file name, so the same
data folder gives byte-identical files. Only sources whose terms allow redistribution are sampled (see
``LICENSES.md`` beside the files): Wikipedia (CC BY-SA), STS-B's image captions and SNLI captions (CC
BY-SA) and news headlines (EMM, with acknowledgement); STS16's headlines and post-editing (CC BY 4.0).
"""

from __future__ import annotations

import argparse
import gzip
import io
import random
from pathlib import Path

from clsr.data.embedded import EMBEDDED_DIR, STS_FILE, WIKI_FILE
from clsr.data.sources import resolve_data_dir

SEED = 0
WIKI_SENTENCES = 3000
STS_ROOT = "senteval/downstream/STS"
STSB_SOURCES = ("images", "track5.en-en", "headlines")  # not MSRpar/MSRvid (Microsoft's licence)
STSB_PAIRS = 300  # per split
STS16_SUBSETS = ("headlines", "postediting")  # not plagiarism (NC), not StackExchange (per-post credit)
STS16_PAIRS = 100  # per subset


def sample(rows: list, count: int, rng: random.Random) -> list:
    """``count`` rows drawn with ``rng``, in their original order."""
    return [rows[i] for i in sorted(rng.sample(range(len(rows)), min(count, len(rows))))]


def wiki_lines(root: Path) -> list[str]:
    lines = (root / "wiki/wiki1m_for_simcse.head11914.txt").read_text(encoding="utf-8").splitlines()
    return sample([line.strip() for line in lines if line.strip()], WIKI_SENTENCES, random.Random(SEED))


def stsb_rows(root: Path, split: str) -> list[tuple[str, ...]]:
    path = root / f"{STS_ROOT}/STSBenchmark/sts-{split}.csv"
    fields = [line.split("\t")[:7] for line in path.read_text(encoding="utf-8").splitlines() if line]
    kept = [("stsb", split, f[1], f[4], f[5], f[6]) for f in fields if f[1] in STSB_SOURCES]
    return sample(kept, STSB_PAIRS, random.Random(f"{SEED}-stsb-{split}"))


def sts16_rows(root: Path) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    for subset in STS16_SUBSETS:
        folder = root / f"{STS_ROOT}/STS16-en-test"
        inputs = (folder / f"STS.input.{subset}.txt").read_text(encoding="utf-8").splitlines()
        gold = (folder / f"STS.gs.{subset}.txt").read_text(encoding="utf-8").splitlines()
        scored = [
            ("sts16", "test", subset, score.strip(), *line.split("\t"))
            for line, score in zip(inputs, gold, strict=True)
            if score.strip()
        ]
        rows.extend(sample(scored, STS16_PAIRS, random.Random(f"{SEED}-sts16-{subset}")))
    return rows


def write_gzip(path: Path, lines: list[str]) -> None:
    """Gzip with no time stamp or file name in the header: the same lines give the same bytes."""
    buffer = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as out:
        out.write("".join(f"{line}\n" for line in lines).encode("utf-8"))
    path.write_bytes(buffer.getvalue())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=None, help="shared data folder (default: $CLSR_DATA_DIR)")
    parser.add_argument(
        "--out", type=Path, default=EMBEDDED_DIR, help="where to write (default: the package)"
    )
    args = parser.parse_args()
    root = resolve_data_dir(args.data_dir)
    if root is None:
        parser.error("set CLSR_DATA_DIR or --data-dir to the shared data folder")
    args.out.mkdir(parents=True, exist_ok=True)
    write_gzip(args.out / WIKI_FILE, wiki_lines(root))
    rows = [*stsb_rows(root, "dev"), *stsb_rows(root, "test"), *sts16_rows(root)]
    write_gzip(args.out / STS_FILE, ["\t".join(row) for row in rows])
    for name in (WIKI_FILE, STS_FILE):
        print(f"{args.out / name}: {(args.out / name).stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
