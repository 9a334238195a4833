"""Study YAML and values: duplicate keys, alias bombs, huge or non-UTF-8 files, tagged or broken
``--set`` values, non-finite floats, out-of-range seeds and sizes, and huge grids are refused fast, as
one-line messages that name the file, field or key, never as a traceback or a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from clsr.cli import main
from clsr.config.trial import TrialConfig
from clsr.study.plan import load
from clsr.study.plan import resolve as plan
from clsr.study.plan.load import load_study
from clsr.study.plan.resolve import count_trials
from clsr.study.spec.schema import StudyError
from clsr.study.spec.strict import MAX_TRIALS
from clsr.study.spec.yaml_safe import MAX_FILE_BYTES
from tests.support.hub import hub_model_ids, stub_datasets_cache, stub_hub_cache

REPO_ROOT = Path(__file__).resolve().parents[4]
STUDIES = sorted((REPO_ROOT / "studies").glob("*.yaml"))
GOOD = """\
name: t
method: simcse_unsup
base:
  model: {name: minilm}
  trainer: {batch_size: 16}
ablations:
  temp:
    grid: {method.temperature: [0.05, 0.1]}
"""
BOMB = """\
a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]
b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a]
c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b]
d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c]
e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d]
f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e]
g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f]
h: &h [*g,*g,*g,*g,*g,*g,*g,*g,*g]
i: &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]
"""
TEN = "[" + ", ".join(str(n) for n in range(1, 11)) + "]"
HUGE_GRID = f"""\
name: huge
method: simcse_unsup
base: {{model: {{name: minilm}}}}
ablations:
  big:
    grid:
      method.temperature: [0.01, 0.02, 0.03, 0.04, 0.05, 0.06, 0.07, 0.08, 0.09, 0.1]
      trainer.max_steps: {TEN}
      trainer.eval_steps: {TEN}
      trainer.log_every: {TEN}
      trainer.warmup_steps: {TEN}
      model.max_seq_length: [16, 17, 18, 19, 20, 21, 22, 23, 24, 25]
"""


def write(tmp_path: Path, text: str | bytes, name: str = "study.yaml") -> Path:
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    return path


def validate(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["study", "validate", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def problem_lines(err: str) -> list[str]:
    """The problem lines of a StudyError as printed (its first line is the header)."""
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert lines[0].startswith("1 problem(s) in study"), err
    return lines[1:]


def refused(capsys, path: Path, *fragments: str) -> str:
    """``study validate`` refuses the file with exactly one one-line problem naming the file and each
    fragment."""
    code, out, err = validate(capsys, str(path))
    assert code == 1 and not out
    (line,) = problem_lines(err)
    assert len(line) < 500, line
    for fragment in (str(path), *fragments):
        assert fragment in line, line
    return line


def test_duplicate_keys_are_refused_with_both_lines(tmp_path, capsys):
    path = write(tmp_path, GOOD + "name: other\n")
    refused(capsys, path, "duplicate key 'name'", "line 1 and line 9")
    nested = GOOD.replace("trainer: {batch_size: 16}", "trainer: {batch_size: 16, batch_size: 32}")
    refused(capsys, write(tmp_path, nested), "duplicate key 'batch_size'", "twice on line 5")


def test_merge_keys_and_a_few_aliases_still_work(tmp_path):
    text = GOOD.replace("base:\n", "x-model: &m {name: minilm}\nbase:\n").replace(
        "model: {name: minilm}", "model: {<<: *m, pooling: avg}"
    )
    with pytest.raises(StudyError, match="x-model"):  # an unknown top-level key, not a YAML problem
        load_study(write(tmp_path, text))
    text = text.replace("x-model: &m {name: minilm}\n", "").replace("<<: *m, ", "name: minilm, ")
    assert load_study(write(tmp_path, text)).base["model"] == {"name": "minilm", "pooling": "avg"}


def test_a_from_file_with_a_duplicate_key_is_refused(tmp_path, capsys):
    write(tmp_path, "grid: {method.temperature: [0.05]}\ngrid: {method.temperature: [0.1]}\n", "space.yaml")
    text = GOOD.replace("    grid: {method.temperature: [0.05, 0.1]}\n", "    from: space.yaml\n")
    code, _, err = validate(capsys, str(write(tmp_path, text)))
    first = err.splitlines()[1]  # then: the ablation has no grid (the file's was not read)
    assert code == 1 and "Traceback" not in err
    assert (
        "ablations.temp.from: " in first and "space.yaml: duplicate key 'grid' (line 1 and line 2)" in first
    )


def test_an_alias_bomb_fails_fast(tmp_path, capsys):
    path = write(tmp_path, BOMB)
    started = time.perf_counter()
    with pytest.raises(StudyError, match="alias"):
        load_study(path)
    assert time.perf_counter() - started < 2
    refused(capsys, path, "aliases (*name) would expand the document", "at most 100,000")


def validate_in_subprocess(path: Path) -> subprocess.CompletedProcess:
    """``platform study validate <path>`` as its own process, bounded in time."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT / "platform")}
    return subprocess.run(
        [sys.executable, "-m", "clsr.cli", "study", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )


def test_an_alias_bomb_does_not_hang_the_command(tmp_path):
    path = write(tmp_path, BOMB)
    done = validate_in_subprocess(path)
    assert done.returncode == 1
    assert "alias" in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr) < 1000


