"""The one private folder per user and machine where the platform writes on a node (rule 1 of
``docs/reliability.md``).

A node's temporary folder is shared: another user can make ``/tmp/clsr-…`` first, plant a link where
a file is about to be created, or write a file this user's process then reads. So everything the
platform writes locally lives under one folder that only this user can enter:

* ``root()``: ``$XDG_RUNTIME_DIR/clsr`` when that folder is this user's and mode 0700 (systemd makes it
  per login), else ``<tempdir>/clsr-<uid>``;
* ``scratch()``: always ``<tempdir>/clsr-<uid>`` (or ``<base>/clsr-<uid>``): for what may be large or must
  outlive the login session (Ray's sessions, checkpoint staging, credentials of a days-long study):
  ``$XDG_RUNTIME_DIR`` is a small RAM disk that systemd removes at logout.

Each is created with ``mkdir(0o700)`` (exclusive: it fails when the name exists) and, when it exists,
accepted only as a real folder (never through a link) owned by this user that no one else can write;
anything else is refused (``UnsafeFolder``) with what to do. Files and subfolders inside are made with
``O_NOFOLLOW`` and, where they must be new, ``O_EXCL``.

What the platform saves now and unpickles in a later run (Optuna's searcher state, written by Tune to the
study's storage, which other writers may reach) is signed with this user's own key (``sign``/``verified``,
rule 2): an HMAC-SHA256 with 32 random bytes kept in ``$XDG_CONFIG_HOME/clsr/state.key`` (``~/.config``):
0600, created exclusively, refused when it is a link or others can read it. Unlike the runtime folder it
outlives the machine's temporary folder and, through a shared home, follows the user to the node a study
resumes on. This module is the lowest layer: it imports nothing of the platform.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import re
import secrets
import shutil
import stat
import tempfile
from pathlib import Path
from typing import IO

NAME = "clsr"
# Ray's AF_UNIX sockets: <temp>/session_<YYYY-MM-DD_HH-MM-SS_ffffff>_<pid>/sockets/plasma_store is about
# 64 characters beyond <temp>, of the 107 a socket path may have
RAY_SOCKET_SUFFIX = 64
SOCKET_PATH_MAX = 107
KEY_FILE = "state.key"
SIGNED = b"clsr-signed-v1 "  # then the length, the HMAC's hex digest, a newline, the signed bytes


class UnsafeFolder(RuntimeError):
    """A folder the platform would write into could be (or was) made or written by someone else."""


def root() -> Path:
    """This user's private runtime folder on this machine (see the module doc), created when missing."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime and _private(Path(runtime)):
        return _ensure(Path(runtime) / NAME)
    return scratch()


def scratch(base: str | os.PathLike[str] | None = None) -> Path:
    """``<base>/clsr-<uid>`` (``base``: the temporary folder unless given), private, created when missing."""
    return _ensure(Path(base or tempfile.gettempdir()) / f"{NAME}-{os.getuid()}")


def subfolder(parent: Path, name: str, fresh: bool = False) -> Path:
    """``parent/name``, private (0700, this user's, not a link), created when missing; ``fresh``: it must
    not exist yet (exclusive creation), else ``FileExistsError``."""
    _check_name(name)
    folder = parent / name
    if fresh:
        os.mkdir(folder, 0o700)
        return folder
    # inside a private parent no one else can have written it, whatever its mode (Ray makes its own
    # folder 0777): it is narrowed to 0700, still refused when not this user's or a link
    return _ensure(folder, others_may_write=_problem(parent) is None)


def ray_folder(base: Path | None = None) -> Path:
    """The local Ray's ``_temp_dir``: ``<scratch>/ray``, or ``/tmp/clsr-<uid>/ray`` where the temporary
    folder is too long for Ray's socket paths (macOS's per-user TMPDIR; Ray's own default is /tmp too);
    refused when even that is too long."""
    folder = subfolder(base or scratch(), "ray")
    if base is None and _too_long(folder):
        folder = subfolder(scratch("/tmp"), "ray")
    if _too_long(folder):
        raise UnsafeFolder(
            f"{folder}: too long a folder for Ray's sockets ({SOCKET_PATH_MAX} characters with "
            f"{RAY_SOCKET_SUFFIX} of Ray's); set TMPDIR to a shorter folder, e.g. /tmp"
        )
    return folder


def _too_long(folder: Path) -> bool:
    return len(str(folder)) + RAY_SOCKET_SUFFIX > SOCKET_PATH_MAX


def open_private(path: Path, mode: str = "a", exclusive: bool = False) -> IO[str]:
    """A text file in a private folder, opened for ``mode`` ("a" or "w") without following a link at its
    name, created 0600 when missing (``exclusive``: it must be new); refused unless it is a plain file of
    this user's."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    flags |= os.O_APPEND if mode == "a" else os.O_TRUNC
    flags |= os.O_EXCL if exclusive else 0
    descriptor = os.open(path, flags, 0o600)
    try:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_nlink != 1:
            raise UnsafeFolder(f"{path}: not a plain file of this user's (another user may have made it)")
        return os.fdopen(descriptor, mode, encoding="utf-8", buffering=1)
    except BaseException:
        os.close(descriptor)
        raise


def write_private(path: Path, text: str) -> Path:
    """A new file (exclusive, 0600, not through a link) holding ``text``."""
    with open_private(path, "w", exclusive=True) as file:
        file.write(text)
    return path


def check_private(folder: Path) -> Path:
    """``folder`` as it is: a real folder of this user's that no one else can write, else ``UnsafeFolder``."""
    problem = _problem(folder)
    if problem:
        raise UnsafeFolder(f"{folder}: {problem}")
    return folder


