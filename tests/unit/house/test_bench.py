"""``platform bench``: the benchmarks run end to end on tiny settings and print their figures.

Wiring checks only (a few steps, a few sentences, on the CPU); the real figures are measured by hand.
``bench study`` runs a whole study, too slow here: only its command line is checked.
"""

from __future__ import annotations

import json
import re

import pytest

from clsr.cli import main


def test_bench_train_prints_both_trainers_and_a_ratio(data_dir, tiny_bert, tmp_path, capsys):
    out = tmp_path / "train.json"
    args = ["bench", "train", "--steps", "2", "--warmup", "0", "--batch", "8", "--length", "16"]
    args += ["--model", tiny_bert, "--length-group", "4", "--attention", "eager"]
    assert main([*args, "--device", "cpu", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "clsr simcse_sup" in text and "SentenceTransformerTrainer MNRL" in text
    assert re.search(r"ratio clsr / sentence-transformers \(sentences/s\): \d+\.\d\d", text)
    assert "machine:" in text and "torch" in text
    figures = json.loads(out.read_text())
    assert figures["ratio_clsr_over_st"] > 0 and figures["machine"]["cpu_cores"] >= 1
    # the same rows (one epoch of them: no warm-up), columns and truncation: the same real tokens
    assert figures["clsr"]["tokens"] == figures["sentence_transformers"]["tokens"]
    assert figures["length_group_size"] == 4 and "in groups of 4 sentences" in text
    assert figures["attention"] == "eager" and "eager attention" in text
    for side in ("clsr", "sentence_transformers"):  # the encoder ran every real token, and some padding
        assert figures[side]["encoder_tokens"] >= figures[side]["tokens"]
        assert 0 <= figures[side]["padding_share"] < 1


def test_bench_train_alternates_rounds_and_gives_their_median(data_dir, tiny_bert, tmp_path, capsys):
    """Three rounds of two steps, clsr's round before sentence-transformers' each time: each side times
    six steps over the same rows (equal real tokens), and the median is of the rounds' own ratios."""
    from clsr_bench import train

    order: list[str] = []
    step = train.PlatformStep.__call__

    def logged(self, indices):
        order.append("clsr")
        return step(self, indices)

    clock_tick = train.StepClock.tick

    def ticked(self, at):
        order.append(f"st{at}")
        return clock_tick(self, at)

    out = tmp_path / "train.json"
    args = ["bench", "train", "--steps", "2", "--warmup", "0", "--rounds", "3", "--batch", "8"]
    args += ["--length", "16", "--model", tiny_bert, "--attention", "eager", "--device", "cpu"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(train.PlatformStep, "__call__", logged)
        patch.setattr(train.StepClock, "tick", ticked)
        assert main([*args, "--json", str(out)]) == 0
    # at each round's start (before sentence-transformers' first step, after its second and fourth)
    # clsr's round: with no warm-up, each side's six steps are one epoch of the same 48 rows
    rounds = [["clsr", "clsr", "st1", "st2"], ["clsr", "clsr", "st3", "st4"], ["clsr", "clsr", "st5", "st6"]]
    assert order == ["st0", *rounds[0], *rounds[1], *rounds[2]]
    figures = json.loads(out.read_text())
    assert figures["rounds"] == 3 and len(figures["round_ratios"]) == 3
    assert figures["ratio_median_of_rounds"] == sorted(figures["round_ratios"])[1]
    assert figures["clsr"]["tokens"] == figures["sentence_transformers"]["tokens"]
    assert figures["clsr"]["s_per_step"] > 0 and figures["sentence_transformers"]["s_per_step"] > 0
    text = capsys.readouterr().out
    assert "6 timed steps after 0 warm-up steps, in 3 alternating rounds of 2" in text
    said = re.search(r"rounds \(clsr's, then sentence-transformers'\): (.*); median (\S+)", text)
    assert said and said.group(1).split() == [f"{r:.2f}" for r in figures["round_ratios"]]
    assert said.group(2) == f"{figures['ratio_median_of_rounds']:.2f}"


def test_bench_sts_eval_scores_match_sentence_transformers(data_dir, capsys):
    args = ["bench", "sts-eval", "--tasks", "sts16", "--max-pairs", "100", "--device", "cpu"]
    assert main(args) == 0
    text = capsys.readouterr().out
    row = next(line.split() for line in text.splitlines() if line.startswith("STS16"))
    assert abs(float(row[1]) - float(row[2])) <= 1e-4
    difference = float(re.search(r"max \|difference\|: (\S+)", text).group(1))
    assert difference <= 1e-4
    assert "first 100 pairs" in text and "ratio clsr / ST" in text


def test_bench_memory_runs_each_configuration_in_a_child(data_dir, tiny_bert, capsys):
    args = ["bench", "memory", "--batches", "8", "--chunk", "4", "--length", "16", "--device", "cpu"]
    args += ["--model", tiny_bert]
    assert main(args) == 0
    text = capsys.readouterr().out
    rows = [line.split() for line in text.splitlines() if line.startswith("8 ")]
    assert [r[1] for r in rows] == ["off", "4"]
    assert all(float(r[2]) > 0 and r[-1] == "-" for r in rows)  # a peak, and no error


def test_bench_study_has_a_command_line(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["bench", "study", "--help"])
    assert exited.value.code == 0
    assert "--study" in capsys.readouterr().out


def test_bench_suite_reads_its_targets_off_the_parts():
    from clsr_bench.suite import epoch_seconds, format_suite, target_rows

    cpu = {
        "device": "cpu",
        "train_simcse_sup_minilm_b64": {"ratio_clsr_over_st": 1.48},
        "train_simcse_sup_minilm_b64_sdpa_packed": {"ratio_clsr_over_st": 1.69},
        "sts_eval": {"ratio_clsr_over_st_time": 0.8},
        "memory": {"error": "RuntimeError: out of memory"},
    }
    assert target_rows(cpu) == [
        ["simcse_sup MiniLM b64 speed vs ST", "≥ 1.6", 1.48, "no"],
        ["the same, model.attention sdpa_packed", "≥ 1.6", 1.69, "yes"],
        ["STS eval time vs ST", "≤ 0.7", 0.8, "no"],
    ]
    text = format_suite({"device": "cpu", "machine": {"cpu": "x"}, "memory": cpu["memory"]})
    assert (
        "== memory ==" in text and "failed: RuntimeError: out of memory" in text and "== targets ==" in text
    )
    # 3 sentences per triplet: 3,000 sentences/s = 1,000 rows/s -> 275.6 s per epoch
    train = {"clsr": {"sentences_per_s": 3000.0}, "columns": ["anchor", "positive", "negative"]}
    assert epoch_seconds(train) == pytest.approx(275.602)
    gpu = {"device": "cuda", "train_simcse_sup_bert_base_b512": train | {"ratio_clsr_over_st": 1.6}}
    rows = target_rows(gpu)
    assert rows[0][2:] == [1.6, "yes"] and rows[1][2] == pytest.approx(275.602) and rows[1][3] == "no"
    assert rows[2][2:] == [None, "-"]  # the GCLSR study did not run
    # with an STS-B dev evaluation and a checkpoint every 125 steps of 512: ceil(275,602 / 64,000) = 5
    train512 = train | {"batch": 512}
    assert epoch_seconds(train512, {"dev_eval_s": 2.0, "checkpoint_s": 1.0}) == pytest.approx(275.602 + 15)


def test_bench_measures_an_evaluation_and_a_checkpoint(tiny_bert, data_dir):
    from clsr.config.model import ModelConfig
    from clsr.encoders.transformer import TransformerEncoder
    from clsr_bench.suite import eval_and_checkpoint, format_eval_and_checkpoint

    part = eval_and_checkpoint(tiny_bert, "cpu")
    assert part["dev_eval_s"] > 0 and part["dev_eval_first_s"] > 0 and part["checkpoint_s"] > 0
    params = sum(
        p.numel() for p in TransformerEncoder(ModelConfig(name=tiny_bert, pooling="cls")).parameters()
    )
    assert part["checkpoint_bytes"] > 4 * 4 * params  # weights + 2 AdamW moments + best weights, float32
    assert "MiB written" in format_eval_and_checkpoint(part)


def test_shaped_random_encoder_loads_with_the_given_tokenizer(tiny_bert, tmp_path):
    from clsr.config.model import ModelConfig
    from clsr.encoders.transformer import TransformerEncoder
    from clsr_bench.suite import shaped_encoder

    shape = {"hidden_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2, "intermediate_size": 16}
    folder = shaped_encoder(tmp_path / "shaped", tiny_bert, **shape)
    encoder = TransformerEncoder(ModelConfig(name=folder, pooling="avg"))
    assert encoder.dim == 8 and encoder.backbone.config.num_hidden_layers == 1
    assert encoder.backbone.config.vocab_size == 30522  # bert-base-uncased's WordPiece vocabulary


def test_the_benchmarked_trainer_needs_neither_ray_nor_mlflow():
    """A GPU machine that gets only the code (and pydantic) can run bench train, memory and sts-eval."""
    import subprocess
    import sys

    from clsr.checkout import benchmarks_folder

    code = (
        f"import sys; sys.path.append({str(benchmarks_folder())!r})\n"  # clsr_bench: the checkout's
        "sys.modules['ray'] = sys.modules['mlflow'] = None\n"
        "import clsr.cli, clsr.train.loop, clsr_bench.train, clsr_bench.memory, clsr_bench.sts_eval\n"
        "from clsr.tracking.run_logger import RunLogger\n"
        "assert not RunLogger(None).active and RunLogger(None).stop_system_metrics() == {}\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_bench_study_prints_the_start_up_before_the_first_trial():
    """The command's start-up is a user-facing figure (issue 36): validation, then until a trial's run opens."""
    from clsr_bench.study import format_study

    trial = {"run": "t", "status": "finished", "steps": 8, "batch": 8, "run_s": 30.0, "trial_wall_s": 25.0}
    figures = {
        "study": "smoke", "file": "studies/smoke.yaml", "smoke": False, "wall_s": 80.0, "trials": 1,
        "trials_per_hour": 45.0, "trials_at_once": 1, "outside_steps_fraction": 0.5,
        "outside_loop_fraction": 0.4, "validate_s": 1.24, "first_trial_s": 14.31,
        "per_trial": [trial | {"loop_s": 10.0, "step_s": 8.0}],
    }  # fmt: skip
    line = next(x for x in format_study(figures).splitlines() if x.startswith("start-up"))
    assert line.startswith(
        "start-up: 1.2 s to load and validate the study, then 14.3 s until the first trial's"
    )
