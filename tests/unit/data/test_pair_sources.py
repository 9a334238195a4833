"""SimCSE Table 4's other pair sources (clsr.data.pair_sources) read from hand-made local copies in each
source's own format, compared with rows written out by hand; their hub path is in hub/test_manifest.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

from clsr.data.catalog import dataset_columns, load_rows

CAPTIONS = ["A dog runs .", "A brown dog is running .", "", "The dog runs on grass .", "A pet outside ."]


def test_qqp_pairs_are_its_duplicates(tmp_path: Path) -> None:
    (tmp_path / "qqp").mkdir()
    (tmp_path / "qqp" / "train.tsv").write_text(
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate\n"
        '0\t1\t2\tHow do I learn "Python"?\tWhat is the best way to learn Python?\t1\n'
        "1\t3\t4\tWhy is the sky blue?\tHow far is the moon?\t0\n"
        "2\t5\t6\t What is love? \tWhat does love mean?\t1\n"
    )
    assert load_rows("qqp_pairs", tmp_path) == [
        {"anchor": 'How do I learn "Python"?', "positive": "What is the best way to learn Python?"},
        {"anchor": "What is love?", "positive": "What does love mean?"},
    ]
    assert dataset_columns("qqp_pairs") == ("anchor", "positive")


def test_flickr30k_pairs_are_every_two_captions_of_one_image(tmp_path: Path) -> None:
    (tmp_path / "flickr30k").mkdir()
    with gzip.open(tmp_path / "flickr30k" / "flickr30k_captions.jsonl.gz", "wt", encoding="utf-8") as f:
        f.write(json.dumps({"set": CAPTIONS}) + "\n" + json.dumps({"set": ["One .", "Two ."]}) + "\n")
    rows = load_rows("flickr30k_pairs", tmp_path)
    kept = [c for c in CAPTIONS if c]  # an empty caption is no sentence
    assert len(rows) == 6 + 1  # C(4, 2) + C(2, 2): 10 per image of five captions
    assert rows[:3] == [{"anchor": kept[0], "positive": kept[i]} for i in (1, 2, 3)]
    assert rows[-1] == {"anchor": "One .", "positive": "Two ."}


def test_anli_triplets_follow_simcses_own(tmp_path: Path) -> None:
    (tmp_path / "nli").mkdir()
    (tmp_path / "nli" / "nli_for_simcse.csv").write_text(
        "sent0,sent1,hard_neg\nA man sleeps .,A person rests .,A man runs .\n"
    )
    anli = {  # ANLI's release: label e / n / c; the premise of round 1 has an entailment and a contradiction
        1: [
            ("Paris is in France .", "Paris is French .", "e"),
            ("Paris is in France .", "Paris is in Spain .", "c"),
        ],
        2: [("Ice is cold .", "Ice is frozen water .", "n")],
        3: [("Rome is old .", "Rome is ancient .", "e")],
    }
    for n, rows in anli.items():
        (tmp_path / "anli" / f"R{n}").mkdir(parents=True)
        lines = [
            json.dumps({"uid": str(i), "context": c, "hypothesis": h, "label": lab})
            for i, (c, h, lab) in enumerate(rows)
        ]
        (tmp_path / "anli" / f"R{n}" / "train.jsonl").write_text("\n".join(lines) + "\n")
    assert load_rows("nli_anli_for_simcse", tmp_path) == [
        {"anchor": "A man sleeps .", "positive": "A person rests .", "negative": "A man runs ."},
        {
            "anchor": "Paris is in France .",
            "positive": "Paris is French .",
            "negative": "Paris is in Spain .",
        },
    ]  # Rome has no contradiction and Ice no entailment: no triplet, as in SimCSE's construction
