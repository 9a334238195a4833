"""The built-in loaders' hub path asks only for what ``clsr.data.hub.manifest`` lists: every loader runs
with ``datasets.load_dataset`` replaced by one that records the request and serves a small real
``datasets.Dataset`` holding exactly the manifest's columns (a column a loader reads that the manifest
does not list fails). SICK-R dev, which the hub does not publish, is refused with the file to provide,
by the loader and by ``study validate``."""

from __future__ import annotations

import textwrap
import warnings

import datasets
import pytest

from clsr.cli import main
from clsr.data.corpora import load_nli_for_simcse, load_nli_pairs, load_wiki_sentences
from clsr.data.hub.manifest import HUB_DATASETS, NotInManifest, require_listed
from clsr.data.ordered_text import load_wiki_ordered
from clsr.data.pair_sources import load_anli_pairs, load_flickr30k_pairs, load_qqp_pairs
from clsr.data.sources import DataUnavailableError
from clsr.data.sts import HUB_IDS, STS_TASKS, allowed_splits, load_sts
from clsr.data.transfer import TRANSFER_TASKS, TREC_CLASSES, load_transfer


def fake_split(columns: tuple[str, ...]) -> datasets.Dataset:
    values = {
        "score": [4.5, 1.0],
        "label": [1, 0],
        "coarse_label": [1, 3],
    }
    data = {c: values.get(c, [f"first {c} row .", f"second {c} row ."]) for c in columns}
    features = {
        c: datasets.Value("float64" if c == "score" else "int64" if c == "label" else "string") for c in data
    }
    if "set" in data:  # Flickr30k's five captions per image
        data["set"] = [[f"caption {i} of {image} ." for i in range(5)] for image in ("one", "two")]
        features["set"] = datasets.Sequence(datasets.Value("string"))
    if "coarse_label" in data:
        features["coarse_label"] = datasets.ClassLabel(names=list(TREC_CLASSES))
    return datasets.Dataset.from_dict(data, features=datasets.Features(features))


@pytest.fixture
def hub_requests(monkeypatch) -> list[tuple[str, dict]]:
    requests: list[tuple[str, dict]] = []

    def load_dataset(hub_id: str, **kwargs):
        requests.append((hub_id, kwargs))
        entry = HUB_DATASETS[hub_id]  # a KeyError here: an id the manifest check let through
        if kwargs.get("split"):
            return fake_split(entry.columns)
        return datasets.DatasetDict({split: fake_split(entry.columns) for split in entry.splits})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr("clsr.data.embedded.hub_serves", lambda hub_id: True)  # not the embedded set
    return requests


def listed(hub_id: str, kwargs: dict) -> bool:
    entry = HUB_DATASETS.get(hub_id)
    split, files = kwargs.get("split"), kwargs.get("data_files")
    return (
        entry is not None
        and (split is None or split in entry.splits)
        and (files is None or files in entry.files)
    )


def test_every_loader_asks_the_hub_only_for_what_the_manifest_lists(hub_requests, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path))  # where wiki_ordered keeps the rows it built
    for task in STS_TASKS:
        for split in allowed_splits(task):
            if task == "sickr" and split != "test":
                continue  # not published: refused below
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                assert len(load_sts(task, split, None).scores) == 2
            if task == "sickr":  # its hub test set is all of SICK, not SentEval's: said
                assert "9,927 SICK pairs" in str(caught[0].message)
    for task in TRANSFER_TASKS:
        if task == "trec":
            continue  # a loading script: refused below
        assert load_transfer(task, None).splits
    assert load_wiki_sentences(None)
    assert load_nli_for_simcse(None)
    load_nli_pairs(None)
    assert len(load_qqp_pairs(None)) == 1  # the fake's labels are [1, 0]: one duplicate
    assert len(load_flickr30k_pairs(None)) == 2 * 10  # every two of five captions, per image
    assert len(load_anli_pairs(None)) == 3 * 2  # three training rounds
    streamed = load_wiki_ordered(None)  # the stream's articles, split
    assert [r["text"] for r in streamed] == ["first text row .", "second text row ."]
    before = len(hub_requests)
    assert load_wiki_ordered(None) == streamed and len(hub_requests) == before  # the copy kept, not the hub
    asked = {hub_id for hub_id, _ in hub_requests}
    readable = {hub_id for hub_id, entry in HUB_DATASETS.items() if not entry.unusable}
    assert asked == readable  # every readable listed source is used, and nothing else
    assert all(listed(hub_id, kwargs) for hub_id, kwargs in hub_requests)


