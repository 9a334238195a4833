"""A Tune experiment's saved state, read before ``Tuner.restore`` continues it.

Tune (2.60) writes an experiment's state into the driver's staging folder (``experiment_state-<session>.json``:
the trials and their checkpoints; ``basic-variant-state-<session>.json`` and the like: the searcher's),
then a background thread copies that folder to the storage path, overwriting each file in place. A driver
killed during the copy (SIGKILL, a lost machine) leaves a truncated file in storage. On restore, Tune's
controller fails to read it, logs "Failed to restore the run state", and starts the experiment over
from the restored Tuner's ``param_space``: there is none (``tuner.pkl`` does not keep it), so the
resumed experiment runs a trial with an empty config instead of the study's trials.

So each file Tune's restore will read is read here first. An unreadable one is replaced by the killed
driver's own staging copy when that driver ran on this machine (its copy was complete before the upload
began); else a grid experiment's searcher state is set aside (a grid's searcher only hands out trials:
the restored ones continue, and a grid trial it never handed out has no run yet, so the resume's
new-version experiment runs it); anything else stops the resume, saying which file is lost.

Then each trial's saved latest checkpoint is looked for: Tune deletes a trial's previous checkpoint when
it registers a new one but saves the state only every few seconds, so a killed driver can leave a state
naming a deleted checkpoint, which Tune's restore fails the trial over on every resume. Such a trial's
newest complete checkpoint left is moved to that name (:func:`repair_missing_checkpoints`).
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from clsr import runtime_dir
from clsr.encoders.checkpoint_files import MANIFEST, read_all

# the files TuneController.resume reads, newest first by name (Tune's own choice: max() of the matches)
EXPERIMENT_STATE = "experiment_state-*.json"
SEARCHER_STATES = ("basic-variant-state-*.json", "search_gen_state-*.json", "searcher-state-*.pkl")
CALLBACK_STATE = "callback-states-*.pkl"
GRID_SEARCHER = SEARCHER_STATES[0]  # BasicVariantGenerator: what a grid experiment's trials come from
OPTUNA_SEARCHER = SEARCHER_STATES[2]  # OptunaSearch's own pickle, signed by this user's platform
SET_ASIDE = ".unreadable"  # Tune reads only names ending in .json/.pkl
MAX_PICKLE_BYTES = 1 << 30


class UnreadableTuneState(RuntimeError):
    """A Tune experiment's saved state is lost: its trials cannot continue where they stopped."""


def read_experiment_state(data: bytes) -> None:
    state = json.loads(data)
    if not isinstance(state, dict) or not isinstance(state.get("trial_data"), list):
        raise ValueError("no trial_data in it")


def read_pickled(data: bytes) -> None:
    """Whether ``data`` is a whole pickle, read as opcodes only: nothing is unpickled (rule 2), so a file
    another user wrote cannot run code here. A truncated pickle ends before its STOP."""
    import pickletools

    if len(data) > MAX_PICKLE_BYTES:
        raise ValueError(f"{len(data)} bytes: larger than any Tune state this platform writes")
    end = None
    for opcode, _arg, position in pickletools.genops(data):
        if opcode.name == "STOP":
            end = position + 1
            break
    if end != len(data):
        raise ValueError("not one whole pickle")


def read_signed(data: bytes) -> None:
    """Optuna's searcher state: signed with this user's key (``clsr.study.run.search.SignedOptunaSearch``),
    its pickle whole; else refused here, before Tune's restore, which would start the experiment over."""
    read_pickled(runtime_dir.verified(data))


def readers() -> dict[str, Callable[[bytes], None]]:
    return (
        {EXPERIMENT_STATE: read_experiment_state}
        | {pattern: read_pickled for pattern in (*SEARCHER_STATES, CALLBACK_STATE)}
        | {OPTUNA_SEARCHER: read_signed}
    )


