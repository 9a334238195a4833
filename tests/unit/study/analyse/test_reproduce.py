"""``platform study reproduce`` without training: a trial rebuilt from a real MLflow sqlite record (its
parent's resolved.yaml as a study driver writes it, its child's params as a trial logs them), an explicit
null override kept, a logged value that differs named; and the side-by-side verdicts on hand-made runs."""

from __future__ import annotations

import argparse
from dataclasses import replace
from types import SimpleNamespace

import pytest
import yaml
from mlflow.tracking import MlflowClient

from clsr.study.analyse.reproduce import (
    CLOSE,
    DIFFERENT,
    EQUAL,
    INCOMPLETE,
    NOTHING,
    ONLY_A,
    ONLY_B,
    compare_runs,
    distributions,
    package_differences,
    package_line,
    render,
)
from clsr.study.analyse.reproduction import NotReproducible, changed_params, find_trial_run, rebuild
from clsr.study.analyse.runs import Trial
from clsr.study.plan.load import load_documents
from clsr.study.plan.study_plan import plan_study
from clsr.study.record.summary import resolved_summary
from clsr.study.run.trial import trial_params
from clsr.tracking.study_runs import start_parent_run
from tests.support.stores import sqlite_uri
from tests.unit.study.analyse.test_results import child

STUDY = """
name: repro
method: simcse_unsup
base:
  model: {name: minilm, pooling: avg, max_seq_length: 32}
  data: {train: wiki1m, max_rows: 64}
  trainer: {batch_size: 8, max_steps: 2, eval_steps: 2}
  eval: {tasks: [stsb]}
ablations:
  temperature:
    grid:
      method.temperature: [0.05, 0.1]
seeds: [1, 2]
metric: best_dev_stsb
"""


