"""Methods from outside the package (``clsr.config.methods``): a ``.py`` file, an importable module, an entry
point of the group ``clsr.methods``; the contract check's one-line refusals; the user's own traceback."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from clsr.config.method_source import FILE_PREFIX, MethodError, file_module_name, sha256_of
from clsr.config.methods import get_method, method_source
from clsr.config.trial import TrialConfig
from clsr.methods.simcse_unsup import SimCSEUnsup

MY_LOSS = """\
from clsr.methods.simcse_unsup import SimCSEUnsup


class MyLoss(SimCSEUnsup):
    \"\"\"SimCSE's loss, as a user's own.\"\"\"
"""


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))
    return path


@pytest.fixture
def on_path(tmp_path, monkeypatch):
    """A folder on sys.path; the modules imported from it are forgotten afterwards."""
    folder = tmp_path / "site"
    folder.mkdir()
    monkeypatch.syspath_prepend(str(folder))
    before = set(sys.modules)
    yield folder
    for name in set(sys.modules) - before:
        if name.startswith(("my_lab", "mylab_dist", FILE_PREFIX)):
            del sys.modules[name]


def test_a_file_loads_under_a_name_made_of_its_path(tmp_path):
    path = write(tmp_path / "my_method.py", MY_LOSS)
    cls = get_method(f"{path}:MyLoss")
    assert issubclass(cls, SimCSEUnsup) and cls.__name__ == "MyLoss"
    assert cls.__module__ == file_module_name(path) and sys.modules[cls.__module__].__file__ == str(path)
    assert get_method(f"{path}:MyLoss") is cls  # loaded once
    source = method_source(f"{path}:MyLoss")
    assert (source.kind, source.file, source.sha256) == ("file", path, sha256_of(path))
    assert source.params() == {"source": "file", "sha256": sha256_of(path)}
    # a trial of it takes the method's own keys, its defaults filled
    trial = TrialConfig(method={"name": f"{path}:MyLoss", "temperature": 0.1})
    defaults = SimCSEUnsup.Config(name="simcse_unsup").model_dump()
    assert trial.method == defaults | {"name": f"{path}:MyLoss", "temperature": 0.1}


def test_an_edited_file_is_loaded_again(tmp_path):
    path = write(tmp_path / "my_method.py", MY_LOSS + "\nVERSION = 1\n")
    first = get_method(f"{path}:MyLoss")
    write(path, MY_LOSS + "\nVERSION = 2\n")
    second = get_method(f"{path}:MyLoss")
    assert first is not second and sys.modules[second.__module__].VERSION == 2


def test_a_module_on_the_path_is_recorded_by_its_hash_and_shipped_as_its_package(on_path):
    write(on_path / "my_lab" / "__init__.py", "")
    module = write(on_path / "my_lab" / "losses.py", MY_LOSS)
    cls = get_method("my_lab.losses:MyLoss")
    assert cls.__module__ == "my_lab.losses"
    source = method_source("my_lab.losses:MyLoss")
    assert (source.kind, source.sha256, source.ship) == ("module", sha256_of(module), on_path / "my_lab")
    assert source.identity() == {"sha256": sha256_of(module)}


def test_a_single_file_module_on_the_path_is_shipped_as_a_package_of_its_name(on_path, tmp_path, monkeypatch):
    from clsr.study.control.ray_session import shipped_methods

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "no-such-folder"))  # the scratch folder instead
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    module = write(on_path / "my_lab_losses.py", MY_LOSS)
    source = method_source("my_lab_losses:MyLoss")
    assert (source.kind, source.sha256, source.ship) == ("module", sha256_of(module), module)
    (folder,) = shipped_methods(["my_lab_losses:MyLoss"])
    assert Path(folder).name == "my_lab_losses"  # what a worker imports, as the driver did
    assert (Path(folder) / "__init__.py").read_text() == module.read_text()


def test_an_entry_point_names_an_installed_distributions_class(on_path):
    write(on_path / "mylab_dist" / "__init__.py", MY_LOSS)
    info = on_path / "mylab_dist-1.2.3.dist-info"
    write(info / "METADATA", "Metadata-Version: 2.1\nName: mylab-dist\nVersion: 1.2.3\n")
    write(info / "top_level.txt", "mylab_dist\n")
    write(info / "RECORD", "mylab_dist/__init__.py,,\n")
    write(info / "entry_points.txt", "[clsr.methods]\ndebiased = mylab_dist:MyLoss\n")
    cls = get_method("debiased")
    assert cls.__module__ == "mylab_dist" and cls.__name__ == "MyLoss"
    source = method_source("debiased")
    assert (source.kind, source.distribution, source.ship) == ("distribution", "mylab-dist==1.2.3", None)
    assert source.identity() == {"distribution": "mylab-dist==1.2.3"}
    assert source.params()["distribution"] == "mylab-dist==1.2.3"
    with pytest.raises(ValueError, match="unknown method 'debiassed'; allowed: .*debiased"):
        get_method("debiassed")


def test_the_built_in_methods_are_recorded_as_nothing_new():
    source = method_source("simcse_unsup")
    assert source.kind == "builtin" and source.identity() is None and source.params() == {}


@pytest.mark.parametrize(
    ("body", "attribute", "message"),
    [
        ("class NotAMethod:\n    pass\n", "NotAMethod", r"NotAMethod \(.*my_method.py\) is not a method"),
        (
            "from clsr.methods.simcse_unsup import SimCSEUnsup\n\n"
            "class Bad(SimCSEUnsup):\n    class Config:\n        pass\n",
            "Bad",
            r"Bad.Config \(.*my_method.py\) must be a class that subclasses .*MethodConfig",
        ),
        (
            "from clsr.methods.base import Method, MethodConfig\n\n"
            "class Half(Method):\n    Config = MethodConfig\n\n"
            "    def views(self):\n        return ('anchor',)\n",
            "Half",
            r"Half \(.*my_method.py\) does not implement loss_from_embeddings",
        ),
        (MY_LOSS, "Missing", r"my_method.py defines no class 'Missing'"),
    ],
)
def test_what_is_not_a_method_is_refused_in_one_line(tmp_path, body, attribute, message):
    path = write(tmp_path / "my_method.py", body)
    with pytest.raises(MethodError, match=message) as refused:
        get_method(f"{path}:{attribute}")
    assert "\n" not in str(refused.value)


def test_a_study_names_the_file_the_class_and_the_field(tmp_path):
    from clsr.study.plan.load import load_study
    from clsr.study.spec.schema import StudyError

    write(tmp_path / "my_method.py", MY_LOSS)
    study = tmp_path / "study.yaml"
    study.write_text(
        "name: mine\nmethod: ./my_method.py:MyLoss\nbase: {method: {temprature: 0.1}}\n"
        "ablations: {t: {grid: {method.temperature: [0.05]}}}\nmetric: best_dev_stsb\n"
    )
    with pytest.raises(StudyError) as refused:
        load_study(study)
    assert refused.value.problems == [
        f"base.method: unknown key 'temprature' of MyLoss.Config ({tmp_path / 'my_method.py'}); did you "
        f"mean 'temperature'?"
    ]
    study.write_text(study.read_text().replace("temprature", "temperature"))
    loaded = load_study(study)  # relative to the study file, not the working folder
    assert loaded.method == f"{tmp_path / 'my_method.py'}:MyLoss"


def test_an_import_error_shows_the_users_frames_not_ours(tmp_path):
    path = write(
        tmp_path / "my_method.py",
        """\
        import math


        def helper():
            return math.sqrt(-1)


        RATE = helper()
        """,
    )
    with pytest.raises(MethodError) as refused:
        get_method(f"{path}:MyLoss")
    text = str(refused.value)
    assert text.splitlines()[0] == f"importing {path} failed:"
    assert f'File "{path}", line 8, in <module>' in text and f'File "{path}", line 5, in helper' in text
    assert text.splitlines()[-1] == "ValueError: math domain error"
    assert "importlib" not in text and "clsr" not in text.replace(str(tmp_path), "")
    assert file_module_name(path) not in sys.modules


def test_a_missing_module_is_named(on_path):
    with pytest.raises(MethodError, match=r"no module named 'my_lab_absent' \(install its package"):
        get_method("my_lab_absent.losses:MyLoss")
    write(on_path / "my_lab_broken.py", "import my_lab_absent_dependency\n")
    with pytest.raises(MethodError, match="No module named 'my_lab_absent_dependency'") as refused:
        get_method("my_lab_broken:MyLoss")
    assert str(on_path / "my_lab_broken.py") in str(refused.value)


STUDY = """\
name: mine
method: ./my_method.py:MyLoss
ablations:
  t: {grid: {method.temperature: [0.05, 0.1]}}
  builtin: {method: simcse_unsup, grid: {method.temperature: [0.05]}}