def config_folder() -> Path:
    """This user's private configuration folder, ``$XDG_CONFIG_HOME/clsr`` (``~/.config/clsr``)."""
    base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    return _ensure(base / NAME)


def user_key() -> bytes:
    """This user's secret signing key, made (32 random bytes) when missing."""
    path = config_folder() / KEY_FILE
    try:
        return _read_key(path)
    except FileNotFoundError:
        partial = write_private(path.with_name(f".{KEY_FILE}.{secrets.token_hex(8)}"), secrets.token_hex(32))
        with contextlib.suppress(FileExistsError):  # another process made it first: its key is the key
            os.link(partial, path)  # a link appears whole, and fails when the name exists
        os.unlink(partial)
        return _read_key(path)


def _read_key(path: Path) -> bytes:
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(descriptor, "rb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise UnsafeFolder(
                f"{path}: this user's signing key must be a plain file of this user's that no one else can "
                f"read (mode {stat.S_IMODE(info.st_mode):o}); remove it, and a new key is made"
            )
        return bytes.fromhex(file.read().decode("ascii"))


class Unsigned(ValueError):
    """Bytes to be unpickled that this user's platform did not sign: they are never unpickled."""


def sign(data: bytes) -> bytes:
    """``data`` after a line with its length and this user's HMAC-SHA256 of it (``verified`` gives it back)."""
    return SIGNED + b"%d " % len(data) + _digest(data) + b"\n" + data


def verified(signed: bytes) -> bytes:
    """The bytes ``sign`` was given, once their HMAC verifies with this user's key, else ``Unsigned``
    (``ValueError`` when they are cut short: a copy stopped midway, not another writer)."""
    head, _, data = signed.partition(b"\n")
    length, _, digest = head.removeprefix(SIGNED).partition(b" ")
    if head.startswith(SIGNED) and length.isdigit() and len(data) < int(length):
        raise ValueError(f"cut short: {len(data)} of {int(length)} signed bytes")
    if not (head.startswith(SIGNED) and hmac.compare_digest(digest, _digest(data))):
        raise Unsigned(
            f"not signed with this user's key ({config_folder() / KEY_FILE}): written by another user, with "
            f"another key, or by a clsr before signed states; not unpickled"
        )
    return data


def _digest(data: bytes) -> bytes:
    return hmac.new(user_key(), data, hashlib.sha256).hexdigest().encode()


def pid_namespace() -> int:
    """This process's pid namespace (its inode; containers sharing a /tmp count their pids apart); 0 off
    Linux. A file named with a pid is another process's only within the same namespace."""
    try:
        return os.stat("/proc/self/ns/pid").st_ino
    except OSError:
        return 0


def alive(pid: int) -> bool:
    """Whether process ``pid`` (of this pid namespace) still runs."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's live process (PermissionError), or unknown: alive, never swept
        return True
    return True


def sweep_dead(root: str | os.PathLike[str], pattern: re.Pattern[str]) -> list[Path]:
    """Remove the folders under ``root`` that processes of this user left when killed; the removed ones.
    ``pattern`` matches a folder's name with its owner's pid (group 1) and pid namespace (group 2): only
    real folders (never through a link) of this user's, of this pid namespace, whose process is gone
    are removed; a live process's, another user's or another container's are never touched."""
    namespace, removed = pid_namespace(), []
    try:
        entries = list(os.scandir(root))
    except OSError:
        return []
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or int(match[2]) != namespace or alive(int(match[1])):
            continue
        try:
            info = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid():
            shutil.rmtree(entry.path, ignore_errors=True)
            removed.append(Path(entry.path))
    return removed


def _ensure(folder: Path, others_may_write: bool = False) -> Path:
    """Make ``folder`` exclusively (0700), or accept the existing one only when it is private
    (``others_may_write``: its mode is not held against it, the caller has checked its parent)."""
    with contextlib.suppress(FileExistsError):
        os.mkdir(folder, 0o700)
    try:  # the folder itself, never a link at its name: checked and narrowed through one descriptor
        descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        descriptor = None
    try:
        problem = (
            _problem(folder) if descriptor is None else _problem_of(os.fstat(descriptor), others_may_write)
        )
        if problem:
            raise UnsafeFolder(
                f"{folder}: {problem}; it was not made by this user's platform, so nothing is written "
                f"there. Remove it if it is yours, or set TMPDIR to a folder of your own"
            )
        os.fchmod(descriptor, 0o700)  # this user's own: no reading by others either (a umask never widens)
    finally:
        if descriptor is not None:
            os.close(descriptor)
    return folder


def _problem(folder: Path) -> str | None:
    try:
        info = os.lstat(folder)
    except OSError as err:
        return f"cannot be read ({err.strerror})"
    if stat.S_ISLNK(info.st_mode):
        return "a link, not a folder"
    return _problem_of(info)


def _problem_of(info: os.stat_result, others_may_write: bool = False) -> str | None:
    if not stat.S_ISDIR(info.st_mode):
        return "not a folder"
    if info.st_uid != os.getuid():
        return f"owned by uid {info.st_uid}, not this user (uid {os.getuid()})"
    if not others_may_write and info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"writable by others (mode {stat.S_IMODE(info.st_mode):o})"
    return None


def _private(folder: Path) -> bool:
    """Whether ``folder`` is this user's with no access for anyone else (what XDG_RUNTIME_DIR promises)."""
    try:
        info = os.stat(folder)
    except OSError:
        return False
    return stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077


def _check_name(name: str) -> None:
    if not name or name in (".", "..") or "/" in name or "\x00" in name:
        raise ValueError(f"{name!r}: one plain folder name")
