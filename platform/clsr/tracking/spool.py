"""MLflow writes of one run that survive a tracking-server outage: queued in order, sent by a thread,
carried in checkpoints, and left in the study's storage when a trial ends before MLflow took them.

Why by hand: MLflow's client retries an HTTP request for a few minutes and then raises; a trial that
logs through it dies with the server (a restart for an upgrade, a network blip on a cluster). No MLflow
or Ray component keeps writes across that, so a trial's writes go through this spool instead:

* every write (metric points with the timestamps they were logged at, params, tags, text and file
  artifacts, the run's end) is queued in memory, in order, and a background thread sends the queue,
  backing off while the server is unreachable (``clsr.tracking.retry``: what is transient is retried
  until the trial ends, a refusal is not); training never waits on MLflow. A sent write leaves
  memory (only a count stays). A file or folder artifact is copied into the spool's local folder when
  written (the caller may delete its own); that folder, ``<tmp>/clsr-spool-<pid>-<pid namespace>-<run>-*``,
  holds nothing else, and the next spool on the machine removes it once its process is gone
  (``sweep_leftovers``: a SIGKILLed trial's);
* replaying a write is harmless: MLflow drops a metric point it already holds (same key, value,
  timestamp and step), and params, tags, artifacts and the final status are idempotent. The unsent
  writes therefore go, whole, into every checkpoint (``save_to``: ``<checkpoint>/spool/journal.jsonl``
  and ``files/``; a trial retried elsewhere sends them, ``load_from``) and, when a trial ends before
  MLflow took them, into the study's storage (``hand_over``), one folder per hand-over::

      <storage>/spool/<run_id>/<seq>-<uuid>/files/<uuid>-<name>   the hand-over's artifacts, first
      <storage>/spool/<run_id>/<seq>-<uuid>/journal.jsonl         then its writes: a temporary name, moved

  so a hand-over is there whole or not at all, and one cut short spoils none after it. ``seq`` counts
  the run's hand-overs: the driver's last writes (``finish_child``) replay after the trial's own. The
  study driver (``replay_pending``; ``platform study resume`` and ``sync``) sends them in that order and
  removes each once sent;
* a journal read back is untrusted input, checked entry by entry before anything is done with it
  (``clsr.tracking.journal``: the journal's format, its checks, and sending one entry).
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from clsr import runtime_dir
from clsr.tracking.journal import (
    FILES,
    JOURNAL,
    Read,
    copy_inside,
    copy_local,
    read_journal,
    refusal,
    remove_local,
    send,
    sound,
    unlinked,
    warn,
    write_journal,
)
from clsr.tracking.retry import backoff_s, is_transient

KEPT = "journal.kept.jsonl"  # a journal with writes that were not sent: for a person, never replayed
PENDING = "spool"  # <storage>/spool/<run_id>/: what a trial could not send by its end
LEFTOVER = re.compile(r"clsr-spool-(\d+)-(\d+)-")  # a spool folder: its owner's pid and pid namespace
HAND_OVER = re.compile(r"(\d{6,})-[0-9a-f]{12}")
RUN_ID = re.compile(r"[0-9A-Za-z_-]{1,64}")


class Spool:
    """The queued writes of one MLflow run, with a sender thread (``start``) or without (``replay``)."""

    def __init__(self, uri: str, run_id: str, folder: str | Path | None = None):
        self.uri, self.run_id = uri, run_id
        if folder is None:
            sweep_leftovers()
            owner = f"{os.getpid()}-{runtime_dir.pid_namespace()}"
            folder = tempfile.mkdtemp(prefix=f"clsr-spool-{owner}-{run_id[:8]}-")
        self.folder = Path(folder)
        (self.folder / FILES).mkdir(parents=True, exist_ok=True)
        self._queue: collections.deque[dict[str, Any]] = collections.deque()  # not sent yet, in order
        self.sent = 0  # entries taken off the queue: sent (or refused by MLflow for good, with a warning)
        self.last_error: str | None = None
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closing = False

    # --- writes -------------------------------------------------------------------------------------

    def metrics(self, points: list[tuple[str, float, int, int]]) -> None:
        """(key, value, timestamp ms, step) points, sent in one request."""
        if points:
            self._append({"op": "metrics", "points": [list(p) for p in points]})

    def params(self, params: dict[str, str]) -> None:
        if params:
            self._append({"op": "params", "params": params})

    def tags(self, tags: dict[str, Any]) -> None:
        if tags:
            self._append({"op": "tags", "tags": {k: str(v) for k, v in tags.items()}})

    def text(self, text: str, artifact_file: str) -> None:
        self._append({"op": "text", "text": text, "file": artifact_file})

    def artifacts(self, local_path: str | Path, artifact_path: str | None = None) -> None:
        """A file or folder, copied into the spool now (the caller may delete its own copy). Raises
        ``OSError`` when it cannot be copied (a full disk); nothing is queued then."""
        name = f"{uuid.uuid4().hex[:12]}-{Path(local_path).name}"
        target = self.folder / FILES / name
        try:
            copy_local(Path(local_path), target)
        except BaseException:
            remove_local(target)
            raise
        self._append({"op": "artifacts", "file": name, "artifact_path": artifact_path})

    def terminate(self, status: str) -> None:
        """The run's end (FINISHED, FAILED or KILLED), at the time it happened."""
        self._append({"op": "terminate", "status": status, "end_time": int(time.time() * 1000)})

    def _append(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self._queue.append(entry)
            self._lock.notify_all()

    # --- sending ------------------------------------------------------------------------------------

    def start(self) -> Spool:
        """Send in the background from now on."""
        self._thread = threading.Thread(target=self._send_loop, name=f"clsr-spool-{self.run_id[:8]}")
        self._thread.daemon = True
        self._thread.start()
        return self

    def _send_loop(self) -> None:
        failures = 0
        while True:
            with self._lock:
                while not self._queue and not self._closing:
                    self._lock.wait()
                if self._closing:  # what is left was handed over (or is the closer's to keep)
                    return
                entry = self._queue[0]
            try:
                send(self.uri, self.run_id, entry, self.folder)
            except Exception as err:
                if is_transient(err):  # the server is down or busy: keep the entry, try again later
                    self.last_error = f"{type(err).__name__}: {err}"[:500]
                    with self._lock:
                        self._lock.wait(backoff_s(failures))
                    failures += 1
                    continue
                warn(f"a {entry['op']} write of run {self.run_id} was refused for good: {err}")
            failures = 0
            with self._lock:
                self._queue.popleft()
                self.sent += 1
                self._lock.notify_all()

    def drain(self, wait_s: float) -> bool:
        """Wait up to ``wait_s`` for everything to be sent; True when nothing is left."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            while self._queue and self._thread is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(min(left, 1.0))
            return not self._queue

    def close(self, wait_s: float, pending_root: str | None) -> int:
        """Stop sending after at most ``wait_s``; what is left goes to ``pending_root`` (the study's
        storage, replayed by the study driver). Returns the number of entries handed over."""
        done = self.drain(wait_s)
        with self._lock:
            self._closing = True
            self._lock.notify_all()
            left = list(self._queue)
        if not done and pending_root:
            hand_over(left, self.folder, pending_root, self.run_id)
        if done or pending_root:
            shutil.rmtree(self.folder, ignore_errors=True)
        return 0 if done else len(left)

    def unsent(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self._queue)

    # --- checkpoints --------------------------------------------------------------------------------

    def save_to(self, checkpoint: Path, points: list[tuple[str, float, int, int]] | None = None) -> None:
        """The entries not yet sent, with their files, into a checkpoint folder (``spool/``); ``points``:
        metric points that go into it without being queued here (yet)."""
        left = self.unsent() + ([{"op": "metrics", "points": [list(p) for p in points]}] if points else [])
        if left:
            write_journal(left, self.folder, checkpoint / PENDING)

    def load_from(self, checkpoint: Path) -> None:
        """Queue what a checkpoint's trial had not sent. The checkpoint came from the study's storage:
        each entry is checked, and its file read only from the checkpoint's own ``spool/files/``."""
        journal = checkpoint / PENDING / JOURNAL
        if not journal.is_file() or not unlinked(checkpoint, f"{PENDING}/{JOURNAL}"):
            return
        read = read_journal(journal.read_text(errors="replace"))
        if read.unreadable:
            warn(f"{read.unreadable} unreadable line(s) in {journal}: skipped")
        for entry in read.entries:
            reason = refusal(entry)
            if reason is None and entry["op"] == "artifacts":
                source = f"{PENDING}/{FILES}/{entry['file']}"
                reason = copy_inside(checkpoint, source, self.folder / FILES / entry["file"])
            if reason is not None:
                warn(f"refused a write in {journal}: {reason}")
                continue
            self._append(entry)


# --- leftovers of killed trials -----------------------------------------------------------------------------


def sweep_leftovers(root: str | None = None) -> int:
    """Remove the spool folders that processes of this user left when they were killed (SIGKILL, a lost
    machine); returns how many (``runtime_dir.sweep_dead``: a live trial's folder, another user's or
    another container's is never touched). Their unsent writes are not lost: they ride in the trial's last
    checkpoint (``save_to``), which its retry sends, and a retry writes again what came after."""
    return len(runtime_dir.sweep_dead(root or tempfile.gettempdir(), LEFTOVER))


# --- the study's pending journals (a trial's leftovers, replayed by the driver) ----------------------------


class _Storage:
    """The study's storage (a local folder, ``file://`` or a pyarrow-supported bucket), by path relative
    to its root."""

    def __init__(self, root: str):
        import pyarrow.fs

        if "://" in root:
            self.filesystem, self.base = pyarrow.fs.FileSystem.from_uri(root)
        else:
            self.filesystem, self.base = pyarrow.fs.LocalFileSystem(), str(Path(root).resolve())
        self.base = self.base.rstrip("/")
        self.local = isinstance(self.filesystem, pyarrow.fs.LocalFileSystem)

    def path(self, relative: str) -> str:
        return f"{self.base}/{relative}"

    def listing(self, relative: str) -> list[Any]:
        import pyarrow.fs

        selector = pyarrow.fs.FileSelector(self.path(relative), allow_not_found=True)
        return self.filesystem.get_file_info(selector)

    def folders(self, relative: str) -> list[str]:
        import pyarrow.fs

        return [i.base_name for i in self.listing(relative) if i.type == pyarrow.fs.FileType.Directory]

    def files(self, relatives: list[str]) -> list[bool]:
        import pyarrow.fs

        infos = self.filesystem.get_file_info([self.path(r) for r in relatives])
        return [info.type == pyarrow.fs.FileType.File for info in infos]

    def read_text(self, relative: str) -> str | None:
        """A journal's text; None when it is reached through a link (a local storage)."""
        if self.local and not unlinked(Path(self.base), relative):
            return None
        with self.filesystem.open_input_stream(self.path(relative)) as stream:
            return stream.read().decode("utf-8", errors="replace")

    def fetch(self, relative: str, target: Path) -> str | None:
        """Copy a file or folder of the storage here; the reason it was refused, or None."""
        import pyarrow.fs

        if self.local:
            return copy_inside(Path(self.base), relative, target)
        if self.filesystem.get_file_info(self.path(relative)).type == pyarrow.fs.FileType.NotFound:
            return f"{relative} is missing"
        pyarrow.fs.copy_files(self.path(relative), str(target), source_filesystem=self.filesystem)
        return None

    def upload(self, source: Path, relative: str) -> None:
        import pyarrow.fs

        pyarrow.fs.copy_files(str(source), self.path(relative), destination_filesystem=self.filesystem)

    def write_whole(self, relative: str, data: bytes) -> None:
        """Under a temporary name, then moved: a reader sees all of it or nothing."""
        temporary = f"{relative}.{uuid.uuid4().hex[:12]}.tmp"
        with self.filesystem.open_output_stream(self.path(temporary)) as out:
            out.write(data)
        self.filesystem.move(self.path(temporary), self.path(relative))

    def next_hand_over(self, run: str) -> str:
        taken = [int(m[1]) for i in self.listing(run) if (m := HAND_OVER.fullmatch(i.base_name))]
        return f"{run}/{max(taken, default=0) + 1:06d}-{uuid.uuid4().hex[:12]}"

    def journals(self, run_id: str) -> list[str]:
        """The folders of a run's complete pending journals, in the order they were handed over."""
        run = f"{PENDING}/{run_id}"
        infos = self.listing(run)
        numbered = sorted((int(m[1]), i.base_name) for i in infos if (m := HAND_OVER.fullmatch(i.base_name)))
        folders = [f"{run}/{name}" for _, name in numbered]
        complete = self.files([f"{folder}/{JOURNAL}" for folder in folders]) if folders else []
        return [folder for folder, whole in zip(folders, complete, strict=True) if whole]

    def remove(self, folder: str) -> None:
        """A replayed journal: the journal first (its files are then no one's), then its folder."""
        self.filesystem.delete_file(self.path(f"{folder}/{JOURNAL}"))
        self.filesystem.delete_dir(self.path(folder))

    def keep_aside(self, folder: str) -> str:
        kept = f"{folder}/{KEPT}"
        self.filesystem.move(self.path(f"{folder}/{JOURNAL}"), self.path(kept))
        return self.path(kept)


def hand_over(entries: list[dict[str, Any]], source: Path, pending_root: str, run_id: str) -> None:
    """``entries`` (and their files) as the run's next pending journal in the study's storage: a folder
    of its own, its journal written last and whole, numbered after the run's earlier hand-overs."""
    entries = sound(entries, f"{pending_root} (run {run_id})")
    if not entries:
        return
    storage = _Storage(pending_root)
    folder = storage.next_hand_over(f"{PENDING}/{run_id}")
    storage.filesystem.create_dir(storage.path(f"{folder}/{FILES}"), recursive=True)
    for entry in entries:
        if entry["op"] == "artifacts":
            storage.upload(source / FILES / entry["file"], f"{folder}/{FILES}/{entry['file']}")
    storage.write_whole(f"{folder}/{JOURNAL}", "".join(json.dumps(e) + "\n" for e in entries).encode())


def has_pending(pending_root: str, run_id: str) -> bool:
    return bool(_Storage(pending_root).journals(run_id))


def pending_runs(pending_root: str) -> list[str]:
    """Run ids with a pending journal in the study's storage."""
    storage = _Storage(pending_root)
    names = [name for name in storage.folders(PENDING) if RUN_ID.fullmatch(name)]
    return sorted(name for name in names if storage.journals(name))


def replay_pending(uri: str, pending_root: str) -> tuple[int, list[str]]:
    """Send every pending journal of a study, each run's in the order they were handed over; a journal
    that went through is removed, one with writes that could not be read or were refused is kept aside
    (with a warning). Returns (entries sent, run ids still pending: MLflow did not answer)."""
    storage = _Storage(pending_root)
    sent, left = 0, []
    for run_id in pending_runs(pending_root):
        try:
            for folder in storage.journals(run_id):
                sent += _replay_journal(uri, storage, run_id, folder)
        except Exception:  # MLflow is unreachable: this run waits for the next replay, in order
            left.append(run_id)
            continue
        if not storage.listing(f"{PENDING}/{run_id}"):
            storage.filesystem.delete_dir(storage.path(f"{PENDING}/{run_id}"))
    return sent, left


def _replay_journal(uri: str, storage: _Storage, run_id: str, folder: str) -> int:
    """Send one pending journal; the number of entries sent. Raises when MLflow does not answer (a
    transient error); a write it refuses (a final one) is skipped and the journal kept aside."""
    text = storage.read_text(f"{folder}/{JOURNAL}")
    read = read_journal(text) if text is not None else Read([], 1)
    sent, skipped = 0, read.unreadable
    with tempfile.TemporaryDirectory(prefix="clsr-replay-") as tmp:
        (Path(tmp) / FILES).mkdir()
        for entry in read.entries:
            if reason := _unsendable(entry, storage, folder, Path(tmp)):
                warn(f"refused a write in {storage.path(folder)}/{JOURNAL}: {reason}")
                skipped += 1
                continue
            try:
                send(uri, run_id, entry, Path(tmp))
            except Exception as err:
                if is_transient(err):  # MLflow did not answer: the journal waits for the next replay
                    raise
                warn(f"MLflow refused a write in {storage.path(folder)}/{JOURNAL} for good: {err}")
                skipped += 1
                continue
            sent += 1
    if skipped:
        kept = storage.keep_aside(folder)
        warn(f"{read.unreadable} unreadable line(s), {skipped} write(s) not sent: kept as {kept}")
    else:
        storage.remove(folder)
    return sent


def _unsendable(entry: Any, storage: _Storage, folder: str, tmp: Path) -> str | None:
    """Why an entry of a pending journal is not sent (its file is fetched here when it is)."""
    reason = refusal(entry)
    if reason is None and entry["op"] == "artifacts":
        reason = storage.fetch(f"{folder}/{FILES}/{entry['file']}", tmp / FILES / entry["file"])
    return reason
