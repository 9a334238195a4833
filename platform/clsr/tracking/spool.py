"""MLflow writes of one run that survive a tracking-server outage: journaled first, sent in order.

Why by hand: MLflow's client retries a request for about two minutes and then raises; a trial that
logs through it dies with the server (a restart for an upgrade, a network blip on a cluster). No MLflow
or Ray component keeps writes across that, so a trial's writes go through this journal instead:

* every write (metric points with the timestamps they were logged at, params, tags, text and file
  artifacts, the run's end) is appended to a JSON-lines journal in a local folder, and a background
  thread sends the journal in order, backing off while the server is unreachable; training never waits
  on MLflow;
* replaying a write is harmless: MLflow drops a metric point it already holds (same key, value,
  timestamp and step), and params, tags, artifacts and the final status are idempotent. A journal can
  therefore be replayed whole, at least once: from a checkpoint (``save_to``/``load_from``: a trial
  retried on another worker still sends what it could not), and from the study's storage
  (``hand_over`` at a trial's end, ``replay_pending`` by the study driver, ``platform study resume``
  and ``platform study sync``).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

JOURNAL = "journal.jsonl"
FILES = "files"
PENDING = "spool"  # <storage>/spool/<run_id>/: what a trial could not send by its end
BACKOFF_S = (1, 2, 5, 10, 20, 30)


class Spool:
    """The journal of one MLflow run, with a sender thread (``start``) or without (``replay``)."""

    def __init__(self, uri: str, run_id: str, folder: str | Path | None = None):
        self.uri, self.run_id = uri, run_id
        self.folder = Path(folder or tempfile.mkdtemp(prefix=f"clsr-spool-{run_id[:8]}-"))
        (self.folder / FILES).mkdir(parents=True, exist_ok=True)
        self.entries: list[dict[str, Any]] = []
        self.sent = 0  # entries[:sent] reached MLflow
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
        """A file or folder, copied into the spool now (the caller may delete its own copy)."""
        name = f"{uuid.uuid4().hex[:12]}-{Path(local_path).name}"
        _copy(Path(local_path), self.folder / FILES / name)
        self._append({"op": "artifacts", "file": name, "artifact_path": artifact_path})

    def terminate(self, status: str) -> None:
        """The run's end (FINISHED, FAILED or KILLED), at the time it happened."""
        self._append({"op": "terminate", "status": status, "end_time": int(time.time() * 1000)})

    def _append(self, entry: dict[str, Any]) -> None:
        with self._lock:
            self.entries.append(entry)
            with open(self.folder / JOURNAL, "a") as journal:
                journal.write(json.dumps(entry) + "\n")
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
                while self.sent == len(self.entries) and not self._closing:
                    self._lock.wait()
                if self.sent == len(self.entries):
                    return
                entry = self.entries[self.sent]
            try:
                send(self.uri, self.run_id, entry, self.folder)
            except Exception as err:  # the server is down or refused: keep the entry, try again later
                self.last_error = f"{type(err).__name__}: {err}"[:500]
                with self._lock:
                    self._lock.wait(BACKOFF_S[min(failures, len(BACKOFF_S) - 1)])
                failures += 1
                continue
            failures = 0
            with self._lock:
                self.sent += 1
                self._lock.notify_all()

    def drain(self, wait_s: float) -> bool:
        """Wait up to ``wait_s`` for everything to be sent; True when nothing is left."""
        deadline = time.monotonic() + wait_s
        with self._lock:
            while self.sent < len(self.entries) and self._thread is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._lock.wait(min(left, 1.0))
            return self.sent == len(self.entries)

    def close(self, wait_s: float, pending_root: str | None) -> int:
        """Stop sending after at most ``wait_s``; what is left goes to ``pending_root`` (the study's
        storage, replayed by the study driver). Returns the number of entries handed over."""
        done = self.drain(wait_s)
        with self._lock:
            self._closing = True
            self._lock.notify_all()
            left = self.entries[self.sent :]
        if not done and pending_root:
            hand_over(left, self.folder, pending_root, self.run_id)
        if done or pending_root:
            shutil.rmtree(self.folder, ignore_errors=True)
        return 0 if done else len(left)

    def unsent(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.entries[self.sent :])

    # --- checkpoints --------------------------------------------------------------------------------

    def save_to(self, checkpoint: Path) -> None:
        """The entries not yet sent, with their files, into a checkpoint folder (``spool/``)."""
        left = self.unsent()
        if left:
            _write_journal(left, self.folder, checkpoint / PENDING)

    def load_from(self, checkpoint: Path) -> None:
        """Queue what a checkpoint's trial had not sent (before anything this trial writes)."""
        journal = checkpoint / PENDING / JOURNAL
        if not journal.exists():
            return
        for entry in read_journal(journal.read_text()):
            if entry["op"] == "artifacts":
                _copy(checkpoint / PENDING / FILES / entry["file"], self.folder / FILES / entry["file"])
            self._append(entry)


def read_journal(text: str) -> list[dict[str, Any]]:
    """A journal's entries; a last line cut off by a crash is dropped (it was never acknowledged)."""
    entries = []
    for line in text.splitlines():
        try:
            entries.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return entries


