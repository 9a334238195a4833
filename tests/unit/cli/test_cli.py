"""The command line and the Tune objects a study builds, without running a study."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from mlflow.tracking import MlflowClient

from clsr.cli import main
from clsr.study.plan.load import load_study
from clsr.study.plan.resolve import grid_points
from clsr.study.run.experiment import build_tuner, param_space
from clsr.study.run.trial import StudyContext
from tests.support.stores import sqlite_uri

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_the_shipped_tune_then_confirm_study_builds_its_searcher(tmp_path):
    """simcse_tuning: Optuna over 2 seeds (Repeater), the paper's configuration first, FIFO; then the
    confirm ablation over 5 fresh seeds: 16 x 2 + (3 + 1) x 5 trials."""
    from ray.tune.schedulers import FIFOScheduler
    from ray.tune.search.optuna import OptunaSearch

    from clsr.study.plan.resolve import count_trials
    from clsr.study.run.search import SeedRepeater
    from clsr.study.run.tune_compat import tuner_tune_config

    study = load_study(REPO_ROOT / "studies" / "simcse_tuning.yaml")
    ctx = StudyContext(study, "sqlite:///x.db", "parent", str(tmp_path))
    tuner = build_tuner(study, ctx, "lr_batch", restore=False)
    tune_config = tuner_tune_config(tuner)
    repeater = tune_config.search_alg
    assert isinstance(repeater, SeedRepeater) and isinstance(repeater.searcher, OptunaSearch)
    assert repeater.seeds == [42, 43] and tune_config.num_samples == 16 * 2
    assert tune_config.scheduler is None or isinstance(tune_config.scheduler, FIFOScheduler)
    assert repeater.searcher._points_to_evaluate[0]["point/overrides/trainer.lr"] == 3.0e-5
    space = param_space(study, "lr_batch")["point"]["overrides"]
    assert set(space) == {"trainer.lr", "trainer.batch_size"}
    assert count_trials(study)[0] == 16 * 2 + (3 + 1) * 5
    assert (
        study.ablations["confirmed"].confirm.of == "lr_batch"
        and study.ablations["confirmed"].reference == "paper"
    )


def test_points_that_cannot_run_offline_are_refused_or_skipped(monkeypatch, capsys, tmp_path):
    from clsr.data.sources import resolve_data_dir
    from clsr.study.plan.study_plan import plan_study
    from clsr.study.run.runner import refuse_unavailable
    from clsr.study.spec.schema import StudyError

    def runnable_points(study):  # what `study run` does before anything is recorded
        plan = plan_study(study)
        refuse_unavailable(study, plan.unavailable)
        return plan.points

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    study = load_study(REPO_ROOT / "studies" / "gclsr_ablations.yaml")
    with pytest.raises(StudyError) as caught:  # the paper's word2vec file is not in the shared folder
        runnable_points(study)
    assert "GoogleNews-vectors-negative300.bin" in caught.value.problems[0]
    # a data folder holding it (a stand-in: validation checks that the file is there): only the
    # back-translation points, whose models need the hub, cannot run
    shared, data = resolve_data_dir(), tmp_path / "data"
    for child in shared.iterdir():
        if child.name != "word_vectors":
            (data / child.name).parent.mkdir(exist_ok=True)
            (data / child.name).symlink_to(child)
    (data / "word_vectors").mkdir()
    for child in (shared / "word_vectors").iterdir():
        (data / "word_vectors" / child.name).symlink_to(child)
    (data / "word_vectors" / "GoogleNews-vectors-negative300.bin").touch()
    monkeypatch.setenv("CLSR_DATA_DIR", str(data))
    study = load_study(REPO_ROOT / "studies" / "gclsr_ablations.yaml")
    with pytest.raises(StudyError) as caught:
        runnable_points(study)
    problems = caught.value.problems
    assert [p.split(":")[0] for p in problems[:2]] == [
        "ablations.components[+ TransL]",
        "ablations.components[+ TransL + self-att. + GP]",
    ]
    assert "Helsinki-NLP/opus-mt-en-de" in problems[0] and "skip_unavailable" in problems[-1]
    smoke = load_study(REPO_ROOT / "studies" / "gclsr_ablations.yaml", smoke=True)
    assert len(runnable_points(smoke)) == 47
    assert "skipped (not available here): ablations.components[+ TransL]" in capsys.readouterr().out


def test_grid_space_is_points_times_seeds():
    study = load_study(REPO_ROOT / "studies" / "simcse_ablations.yaml")
    trials = param_space(study, None)["point"]["grid_search"]
    # Tables 3, D.1, 6 (unsup, sup), 7, 1 with Table 2's two-encoder and next-sentence rows, 4 and Appendix A
    assert len(trials) == (8 + 6 + 5 + 5 + 5 + (10 + 2 + 4) + 16 + 12) * 3
    assert [t["seed"] for t in trials[:4]] == [42, 43, 44, 42]


def test_validate_command_exit_codes(tmp_path, capsys):
    assert main(["study", "validate", str(REPO_ROOT / "studies" / "smoke.yaml")]) == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nmethod: nope\nablations: {}\n")
    assert main(["study", "validate", str(bad)]) == 1
    assert "method: unknown method 'nope'" in capsys.readouterr().err


def test_eval_prints_the_table_and_logs_to_mlflow(tmp_path, monkeypatch, capsys, data_dir):
    uri = sqlite_uri(tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    assert main(["eval", "--model", "minilm", "--pooling", "mean", "--tasks", "sts16", "--mlflow"]) == 0
    assert "78.99" in capsys.readouterr().out  # all-MiniLM-L6-v2's published STS16 score
    client = MlflowClient(uri)
    run = client.search_runs([client.get_experiment_by_name("eval").experiment_id])[0]
    assert round(run.data.metrics["test_sts16"], 2) == 78.99
    assert (run.data.params["device"], run.data.params["precision"]) == ("cpu", "fp32")  # auto, no GPU here
    # the precision asked for is the one used: bf16 rounding moves the score, a little (on 300 of the pairs:
    # CPU bf16 is emulated, 4x slower than fp32, on CPUs without AVX-512 BF16 such as CI's)
    from clsr.data.sts import load_sts

    sts16 = load_sts("sts16", "test", data_dir)
    pairs = tmp_path / "pairs.tsv"
    rows = zip(sts16.sentences1[:300], sts16.sentences2[:300], sts16.scores[:300], strict=True)
    pairs.write_text("sentence1\tsentence2\tscore\n" + "".join(f"{a}\t{b}\t{s}\n" for a, b, s in rows))
    (tmp_path / "tasks.yaml").write_text(f"part: {{type: sts, path: {pairs}}}\n")
    for precision in ("fp32", "bf16"):
        args = ["eval", "--model", "minilm", "--pooling", "mean", "--custom", str(tmp_path / "tasks.yaml")]
        assert main([*args, "--precision", precision, "--mlflow"]) == 0
    part = {
        r.data.params["precision"]: r.data.metrics["test_part"]
        for r in client.search_runs([client.get_experiment_by_name("eval").experiment_id])
        if "test_part" in r.data.metrics
    }
    assert part["bf16"] != part["fp32"] and abs(part["bf16"] - part["fp32"]) < 0.5


def test_eval_refuses_a_device_this_machine_does_not_have(capsys):
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: --device cuda is valid here")
    assert main(["eval", "--model", "minilm", "--device", "cuda"]) == 2
    assert (
        "--device: device 'cuda': no CUDA GPU is visible here; use --device cpu (or auto)"
        in capsys.readouterr().err
    )


def test_summary_rows_show_the_averages_a_trial_has():
    """Rows come from the trials' MLflow runs (the record), superseded runs left out."""
    from types import SimpleNamespace

    from clsr.study.record.summary import format_rows, summary_rows

    study = load_study(REPO_ROOT / "studies" / "supmpn_ablations.yaml", smoke=True)

    def run(start: int, seed: int, metrics: dict, **tags) -> SimpleNamespace:
        labels = {"clsr.ablation": "reference", "clsr.point": "SupMPN-BERT-base", "clsr.seed": str(seed)}
        return SimpleNamespace(
            info=SimpleNamespace(start_time=start),
            data=SimpleNamespace(tags={**labels, "clsr.status": "finished", **tags}, metrics=metrics),
        )

    smoke = run(
        1, 1, {"best_dev_sickr": 80.0, "test_stsb": 82.5, "test_mr": 70.0, "test_transfer_avg": 75.25}
    )
    full = run(2, 2, {"test_sts_avg": 81.0, "test_stsb": 84.0})
    old = run(0, 2, {"test_sts_avg": 1.0}, **{"clsr.superseded": "v2"})
    rows = summary_rows([full, old, smoke], study)
    assert len(rows) == 2
    assert rows[0] == {
        "ablation": "reference",
        "point": "SupMPN-BERT-base",
        "seed": "1",
        "status": "finished",
        "best_dev_sickr": 80.0,
        "test_stsb": 82.5,
        "test_transfer_avg": 75.25,
    }
    assert rows[1]["test_sts_avg"] == 81.0 and "test_stsb" not in rows[1]
    assert "test_transfer_avg" in format_rows(rows).splitlines()[0]
    error = "Traceback (most recent call last):\n  File x\nDataUnavailableError: missing /d/wiki/wiki1m.txt\n"
    failed = run(3, 3, {}, **{"clsr.status": "failed", "clsr.error": error})
    rows = summary_rows([smoke, failed], study)
    assert "reason" not in rows[0] and rows[1]["reason"] == "DataUnavailableError: missing /d/wiki/wiki1m.txt"
    assert format_rows(rows).splitlines()[0].split(" | ")[-1].strip() == "reason"
    # a long reason is never cut before its hint: numbered in the table, written out whole once below it
    hint = "offline: set CLSR_DATA_DIR to the shared data folder (ConnectionError: hub unreachable)"
    long = f"DataUnavailableError: stsb needs the hub or a data folder; {hint}"
    twice = [run(4 + n, n, {}, **{"clsr.status": "failed", "clsr.error": long}) for n in (4, 5)]
    table = format_rows(summary_rows([smoke, *twice], study)).splitlines()
    assert [line.split(" | ")[-1].strip() for line in table[3:5]] == ["[1]", "[1]"]
    assert table[-1] == f"[1] {long}" and sum(hint in line for line in table) == 1


