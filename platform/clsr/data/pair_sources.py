"""SimCSE Table 4's supervised pair sources beyond SNLI and MultiNLI (§5, "Exploiting supervised data").

* **QQP** (``qqp_pairs``): the Quora Question Pairs train split of GLUE, its duplicates (label 1) as
  (question1, question2): 134,378 of its 363,846 pairs, the table's "QQP (134k)".
* **Flickr30k** (``flickr30k_pairs``): the five captions of each of Flickr30k's 31,783 images; every two
  captions of one image are a positive pair, 10 per image: 317,830 pairs, the table's "Flickr30k (318k)".
* **ANLI** (``nli_anli_for_simcse``): SimCSE's released SNLI+MNLI triplets followed by triplets built the
  same way from ANLI's three training rounds (a premise, an entailed hypothesis, a seeded contradicted
  one), the table's "+ ANLI (52k)" row. How many ANLI premises yield a triplet (the paper's 52k) is not
  checked here: this machine has no hub access.

* **ParaNMT** (``paranmt_pairs``): the 5m filtered ParaNMT-50M pairs Wieting & Gimpel released as
  ``para-nmt-5m-processed.txt`` (two tab-separated sentences a line), the table's "ParaNMT (5m)". No hub
  copy documents its columns or its filtering, so it is read only from the data folder.

Each other one comes from the hub source ``clsr.data.hub.manifest`` lists, or from the same file under the
data folder when it is there (the shared offline folder has none of them).
"""

from __future__ import annotations

import csv
import gzip
import itertools
import json
import os

from clsr.data.corpora import NLIPair, build_simcse_triplets, load_nli_for_simcse
from clsr.data.sources import DataUnavailableError, load_from_hub, local_files

QQP_HUB_ID, QQP_FILE = "nyu-mll/glue", "qqp/train.tsv"  # GLUE's own TSV: question1, question2, is_duplicate
FLICKR_HUB_ID, FLICKR_NAME = "embedding-data/flickr30k_captions_quintets", "flickr30k_captions.jsonl.gz"
FLICKR_FILE = f"flickr30k/{FLICKR_NAME}"  # one JSON object per image: {"set": [five captions]}
ANLI_HUB_ID, ANLI_ROUNDS = "facebook/anli", ("train_r1", "train_r2", "train_r3")
ANLI_FILES = tuple(f"anli/R{n}/train.jsonl" for n in (1, 2, 3))  # ANLI's release: context, hypothesis, label
PARANMT_FILE = "paranmt/para-nmt-5m-processed.txt"  # sentence<TAB>paraphrase, one pair a line
PARANMT_RELEASE = "https://www.cs.cmu.edu/~jwieting/ (ParaNMT-50M, the para-nmt-5m-processed.zip release)"
_ANLI_LABELS = {"e": "entailment", "n": "neutral", "c": "contradiction", "0": "entailment", "1": "neutral", "2": "contradiction"}  # fmt: skip


def load_qqp_pairs(data_dir: str | os.PathLike[str] | None = None) -> list[dict[str, str]]:
    """QQP's duplicate question pairs (label 1) of its train split, as anchor/positive rows."""
    if files := local_files(data_dir, QQP_FILE):
        with files[0].open(encoding="utf-8", newline="") as f:
            rows = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
            pairs = [(r["question1"], r["question2"], r["is_duplicate"]) for r in rows]
    else:
        data = load_from_hub(QQP_HUB_ID, local_hint=QQP_FILE, name="qqp", split="train")
        pairs = list(zip(data["question1"], data["question2"], map(str, data["label"]), strict=True))
    return [
        {"anchor": q1.strip(), "positive": q2.strip()}
        for q1, q2, duplicate in pairs
        if duplicate.strip() == "1" and q1.strip() and q2.strip()
    ]


def load_flickr30k_pairs(data_dir: str | os.PathLike[str] | None = None) -> list[dict[str, str]]:
    """Every two captions of one Flickr30k image, in caption order, as anchor/positive rows."""
    if files := local_files(data_dir, FLICKR_FILE):
        with gzip.open(files[0], "rt", encoding="utf-8") as f:
            sets = [json.loads(line)["set"] for line in f if line.strip()]
    else:
        sets = load_from_hub(FLICKR_HUB_ID, local_hint=FLICKR_FILE, data_files=FLICKR_NAME, split="train")[
            "set"
        ]
    rows = []
    for captions in sets:
        kept = [c.strip() for c in captions if c and c.strip()]
        rows += [{"anchor": a, "positive": b} for a, b in itertools.combinations(kept, 2)]
    return rows


def load_anli_pairs(data_dir: str | os.PathLike[str] | None = None) -> list[NLIPair]:
    """ANLI's three training rounds as gold-labelled NLI pairs."""
    if files := local_files(data_dir, *ANLI_FILES):
        rows = []
        for path in files:
            with path.open(encoding="utf-8") as f:
                records = [json.loads(line) for line in f if line.strip()]
                rows += [(r["context"], r["hypothesis"], r["label"]) for r in records]
    else:
        rows = []
        for split in ANLI_ROUNDS:
            data = load_from_hub(ANLI_HUB_ID, local_hint=" and ".join(ANLI_FILES), split=split)
            rows += zip(data["premise"], data["hypothesis"], map(str, data["label"]), strict=True)
    pairs = []
    for premise, hypothesis, label in rows:
        name = _ANLI_LABELS.get(str(label).strip().lower())
        if name and premise.strip() and hypothesis.strip():
            pairs.append(NLIPair(premise.strip(), hypothesis.strip(), name))
    return pairs


def load_nli_anli_for_simcse(
    data_dir: str | os.PathLike[str] | None = None, seed: int = 0
) -> list[dict[str, str]]:
    """SimCSE's SNLI+MNLI triplets, then ANLI's built the same way (premise, entailment, contradiction)."""
    return load_nli_for_simcse(data_dir) + build_simcse_triplets(load_anli_pairs(data_dir), seed)


def load_paranmt_pairs(data_dir: str | os.PathLike[str] | None = None) -> list[dict[str, str]]:
    """ParaNMT's filtered 5m pairs as anchor/positive rows; a line without two tab-separated sentences is
    refused with its number (the file is the user's download, not a checked hub copy)."""
    files = local_files(data_dir, PARANMT_FILE)
    if not files:
        raise DataUnavailableError(
            f"paranmt_pairs has no hub copy: download {PARANMT_RELEASE}, unzip it to "
            f"<data_dir>/{PARANMT_FILE} and point CLSR_DATA_DIR / data.data_dir at that data_dir"
        )
    rows = []
    with files[0].open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = [field.strip() for field in line.rstrip("\n").split("\t")]
            if len(fields) < 2 or not fields[0] or not fields[1]:
                if not line.strip():
                    continue
                raise ValueError(
                    f"{files[0]}:{number}: expected a sentence and its paraphrase separated by a tab "
                    f"(ParaNMT's para-nmt-5m-processed.txt), got {line.strip()[:80]!r}"
                )
            rows.append({"anchor": fields[0], "positive": fields[1]})
    return rows