def test_files_over_one_mib_are_refused_before_reading(tmp_path, capsys):
    path = write(tmp_path, GOOD + "#" * MAX_FILE_BYTES + "\n")
    refused(capsys, path, f"{path.stat().st_size:,} bytes", "at most 1,048,576 bytes")
    sparse = tmp_path / "sparse.yaml"
    with sparse.open("wb") as f:
        f.truncate(50 * 2**20)
    started = time.perf_counter()
    refused(capsys, sparse, "52,428,800 bytes")
    assert time.perf_counter() - started < 2


def test_non_utf8_bytes_name_the_offset(tmp_path, capsys):
    path = write(tmp_path, GOOD.encode().replace(b"name: t\n", b"name: caf\xe9\n"))
    refused(capsys, path, "not UTF-8", "byte 0xe9 at offset 9")


def test_a_set_value_with_a_tag_is_refused(tmp_path, capfd):
    marker = tmp_path / "pwned"
    value = f'trainer.lr=!!python/object/apply:os.system ["touch {marker}"]'
    for action in ("validate", "run"):  # run: the driver child refuses it, on the command's stderr
        code = main(["study", action, str(REPO_ROOT / "studies" / "smoke.yaml"), "--set", value])
        out, err = capfd.readouterr()
        assert code == 2 and "Traceback" not in err
        (line,) = err.strip().splitlines()
        assert f"--set {value}: not a plain YAML value (tags are not allowed)" in line
    assert not marker.exists()


def test_a_set_value_with_broken_syntax_is_refused(capsys):
    code, out, err = validate(capsys, str(REPO_ROOT / "studies" / "smoke.yaml"), "--set", "seeds=[1, 2")
    assert code == 2 and not out and "Traceback" not in err
    (line,) = err.strip().splitlines()
    assert "--set seeds=[1, 2: not valid YAML" in line


@pytest.mark.parametrize(
    ("change", "field", "fragment"),
    [
        (("trainer: {batch_size: 16}", "trainer: {batch_size: 16, lr: .inf}"), "base.trainer.lr", "finite"),
        (("trainer: {batch_size: 16}", "trainer: {batch_size: 16, epochs: .inf}"), "base.trainer.epochs", "finite"),
        (("trainer: {batch_size: 16}", "trainer: {batch_size: 16, epochs: 1.0e+6}"), "base.trainer.epochs", "10000"),
        (("trainer: {batch_size: 16}", "trainer: {batch_size: 16, lr: .nan}"), "base.trainer.lr", "finite"),
        (("[0.05, 0.1]", "[0.05, .inf]"), "method.temperature", "finite"),
        (("ablations:", "seeds: [1e23]\nablations:"), "seeds.0", "'1e23'"),
        (("ablations:", "seeds: [1.0e+23]\nablations:"), "seeds.0", "1e+23"),
        (("ablations:", "seeds: [100000000000000000000000]\nablations:"), "seeds.0", "2**32 - 1"),
        (("ablations:", "seeds: [-1]\nablations:"), "seeds.0", "2**32 - 1"),
        (("model: {name: minilm}", "model: {name: minilm}\n  data: {subset_seed: -5}"), "base.data.subset_seed", "2**32"),
        (("trainer: {batch_size: 16}", "trainer: {batch_size: 1e30}"), "base.trainer.batch_size", "1e30"),
        (("trainer: {batch_size: 16}", "trainer: {batch_size: 1.0e+30}"), "base.trainer.batch_size", "1e+30"),
        (("trainer: {batch_size: 16}", "trainer: {batch_size: 2000000}"), "base.trainer.batch_size", "1000000"),
        (("trainer: {batch_size: 16}", "trainer: {max_steps: 10000000000}"), "base.trainer.max_steps", "1000000000"),
        (("model: {name: minilm}", "model: {name: minilm}\n  data: {max_rows: 1.0e+11}"), "base.data.max_rows", "10000000000"),
    ],
)  # fmt: skip
def test_values_out_of_range_are_refused(tmp_path, capsys, change, field, fragment):
    text = GOOD.replace(*change)
    assert text != GOOD
    code, out, err = validate(capsys, str(write(tmp_path, text)))
    assert code == 1 and not out and "Traceback" not in err
    lines = err.strip().splitlines()[1:]
    assert any(field in line and fragment in line for line in lines), err
    assert all(len(line) < 500 for line in lines)