def test_summary_rows_follow_the_study_files_order():
    """Issue 53: the end-of-study table lists ablations and their points in the study file's order, then
    seeds, whatever order the trials started in; a label the file does not have goes after its ablation's."""
    from types import SimpleNamespace

    from clsr.study.record.summary import summary_rows

    study = load_study(REPO_ROOT / "studies" / "simcse_ablations.yaml", smoke=True)
    first, second = list(study.ablations)[:2]
    labels = [p.label for p in grid_points(study.ablations[first])]
    assert len(labels) >= 2

    def run(start: int, ablation: str, point: str, seed: int) -> SimpleNamespace:
        tags = {
            "clsr.ablation": ablation,
            "clsr.point": point,
            "clsr.seed": str(seed),
            "clsr.status": "finished",
        }
        return SimpleNamespace(
            info=SimpleNamespace(start_time=start), data=SimpleNamespace(tags=tags, metrics={})
        )

    started = [  # the order Tune happened to start them in
        run(0, second, "whatever", 1),
        run(1, first, "gone from the file", 1),
        run(2, first, labels[1], 2),
        run(3, first, labels[1], 1),
        run(4, first, labels[0], 1),
    ]
    rows = summary_rows(started, study)
    assert [(r["ablation"], r["point"], r["seed"]) for r in rows] == [
        (first, labels[0], "1"),
        (first, labels[1], "1"),
        (first, labels[1], "2"),
        (first, "gone from the file", "1"),
        (second, "whatever", "1"),
    ]


