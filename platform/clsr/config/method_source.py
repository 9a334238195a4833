"""A method's code outside the package: a ``.py`` file or an importable module, loaded, checked against the
method contract, and described for the record (what ``resume`` compares) and for Ray's workers.

A file is loaded under a module name derived from its path (``clsr_method_<hash>``): the same name on
the driver and on a worker, where the file arrives as a one-module package in Ray's ``py_modules``
(``staged``), so a worker imports the shipped copy and a pickled object of the user's class finds it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import shutil
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

FILE_PREFIX = "clsr_method_"
SHOWN_FRAMES = 5  # of the user's traceback


class MethodError(ValueError):
    """A method reference that names something which is not a usable method: one line (or a traceback)."""


@dataclass(frozen=True)
class MethodSource:
    """Where a method's class comes from: ``kind`` builtin, file, module (not in any installed
    distribution) or distribution (an installed package, also an entry point's); ``file``: the module's
    source file (None for a built-in); ``sha256``: its hash (file and module); ``distribution``:
    ``name==version``; ``ship``: what Ray's ``py_modules`` sends to workers, a package's folder or a
    single-file module's ``.py`` (None: installed there)."""

    kind: str
    file: Path | None = None
    sha256: str | None = None
    distribution: str | None = None
    ship: Path | None = None

    def identity(self) -> dict[str, str] | None:
        """What decides whether the method changed (a trial's fingerprint); None for a built-in."""
        if self.kind == "builtin":
            return None
        if self.distribution is not None:
            return {"distribution": self.distribution}
        return {"sha256": self.sha256 or ""}

    def params(self) -> dict[str, str]:
        """The child run's ``method.*`` params that record it (none for a built-in)."""
        if self.kind == "builtin":
            return {}
        out = {"source": self.kind}
        if self.distribution is not None:
            out["distribution"] = self.distribution
        if self.sha256 is not None:
            out["sha256"] = self.sha256
        return out


def is_file_reference(target: str) -> bool:
    return target.endswith(".py") or "/" in target or target.startswith(("~", "."))


def file_module_name(path: Path) -> str:
    return FILE_PREFIX + hashlib.sha256(str(path).encode()).hexdigest()[:16]


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_file(path: Path) -> ModuleType:
    """The module of the file at ``path`` (absolute): Ray's shipped copy where a worker has one (what the
    driver fingerprinted, even where the worker sees the file too), else the file itself, loaded once
    (again when its content changed)."""
    name = file_module_name(path)
    module = sys.modules.get(name)
    loaded = None if module is None else getattr(module, "__clsr_sha256__", "shipped")
    if loaded == "shipped" or (loaded is not None and (not path.is_file() or loaded == sha256_of(path))):
        return module  # type: ignore[return-value]
    if module is None and importlib.util.find_spec(name) is not None:
        return _import(name)  # a Ray worker: the driver's copy arrived in py_modules
    if not path.is_file():
        raise MethodError(f"file not found: {path}")
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    # The bytes hashed are the bytes run: no bytecode cache (keyed by mtime and size, it serves a stale
    # module after an edit within the same second) and no __pycache__ written beside the user's file.
    source = path.read_bytes()
    module.__clsr_sha256__ = hashlib.sha256(source).hexdigest()  # type: ignore[attr-defined]
    sys.modules[name] = module
    try:
        exec(compile(source, str(path), "exec"), module.__dict__)
    except Exception as err:
        del sys.modules[name]
        raise MethodError(f"importing {path} failed:\n{their_traceback(err)}") from None
    return module


def load_module(name: str) -> ModuleType:
    try:
        return _import(name)
    except ModuleNotFoundError as err:
        if err.name is not None and (name == err.name or name.startswith(err.name + ".")):
            raise MethodError(
                f"no module named {err.name!r} (install its package, or put its folder on PYTHONPATH)"
            ) from None
        raise MethodError(f"importing {name} failed:\n{their_traceback(err)}") from None


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError:
        raise
    except Exception as err:
        raise MethodError(f"importing {name} failed:\n{their_traceback(err)}") from None


def their_traceback(err: BaseException) -> str:
    """The last frames of the user's code (importlib's and the platform's own left out) and the error."""
    ours = (str(Path(__file__).resolve().parents[1]), "<frozen ")
    frames = [f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith(ours)]
    shown = "".join(traceback.format_list(frames[-SHOWN_FRAMES:]))
    return (shown + "".join(traceback.format_exception_only(type(err), err))).rstrip()


def source_of(module: ModuleType, builtin: bool) -> MethodSource:
    """How ``module`` (a method's) is recorded and shipped."""
    if builtin:
        return MethodSource("builtin")
    file = Path(module.__file__).resolve() if getattr(module, "__file__", None) else None
    sha = sha256_of(file) if file is not None and file.is_file() else None
    if module.__name__.startswith(FILE_PREFIX):
        return MethodSource("file", file, sha)
    top = module.__name__.partition(".")[0]
    if dist := distribution_of(top):
        return MethodSource("distribution", file, sha, dist)
    package = sys.modules[top]
    is_package = getattr(package, "__path__", None) is not None
    ship = Path(package.__file__).resolve().parent if is_package and package.__file__ else file
    return MethodSource("module", file, sha, ship=ship)


@functools.lru_cache(maxsize=64)  # scanning every installed distribution takes a while; asked per trial
def distribution_of(top: str) -> str | None:
    """``name==version`` of the installed distribution that holds top-level module ``top``, or None."""
    dists = importlib.metadata.packages_distributions().get(top, [])
    dist = importlib.metadata.distribution(dists[0]) if dists else None
    return f"{dist.metadata['Name']}=={dist.version}" if dist else None


def staged(file: Path, name: str, root: Path) -> Path:
    """The single-file module ``file`` as a one-module package ``name`` (as the driver imports it) under
    ``root`` (private), content-addressed: the folder Ray's ``py_modules`` sends to every worker (Ray
    ships folders and wheels; a lone ``.py`` would arrive under a name of Ray's)."""
    folder = root / sha256_of(file)[:16] / name
    if not (folder / "__init__.py").is_file():
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        shutil.copyfile(file, folder / ".__init__.py.part")
        (folder / ".__init__.py.part").replace(folder / "__init__.py")
    return folder
