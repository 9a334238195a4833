"""The driver's Ray: join the cluster this user's Ray names (or RAY_ADDRESS), else start a local one
with its dashboard on 127.0.0.1 and a private token; what trials need of the driver's environment.
"""

from __future__ import annotations

import os
from pathlib import Path

from clsr.study.control.console import Console

QUIET_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "TOKENIZERS_PARALLELISM": "false",
    # short in-process trials checkpoint often; Tune's "snapshotting may become a bottleneck" is noise here
    "TUNE_WARN_EXCESSIVE_EXPERIMENT_CHECKPOINT_SYNC_THRESHOLD_S": "0",
}


def init_ray(console: Console | None = None, py_modules: list[str] | tuple[str, ...] = ()) -> str | None:
    """Join ``RAY_ADDRESS`` when set (a cluster), else start a local Ray; returns the dashboard's address.
    ``py_modules``: folders every worker of this driver imports from (``shipped_methods``).

    A local Ray keeps its dashboard process: it serves the state API through which Ray Train removes
    the resources of a trial that was stopped (by ASHA, a time limit or Ctrl-C); without it later trials
    wait for those CPUs and GPUs forever. But the dashboard's job API runs any code it is sent, so it
    listens on 127.0.0.1 only and Ray's token authentication is on, with the token readable by this
    user alone (Ray writes it world-readable): another user of a shared machine cannot submit code.
    """
    import ray

    from clsr.runtime_dir import ray_folder  # rule 1: the local Ray's sessions in the private folder
    from clsr.tracking.credentials import move_aws_to_file  # rule 3

    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    if ray.is_initialized():
        return None
    address = cluster_address(console)
    local = {}
    if not address:  # Ray 2.60 turns token authentication on for a new local cluster unless told not to
        if os.environ.get("RAY_AUTH_MODE", "token").lower() == "token":
            private_token()
        local = {"include_dashboard": True, "dashboard_host": "127.0.0.1", "_temp_dir": str(ray_folder())}
    context = ray.init(
        address=address or "local",  # "local": a new Ray, even where a dead cluster's pointer file is left
        runtime_env={
            "env_vars": QUIET_ENV | _forwarded_env() | move_aws_to_file(),  # rule 3: no AWS keys
            **({"py_modules": list(py_modules)} if py_modules else {}),
        },
        log_to_driver=True,  # without --verbose, to the driver's log (clsr.study.run.progress)
        **local,
    )
    if console is not None and console.quiet is not None:
        console.quiet.route_workers()
    return context.dashboard_url


def cluster_address(console: Console | None = None) -> str | None:
    """The Ray cluster to join: ``RAY_ADDRESS``, else the one ``ray start`` last started on this machine
    while it answers (``ray.init()`` would join it too) and its pointer file is this user's own, else
    None: start a local Ray."""
    import socket
    import tempfile

    if os.environ.get("RAY_ADDRESS"):
        return os.environ["RAY_ADDRESS"]
    pointer = Path(tempfile.gettempdir()) / "ray" / "ray_current_cluster"
    try:
        if not written_by_me_alone(pointer):
            (console or Console()).note_once(
                f"note: not joining the Ray cluster named in {pointer}: another user could have written "
                f"it (Ray makes that folder writable by everyone); set RAY_ADDRESS to join a cluster"
            )
            return None
        address = pointer.read_text().strip()
        host, port = address.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=2):
            return address
    except (OSError, ValueError):
        return None


def written_by_me_alone(path: Path) -> bool:
    """Whether ``path`` is a plain file of this user's in a folder of this user's that no one else may
    write to. ``/tmp/ray`` is shared by every user of a machine (Ray makes it mode 777): a pointer file
    there that someone else could have replaced would send this study (its code, data and credentials)
    to their Ray. Raises OSError when there is no such file."""
    import stat

    me = os.getuid()
    folder, file = os.stat(path.parent, follow_symlinks=False), os.stat(path, follow_symlinks=False)
    if not stat.S_ISREG(file.st_mode) or file.st_uid != me or folder.st_uid != me:
        return False
    return not (folder.st_mode | file.st_mode) & (stat.S_IWGRP | stat.S_IWOTH)


def private_token() -> Path:
    """Ray's token file (``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``), created if missing, and
    readable by this user only."""
    import secrets

    path = Path(os.environ.get("RAY_AUTH_TOKEN_PATH") or Path.home() / ".ray" / "auth_token")
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists():
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as token:
            token.write(secrets.token_hex(32))
    os.chmod(path, 0o600)
    return path


def _forwarded_env() -> dict[str, str]:
    """What trials need of the driver's environment. Folders are made absolute: Ray runs each trial in a
    folder of its own, where ``CLSR_DATA_DIR=../shared/data`` (the README's command) points nowhere."""
    keys = ("CLSR_DATA_DIR", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HOME")
    env = {k: os.environ[k] for k in keys if k in os.environ}
    for folder in ("CLSR_DATA_DIR", "HF_HOME"):
        if env.get(folder):
            env[folder] = os.path.abspath(os.path.expanduser(env[folder]))
    return env


def shipped_methods(references: list[str]) -> list[str]:
    """The folders Ray's ``py_modules`` sends to every worker so that it imports the methods the study names
    from outside the package: a file's module, or a single-file top-level module's, staged as a one-module
    package in the private runtime folder; a module's top-level package folder; nothing for a built-in or an installed distribution's (installed
    on the workers as on the driver)."""
    import sys

    from clsr.config.method_source import staged
    from clsr.config.methods import get_method, method_source
    from clsr.runtime_dir import root, subfolder

    folders = []
    for reference in references:
        source = method_source(reference)
        if source.kind == "file":
            module = sys.modules[get_method(reference).__module__]
            folders.append(staged(Path(module.__file__), module.__name__, subfolder(root(), "methods")))
        elif source.kind == "module" and source.ship is not None and source.ship.is_file():
            name = reference.partition(":")[0]  # a single-file module is top-level: no dots
            folders.append(staged(source.ship, name, subfolder(root(), "methods")))
        elif source.kind == "module" and source.ship is not None:
            folders.append(source.ship)
    return sorted({str(folder) for folder in folders})
