"""Credentials out of the environment Ray copies to its workers (rule 3 of ``docs/reliability.md``).

Ray Tune copies ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_SECURITY_TOKEN`` and
``AWS_SESSION_TOKEN`` from the driver's environment into every trial actor's runtime environment
(``ray.tune.execution.class_cache``), and Ray puts a runtime environment on the workers' command lines
and in ``runtime_env_agent.log``, which other users of the node can read. So before Ray starts, the
driver moves them into a 0600 credentials file in its private scratch folder (``clsr.runtime_dir``) and
keeps only ``AWS_SHARED_CREDENTIALS_FILE`` in its environment: botocore (MLflow's artifacts) and the AWS
SDK under pyarrow (Tune's storage) read that file as they would the variables. The file is removed when
the driver ends.

``secret_assignments`` names the secrets a shell text sets (``platform cluster sbatch`` refuses a
``--setup`` or ``--set`` holding one: the batch script is a file others may read).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
from pathlib import Path

from clsr import runtime_dir
from clsr.tracking.secrets import mask_uri

MOVED = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN")
FILE_VARIABLE = "AWS_SHARED_CREDENTIALS_FILE"
# NAME= for the credentials sbatch refuses in a script: the known ones, and *_TOKEN, *_API_KEY, *_SECRET*
_SECRET_NAME = re.compile(
    r"(?<![A-Za-z0-9_])(?P<name>MLFLOW_TRACKING_TOKEN|MLFLOW_TRACKING_PASSWORD|AWS_SECRET_ACCESS_KEY"
    r"|AWS_SESSION_TOKEN|AWS_SECURITY_TOKEN|HF_TOKEN|HUGGING_FACE_HUB_TOKEN|[A-Za-z0-9_]*_API_KEY"
    r"|[A-Za-z0-9_]*_TOKEN|[A-Za-z0-9_]*_SECRET[A-Za-z0-9_]*|[A-Za-z0-9_]*PASSWORD)[ \t]*[=:]",
    re.IGNORECASE,
)
_SECRET_VALUE = re.compile(
    rf"(?P<head>{_SECRET_NAME.pattern})(?P<value>'[^']*'?|\"[^\"]*\"?|\S+)", re.IGNORECASE
)
# scheme://<userinfo>@host: a token (https://TOKEN@host) or user:password before the first /
_URL_LOGIN = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*://[^\s/@'\"]+@")


def move_aws_to_file(environ: dict[str, str] | None = None) -> dict[str, str]:
    """Move the AWS keys out of ``environ`` (``os.environ``) into a new 0600 credentials file; returns
    ``{AWS_SHARED_CREDENTIALS_FILE: path}`` for the workers' environment, or {} when there were none."""
    env = os.environ if environ is None else environ
    if not env.get("AWS_SECRET_ACCESS_KEY") and not env.get("AWS_SESSION_TOKEN"):
        return {FILE_VARIABLE: env[FILE_VARIABLE]} if env.get(FILE_VARIABLE) else {}
    profile = env.get("AWS_PROFILE") or "default"
    lines = [f"[{profile}]"]
    for name in MOVED:
        if env.get(name):
            lines.append(f"{name.lower()} = {env[name]}")
    folder = runtime_dir.subfolder(runtime_dir.scratch(), "credentials")
    sweep_dead(folder)
    path = runtime_dir.write_private(
        folder / f"aws-{os.getpid()}-{runtime_dir.pid_namespace()}-{os.urandom(4).hex()}",
        "\n".join(lines) + "\n",
    )
    atexit.register(_remove, path)
    for name in MOVED:
        env.pop(name, None)
    env[FILE_VARIABLE] = str(path)
    return {FILE_VARIABLE: str(path)}


def secret_assignments(text: str) -> list[str]:
    """What in ``text`` is a credential: ``NAME=`` of a secret-looking name, a URL with a login
    (``https://TOKEN@host``, ``user:password@host``), or what ``mask_uri`` masks; masked for showing."""
    found = [f"{m['name']}=…" for m in _SECRET_NAME.finditer(text)]
    found += [m[0].split("://", 1)[0] + "://***@" for m in _URL_LOGIN.finditer(text)]
    if not found and mask_uri(text) != text:
        found.append(mask_uri(text))
    return found


def masked(text: str) -> str:
    """``text`` with the values ``secret_assignments`` finds replaced by ``***`` (for an error message)."""
    text = _SECRET_VALUE.sub(lambda m: f"{m['head']}***", text)
    text = _URL_LOGIN.sub(lambda m: m[0].split("://", 1)[0] + "://***@", text)
    return mask_uri(text)


def sweep_dead(folder: Path) -> int:
    """Remove the credentials files that drivers of this pid namespace left when killed (no atexit ran)."""
    removed, namespace = 0, runtime_dir.pid_namespace()
    for path in folder.glob("aws-*-*-*"):
        pid, file_namespace = path.name.split("-")[1:3]
        if pid.isdigit() and file_namespace == str(namespace) and not runtime_dir.alive(int(pid)):
            _remove(path)
            removed += 1
    return removed


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()
