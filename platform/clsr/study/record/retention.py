"""What a finished study keeps of its trials' checkpoints: what a later study loads, not what a resume needs.

A trial's checkpoint (``clsr.train.checkpoint.save_checkpoint``) holds ``state.pt``: the trained weights plus
the optimizer's state (Adam's two moments: twice the weights), the scheduler's, the random generators'
and the counters; and ``best_model.pt``: the best-dev weights. About 4x the trained weights, all of it
needed to resume the trial. Once the study's record is closed as finished, no finished trial runs again
(a resume restores only unfinished and errored trials), and a later study (``needs:``,
``clsr.encoders.trained``) loads only weights. So each finished trial's ``state.pt`` is rewritten with
the weights and counters alone (about 2x the trained weights with ``best_model.pt``, which is kept).
``keep_checkpoints: true`` keeps every checkpoint whole; failed, interrupted, timed-out and early-stopped
trials always keep theirs (a resume may continue them; an early-stopped one carries no checkpoint tag).

The best weights are kept once: a finished trial's MLflow run holds them as its ``model/`` artifact (what
``platform eval --model runs:/<id>/model`` and users load), so its ``best_model.pt`` is removed too, unless
an ablation of the study ``needs:`` the trial's ablation (a later stage loads the checkpoint's weights,
heads included) or the model was not logged. The manifest names the MLflow model instead
(``best_model``), and ``clsr.encoders.trained`` points a reader of the removed file there.

The swap is safe for a reader at any moment, and for a shrink stopped at any point (the manifest
accepts a list of hashes: ``clsr.encoders.checkpoint_files``):

1. the smaller ``state.pt`` is written under a temporary name beside it (``.state.pt.shrinking``);
2. the manifest is replaced (written aside, then renamed) by one accepting the old and the new hash;
3. the temporary file is renamed to ``state.pt``;
4. the manifest is replaced by one with the new hash alone, marking ``state.pt`` as shrunk.

Every file appears whole under its name (a rename locally; an object store's copy or upload appears
whole), and at every step the manifest accepts the ``state.pt`` in place; a reader that read the manifest
before step 2 and opened the file after step 3 finds the new hash in the manifest it reads again. A shrink
stopped between steps leaves a folder that loads, and the next one finishes it. The file is checked
against the manifest before it is rewritten: a changed file is never given a fresh hash.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from clsr.encoders.checkpoint_files import MANIFEST, accepts, read_all, sha256_of
from clsr.study.plan.resolve import human_bytes

STATE = "state.pt"
BEST = "best_model.pt"
# what only a resume needs: the optimizer's moments, the learning-rate schedule, the random generators
RESUME_ONLY = ("optimizer", "scheduler", "rng", "grad_scaler")
SHRUNK = "shrunk"  # the manifest's list of files rewritten to weights and counters
SWAP = f".{STATE}.shrinking"  # step 1's temporary name
_CHUNK = 1 << 20


def shrink_finished_checkpoints(study, client, parent_run_id: str, storage: str) -> str:
    """Shrink the checkpoint of every finished trial of a study whose record is closed as finished.

    ``study``: the ``Study``; ``client``: an MLflow client of the study's store; ``parent_run_id``: the
    study's parent run; ``storage``: the study's storage folder (only checkpoints under it are touched:
    the tag naming one is anyone's to write on a shared tracking server). Returns one line to print.
    Never raises for a checkpoint it cannot shrink (it is kept whole and named in the line).
    """
    from clsr.tracking.study_runs import children, under_root
    from clsr.tracking.tags import CHECKPOINT_TAG

    if study.keep_checkpoints:
        return "checkpoints: kept whole (keep_checkpoints: true)"
    if client.get_run(parent_run_id).data.tags.get("clsr.status") != "finished":
        return "checkpoints: kept whole, the study did not finish (a resume continues its trials)"
    needed = {need.ablation for ablation in study.ablations.values() for need in ablation.needs.values()}
    runs = {
        run.data.tags[CHECKPOINT_TAG]: run
        for run in children(client, parent_run_id)
        if run.data.tags.get("clsr.status") == "finished"
        and CHECKPOINT_TAG in run.data.tags
        and under_root(run.data.tags[CHECKPOINT_TAG], storage)
    }
    before = after = shrunk = once = 0
    kept: list[str] = []
    for location in sorted(runs):
        run = runs[location]
        try:
            was, now = shrink_checkpoint(location)
            if run.data.tags.get("clsr.ablation") not in needed and _model_logged(client, run):
                freed = drop_best(location, f"runs:/{run.info.run_id}/model")
                now, once = now - freed, once + (freed > 0)
        except Exception as err:  # storage not answering, a folder changed by hand: kept as it is
            kept.append(f"{location}: {type(err).__name__}: {str(err)[:200]}")
            continue
        before, after, shrunk = before + was, after + now, shrunk + (now < was)
    line = (
        f"checkpoints of {len(runs) - len(kept)} finished trial(s): {human_bytes(before)} -> "
        f"{human_bytes(after)} ({shrunk} shrunk to their last and best weights, {once} with their best "
        f"weights kept once, as the run's MLflow model; keep_checkpoints: true keeps them whole)"
    )
    if kept:
        line += f"; {len(kept)} kept whole, could not be shrunk: " + "; ".join(kept[:3])
    return line


def shrink_checkpoint(location: str, filesystem=None) -> tuple[int, int]:
    """Rewrite one checkpoint folder's ``state.pt`` to weights and counters (see the module doc).

    ``location``: a local folder or a ``scheme://`` URI; ``filesystem``: a pyarrow filesystem to reach
    it through instead (then ``location`` is its path there). Returns (bytes before, bytes after) of the
    folder's files; equal when there was nothing to do (shrunk already).
    """
    import pyarrow.fs

    fs, folder = _reach(location, filesystem)
    _remove(fs, f"{folder}/{SWAP}")  # left by a shrink stopped after step 1: written again below
    before = _folder_bytes(fs, folder)
    content = json.loads(read_all(fs, f"{folder}/{MANIFEST}"))
    hashes = content.get("sha256") if isinstance(content, dict) else None
    if not isinstance(hashes, dict) or STATE not in hashes:
        raise ValueError(f"{folder} is not a trainer's checkpoint (no {MANIFEST} listing {STATE})")
    if STATE in content.get(SHRUNK, []) and isinstance(hashes[STATE], str):
        return before, before  # shrunk already (and step 4 was reached)
    with tempfile.TemporaryDirectory(prefix="clsr-shrink-") as tmp:
        local = Path(tmp) / STATE
        if isinstance(fs, pyarrow.fs.LocalFileSystem):
            local = Path(folder) / STATE
        else:
            _download(fs, f"{folder}/{STATE}", local)
        with open(local, "rb") as f:
            old_hash = sha256_of(f)
            if not accepts(hashes[STATE], old_hash):
                raise ValueError(
                    f"{folder}/{STATE} does not match its recorded SHA-256: it was changed after it was "
                    f"written, so it is left as it is"
                )
            f.seek(0)
            state = torch.load(f, map_location="cpu", weights_only=True)
        if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
            raise ValueError(f"{folder}/{STATE} holds no trained weights ('model'); left as it is")
        if any(key in state for key in RESUME_ONLY):
            slim = Path(tmp) / SWAP
            torch.save({k: v for k, v in state.items() if k not in RESUME_ONLY}, slim)
            del state
            with open(slim, "rb") as f:
                new_hash = sha256_of(f)
            _upload(fs, slim, f"{folder}/{SWAP}")  # 1
            _write_manifest(fs, folder, content, {STATE: [old_hash, new_hash]})  # 2
            fs.move(f"{folder}/{SWAP}", f"{folder}/{STATE}")  # 3
        else:  # a shrink stopped after step 3: the file in place is the small one
            new_hash = old_hash
    _write_manifest(fs, folder, content, {STATE: new_hash}, shrunk=True)  # 4
    return before, _folder_bytes(fs, folder)


def _model_logged(client, run) -> bool:
    """Whether the trial's MLflow run holds its model (``model/``; no export error)."""
    return "clsr.model_error" not in run.data.tags and bool(client.list_artifacts(run.info.run_id, "model"))


def drop_best(location: str, model_uri: str, filesystem=None) -> int:
    """Remove a shrunk checkpoint's ``best_model.pt``, its weights being ``model_uri`` (the manifest names
    it first, so the folder never lists a file that is gone without saying where it went). Returns the
    bytes freed (0: removed already)."""
    fs, folder = _reach(location, filesystem)
    content = json.loads(read_all(fs, f"{folder}/{MANIFEST}"))
    if BEST not in content.get("sha256", {}):
        return 0
    size = fs.get_file_info(f"{folder}/{BEST}").size or 0
    hashes = {name: h for name, h in content["sha256"].items() if name != BEST}
    _write_manifest(fs, folder, {**content, "sha256": hashes, "best_model": model_uri}, {})
    _remove(fs, f"{folder}/{BEST}")
    return size


def _reach(location: str, filesystem) -> tuple[Any, str]:
    import pyarrow.fs

    if filesystem is not None:
        return filesystem, location.rstrip("/")
    if "://" in location:
        fs, path = pyarrow.fs.FileSystem.from_uri(location)
        return fs, path.rstrip("/")
    return pyarrow.fs.LocalFileSystem(), str(Path(location).expanduser().resolve())


def _write_manifest(fs, folder: str, content: dict, changed: dict, shrunk: bool = False) -> None:
    """Replace the manifest: written under a temporary name, then renamed over the old one."""
    content = {**content, "sha256": {**content["sha256"], **changed}}
    if shrunk:
        content[SHRUNK] = sorted({*content.get(SHRUNK, []), *changed})
    text = json.dumps(content, indent=1, sort_keys=True).encode()
    partial = f"{folder}/.{MANIFEST}.partial"
    with fs.open_output_stream(partial) as stream:
        stream.write(text)
    _fsync(fs, partial)
    fs.move(partial, f"{folder}/{MANIFEST}")


def _upload(fs, local: Path, target: str) -> None:
    with open(local, "rb") as source, fs.open_output_stream(target) as stream:
        while chunk := source.read(_CHUNK):
            stream.write(chunk)
    _fsync(fs, target)


def _download(fs, source: str, local: Path) -> None:
    with fs.open_input_stream(source) as stream, open(local, "wb") as target:
        shutil.copyfileobj(stream, target, _CHUNK)


def _fsync(fs, path: str) -> None:
    """On disk before a rename makes it visible (a local folder; an object store's upload is durable
    once it is whole)."""
    import pyarrow.fs

    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        with open(path, "rb") as f:
            os.fsync(f.fileno())


def _remove(fs, path: str) -> None:
    import pyarrow.fs

    if fs.get_file_info(path).type == pyarrow.fs.FileType.File:
        fs.delete_file(path)


def _folder_bytes(fs, folder: str) -> int:
    import pyarrow.fs

    entries = fs.get_file_info(pyarrow.fs.FileSelector(folder))
    return sum(e.size for e in entries if e.type == pyarrow.fs.FileType.File)
