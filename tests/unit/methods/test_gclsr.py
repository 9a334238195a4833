"""GCLSR: grouped loss, self-attention, TextCNN, the SGD schedules, and a local training run."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from clsr.augment.pwva import PWVAConfig
from clsr.config.model import TextCNNConfig
from clsr.config.trial import TrainerConfig, TrialConfig
from clsr.encoders.textcnn import TextCNNEncoder
from clsr.encoders.word_vectors import OOV_ID, PAD_ID, WordTable, WordTokenizer
from clsr.methods.gclsr import GCLSR, GCLSRConfig, GCLSRModel, grouped_simsiam_loss, word_self_attention
from clsr.study.plan.load import load_study
from clsr.study.plan.resolve import find_point, grid_points
from clsr.train.optim import build_optimizer, build_scheduler, schedule_factor, set_momentum, warmup_steps

P1, P2 = [[1.0, 0.0, 0.0, 1.0]], [[0.0, 1.0, 1.0, 0.0]]
Z1, Z2 = [[1.0, 1.0, 1.0, 0.0]], [[1.0, 0.0, 1.0, 1.0]]


def test_grouped_loss_equals_hand_computation():
    p1, p2, z1, z2 = (torch.tensor(t) for t in (P1, P2, Z1, Z2))
    # groups of 2: cos(p1,z2) = (1, 1/√2), cos(p2,z1) = (1/√2, 1) → every group gives -(½ + ½/√2)
    assert grouped_simsiam_loss(p1, p2, z1, z2, 2).item() == pytest.approx(-(0.5 + 0.5 / math.sqrt(2)))
    # no grouping: both cosines are 2 / (√2·√3)
    assert grouped_simsiam_loss(p1, p2, z1, z2, None).item() == pytest.approx(-2 / math.sqrt(6))
    assert grouped_simsiam_loss(p1, p2, z1, z2, 4).item() == pytest.approx(-2 / math.sqrt(6))


def test_grouped_loss_stops_the_gradient_on_the_projector_outputs():
    p1, p2, z1, z2 = (torch.tensor(t, requires_grad=True) for t in (P1, P2, Z1, Z2))
    grouped_simsiam_loss(p1, p2, z1, z2, 2).backward()
    assert z1.grad is None and z2.grad is None
    assert p1.grad.abs().sum() > 0 and p2.grad.abs().sum() > 0


def test_self_attention_weights_on_a_hand_made_sentence():
    x = torch.tensor([[[1.0, 0.0], [1.0, 1.0], [5.0, 5.0]]])  # two words and one padding row
    mask = torch.tensor([[True, True, False]])
    out = word_self_attention(x, mask)
    # S = XXᵀ/√2 on real cells, 1e-9 elsewhere; importance = row sum
    a0, a1 = 2 / math.sqrt(2) + 1e-9, 1 / math.sqrt(2) + math.sqrt(2) + 1e-9
    assert out[0, 0].tolist() == pytest.approx([a0, 0.0])
    assert out[0, 1].tolist() == pytest.approx([a1, a1])
    assert out[0, 2].tolist() == pytest.approx([15e-9, 15e-9], abs=1e-12)


def _table(dim: int = 4, words: int = 5) -> WordTable:
    rng = np.random.default_rng(0)
    vectors = rng.normal(size=(words + 2, dim)).astype(np.float32)
    vectors[OOV_ID] = 0
    return WordTable(
        words=[f"w{i}" for i in range(words)],
        vectors=vectors,
        tokenizer=WordTokenizer("words"),
        max_words=8,
        oov_words=0,
        source="test",
    )


def test_textcnn_shapes_and_oov_redraw():
    cfg = TextCNNConfig(vectors="test", region_sizes=[1, 2, 3], filters=5, max_words=8)
    encoder = TextCNNEncoder(cfg, _table())
    ids = torch.tensor([[2, 3, OOV_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID]])
    assert encoder(ids).shape == (1, 15)
    first, second = encoder.embed_words(ids), encoder.embed_words(ids)
    assert not torch.equal(first[0, 2], second[0, 2])  # the code redraws OOV vectors every call
    assert torch.equal(first[0, :2], second[0, :2])
    bound = math.sqrt(3 / 4)
    assert first[0, 2].abs().max() <= bound
    same = [encoder.embed_words(ids, torch.Generator().manual_seed(3)) for _ in range(2)]
    assert torch.equal(same[0], same[1])
    assert not encoder.words.weight.requires_grad  # frozen, as in the paper


def _no_aug_model(oov_draw: str, **method) -> GCLSRModel:
    cfg = TextCNNConfig(vectors="test", region_sizes=[1, 2], filters=4, max_words=8)
    torch.manual_seed(0)
    encoder = TextCNNEncoder(cfg, _table())
    method_cfg = GCLSRConfig(
        augmentation="none", oov_draw=oov_draw, projector_dim=8, predictor_hidden=4, group_size=4, **method
    )
    return GCLSRModel(encoder, method_cfg).train()


NO_AUG_IDS = torch.tensor(
    [[2, OOV_ID, 3, OOV_ID, PAD_ID, PAD_ID, PAD_ID, PAD_ID], [4, 5, OOV_ID, 6, 2, 3, 4, PAD_ID]]
)
NO_AUG_MASK = NO_AUG_IDS != PAD_ID


def test_per_view_oov_draws_differ_only_at_oov_positions():
    """Paper §5.7: the random OOV vectors are an augmentation, so two 'No Aug.' views differ there."""
    model = _no_aug_model("per_view")
    first, second = model.word_views(NO_AUG_IDS)
    oov = NO_AUG_IDS == OOV_ID
    table = torch.tensor(_table().vectors)
    for view in (first, second):  # every other position is its table row, in both views
        assert torch.equal(view[~oov], table[NO_AUG_IDS[~oov]])
        assert view[oov].abs().max() <= math.sqrt(3 / 4)  # U(±√(3/d)), d = 4
    assert (first[oov] != second[oov]).all()  # fresh draws: no coordinate coincides
    p1, p2, z1, z2 = model(NO_AUG_IDS, NO_AUG_MASK)
    assert not torch.equal(z1, z2) and not torch.equal(p1, p2)


def test_shared_oov_draw_makes_unaugmented_views_bit_identical():
    model = _no_aug_model("shared")
    first, second = model.word_views(NO_AUG_IDS)
    assert torch.equal(first, second)
    p1, p2, z1, z2 = model(NO_AUG_IDS, NO_AUG_MASK)
    assert torch.equal(z1, z2) and torch.equal(p1, p2)
    # one 'No Aug.' view is then the other: the loss is −cos(p, z) of a single view
    assert grouped_simsiam_loss(p1, p2, z1, z2, 4).item() == pytest.approx(
        -F.cosine_similarity(p1.reshape(-1, 4), z1.reshape(-1, 4), dim=-1).mean().item(), abs=1e-6
    )


@pytest.mark.parametrize("oov_draw", ["per_view", "shared"])
def test_seeded_oov_draws_are_reproducible(oov_draw: str):
    model = _no_aug_model(oov_draw, self_attention=True)

    def views(seed: int) -> tuple[torch.Tensor, ...]:
        torch.manual_seed(seed)
        return model.word_views(NO_AUG_IDS)

    assert all(torch.equal(a, b) for a, b in zip(views(5), views(5), strict=True))
    assert not torch.equal(views(5)[0], views(6)[0])


def test_text_level_views_always_draw_their_own_oov_vectors():
    model = _no_aug_model("shared")
    first, second = model.word_views(NO_AUG_IDS, NO_AUG_IDS.clone())
    assert not torch.equal(first, second)  # EDA / back-translation sentences are embedded separately


def test_oov_draw_is_validated():
    with pytest.raises(ValueError, match="oov_draw") as err:
        GCLSRConfig(oov_draw="per_batch")
    assert "'per_view' or 'shared'" in str(err.value)
    assert GCLSRConfig().oov_draw == "per_view"


# PWVA values the paper does not give, and the source each field must name instead.
PWVA_SOURCES = {
    "keep_prob": "CLSEP code",
    "probs": "GCLSR code",
    "noise_std": "our choice",
    "dropout": "CLSEP code",
}


def test_pwva_defaults_never_claim_the_paper_for_values_it_does_not_give():
    fields = PWVAConfig.model_fields
    assert set(fields) == {"operators", *PWVA_SOURCES}
    for name, source in PWVA_SOURCES.items():
        description = fields[name].description or ""
        assert source in description, name
        assert "the paper gives no" in description, name
        claims = ("(paper)", "paper:", "paper default", "paper value", "from the paper", "paper and code")
        assert not any(claim in description for claim in claims), name
    operators = fields["operators"].description or ""
    assert fields["operators"].default == "paper"
    assert (
        "chosen values" in operators and "identity" in operators
    )  # the name is the operators', not the values'


def test_pwva_docstring_cites_the_gclsr_authors_and_section():
    from clsr.augment import pwva

    assert "Wang, Zhang, Lei & Peng, Appl. Sci. 2023, 13, 9873" in pwva.__doc__
    assert "§3.1" in pwva.__doc__ and "Zheng" not in pwva.__doc__


STUDY = Path(__file__).parents[3] / "studies" / "gclsr_ablations.yaml"
REFERENCES = {
    "components": "GCLSR_base",
    "batch_size": "512",
    "weight_decay": "0.001",
    "predictor_lr": "1",
    "momentum": "(0.9, 0.8)",
    "warmup": "5",
    "region_sizes": "(1,1,1,6,15,20)",
    "augmentation": "Partial Aug.",
    "group_size": "16",
    "code_variant": "paper",
}


@pytest.mark.parametrize("smoke", [False, True])
def test_every_gclsr_ablation_names_its_reference_row(smoke: bool):
    study = load_study(STUDY, smoke=smoke)
    assert {name: a.reference for name, a in study.ablations.items()} == REFERENCES
    for name, ablation in study.ablations.items():
        assert find_point(grid_points(ablation), ablation.reference) is not None, name


@pytest.mark.parametrize("smoke", [False, True])
def test_code_variant_shares_the_oov_draw(smoke: bool):
    points = {
        p.label: p.overrides for p in grid_points(load_study(STUDY, smoke=smoke).ablations["code_variant"])
    }
    assert points["official code"]["method.oov_draw"] == "shared"
    assert "method.oov_draw" not in points["paper"]  # the default: per view


def test_region_size_larger_than_the_sentence_is_refused():
    with pytest.raises(ValueError, match="exceeds max_words"):
        TextCNNConfig(region_sizes=[1, 40], max_words=32)


def test_group_size_must_divide_the_projector():
    with pytest.raises(ValueError, match="must divide"):
        GCLSRConfig(group_size=48, projector_dim=4096)


def _gclsr_trainer(**changes) -> TrainerConfig:
    trainer = {**GCLSR.paper_defaults["trainer"], **changes}
    return TrainerConfig(**trainer)


class _Heads(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Linear(2, 2)
        self.predictor = nn.Linear(2, 2)


def _lrs(optimizer) -> dict[bool, float]:
    return {g["fixed_lr"]: g["lr"] for g in optimizer.param_groups}


def test_gclsr_learning_rate_and_momentum_schedule():
    """Batch 512: LR 0.03 × 512/128 = 0.12, 19 steps/epoch, 5 warm-up epochs = 95 steps of 380."""
    cfg = _gclsr_trainer()
    method = GCLSR(GCLSRConfig())
    optimizer = build_optimizer(_Heads(), cfg, method.param_group_lrs(), method.fixed_lr_prefixes())
    scheduler = build_scheduler(optimizer, cfg, total_steps=380, steps_per_epoch=19)
    assert warmup_steps(cfg, 380, 19) == 95
    seen = {}
    for step in range(381):
        momentum = set_momentum(optimizer, cfg, step, warmup=95)
        seen[step] = (_lrs(optimizer), momentum)
        optimizer.step()
        scheduler.step()
    assert seen[0][0] == {False: 0.0, True: 1.0}  # warm-up starts at 0; the predictor stays at 1.0
    assert seen[19][0][False] == pytest.approx(0.12 * 19 / 95)
    assert seen[95][0][False] == pytest.approx(0.12)
    assert seen[95 + 285 // 2][0][False] == pytest.approx(0.12 * 0.5 * (1 + math.cos(math.pi * 142 / 285)))
    assert seen[380][0] == {False: pytest.approx(0.0), True: 1.0}
    assert {seen[s][1] for s in range(95)} == {0.9} and {seen[s][1] for s in range(95, 381)} == {0.8}


def test_decayed_predictor_follows_the_base_schedule():
    cfg = _gclsr_trainer()
    method = GCLSR(GCLSRConfig(predictor_lr="decay"))
    optimizer = build_optimizer(_Heads(), cfg, method.param_group_lrs(), method.fixed_lr_prefixes())
    assert len(optimizer.param_groups) == 1


def test_schedule_factors_equal_transformers_schedulers():
    from transformers import get_scheduler

    for name, kind in (("linear", "linear"), ("cosine", "cosine"), ("constant_with_warmup", "constant")):
        reference = get_scheduler(name, torch.optim.SGD([nn.Parameter(torch.zeros(1))], lr=1.0), 7, 30)
        ours = schedule_factor(kind, 7, 30)
        for step in (0, 3, 7, 12, 29, 30):
            assert ours(step) == pytest.approx(reference.lr_lambdas[0](step)), (name, step)


def test_constant_momentum_when_no_switch_is_set():
    cfg = _gclsr_trainer(momentum=0.99, momentum_after_warmup=None)
    optimizer = build_optimizer(_Heads(), cfg, {})
    assert {set_momentum(optimizer, cfg, s, 95) for s in (0, 94, 95, 300)} == {0.99}


def test_momentum_switch_needs_sgd():
    with pytest.raises(ValueError, match="needs optimizer: sgd"):
        TrainerConfig(optimizer="adamw", momentum_after_warmup=0.8)


def tiny_gclsr(**method) -> TrialConfig:
    """A small GCLSR trial on the smoke study's 50-d GloVe words (MiniLM's 384-d table made PyTorch's CPU
    conv1d with 8 filters five times slower, for nothing these tests check)."""
    return TrialConfig.model_validate(
        {
            "model": {"type": "textcnn", "vectors": "glove-6b-50d-local", "filters": 8},
            "data": {"train": "wiki1m", "max_rows": 128, "subset_seed": 2},
            "trainer": {**GCLSR.paper_defaults["trainer"], "batch_size": 32, "epochs": 2, "warmup_epochs": 1},
            "method": {"name": "gclsr", "projector_dim": 32, "predictor_hidden": 8, **method},
            "eval": {"dev_tasks": ["stsb"], "tasks": ["sts12", "sts13", "sts14", "sts15"]},
        }
    )


def test_gclsr_trains_locally_and_reports_the_paper_metrics(data_dir):
    from clsr.train.loop import fit
    from clsr.train.session import LocalSession

    session = LocalSession()
    final = fit(tiny_gclsr(eda={"synonyms": "vectors"}), session)
    assert [r["step"] for r in session.reports] == [4, 8, 8]  # one dev evaluation per epoch
    losses = [r["loss_avg"] for r in session.reports[:2]]
    assert -1.0 <= losses[1] < losses[0] < 0  # negative cosine falls towards -1
    assert final["test_sts12_15_avg"] == pytest.approx(
        np.mean([final[f"test_sts{n}"] for n in (12, 13, 14, 15)])
    )
    assert 20 < final["test_sts12_15_avg"] < 90
    assert final["best_dev_stsb"] == max(r["dev_stsb"] for r in session.reports[:2])


def test_text_level_augmentation_trains(data_dir):
    from clsr.train.loop import fit
    from clsr.train.session import LocalSession

    trial = tiny_gclsr(augmentation="eda", eda={"synonyms": "vectors"}, group_size=None)
    trial.trainer.max_steps = 2
    trial.eval.tasks = []
    session = LocalSession()
    fit(trial, session)
    assert session.reports[-1]["finished"] == 1


def test_back_translation_is_reported_unavailable_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    trial = tiny_gclsr(augmentation="back_translation")
    why = GCLSR(GCLSRConfig(augmentation="back_translation")).unavailable(trial)
    assert why is not None and "Helsinki-NLP/opus-mt-en-de" in why