metric: best_dev_stsb
"""


def test_an_edited_method_file_changes_exactly_its_trials_fingerprints(tmp_path):
    from clsr.study.plan.fingerprint import compare, fingerprint
    from clsr.study.plan.load import load_study

    path = write(tmp_path / "my_method.py", MY_LOSS)
    (tmp_path / "study.yaml").write_text(STUDY)
    before = fingerprint(load_study(tmp_path / "study.yaml"))
    assert fingerprint(load_study(tmp_path / "study.yaml")) == before  # stable
    write(path, MY_LOSS + "\n# the loss, reweighted\n")
    changes = compare(before, fingerprint(load_study(tmp_path / "study.yaml")))
    assert changes.changed == [
        f"(method) {path}:MyLoss",
        "t[method.temperature=0.05] seed=42",
        "t[method.temperature=0.1] seed=42",
    ]  # the built-in ablation's trial: unchanged
    assert not changes.added and not changes.removed
    assert changes.describe() == [
        f"the method {path}:MyLoss changed (its file's SHA-256, or its distribution's version): its trials "
        "below run again",
        "2 changed: t[method.temperature=0.05] seed=42, t[method.temperature=0.1] seed=42",
    ]


def test_a_built_in_methods_trial_hashes_as_before(tmp_path):
    """Studies recorded before methods could come from files resume without a change."""
    from clsr.study.plan.fingerprint import digest, fingerprint, trial_key
    from clsr.study.plan.load import load_study
    from clsr.study.plan.resolve import trial_document

    write(tmp_path / "my_method.py", MY_LOSS)
    (tmp_path / "study.yaml").write_text(STUDY)
    study = load_study(tmp_path / "study.yaml")
    doc = trial_document(study, "builtin", {"method.temperature": 0.05}, 42)
    assert fingerprint(study)[trial_key("builtin", "method.temperature=0.05", 42)] == digest(doc)


def test_the_driver_ships_a_file_as_a_package_named_as_it_loads_it(tmp_path, monkeypatch):
    from clsr.study.control.ray_session import shipped_methods

    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "no-such-folder"))  # the scratch folder instead
    monkeypatch.setattr("tempfile.tempdir", str(tmp_path))
    path = write(tmp_path / "study" / "my_method.py", MY_LOSS)
    (folder,) = shipped_methods([f"{path}:MyLoss", "simcse_unsup"])
    assert Path(folder).name == file_module_name(path)
    assert (Path(folder) / "__init__.py").read_text() == path.read_text()
    assert shipped_methods([f"{path}:MyLoss"]) == [folder]  # content-addressed: staged once


def test_the_built_in_methods_are_the_packages_entry_points():
    import tomllib

    from clsr.config.methods import BUILT_IN

    pyproject = tomllib.loads((Path(__file__).resolve().parents[3] / "pyproject.toml").read_text())
    assert pyproject["project"]["entry-points"]["clsr.methods"] == BUILT_IN
