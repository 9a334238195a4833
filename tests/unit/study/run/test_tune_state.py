"""Tune's saved experiment state, checked and repaired before a resume restores it: what a driver killed
while Tune copied that state to storage leaves behind (clsr.study.run.tune_state). No Ray cluster runs here;
tests/e2e/test_record.py resumes a killed driver's study through the real command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from clsr.study.run.tune_state import UnreadableTuneState, repair_before_restore

SESSION = "2026-11-25_14-07-34"
TRIAL_DIR = f"run_trial_90249_00000_0_point=one_{SESSION}"
EXPERIMENT_STATE = f"experiment_state-{SESSION}.json"
SEARCHER_STATE = f"basic-variant-state-{SESSION}.json"


def experiment_state() -> bytes:
    trial = {"trial_id": "90249_00000", "relative_logdir": TRIAL_DIR, "config": {"point": {"seed": 1}}}
    return json.dumps({"trial_data": [[json.dumps(trial), "{}"]], "runner_data": {}, "stats": {}}).encode()


def searcher_state(folder: Path) -> bytes:
    from ray.tune.search import BasicVariantGenerator

    folder.mkdir(parents=True)
    BasicVariantGenerator().save_to_dir(str(folder), session_str=SESSION)
    return (folder / SEARCHER_STATE).read_bytes()


def state_folder(folder: Path, **files: bytes) -> Path:
    """An experiment folder as Tune writes it: the state files and one trial's folder."""
    (folder / TRIAL_DIR).mkdir(parents=True)
    for name, data in files.items():
        (folder / name).write_bytes(data)
    return folder


@pytest.fixture()
def searcher(tmp_path) -> bytes:
    return searcher_state(tmp_path / "made")


def test_complete_state_is_left_as_it_is(tmp_path, searcher):
    storage = state_folder(
        tmp_path / "runs" / "grid", **{EXPERIMENT_STATE: experiment_state(), SEARCHER_STATE: searcher}
    )
    assert repair_before_restore(str(storage), grid=True, staging_roots=[]) == []
    assert (storage / SEARCHER_STATE).read_bytes() == searcher


def test_the_stopped_drivers_staging_copy_replaces_a_truncated_file(tmp_path, searcher):
    """Tune copies its staging folder to storage in place: a kill during the copy truncates the storage
    file, while the staging copy was already complete. Only this experiment's staging folder is used."""
    storage = state_folder(
        tmp_path / "runs" / "grid", **{EXPERIMENT_STATE: b'{"trial_da', SEARCHER_STATE: b""}
    )
    ray_tmp = tmp_path / "ray"
    staged = ray_tmp / "session_2026-11-25_14-07-30_1_2" / "artifacts" / SESSION / "grid" / "driver_artifacts"
    state_folder(staged, **{EXPERIMENT_STATE: experiment_state(), SEARCHER_STATE: searcher})
    # another study's experiment named "grid", staged in the same second: its trials are not these
    other = ray_tmp / "session_2026-11-25_14-07-31_1_3" / "artifacts" / SESSION / "grid" / "driver_artifacts"
    (other / "run_trial_77777_00000_0_2026-11-25_14-07-34").mkdir(parents=True)
    (other / EXPERIMENT_STATE).write_text(json.dumps({"trial_data": []}))

    lines = repair_before_restore(str(storage), grid=True, staging_roots=[ray_tmp])

    assert len(lines) == 2 and all("restored from the stopped driver's copy" in line for line in lines)
    assert str(staged) in lines[0] and str(other) not in "".join(lines)
    assert (storage / EXPERIMENT_STATE).read_bytes() == experiment_state()
    assert (storage / SEARCHER_STATE).read_bytes() == searcher
    assert sorted(p.name for p in storage.iterdir()) == sorted([EXPERIMENT_STATE, SEARCHER_STATE, TRIAL_DIR])


def test_a_grids_unreadable_searcher_state_is_set_aside_where_tune_does_not_read_it(tmp_path):
    from ray.tune.search import BasicVariantGenerator

    storage = state_folder(
        tmp_path / "runs" / "grid", **{EXPERIMENT_STATE: experiment_state(), SEARCHER_STATE: b""}
    )
    [line] = repair_before_restore(str(storage), grid=True, staging_roots=[tmp_path / "no-ray"])
    assert f"{SEARCHER_STATE}: unreadable (empty); set aside" in line
    assert not (storage / SEARCHER_STATE).exists() and (storage / f"{SEARCHER_STATE}.unreadable").exists()
    assert not BasicVariantGenerator().has_checkpoint(str(storage))  # Tune restores without it
    assert (storage / EXPERIMENT_STATE).read_bytes() == experiment_state()