@pytest.fixture
def record(tmp_path, monkeypatch):
    """A study run with ``--set trainer.max_grad_norm=null``: its parent's resolved.yaml and its trials'
    runs, as the driver and the trials write them."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "repro.yaml").write_text(STUDY)
    documents = load_documents(str(tmp_path / "repro.yaml"), [("trainer.max_grad_norm", None)])
    plan = plan_study(documents.study, documents)
    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    parent = start_parent_run(client, "repro", str(tmp_path / "runs"), None)
    client.log_text(parent, yaml.safe_dump(resolved_summary(plan.study), sort_keys=False), "resolved.yaml")
    runs = {}
    for t in plan.trials:
        study = {"ablation": t.ablation, "point": t.label, "seed": t.seed}
        params = trial_params(t.config) | {"study": study}
        runs[(t.label, t.seed)] = child(client, uri, parent, t.ablation, t.label, t.seed, params, {"x": 1.0})
    return uri, client, plan, runs


def test_a_trial_is_rebuilt_from_the_record_with_its_explicit_null_override(record, tmp_path):
    uri, client, plan, runs = record
    trial = plan.trials[3]
    assert trial.config.trainer.max_grad_norm is None and trial.seed == 2
    found = find_trial_run(client, uri, "repro", trial.label, 2)
    assert (
        found.info.run_id
        == runs[(trial.label, 2)]
        == find_trial_run(client, uri, found.info.run_id, None, None).info.run_id
    )
    rebuilt = rebuild(client, found, tmp_path)
    assert rebuilt.config == trial.config
    assert rebuilt.config.trainer.max_grad_norm is None
    assert rebuilt.differences == ()
    assert (rebuilt.ablation, rebuilt.label, rebuilt.seed) == ("temperature", trial.label, 2)


def test_a_logged_value_the_rebuild_does_not_give_is_named(record, tmp_path):
    uri, client, plan, runs = record
    other = runs[(plan.trials[2].label, 1)]  # temperature 0.1's run, tagged as if it were 0.05's
    client.set_tag(other, "clsr.point", plan.trials[0].label)
    rebuilt = rebuild(client, client.get_run(other), tmp_path)
    assert rebuilt.config == plan.trials[0].config
    assert rebuilt.differences == (("method.temperature", "0.1", "0.05"),)


def test_a_rebuild_unlike_the_trials_logged_configuration_is_not_rerun_without_force(
    record, tmp_path, monkeypatch, capsys
):
    import clsr.study.reproduce as module
    from clsr.cli.study_reproduce import cmd_study_reproduce

    uri, client, plan, runs = record
    edited = runs[(plan.trials[2].label, 1)]  # trained at 0.1 while resolved.yaml says 0.05: an edited resume
    client.set_tag(edited, "clsr.point", plan.trials[0].label)
    checked = []
    monkeypatch.setattr(module, "check", lambda recorded, *_: checked.append(recorded) or 1 / 0)
    args = argparse.Namespace(point=None, seed=None, tracking_uri=uri, rtol=1e-6, atol=1e-9)
    args.check_only = args.log_model = args.force = False
    assert cmd_study_reproduce(argparse.Namespace(**vars(args), run=edited)) == 2
    out, err = capsys.readouterr()
    assert "configuration differs: method.temperature logged '0.1', rebuilt '0.05'" in out
    assert err.splitlines()[-1] == (  # one line (MLflow's download progress aside)
        "error: the rebuilt configuration differs from the trial's logged params in method.temperature "
        "(the record's resolved.yaml may predate an edited resume): pass --force to rerun anyway"
    )
    assert checked == []  # refused before anything is checked or trained
    args.force = True
    with pytest.raises(ZeroDivisionError):  # --force: on to the check (here, a planted failure)
        cmd_study_reproduce(argparse.Namespace(**vars(args), run=edited))
    assert [c.run_id for c in checked] == [edited]
    edited_file = ("method.sha256", "a" * 64, "b" * 64)  # a method file edited since: drift, not refused
    assert changed_params(replace(checked[0], differences=(edited_file,))) == []
    assert changed_params(checked[0]) == ["method.temperature"]


def test_what_is_no_trial_or_not_found_is_refused_by_name(record, tmp_path):
    uri, client, plan, runs = record
    parent = client.get_run(runs[(plan.trials[0].label, 1)]).data.tags["mlflow.parentRunId"]
    with pytest.raises(NotReproducible, match="is no study trial"):
        rebuild(client, client.get_run(parent), tmp_path)
    summary = yaml.safe_load(STUDY)
    planted = yaml.safe_dump({"study": summary, "base_trials": ["x"], "points": {"temperature": 3}})
    client.log_text(parent, planted, "resolved.yaml")  # a colleague's resolved.yaml: refused, never raised on
    with pytest.raises(NotReproducible, match="holds no base trial and grid points"):
        rebuild(client, client.get_run(runs[(plan.trials[0].label, 1)]), tmp_path / "planted")
    with pytest.raises(NotReproducible, match="no MLflow run"):
        find_trial_run(client, uri, "0" * 32, None, None)
    with pytest.raises(NotReproducible, match="its points: method.temperature=0.05, method.temperature=0.1"):
        find_trial_run(client, uri, "repro", "method.temperature=0.2", 1)


def run(run_id: str, metrics: dict, weights: str | None = None, **params: str) -> Trial:
    tags = {"clsr.weights_sha256": weights} if weights else {}
    return Trial(run_id, "t", "p", 1, "finished", metrics, tags, 0, params)


def test_metrics_side_by_side_costs_not_compared_and_one_sided_metrics_named():
    a = run(
        "a",
        {
            "best_dev_stsb": 80.25,
            "test_stsb": 79.0,
            "trial_cpu_utilization_mean": 97.0,
            "samples_per_s": 50.0,
            "only_a": 1.0,
        },
        "w1",
        **{"env.torch": "2.13.0"},
    )
    b = run(
        "b",
        {
            "best_dev_stsb": 80.25,
            "test_stsb": 79.0 + 1e-9,
            "trial_cpu_utilization_mean": 12.0,
            "samples_per_s": 9.0,
            "only_b": 2.0,
        },
        "w1",
        **{"env.torch": "2.13.0"},
    )
    c = compare_runs(a, b)
    verdicts = {m.name: m.verdict for m in c.metrics}
    assert verdicts == {"best_dev_stsb": EQUAL, "test_stsb": CLOSE, "only_a": ONLY_A, "only_b": ONLY_B}
    assert c.costs == ["samples_per_s", "trial_cpu_utilization_mean"]
    assert c.weights == EQUAL and c.verdict == INCOMPLETE  # only_a: a result the reproduction lacks
    shown = render(c)
    assert "not compared (cost): samples_per_s, trial_cpu_utilization_mean" in shown
    assert "environment: the same" in shown
    assert "reproduction: incomplete (missing from the reproduction: only_a)" in shown
    del a.metrics["only_a"]
    assert compare_runs(a, b).verdict == CLOSE  # one only the reproduction logged is left out


def test_missing_results_are_never_bitwise_equal_and_exit_1(monkeypatch, capsys):
    a = run("a", {"best_dev_stsb": 80.25, "test_stsb": 79.0, "trial_wall_s": 3.0}, "w1")
    lost = run("b", {"trial_wall_s": 2.0}, "w1")  # its journal never reached MLflow: costs only
    c = compare_runs(a, lost)
    assert c.verdict == INCOMPLETE and c.weights == EQUAL
    assert "reproduction: incomplete (missing from the reproduction: best_dev_stsb, test_stsb)" in render(c)
    empty = compare_runs(run("a", {"trial_wall_s": 3.0}), run("b", {}))
    assert empty.verdict == NOTHING
    assert render(empty).endswith(
        "reproduction: nothing to compare (no result metric nor weights' hash in both runs)"
    )
    import clsr.study.reproduce as module
    from clsr.cli.study_reproduce import cmd_study_reproduce

    args = argparse.Namespace(run="x", point=None, seed=None, tracking_uri=None, rtol=1e-6, atol=1e-9)
    args.check_only = args.log_model = args.force = False
    for comparison in (c, empty):
        done = module.Reproduction(SimpleNamespace(run_id="a"), False, "b", comparison)
        monkeypatch.setattr(module, "reproduce", lambda *_, done=done, **__: done)
        assert cmd_study_reproduce(args) == 1
        assert f"reproduction: {comparison.verdict}" in capsys.readouterr().out


def test_bitwise_equal_different_and_drift():
    a = run("a", {"best_dev_stsb": 80.25}, "w1", **{"env.torch": "2.13.0", "data.stsb.sha256": "a" * 64})
    same = run("b", {"best_dev_stsb": 80.25}, "w1", **{"env.torch": "2.13.0", "data.stsb.sha256": "a" * 64})
    assert compare_runs(a, same).verdict == EQUAL
    assert "data hashes agree (1 logged by both)" in render(compare_runs(a, same))
    moved = run("c", {"best_dev_stsb": 80.5}, "w2", **{"env.torch": "2.14.0", "data.stsb.sha256": "b" * 64})
    c = compare_runs(a, moved)
    assert c.verdict == DIFFERENT and c.weights == DIFFERENT
    shown = render(c)
    assert "environment differs: torch 2.13.0 (A) / 2.14.0 (B)" in shown
    assert "data hashes differ: data.stsb.sha256 aaaaaaaaaaaa (A) / bbbbbbbbbbbb (B)" in shown
    assert "reproduction: different" in shown


def test_installed_packages_compared_and_a_planted_line_skipped():
    recorded = distributions("torch==2.13.0\nNumPy==2.1.0\n\x1b]52;c;AAAA\x07\nnot a line\nold==1.0\n")
    here = distributions("torch==2.13.0\nnumpy==2.2.0\nnew==0.1\n")
    assert recorded == {"torch": "2.13.0", "numpy": "2.1.0", "old": "1.0"}
    changes = package_differences(recorded, here)
    assert changes == [("new", "-", "0.1"), ("numpy", "2.1.0", "2.2.0"), ("old", "1.0", "-")]
    assert (
        package_line(changes)
        == "packages differ: new - (A) / 0.1 (B); numpy 2.1.0 (A) / 2.2.0 (B); old 1.0 (A) / - (B)"
    )
    assert package_line([]) == "installed packages: the same"


def test_a_planted_metric_name_reaches_the_terminal_escaped():
    shown = render(
        compare_runs(run("a", {"x\x1b]52;c;AAAA\x07": 1.0}), run("b", {"x\x1b]52;c;AAAA\x07": 1.0}))
    )
    assert "\x1b" not in shown and "x\\x1b]52;c;AAAA\\x07" in shown


def test_the_reruns_kept_writes_are_sent_before_the_comparison_or_it_fails(tmp_path):
    from clsr.study.reproduce import UnsentWrites, send_kept
    from clsr.tracking.spool import PENDING, Spool, hand_over

    uri = sqlite_uri(tmp_path / "mlflow.db")
    client = MlflowClient(uri)
    run_id = client.create_run(client.create_experiment("r")).info.run_id
    spool = Spool(uri, run_id, tmp_path / "spool")  # what MLflow had not taken when the rerun ended
    spool.metrics([("best_dev_stsb", 80.25, 1, 2), ("test_stsb", 79.0, 1, 2)])
    pending = tmp_path / "pending"
    hand_over(spool.unsent(), spool.folder, str(pending), run_id)
    send_kept(uri, run_id, pending, 0)
    assert client.get_run(run_id).data.metrics == {"best_dev_stsb": 80.25, "test_stsb": 79.0}
    assert not (pending / PENDING / run_id).exists()
    send_kept(uri, run_id, tmp_path / "none", 0)  # nothing was left: nothing to send
    broken = pending / PENDING / run_id / "000001-0123456789ab"
    broken.mkdir(parents=True)
    (broken / "journal.jsonl").write_text("not a write\n")  # refused: kept aside, not sent
    with (
        pytest.raises(UnsentWrites, match=f"did not all reach .* \\(run {run_id}\\)"),
        pytest.warns(UserWarning, match="1 write\\(s\\) not sent"),
    ):
        send_kept(uri, run_id, pending, 0)
