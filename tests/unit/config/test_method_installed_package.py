"""A lab's methods as a package installed with pip into a virtual environment, declared in the entry-point
group ``clsr.methods``: a study names one by its entry point, validates, and records the distribution's
name and version (what ``resume`` compares) instead of a file hash.

The environment is a fresh venv (no pip of its own) that sees this one's packages through a ``.pth``
file, and the package is built and installed by pip from its ``pyproject.toml``, as ``pip install
my-lab-methods`` would: about 10 s."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import textwrap
import venv
from pathlib import Path

import pytest

import clsr

PYPROJECT = """\
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "my-lab-methods"
version = "0.3.1"

[project.entry-points."clsr.methods"]
debiased = "my_lab_methods.losses:Debiased"
"""

LOSSES = """\
from clsr import Method
from clsr.methods.simcse_unsup import SimCSEUnsup


class Debiased(SimCSEUnsup):
    \"\"\"The lab's loss: SimCSE's, for the test.\"\"\"


assert issubclass(Debiased, Method)
"""

STUDY = """\
name: lab-method
method: debiased
base:
  model: {name: minilm, pooling: avg, mlp_only_train: false, max_seq_length: 32}
  data: {max_rows: 64}
  trainer: {batch_size: 8, max_steps: 2, eval_steps: 2}
  eval: {tasks: [stsb], dev_tasks: [sickr], select_on: sickr, log_model: false}
ablations:
  t: {grid: {method.temperature: [0.05]}}
seeds: [1]
metric: best_dev_sickr
resources: {workers_per_trial: 0}
"""

CHECK = """\
import json, sys
from clsr.config.methods import get_method, method_source
cls = get_method("debiased")
print(json.dumps({"module": cls.__module__, "params": method_source("debiased").params()}))
"""


def lab_venv(tmp_path: Path) -> Path:
    """A venv holding ``my-lab-methods`` installed by pip, seeing this interpreter's packages."""
    package = tmp_path / "my-lab-methods"
    (package / "my_lab_methods").mkdir(parents=True)
    (package / "pyproject.toml").write_text(PYPROJECT)
    (package / "my_lab_methods" / "__init__.py").write_text("")
    (package / "my_lab_methods" / "losses.py").write_text(textwrap.dedent(LOSSES))
    env = tmp_path / "lab-venv"
    venv.create(env, with_pip=False)
    site = next((env / "lib").glob("python3.*/site-packages"))
    # clsr's own folder too: an editable install (CI's `pip install -e`) is found through a finder
    # that a .pth in purelib registers, and a path added by another .pth has its .pth files unread
    source_root = str(Path(clsr.__file__).resolve().parents[1])
    python_path = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    ours = [sysconfig.get_paths()["purelib"], source_root, *python_path]
    (site / "parent.pth").write_text("\n".join(p for p in ours if p) + "\n")
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-build-isolation", "--no-deps",
         "--target", str(site), str(package)],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    return env / "bin" / "python"


def test_an_entry_point_of_a_pip_installed_package_is_a_method(tmp_path):
    python = lab_venv(tmp_path)
    run = subprocess.run([python, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout.strip().splitlines()[-1])
    assert found == {
        "module": "my_lab_methods.losses",
        "params": {
            "source": "distribution",
            "distribution": "my-lab-methods==0.3.1",
            "sha256": hashlib.sha256(textwrap.dedent(LOSSES).encode()).hexdigest(),  # the installed file
        },
    }
    (tmp_path / "study.yaml").write_text(STUDY)
    validate = [python, "-m", "clsr.cli", "study", "validate", str(tmp_path / "study.yaml")]
    checked = subprocess.run(validate, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert checked.returncode == 0 and "1 trial" in checked.stdout, checked.stdout + checked.stderr
    # not installed in this interpreter: the name is unknown here, as it would be before `pip install`
    from clsr.config.methods import get_method

    with pytest.raises(ValueError, match="unknown method 'debiased'"):
        get_method("debiased")