def test_sickr_dev_from_the_hub_is_refused_with_the_file_to_provide(hub_requests):
    with pytest.raises(DataUnavailableError) as err:
        load_sts("sickr", "dev", None)
    assert "'mteb/sickr-sts' does not publish validation; it has split(s) test" in str(err.value)
    assert "senteval/downstream/SICK/SICK_trial.txt" in str(err.value)
    assert hub_requests == []  # refused before any download


def test_trec_from_the_hub_is_refused_with_the_files_to_provide(hub_requests):
    with pytest.raises(DataUnavailableError) as err:
        load_transfer("trec", None)
    assert "'CogComp/trec' cannot be read from the hub: it is a loading script" in str(err.value)
    assert "senteval/downstream/TREC/train_5500.label" in str(err.value)
    assert hub_requests == []


def test_an_unlisted_source_is_refused():
    with pytest.raises(NotInManifest, match="not a built-in hub source"):
        require_listed("someone/else")
    with pytest.raises(NotInManifest, match="does not publish nli.csv"):
        require_listed("princeton-nlp/datasets-for-simcse", files=["nli.csv"])
    with pytest.raises(NotInManifest, match="configuration\\(s\\) qqp, not 'mrpc'"):
        require_listed("nyu-mll/glue", ["train"], config="mrpc")  # another GLUE task has other columns
    assert set(HUB_IDS.values()) <= set(HUB_DATASETS)


def test_study_validate_refuses_sickr_dev_without_a_data_folder(tmp_path, capsys, monkeypatch):
    study = tmp_path / "sick.yaml"
    study.write_text(
        textwrap.dedent(
            """\
            name: sick
            method: simcse_sup
            metric: best_dev_sickr
            base:
              model: {name: minilm, pooling: avg}
              data: {train: nli_triplets}
              eval: {dev_tasks: [sickr], select_on: sickr}
            ablations:
              temp:
                grid: {method.temperature: [0.05, 0.1]}
            """
        )
    )
    assert main(["study", "validate", str(study)]) == 0  # CLSR_DATA_DIR holds SICK_trial.txt
    capsys.readouterr()
    monkeypatch.delenv("CLSR_DATA_DIR")
    assert main(["study", "validate", str(study)]) == 1
    err = capsys.readouterr().err
    assert (
        "eval.dev_tasks sickr: no data folder is set, so it would come from the hub, but 'mteb/sickr-sts'"
        in err
    )
    assert "senteval/downstream/SICK/SICK_trial.txt" in err


def test_a_pinned_hub_set_is_asked_for_at_its_commit_and_an_unpinned_one_at_the_default(hub_requests):
    """Issue 55: the STS sets at MTEB's pinned commits; the others (``UNPINNED``) at the hub's default branch."""
    from clsr.data.hub.manifest import STS_REVISIONS

    load_sts("sts12", "test", None)
    load_transfer("mr", None)
    (sts_id, sts_kwargs), (mr_id, mr_kwargs) = hub_requests
    assert sts_kwargs["revision"] == STS_REVISIONS[sts_id] == "a0d554a64d88156834ff5ae9920b964011b16384"
    assert mr_id == "cornell-movie-review-data/rotten_tomatoes" and "revision" not in mr_kwargs
