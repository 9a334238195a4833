"""Rule 2: nothing is unpickled unless this process, in this run, wrote it; third-party artefacts are
pinned and hashed. The attacks of issue 52: a co-tenant's pickle planted in the shared /tmp/ray where
the Tune-state repair looked for a backup (and unpickled each candidate to test it), and GCLSR's word
vectors loaded as gensim pickles from an unpinned hub repository."""

from __future__ import annotations

import hashlib
import os
import pickle
from pathlib import Path

import pytest

from clsr.study.run.tune_state import UnreadableTuneState, repair_before_restore
from tests.security.rule123_cotenant import as_cotenant, shared_tmp
from tests.unit.study.run.test_tune_state import (
    EXPERIMENT_STATE,
    SEARCHER_STATE,
    SESSION,
    TRIAL_DIR,
    experiment_state,
    state_folder,
)


class Payload:
    """What a planted pickle runs when it is unpickled: it leaves a marker file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture()
def shared(monkeypatch):
    with shared_tmp(monkeypatch) as folder:
        yield folder


def _storage(tmp_path: Path, searcher: bytes = b"\x80\x04trunc") -> Path:
    """A stopped driver's experiment in storage: its searcher state cut short by the kill."""
    return state_folder(
        tmp_path / "runs" / "grid", **{EXPERIMENT_STATE: experiment_state(), SEARCHER_STATE: searcher}
    )


def _staged(ray_root: Path) -> Path:
    return ray_root / "session_2026-11-25_14-07-30_1_2" / "artifacts" / SESSION / "grid" / "driver_artifacts"


def test_a_pickle_planted_in_the_shared_ray_folder_is_never_run(shared, tmp_path):
    marker = tmp_path / "ran"
    payload = shared / "payload.pkl"
    payload.write_bytes(pickle.dumps(Payload(marker)))
    payload.chmod(0o644)
    storage = _storage(tmp_path)
    staged = _staged(shared / "ray")  # where the repair used to look, with names the user's staging shows
    as_cotenant(f"mkdir -p -m 777 {staged}/{TRIAL_DIR} && cp {payload} {staged}/{SEARCHER_STATE}")
    with pytest.raises(UnreadableTuneState):  # no copy of this user's: the resume stops, saying so
        repair_before_restore(str(storage), grid=False)
    with pytest.raises(UnreadableTuneState):  # nor when pointed at the shared folder itself
        repair_before_restore(str(storage), grid=False, staging_roots=[shared / "ray"])
    assert not marker.exists()


def test_a_whole_pickle_in_storage_is_checked_without_being_run(tmp_path):
    marker = tmp_path / "ran"
    storage = _storage(tmp_path, searcher=pickle.dumps(Payload(marker)))
    assert repair_before_restore(str(storage), grid=False, staging_roots=[]) == []
    assert not marker.exists()


def test_a_candidate_in_the_private_folder_is_checked_without_being_run(shared, tmp_path):
    from clsr import runtime_dir

    marker = tmp_path / "ran"
    storage = _storage(tmp_path)
    staged = _staged(runtime_dir.ray_folder())
    state_folder(staged, **{SEARCHER_STATE: pickle.dumps(Payload(marker))})
    [line] = repair_before_restore(str(storage), grid=False)
    assert "restored from the stopped driver's copy" in line and not marker.exists()


def test_gclsrs_named_vectors_never_come_from_the_hubs_pickles(monkeypatch, tmp_path):
    """GCLSR's two named sets exist on the hub only as gensim pickles at no pinned revision: they are
    read as their publishers' word2vec/GloVe files from the data folder, never downloaded or unpickled;
    missing, they are refused in one line naming the file and where it comes from."""
    import huggingface_hub
    from gensim.models import KeyedVectors

    from clsr.data.sources import DataUnavailableError
    from clsr.encoders.word_vectors import NAMED_VECTORS, build_word_table, named_vectors_unavailable

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **k: pytest.fail("downloaded"))
    monkeypatch.setattr(KeyedVectors, "load", lambda *a, **k: pytest.fail("a gensim pickle was loaded"))
    for name in ("word2vec-google-news-300", "glove-wiki-gigaword-300"):
        with pytest.raises(DataUnavailableError, match="gensim pickles") as err:
            build_word_table(name, ["the"], data_dir=tmp_path)
        assert "\n" not in str(err.value) and str(tmp_path / NAMED_VECTORS[name].local_file) in str(err.value)
        assert named_vectors_unavailable(name, tmp_path) == str(err.value)  # validate says the same
    glove = tmp_path / NAMED_VECTORS["glove-wiki-gigaword-300"].local_file
    glove.parent.mkdir()
    glove.write_text("the 0.1 0.2 0.3\ncat 0.4 0.5 0.6\n")
    assert named_vectors_unavailable("glove-wiki-gigaword-300", tmp_path) is None
    assert build_word_table("glove-wiki-gigaword-300", ["the", "dog"], data_dir=tmp_path).words == ["the"]


@pytest.fixture()
def pinned(monkeypatch, tmp_path):
    """A named set pinned to a word2vec text file, served by a stand-in for the hub download."""
    import huggingface_hub
    from gensim.models import KeyedVectors

    from clsr.encoders import word_vectors

    vectors = tmp_path / "vectors.txt"
    vectors.write_text("2 3\nthe 0.1 0.2 0.3\ncat 0.4 0.5 0.6\n")
    downloads = []
    monkeypatch.setattr(
        huggingface_hub,
        "hf_hub_download",
        lambda *a, **k: downloads.append(k.get("revision")) or str(vectors),
    )
    monkeypatch.setattr(KeyedVectors, "load", lambda *a, **k: pytest.fail("a gensim pickle was loaded"))

    def pin(sha256: str) -> None:
        spec = word_vectors.NamedVectors(
            "word2vec_text", "owner/vectors", "vectors.txt", revision="abc123", sha256=sha256
        )
        monkeypatch.setitem(word_vectors.NAMED_VECTORS, "pinned", spec)

    return vectors, pin, downloads


def test_pinned_vectors_load_from_text_at_their_revision_with_their_hash(pinned):
    from clsr.data.sources import DataUnavailableError
    from clsr.encoders.word_vectors import build_word_table

    vectors, pin, downloads = pinned
    pin("0" * 64)
    with pytest.raises(DataUnavailableError, match="is not the pinned"):
        build_word_table("pinned", ["the"])
    pin(hashlib.sha256(vectors.read_bytes()).hexdigest())
    table = build_word_table("pinned", ["the", "dog"])
    assert table.words == ["the"] and downloads == ["abc123", "abc123"]