@pytest.mark.parametrize("lost", ["experiment state", "sampled searcher state"])
def test_state_that_cannot_be_recovered_stops_the_resume(tmp_path, searcher, lost):
    """An unreadable experiment state (any experiment), or a sampled experiment's searcher state, with no
    complete copy: the resume stops, saying so, rather than letting Tune start the experiment over."""
    broken = {EXPERIMENT_STATE: b"", SEARCHER_STATE: searcher}
    if lost != "experiment state":
        broken = {EXPERIMENT_STATE: experiment_state(), SEARCHER_STATE: searcher[:20]}
    storage = state_folder(tmp_path / "runs" / "lr", **broken)
    with pytest.raises(UnreadableTuneState, match="cannot be read: .* continued from their checkpoints"):
        repair_before_restore(str(storage), grid=lost == "experiment state", staging_roots=[])
    assert {p.name: p.read_bytes() for p in storage.iterdir() if p.is_file()} == broken  # nothing moved


def state_with_checkpoint(checkpoint: Path) -> bytes:
    """An experiment state naming ``checkpoint`` as its trial's latest, written by Tune's own classes."""
    from ray.train import Checkpoint, CheckpointConfig
    from ray.train._internal.checkpoint_manager import _CheckpointManager
    from ray.train._internal.session import _TrainingResult
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    metadata = _TrainingRunMetadata()
    manager = _CheckpointManager(CheckpointConfig(num_to_keep=1))
    manager.register_checkpoint(_TrainingResult(checkpoint=Checkpoint(str(checkpoint)), metrics={"step": 50}))
    metadata.checkpoint_manager = manager
    trial = {"trial_id": "90249_00000", "relative_logdir": TRIAL_DIR, "config": {"point": {"seed": 1}}}
    data = {"trial_data": [[json.dumps(trial), metadata.get_json_state()]], "runner_data": {}, "stats": {}}
    return json.dumps(data).encode()


def complete(folder: Path) -> None:
    """A checkpoint folder as the trainer writes it: its files, then the manifest that lists them."""
    folder.mkdir()
    (folder / "state.pt").write_bytes(b"weights")
    (folder / "manifest.json").write_text(json.dumps({"sha256": {"state.pt": "0" * 64}}))


def latest_checkpoint(state_file: Path) -> str | None:
    from clsr.study.run.tune_compat import saved_latest_checkpoint

    [[_, metadata]] = json.loads(state_file.read_text())["trial_data"]
    latest = saved_latest_checkpoint(metadata)
    return latest.path if latest else None


@pytest.mark.parametrize("left", [["checkpoint_000006"], []])
def test_a_saved_checkpoint_deleted_before_the_state_was_saved_again_is_replaced(tmp_path, searcher, left):
    """Tune deleted checkpoint 5 when it registered 6, and the driver was killed before Tune saved its
    state again (and while it copied 7): 6, the newest complete one, takes 5's name, so the state stays as
    Tune wrote it (its next checkpoint is 6 again); with none left the trial starts over. Either way the
    resume no longer fails the trial with "Could not recover from checkpoint ... does not exist"."""
    storage = tmp_path / "runs" / "grid"
    gone = storage / TRIAL_DIR / "checkpoint_000005"
    state = state_with_checkpoint(gone)
    state_folder(storage, **{EXPERIMENT_STATE: state, SEARCHER_STATE: searcher})
    for name in left:
        complete(storage / TRIAL_DIR / name)
    (storage / TRIAL_DIR / "checkpoint_000007").mkdir()  # the copy a kill cut short: no manifest

    [line] = repair_before_restore(str(storage), grid=True, staging_roots=[])

    assert f"saved checkpoint {gone} is gone" in line
    left_now = sorted(p.name for p in (storage / TRIAL_DIR).iterdir())
    if left:
        assert f"the newer {storage / TRIAL_DIR / left[0]} takes its place" in line
        assert (storage / EXPERIMENT_STATE).read_bytes() == state
        assert left_now == ["checkpoint_000005", "checkpoint_000007"]
        assert (gone / "state.pt").read_bytes() == b"weights"
    else:
        assert "none is left: it starts over" in line
        assert latest_checkpoint(storage / EXPERIMENT_STATE) is None
        assert left_now == ["checkpoint_000007"]
    assert repair_before_restore(str(storage), grid=True, staging_roots=[]) == []  # repaired once


def test_a_saved_checkpoint_that_exists_is_kept(tmp_path, searcher):
    storage = tmp_path / "runs" / "grid"
    kept = storage / TRIAL_DIR / "checkpoint_000005"
    state = state_with_checkpoint(kept)
    state_folder(storage, **{EXPERIMENT_STATE: state, SEARCHER_STATE: searcher})
    complete(kept)
    assert repair_before_restore(str(storage), grid=True, staging_roots=[]) == []
    assert (storage / EXPERIMENT_STATE).read_bytes() == state