def test_failures_that_come_back_on_every_retry_are_final():
    """A missing data file or model, and a batch that does not fit, end the trial at once with a reason."""
    import torch

    from clsr.data.hub.model_registry import ModelUnavailableError
    from clsr.data.sources import DataUnavailableError
    from clsr.train.outcome import failure_line
    from clsr.train.worker import NON_RETRYABLE

    for final in (DataUnavailableError, ModelUnavailableError, FileNotFoundError, torch.OutOfMemoryError):
        assert issubclass(final, NON_RETRYABLE)
    assert not issubclass(ConnectionError, NON_RETRYABLE)  # a lost node or server is retried
    oom = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nsee the docs")
    assert failure_line(oom) == (
        "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB -- the batch does not fit this "
        "device: set trainer.gradcache_chunk_rows (the same loss in less memory), trainer.precision: bf16, "
        "or a smaller trainer.batch_size"
    )


def test_version_help_and_folders(tmp_path, capfd):
    import clsr

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0 and capfd.readouterr().out.strip() == f"platform (clsr) {clsr.__version__}"
    for args in (["--help"], ["study", "--help"]):
        with pytest.raises(SystemExit):
            main(args)
        out = capfd.readouterr().out
        assert "``" not in out  # no reStructuredText markup in the help
    assert all(action in out for action in ("run", "resume", "sync", "validate", "report", "plan"))

    folder = tmp_path / "studies"
    folder.mkdir()
    smoke = (REPO_ROOT / "studies" / "smoke.yaml").read_text()
    (folder / "a.yaml").write_text(smoke)
    (folder / "b.yml").write_text(smoke.replace("name: smoke", "name: other"))
    (folder / "notes.txt").write_text("not a study")
    assert main(["study", "validate", str(folder)]) == 0  # every study file in it
    out = capfd.readouterr().out
    chosen = (
        "    note: ablations.temperature[method.temperature=0.05], ablations.temperature[method.temperature=0.1]: "
        "model.attention auto: sdpa_packed on CPU trials (minilm: bert)"
    )  # what the default attention runs, said at validation
    one_seed = "    note: ablations.temperature: 1 seed: no CI or verdict; give seeds: [42, 43, 44] (or more)"
    assert out.splitlines() == [
        f"ok  {folder / 'a.yaml'}: 2 trials (2 distinct)",
        chosen,
        one_seed,
        f"ok  {folder / 'b.yml'}: 2 trials (2 distinct)",
        chosen,
        one_seed,
        "2 valid",  # several files: one summary line
    ]
    assert main(["study", "run", str(folder)]) == 2
    assert (
        f"{folder}: a folder, not a study file: give one of its .yaml files (it holds a.yaml, b.yml)"
        in capfd.readouterr().err  # the driver child's, on the command's stderr
    )


def test_trials_get_the_data_folder_as_an_absolute_path(tmp_path, monkeypatch):
    """A relative `export CLSR_DATA_DIR=../shared/data` (as in the README): Ray runs each trial in a folder
    of its own, so the driver hands trials the folder it means, not the relative path."""
    from clsr.study.control.ray_session import _forwarded_env

    (tmp_path / "shared" / "data").mkdir(parents=True)
    (tmp_path / "clsr").mkdir()
    monkeypatch.chdir(tmp_path / "clsr")
    monkeypatch.setenv("CLSR_DATA_DIR", "../shared/data")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    env = _forwarded_env()
    assert Path(env["CLSR_DATA_DIR"]).is_absolute()
    assert Path(env["CLSR_DATA_DIR"]).resolve() == (tmp_path / "shared" / "data").resolve()
    assert env["HF_HUB_OFFLINE"] == "1"
