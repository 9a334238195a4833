"""The built-in data sets' Hugging Face hub sources, in one place: every hub id a loader may read, the
splits and files it publishes, and the columns the loaders use. ``load_from_hub`` refuses a request the
manifest does not list, so a loader can only ask for what was checked; a split the hub does not have
(SICK-R's dev set) fails with the local files to provide instead of a download error.

Each entry says where it was checked (``checked``): the hub's published dataset card or file list as
found in public references; this machine has no hub access, so the hub path has not been run here.
A user's own hub data (``data.train: owner/name``, ``eval.custom``) goes through
``clsr.data.external`` instead and is not limited by this list.

Revisions (``revision``): a pinned entry names the hub commit (40 hex digits) its loader asks for, so a
hub copy changed upstream is not read silently. The seven STS sets are pinned to the commits MTEB's own
task definitions pin (``mteb/tasks/STS/eng/*.py``, the ``revision`` of each ``TaskMetadata``). The others
are ``UNPINNED`` (None): no commit of theirs was known where this was written (no hub access), and a
made-up one would fail every load; they are read at the hub's default branch, and each trial logs the
commit they resolved to (``clsr.data.identity.digest.resolved_revision``, ``data.<name>.revision``). To pin or
refresh one: on a machine with hub access, ``huggingface_hub.HfApi().dataset_info(hub_id).sha`` gives the
current commit; check its splits and columns against the entry, write it here and say in ``checked`` when.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace

# The ids the loaders (and the embedded sample's check of the hub) name: here, below every loader
SIMCSE_HUB_ID = "princeton-nlp/datasets-for-simcse"  # wiki1m and nli_for_simcse
STS_HUB_IDS = {
    **{f"sts{year}": f"mteb/sts{year}-sts" for year in range(12, 17)},
    "stsb": "mteb/stsbenchmark-sts",
    "sickr": "mteb/sickr-sts",
}

UNPINNED = None  # an entry read at the hub's default branch (module docstring)


@dataclass(frozen=True)
class HubDataset:
    splits: tuple[str, ...]  # the splits the hub publishes (for ``files``: the split they load as)
    columns: tuple[str, ...]  # the columns the loaders read
    files: tuple[str, ...] = ()  # files loaded by name (``data_files=``)
    configs: tuple[str, ...] = ()  # the configurations (``name=``) a loader may ask for; () for none
    missing: str = ""  # what the hub does not have that a user might expect
    unusable: str = ""  # why the loaders cannot read it at all (then the local files are needed)
    checked: str = ""
    revision: str | None = UNPINNED  # the pinned hub commit, or UNPINNED (the default branch, see above)


# MTEB's pins (mteb/tasks/STS/eng: STS12STS.py … SickrSTS.py, STSBenchmarkSTS.py)
STS_REVISIONS = {
    "mteb/sts12-sts": "a0d554a64d88156834ff5ae9920b964011b16384",
    "mteb/sts13-sts": "7e90230a92c190f1bf69ae9002b8cea547a64cca",
    "mteb/sts14-sts": "6031580fec1f6af667f0bd2da0a551cf4f0b2375",
    "mteb/sts15-sts": "ae752c7c21bf194d8b67fd573edf7ae58183cbe3",
    "mteb/sts16-sts": "4d8694f8f0e0100860b497b999b3dbed754a0513",
    "mteb/stsbenchmark-sts": "b0fddb56ed78048fa8b90373c8a3cfc37b684831",
    "mteb/sickr-sts": "20a6d6f312dd54037fe07a32d58e5e168867909d",
}


_MTEB_STS = ("sentence1", "sentence2", "score")
_HF = "huggingface.co/datasets/{}: file tree and dataset viewer (stored copies, 2026)"

HUB_DATASETS: dict[str, HubDataset] = {
    "mteb/sts12-sts": HubDataset(
        ("train", "test"), _MTEB_STS, checked=_HF.format("mteb/sts12-sts") + ": train 2,234, test 3,108"
    ),
    **{
        f"mteb/{year}-sts": HubDataset(
            ("test",), _MTEB_STS, checked=_HF.format(f"mteb/{year}-sts") + f": {n}"
        )
        for year, n in (
            ("sts13", "test 1,500"),
            ("sts14", "test 3,750"),
            ("sts15", "test 3,000"),
            ("sts16", "test 1,186"),
        )
    },
    "mteb/stsbenchmark-sts": HubDataset(
        ("train", "validation", "test"),
        _MTEB_STS,
        checked=_HF.format("mteb/stsbenchmark-sts") + ": 5,749 / 1,500 / 1,379",
    ),
    "mteb/sickr-sts": HubDataset(
        ("test",),
        _MTEB_STS,
        missing="SICK-R's train and dev (trial) splits: its train and validation files were deleted in "
        "2022 as copies of test, and its test split holds all 9,927 SICK pairs (MTEB's SICK-R), not "
        "SentEval's 4,927-pair test set, so hub SICK-R scores are not the papers'. No hub copy has the "
        "official 4,500/500/4,927 split (RobZamp/sick: 4,439/495/4,906, a loading script)",
        checked=_HF.format("mteb/sickr-sts") + " at 20a6d6f (MTEB's revision), its commit history",
    ),
    "cornell-movie-review-data/rotten_tomatoes": HubDataset(
        ("train", "validation", "test"),
        ("text", "label"),
        checked=_HF.format("cornell-movie-review-data/rotten_tomatoes") + ": 8,530 / 1,066 / 1,066",
    ),
    "SetFit/SentEval-CR": HubDataset(
        ("train", "test"), ("text", "label"), checked=_HF.format("SetFit/SentEval-CR")
    ),
    "SetFit/subj": HubDataset(("train", "test"), ("text", "label"), checked=_HF.format("SetFit/subj")),
    "jxm/mpqa": HubDataset(
        ("train", "dev", "test"),
        ("sentence", "label"),
        checked=_HF.format("jxm/mpqa") + ": 8,603 / 256 / 2,000",
    ),
    "stanfordnlp/sst2": HubDataset(
        ("train", "validation", "test"),
        ("sentence", "label"),
        missing="SST-2 test labels (GLUE hides them: -1); the test split comes from SetFit/sst2",
        checked=_HF.format("stanfordnlp/sst2") + ": 67,349 / 872 / 1,821",
    ),
    "SetFit/sst2": HubDataset(
        ("train", "validation", "test"),
        ("text", "label"),
        checked=_HF.format("SetFit/sst2") + ": 6,920 / 872 / 1,821",
    ),
    "CogComp/trec": HubDataset(
        ("train", "test"),
        ("text", "coarse_label"),
        unusable="it is a loading script (trec.py, downloading from cogcomp.org), which datasets 4 and later "
        "no longer run",
        checked=_HF.format("CogComp/trec") + ": 5,452 / 500, trec.py only",
    ),
    "SetFit/mrpc": HubDataset(
        ("train", "validation", "test"),
        ("text1", "text2", "label"),
        checked=_HF.format("SetFit/mrpc") + ": 3,668 / 408 / 1,725",
    ),
    "princeton-nlp/datasets-for-simcse": HubDataset(
        ("train",),
        ("text", "sent0", "sent1", "hard_neg"),
        files=("wiki1m_for_simcse.txt", "nli_for_simcse.csv"),
        checked=_HF.format("princeton-nlp/datasets-for-simcse") + ": both files (120 MB, 49 MB)",
    ),
    "stanfordnlp/snli": HubDataset(
        ("train", "validation", "test"),
        ("premise", "hypothesis", "label"),
        checked=_HF.format("stanfordnlp/snli")
        + ": config plain_text, 550,152 / 10,000 / 10,000 (label -1: no gold)",
    ),
    "nyu-mll/multi_nli": HubDataset(
        ("train", "validation_matched", "validation_mismatched"),
        ("premise", "hypothesis", "label"),
        checked=_HF.format("nyu-mll/multi_nli") + ": 392,702 / 9,815 / 9,832",
    ),
    "nyu-mll/glue": HubDataset(  # SimCSE Table 4's QQP
        ("train", "validation", "test"),
        ("question1", "question2", "label"),
        configs=("qqp",),
        missing="QQP's test labels (GLUE hides them: -1)",
        checked=_HF.format("nyu-mll/glue") + ": config qqp, qqp/train-00000-of-00001.parquet (33.6 MB), "
        "features question1, question2, label, idx (README dataset_info)",
    ),
    "embedding-data/flickr30k_captions_quintets": HubDataset(
        ("train",),
        ("set",),
        files=("flickr30k_captions.jsonl.gz",),
        checked=_HF.format("embedding-data/flickr30k_captions_quintets")
        + ": flickr30k_captions.jsonl.gz (3.11 MB), 31.8k rows, a 'set' of five captions each",
    ),
    "wikimedia/wikipedia": HubDataset(  # SimCSE Table 2's ordered text (wiki_ordered), streamed
        ("train",),
        ("id", "text"),
        configs=("20231101.en",),
        checked=_HF.format("wikimedia/wikipedia") + ": config 20231101.en (one per language of the "
        "2023-11-01 dump), split train, features id, url, title, text (public code loading it by that name)",
    ),
    "facebook/anli": HubDataset(
        ("train_r1", "train_r2", "train_r3", "dev_r1", "dev_r2", "dev_r3", "test_r1", "test_r2", "test_r3"),
        ("premise", "hypothesis", "label"),
        checked=_HF.format("facebook/anli") + ": config plain_text, one parquet per split",
    ),
}


for _hub_id, _commit in STS_REVISIONS.items():
    HUB_DATASETS[_hub_id] = replace(HUB_DATASETS[_hub_id], revision=_commit)


def pinned_revision(hub_id: str) -> str | None:
    """The commit a built-in loader reads ``hub_id`` at; None for an unpinned or unlisted id."""
    entry = HUB_DATASETS.get(hub_id)
    return entry.revision if entry is not None else None


class NotInManifest(LookupError):
    """A built-in loader asked the hub for something the manifest does not list."""


def require_listed(
    hub_id: str, splits: Iterable[str] = (), files: Iterable[str] = (), config: str | None = None
) -> HubDataset:
    """The manifest's entry for ``hub_id`` when it lists every split and file asked for, and the
    configuration (the columns are the listed configuration's)."""
    entry = HUB_DATASETS.get(hub_id)
    if entry is None:
        raise NotInManifest(f"{hub_id!r} is not a built-in hub source (clsr.data.hub.manifest)")
    if entry.unusable:
        raise NotInManifest(f"{hub_id!r} cannot be read from the hub: {entry.unusable}")
    if config is not None and config not in entry.configs:
        raise NotInManifest(
            f"{hub_id!r} is listed with configuration(s) {', '.join(entry.configs) or 'none'}, not {config!r}"
        )
    unlisted = [s for s in splits if s not in entry.splits] + [f for f in files if f not in entry.files]
    if unlisted:
        missing = f" ({entry.missing})" if entry.missing else ""
        raise NotInManifest(
            f"{hub_id!r} does not publish {', '.join(unlisted)}; it has split(s) {', '.join(entry.splits)}"
            f"{' and file(s) ' + ', '.join(entry.files) if entry.files else ''}{missing}"
        )
    return entry