def repair_before_restore(path: str, grid: bool, staging_roots: list[Path] | None = None) -> list[str]:
    """Check (and where it can be done safely, repair) the state Tune will restore ``path`` from.

    ``grid``: the experiment's trials come from a grid (Tune's BasicVariantGenerator). Returns what was
    repaired, one line each; raises UnreadableTuneState when the experiment cannot be continued.
    """
    import pyarrow.fs

    fs, root = pyarrow.fs.FileSystem.from_uri(path)
    entries = fs.get_file_info(pyarrow.fs.FileSelector(root))
    files = {Path(e.path).name for e in entries if e.type == pyarrow.fs.FileType.File}
    trial_dirs = {Path(e.path).name for e in entries if e.type == pyarrow.fs.FileType.Directory}
    repaired, newest = [], {}
    for pattern, read in readers().items():
        matches = fnmatch.filter(files, pattern)
        if not matches:
            continue
        name = newest[pattern] = max(matches)
        why = _unreadable(lambda fs_path=f"{root}/{name}": read_all(fs, fs_path), read)
        if why is None:
            continue
        copy = _staging_copy(Path(path).name, name, trial_dirs, read, staging_roots)
        if copy is not None:
            _write_atomically(fs, f"{root}/{name}", copy.read_bytes())
            repaired.append(
                f"{name}: unreadable in storage ({why}); restored from the stopped driver's copy {copy}"
            )
        elif grid and pattern == GRID_SEARCHER:
            fs.move(f"{root}/{name}", f"{root}/{name}{SET_ASIDE}")
            repaired.append(
                f"{name}: unreadable ({why}); set aside as {name}{SET_ASIDE}: the grid's restored trials "
                f"continue, and any it had not handed out yet run in this resume's new-version experiment"
            )
        else:
            raise UnreadableTuneState(_lost(path, name, why))
    if EXPERIMENT_STATE in newest:  # readable now, or restored from a copy
        repaired += repair_missing_checkpoints(fs, f"{root}/{newest[EXPERIMENT_STATE]}")
    return repaired


def _lost(path: str, name: str, why: str) -> str:
    if why.startswith(runtime_dir.Unsigned.__name__):  # Optuna cannot go on without its trials: no fresh one
        return (
            f"Tune's saved state of the experiment at {path} is refused: {name} ({why}). Optuna's search "
            f"cannot continue without it; run the study under a new name to search afresh."
        )
    return (
        f"Tune's saved state of the experiment at {path} cannot be read: {name} ({why}), most likely "
        f"because its driver was stopped while Tune was writing it, and no complete copy of it is on "
        f"this machine. Its trials cannot be continued from their checkpoints."
    )


def repair_missing_checkpoints(fs, state_path: str) -> list[str]:
    """Give each trial whose saved latest checkpoint is gone the newest complete one left in its folder.

    Tune deletes a trial's previous checkpoint as soon as it registers a new one (``num_to_keep``), but
    saves the experiment state only every ``checkpoint_period`` (10 s by default): a driver killed in
    between leaves a state naming a deleted checkpoint, and Tune's restore then fails that trial on every
    resume. The newer checkpoint is moved to the name the state holds, so the state stays as Tune wrote
    it (its next checkpoint's number included). With none left, the state forgets the checkpoint and the
    trial starts over. The state is Tune's own (its restore unpickles the same run metadata, read and
    written through ``clsr.study.run.tune_compat``).
    """
    from clsr.study.run.tune_compat import forget_checkpoints, saved_latest_checkpoint

    state = json.loads(read_all(fs, state_path))
    repaired, forgotten = [], False
    for entry in state["trial_data"]:
        try:
            latest = saved_latest_checkpoint(entry[1])
            if latest is None or _exists(latest):
                continue
            missing, newer = latest.path, _newest_left(latest)
        except Exception:  # a form this code does not know, storage not answering: Tune's restore decides
            continue
        fs_of_trial = latest.filesystem
        if newer is not None:
            _move_folder(fs_of_trial, newer, missing)
            repaired.append(
                f"a trial's saved checkpoint {storage_uri(fs_of_trial, missing)} is gone; the newer "
                f"{storage_uri(fs_of_trial, newer)} takes its place"
            )
            continue
        entry[1] = forget_checkpoints(entry[1])
        forgotten = True
        repaired.append(
            f"a trial's saved checkpoint {storage_uri(fs_of_trial, missing)} is gone and none is left: it starts over"
        )
    if forgotten:
        _write_atomically(fs, state_path, json.dumps(state).encode())
    return repaired


def _exists(checkpoint) -> bool:
    import pyarrow.fs

    return checkpoint.filesystem.get_file_info(checkpoint.path).type != pyarrow.fs.FileType.NotFound


def _newest_left(missing) -> str | None:
    """The newest complete checkpoint folder beside ``missing`` (Tune numbers them checkpoint_000000, ...).

    Complete: the trainer's manifest is there with every file it lists (Tune copies a checkpoint folder
    into storage file by file, and a driver killed during the copy leaves part of one)."""
    import pyarrow.fs

    fs = missing.filesystem
    folder = str(PurePosixPath(missing.path).parent)
    entries = fs.get_file_info(pyarrow.fs.FileSelector(folder, allow_not_found=True))
    left = sorted(
        (
            e.path
            for e in entries
            if e.type == pyarrow.fs.FileType.Directory
            and PurePosixPath(e.path).name.startswith("checkpoint_")
        ),
        reverse=True,
    )
    return next((path for path in left if _complete(fs, path)), None)