def test_trial_seeds_out_of_range_are_refused():
    with pytest.raises(ValidationError, match="a seed is a whole number from 0 to 2"):
        TrialConfig.model_validate({"method": {"name": "simcse_unsup"}, "trainer": {"seed": 2**32}})


def test_a_need_seed_out_of_range_is_refused(tmp_path):
    text = GOOD + (
        "  down:\n    grid: {method.temperature: [0.05]}\n"
        "    needs: {model.name: {ablation: temp, point: '0.05', seed: 4294967296}}\n"
    )
    with pytest.raises(StudyError, match=r"ablations\.down\.needs\.model\.name\.seed: a seed"):
        load_study(write(tmp_path, text))


def test_a_million_point_grid_is_refused_before_expansion(tmp_path, capsys, monkeypatch):
    def never(*_):
        raise AssertionError("a grid was expanded")

    for module in (load, plan):  # wherever a grid could be expanded
        monkeypatch.setattr(module, "grid_points", never)
    path = write(tmp_path, HUGE_GRID)
    started = time.perf_counter()
    with pytest.raises(StudyError) as caught:
        load_study(path)
    assert time.perf_counter() - started < 2
    (problem,) = caught.value.problems
    assert "1,000,000 trials" in problem and f"at most {MAX_TRIALS:,}" in problem
    refused(capsys, path, "ablations: 1,000,000 trials (big: 1,000,000)")


def test_a_million_point_grid_does_not_hang_the_command(tmp_path):
    path = write(tmp_path, HUGE_GRID)
    done = validate_in_subprocess(path)
    assert done.returncode == 1 and "1,000,000 trials" in done.stderr and "Traceback" not in done.stderr


ATTENTION_NOTE = (
    "    note: ablations.temperature[method.temperature=0.05], ablations.temperature[method.temperature=0.1]: "
    "model.attention auto: sdpa_packed on CPU trials (minilm: bert)"
)  # what the default attention runs on the smoke study's CPU trials


def test_validate_prints_trials_and_distinct_trials(tmp_path, capsys):
    code, out, err = validate(capsys, "studies/smoke.yaml")
    assert code == 0 and out.splitlines()[0] == "ok  studies/smoke.yaml: 2 trials (2 distinct)"
    one_seed = "    note: ablations.temperature: 1 seed: no CI or verdict; give seeds: [42, 43, 44] (or more)"
    assert out.splitlines()[1:] == [ATTENTION_NOTE, one_seed]
    twice = GOOD + "  again:\n    grid: {method.temperature: [0.1, 0.2]}\n"
    path = write(tmp_path, twice)
    assert count_trials(load_study(path)) == (4, 3)  # temperature 0.1 runs in both ablations
    code, out, _ = validate(capsys, str(path))
    assert code == 0 and out.splitlines()[0] == f"ok  {path}: 4 trials (3 distinct)"
    assert "note:" in out  # minilm with SimCSE's cls, not its own mean pooling: said, not refused


def test_validate_accepts_set(capsys):
    smoke = str(REPO_ROOT / "studies" / "smoke.yaml")
    code, out, _ = validate(capsys, smoke, "--set", "seeds=[1, 2, 3]", "--set", "trainer.max_steps=4")
    assert code == 0 and out.splitlines() == [f"ok  {smoke}: 6 trials (6 distinct)", ATTENTION_NOTE]
    code, out, err = validate(capsys, smoke, "--set", "trainer.lr=.inf")
    assert code == 1 and "base.trainer.lr: Input should be a finite number" in err