def send(uri: str, run_id: str, entry: dict[str, Any], folder: Path) -> None:
    """One journal entry to MLflow (idempotent)."""
    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient

    client = MlflowClient(uri)
    op = entry["op"]
    if op == "metrics":
        points = [Metric(k, float(v), int(t), int(s)) for k, v, t, s in entry["points"]]
        for start in range(0, len(points), 1000):  # MLflow's per-request metric limit
            client.log_batch(run_id, metrics=points[start : start + 1000])
    elif op == "params":
        items = [Param(k, v) for k, v in entry["params"].items()]
        for start in range(0, len(items), 100):  # MLflow's per-request param limit
            client.log_batch(run_id, params=items[start : start + 100])
    elif op == "tags":
        client.log_batch(run_id, tags=[RunTag(k, v) for k, v in entry["tags"].items()])
    elif op == "text":
        client.log_text(run_id, entry["text"], entry["file"])
    elif op == "artifacts":
        path = folder / FILES / entry["file"]
        if path.is_dir():
            client.log_artifacts(run_id, str(path), entry["artifact_path"])
        else:  # the file keeps its original name (the spool's copy carries a unique prefix)
            with tempfile.TemporaryDirectory() as tmp:
                original = Path(tmp) / entry["file"].split("-", 1)[1]
                shutil.copy2(path, original)
                client.log_artifact(run_id, str(original), entry["artifact_path"])
    elif op == "terminate":
        client.set_terminated(run_id, status=entry["status"], end_time=entry["end_time"])
    else:
        raise ValueError(f"unknown journal entry {op!r}")


# --- the study's pending journals (a trial's leftovers, replayed by the driver) ----------------------


def _filesystem(root: str):
    import pyarrow.fs

    if "://" in root:
        return pyarrow.fs.FileSystem.from_uri(root)
    return pyarrow.fs.LocalFileSystem(), str(Path(root).resolve())


def _copy(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target, dirs_exist_ok=True)
    else:
        shutil.copy2(source, target)


def _write_journal(entries: list[dict[str, Any]], source: Path, target: Path) -> None:
    (target / FILES).mkdir(parents=True, exist_ok=True)
    for entry in entries:
        if entry["op"] == "artifacts":
            _copy(source / FILES / entry["file"], target / FILES / entry["file"])
    with open(target / JOURNAL, "a") as journal:
        journal.writelines(json.dumps(e) + "\n" for e in entries)


def hand_over(entries: list[dict[str, Any]], source: Path, pending_root: str, run_id: str) -> None:
    """Append ``entries`` (and their files) to the run's pending journal in the study's storage."""
    import pyarrow.fs

    with tempfile.TemporaryDirectory(prefix="clsr-handover-") as tmp:
        filesystem, base = _filesystem(pending_root)
        remote = f"{base.rstrip('/')}/{PENDING}/{run_id}"
        local = Path(tmp) / run_id
        if filesystem.get_file_info(f"{remote}/{JOURNAL}").type != pyarrow.fs.FileType.NotFound:
            pyarrow.fs.copy_files(remote, str(local), source_filesystem=filesystem)
        _write_journal(entries, source, local)
        filesystem.create_dir(remote, recursive=True)
        pyarrow.fs.copy_files(str(local), remote, destination_filesystem=filesystem)


def has_pending(pending_root: str, run_id: str) -> bool:
    import pyarrow.fs

    filesystem, base = _filesystem(pending_root)
    info = filesystem.get_file_info(f"{base.rstrip('/')}/{PENDING}/{run_id}/{JOURNAL}")
    return info.type != pyarrow.fs.FileType.NotFound


def pending_runs(pending_root: str) -> list[str]:
    """Run ids with a pending journal in the study's storage."""
    import pyarrow.fs

    filesystem, base = _filesystem(pending_root)
    selector = pyarrow.fs.FileSelector(f"{base.rstrip('/')}/{PENDING}", allow_not_found=True)
    return sorted(
        info.base_name
        for info in filesystem.get_file_info(selector)
        if info.type == pyarrow.fs.FileType.Directory
    )


def replay_pending(uri: str, pending_root: str) -> tuple[int, list[str]]:
    """Send every pending journal of a study (each whole, in order); a journal that went through is
    removed. Returns (entries sent, run ids still pending)."""
    import pyarrow.fs

    filesystem, base = _filesystem(pending_root)
    sent, left = 0, []
    for run_id in pending_runs(pending_root):
        remote = f"{base.rstrip('/')}/{PENDING}/{run_id}"
        with tempfile.TemporaryDirectory(prefix="clsr-replay-") as tmp:
            pyarrow.fs.copy_files(remote, tmp, source_filesystem=filesystem)
            entries = read_journal((Path(tmp) / JOURNAL).read_text())
            try:
                for entry in entries:
                    send(uri, run_id, entry, Path(tmp))
            except Exception:
                left.append(run_id)
                continue
        filesystem.delete_dir(remote)
        sent += len(entries)
    return sent, left