def storage_uri(filesystem, fs_path: str) -> str:
    """A pyarrow filesystem path as one string: a local path, or ``<scheme>://<path>`` on cloud storage
    (pyarrow's paths drop the scheme)."""
    scheme = getattr(filesystem, "type_name", "local")
    return fs_path if scheme == "local" else f"{scheme}://{fs_path}"


def _move_folder(fs, source: str, target: str) -> None:
    """A rename where the filesystem has one (local, NFS); else copy, then delete (object stores)."""
    import pyarrow.fs

    try:
        fs.move(source, target)
    except (OSError, NotImplementedError):
        pyarrow.fs.copy_files(source, target, source_filesystem=fs, destination_filesystem=fs)
        fs.delete_dir(source)


def _complete(fs, folder: str) -> bool:
    import pyarrow.fs

    try:
        listed = json.loads(read_all(fs, f"{folder}/{MANIFEST}"))["sha256"]
        paths = [f"{folder}/{name}" for name in listed]
        return all(info.type == pyarrow.fs.FileType.File for info in fs.get_file_info(paths))
    except Exception:  # no manifest, or not the trainer's: not a checkpoint to continue from
        return False


def _unreadable(load: Callable[[], bytes], read: Callable[[bytes], None]) -> str | None:
    """None when the file reads as Tune will read it, else why not."""
    try:
        data = load()
        if not data:
            return "empty"
        read(data)
    except Exception as err:  # truncated JSON or pickle, a missing class, an I/O error: all mean lost
        return f"{type(err).__name__}: {str(err)[:300]}"
    return None


def ray_temp_root() -> Path:
    """Where the local Ray of this user keeps its sessions: the private scratch folder's ``ray``
    (``clsr.runtime_dir``, rule 1), never the shared ``/tmp/ray``, where anyone can plant a file."""
    return runtime_dir.ray_folder()


def _staging_copy(
    experiment: str, name: str, trial_dirs: set[str], read: Callable[[bytes], None], roots: list[Path] | None
) -> Path | None:
    """A complete copy of ``name`` in the staging folder of the driver that wrote it, when on this machine.

    Tune stages an experiment at ``<ray temp>/session_*/artifacts/<driver start>/<experiment>/driver_artifacts``.
    The file name carries the writing driver's start time, and the folder's trial folders must all be
    trials of this experiment (their names carry the trials' random ids), so another experiment's copy is
    never taken. Only a private root is searched, only plain files of this user's reached without a link
    are candidates, and each is checked by ``read`` without being unpickled (rule 2).
    """
    candidates = []
    for root in roots if roots is not None else [ray_temp_root()]:
        try:
            runtime_dir.check_private(root)
        except runtime_dir.UnsafeFolder:
            continue
        for copy in root.glob(f"session_*/artifacts/*/{experiment}/driver_artifacts/{name}"):
            if not _own_file_below(root, copy):
                continue
            staged = {p.name for p in copy.parent.iterdir() if p.is_dir() and not p.is_symlink()}
            if staged and staged <= trial_dirs and _unreadable(copy.read_bytes, read) is None:
                candidates.append(copy)
    return max(candidates, key=lambda p: p.stat().st_mtime, default=None)


def _own_file_below(root: Path, path: Path) -> bool:
    """A plain file of this user's, with no link between ``root`` and it (``session_latest`` is one)."""
    import stat

    relative = path.relative_to(root)  # session_*/artifacts/…/name: each step lstat'ed
    steps = [root / relative, *(root / parent for parent in relative.parents if parent != Path("."))]
    try:
        infos = [os.lstat(step) for step in steps]
    except OSError:
        return False
    file = infos[0]
    return (
        stat.S_ISREG(file.st_mode)
        and file.st_uid == os.getuid()
        and not any(stat.S_ISLNK(info.st_mode) or info.st_uid != os.getuid() for info in infos)
    )


def _write_atomically(fs, fs_path: str, data: bytes) -> None:
    """Write then rename: a reader (or another stop) never sees half a file (renames are atomic locally;
    an object store's upload appears whole)."""
    partial = f"{fs_path}.partial"
    with fs.open_output_stream(partial) as stream:
        stream.write(data)
    fs.move(partial, fs_path)
