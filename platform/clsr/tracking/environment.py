"""Where a trial ran, as its run records it: Python, OS, CPU, torch with its CUDA and cuDNN builds, the
GPUs and their driver, ``transformers``, and the code (``clsr.version``, git commit, a dirty flag), as
params ``env.*``; every installed distribution as the artifact ``environment/environment.txt`` and the
checkout's uncommitted diff as ``environment/diff.patch`` (only when dirty, size-capped).

Captured where the training runs (the trial's process, a Ray Train worker's rank 0), so the GPU and the
driver are the trial's own; the study's parent run gets the driver's. Nothing here initialises CUDA: a
device's name is read from torch only once the trial has put work on it, else from NVML, and a machine
without a GPU (or without NVML) records ``none``.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import clsr
from clsr.tracking.secrets import mask_uri

PREFIX = "env."
ENV_ARTIFACTS = "environment"  # the run's artifact folder: environment.txt, diff.patch
MAX_DIFF_BYTES = 1_000_000  # a diff.patch past it is cut, with a line that says so
NONE = "none"


@dataclass(frozen=True)
class Environment:
    """One process's environment; ``params()`` are the run's ``env.*`` params (MLflow's strings)."""

    python: str
    os: str
    cpu: str
    torch: str
    cuda: str
    cudnn: str
    gpu: str
    gpu_count: int
    driver: str
    transformers: str
    clsr: str
    git_commit: str
    git_dirty: bool
    distributions: tuple[str, ...] = ()  # "name==version", sorted: environment.txt
    diff: str = ""  # the uncommitted diff (empty: clean, or no checkout)

    def params(self) -> dict[str, str]:
        fields = asdict(self)
        del fields["distributions"], fields["diff"]
        return {f"{PREFIX}{k}": str(v).lower() if isinstance(v, bool) else str(v) for k, v in fields.items()}

    def lock_text(self) -> str:
        """``environment.txt``: every installed distribution, pip-freeze style."""
        return "\n".join(self.distributions) + "\n"


def capture(device: str | None = None) -> Environment:
    """This process's environment. ``device``: the trial's device type (``cuda`` or ``cpu``), whose
    GPUs are the trial's own; None (the study driver): the machine's GPUs, as NVML lists them."""
    gpu, count = gpus(device)
    commit, dirty, diff = git_state()
    return Environment(
        python=platform.python_version(),
        os=platform.platform(),
        cpu=cpu_model(),
        torch=version_of("torch"),
        cuda=_torch_build("cuda"),
        cudnn=_torch_build("cudnn"),
        gpu=gpu,
        gpu_count=count,
        driver=nvml_driver(),
        transformers=version_of("transformers"),
        clsr=clsr.__version__,
        git_commit=commit,
        git_dirty=dirty,
        distributions=distributions(),
        diff=diff,
    )


def version_of(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return NONE


def distributions() -> tuple[str, ...]:
    """Every distribution on the path, ``name==version``, once each (the first found wins, as imports)."""
    seen: dict[str, str] = {}
    for dist in importlib.metadata.distributions():
        name, version = name_version(dist)
        if name and name.lower() not in seen:
            seen[name.lower()] = f"{name}=={version}"
    return tuple(sorted(seen.values(), key=str.lower))


def name_version(dist: importlib.metadata.Distribution) -> tuple[str | None, str | None]:
    """A distribution's Name and Version from its metadata's header alone: ``dist.metadata`` parses the
    whole file (long descriptions) each time it is asked, 12x slower over a training image's packages."""
    text = dist.read_text("METADATA") or dist.read_text("PKG-INFO") or ""
    found: dict[str, str] = {}
    for line in text.split("\n\n", 1)[0].splitlines():
        key, _, value = line.partition(":")
        if key in ("Name", "Version"):
            found.setdefault(key, value.strip())
    return found.get("Name"), found.get("Version")


def cpu_model() -> str:
    """The CPU's model name (Linux: /proc/cpuinfo), else what ``platform`` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _torch_build(part: str) -> str:
    try:
        import torch
    except ImportError:
        return NONE
    if part == "cuda":
        return torch.version.cuda or NONE
    try:
        return str(torch.backends.cudnn.version() or NONE)
    except Exception:  # a broken cuDNN install: recorded as such, the trial goes on
        return NONE


def gpus(device: str | None) -> tuple[str, int]:
    """(the GPU model names, ``; ``-joined and deduplicated, and their count)."""
    if device == "cpu":
        return NONE, 0
    torch = sys.modules.get("torch")
    if device == "cuda" and torch is not None and torch.cuda.is_initialized():
        names = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    else:
        names = (
            _nvml(
                lambda nv: [
                    _text(nv.nvmlDeviceGetName(nv.nvmlDeviceGetHandleByIndex(i)))
                    for i in range(nv.nvmlDeviceGetCount())
                ]
            )
            or []
        )
    return "; ".join(dict.fromkeys(names)) or NONE, len(names)


def nvml_driver() -> str:
    return _nvml(lambda nv: _text(nv.nvmlSystemGetDriverVersion())) or NONE


def _nvml(read):
    """``read(pynvml)`` between NVML's init and shutdown; None without NVML or a GPU."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU: nothing to record
        return None
    try:
        return read(pynvml)
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def git_state() -> tuple[str, bool, str]:
    """(commit, dirty, the uncommitted diff) of the platform's own checkout, not the cwd's: untracked
    files count as dirty and are listed by name at the diff's head (their content is not copied); no
    checkout (an installed wheel, a worker's shipped copy): ("unknown", False, "")."""
    source = Path(clsr.__file__).resolve().parent
    commit = _git(source, "rev-parse", "HEAD")
    if commit is None:
        return "unknown", False, ""
    status = _git(source, "status", "--porcelain") or ""
    if not status:
        return commit, False, ""
    untracked = [line[3:] for line in status.splitlines() if line.startswith("??")]
    head = "".join(f"# untracked: {name}\n" for name in untracked)
    return commit, True, capped(head + (_git(source, "diff", "HEAD", strip=False) or ""))


def capped(diff: str) -> str:
    """The diff, credentials masked, cut at ``MAX_DIFF_BYTES`` with a line that says so."""
    data = mask_uri(diff).encode()
    if len(data) <= MAX_DIFF_BYTES:
        return data.decode()
    kept = data[:MAX_DIFF_BYTES].decode(errors="ignore")
    return f"{kept}\n# clsr: diff cut at {MAX_DIFF_BYTES} bytes of {len(data)}\n"


def _git(cwd: Path, *args: str, strip: bool = True) -> str | None:
    try:
        out = subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
            env={**os.environ, "GIT_OPTIONAL_LOCKS": "0"},  # a read: never takes the index lock
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if strip else out.stdout