def test_run_of_more_than_2000_trials_needs_yes(tmp_path, capfd, monkeypatch):
    import ray

    monkeypatch.chdir(tmp_path)
    temperatures = ", ".join(f"{0.01 * n:.2f}" for n in range(1, 42))
    text = GOOD.replace("[0.05, 0.1]", f"[{temperatures}]") + f"seeds: {list(range(50))}\n"
    path = write(tmp_path, text)
    assert main(["study", "run", str(path)]) == 2
    out, err = capfd.readouterr()  # the driver child's, on the command's stderr
    (line,) = err.strip().splitlines()
    assert "2,050 trials" in line and "--yes" in line and "Traceback" not in err
    assert not ray.is_initialized()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["study.yaml"]  # no MLflow store, no Ray storage


@pytest.fixture(scope="module")
def shipped_models_cache(tmp_path_factory) -> Path:
    """The hub models the shipped studies name, as if downloaded (config only: validation reads no weights)."""
    return stub_hub_cache(tmp_path_factory.mktemp("hub"), hub_model_ids(STUDIES))


@pytest.fixture(scope="module")
def every_hub_dataset(tmp_path_factory) -> Path:
    """Every hub data set of the manifest, as if downloaded and prepared by datasets."""
    return stub_datasets_cache(tmp_path_factory.mktemp("datasets"))


@pytest.fixture(scope="module")
def data_with_release_files(tmp_path_factory) -> Path:
    """The shared data folder plus an (empty) ParaNMT release file: the one catalogue file no hub has."""
    from clsr.data.pair_sources import PARANMT_FILE
    from clsr.data.sources import resolve_data_dir

    root = tmp_path_factory.mktemp("data")
    for child in resolve_data_dir().iterdir():
        (root / child.name).symlink_to(child)
    (root / PARANMT_FILE).parent.mkdir()
    (root / PARANMT_FILE).touch()
    return root


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.name)
def test_every_shipped_study_validates_with_and_without_smoke(
    path, capsys, monkeypatch, shipped_models_cache, every_hub_dataset, data_with_release_files
):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(shipped_models_cache))  # its hub ids downloaded: validates
    monkeypatch.setenv("HF_DATASETS_CACHE", str(every_hub_dataset))
    monkeypatch.setenv("CLSR_DATA_DIR", str(data_with_release_files))
    code, out, err = validate(capsys, str(path))
    assert code == 0 and out.startswith(f"ok  {path}: ") and "distinct" in out, err
    if "smoke" in yaml.safe_load(path.read_text()):
        code, out, err = validate(capsys, str(path), "--smoke")
        assert code == 0 and "distinct" in out, err


@pytest.mark.parametrize("path", STUDIES, ids=lambda p: p.name)
def test_every_shipped_study_validates_offline_skipping_what_needs_the_hub(
    path, capsys, monkeypatch, tmp_path
):
    """Nothing downloaded: each point needing the hub is named as skipped, and the rest validates."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-hub"))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "empty-datasets"))
    code, out, err = validate(capsys, str(path), "--set", "skip_unavailable=true")
    assert code == 0 and out.startswith(f"ok  {path}: "), err
    if hub_model_ids([path]):  # MiniLM ships with the package; other models come from the hub
        assert "    skipped when run here: " in out


def test_the_simcse_study_offline_names_each_row_whose_data_is_not_here(
    capsys, monkeypatch, shipped_models_cache
):
    """Only the models downloaded: the rows reading hub data sets, or ParaNMT's release file, are named
    with what to provide, and skip_unavailable runs the rest."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(shipped_models_cache))
    monkeypatch.setenv("HF_DATASETS_CACHE", str(shipped_models_cache / "no-arrow-cache"))
    path = str(REPO_ROOT / "studies" / "simcse_ablations.yaml")
    code, _, err = validate(capsys, path)
    named = {
        line.split(": data.train ")[1].split(":")[0] for line in err.splitlines() if ": data.train " in line
    }
    assert code != 0 and named == {
        "wiki_ordered", "qqp_pairs", "flickr30k_pairs", "paranmt_pairs", "nli_for_simcse", "nli_anli_for_simcse"
    }, err  # fmt: skip
    assert "ablations.positives[Table 2: next sentence]" in err and "para-nmt-5m-processed.txt" in err
    code, out, err = validate(capsys, path, "--set", "skip_unavailable=true")
    assert code == 0 and out.startswith(f"ok  {path}: "), err
