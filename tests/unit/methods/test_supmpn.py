"""SupMPN: SupMPNRL (paper Eq. 7 and the released code's variant) on hand-made batches, the plug-in."""

from __future__ import annotations

import math

import pytest
import torch

from clsr.methods.simcse_sup import simcse_sup_loss
from clsr.methods.supmpn import SupMPN, SupMPNConfig, supmpn_loss

# Two rows, P = 2 positives, Q = 1 negative, 2-d embeddings chosen so the cosines are simple.
ANCHORS = [(1.0, 0.0), (0.0, 1.0)]
POSITIVES = [[(1.0, 0.0), (1.0, 1.0)], [(0.0, 1.0), (-1.0, 1.0)]]
NEGATIVES = [[(-1.0, 0.0)], [(1.0, -1.0)]]
TAU = 0.5


def _batch() -> torch.Tensor:
    rows = [[a, *p, *n] for a, p, n in zip(ANCHORS, POSITIVES, NEGATIVES, strict=True)]
    return torch.tensor(rows)


def _cos(u, v) -> float:
    return sum(x * y for x, y in zip(u, v, strict=True)) / (math.hypot(*u) * math.hypot(*v))


def _eq7_by_hand(own_other_logit: float | None) -> float:
    """Eq. 7 written out term by term; ``own_other_logit`` is None (paper) or 0 (code)."""
    n, p = len(ANCHORS), len(POSITIVES[0])
    total = 0.0
    for i in range(n):
        for k in range(p):
            target = math.exp(_cos(ANCHORS[i], POSITIVES[i][k]) / TAU)
            denominator = target
            for j in range(n):
                for kk in range(p):
                    if j != i:
                        denominator += math.exp(_cos(ANCHORS[i], POSITIVES[j][kk]) / TAU)
                    elif kk != k and own_other_logit is not None:
                        denominator += math.exp(own_other_logit)
                for neg in NEGATIVES[j]:
                    denominator += math.exp(_cos(ANCHORS[i], neg) / TAU)
            total += -math.log(target / denominator) / p
    return total / n


def test_paper_eq7_matches_the_hand_computation():
    loss = supmpn_loss(_batch(), positives=2, temperature=TAU, loss_variant="paper")
    assert loss.item() == pytest.approx(_eq7_by_hand(None), abs=1e-6)
    assert loss.item() == pytest.approx(0.73969, abs=1e-5)


def test_code_variant_adds_one_per_own_other_positive():
    loss = supmpn_loss(_batch(), positives=2, temperature=TAU, loss_variant="code")
    assert loss.item() == pytest.approx(_eq7_by_hand(0.0), abs=1e-6)
    assert loss.item() == pytest.approx(0.82351, abs=1e-5)


def test_one_positive_one_negative_is_supervised_simcse():
    batch = torch.randn(6, 3, 8, generator=torch.Generator().manual_seed(0))
    for variant in ("paper", "code"):
        got = supmpn_loss(batch, positives=1, temperature=0.05, loss_variant=variant)
        assert got.item() == pytest.approx(simcse_sup_loss(batch, 0.05).item(), abs=1e-5)


def test_code_variant_masks_carry_no_gradient():
    batch = _batch().requires_grad_(True)
    supmpn_loss(batch, positives=2, temperature=TAU, loss_variant="code").backward()
    paper = _batch().requires_grad_(True)
    supmpn_loss(paper, positives=2, temperature=TAU, loss_variant="paper").backward()
    assert torch.isfinite(batch.grad).all() and torch.isfinite(paper.grad).all()


def test_default_loss_is_the_released_code_and_differs_from_eq7_by_the_constant():
    assert SupMPNConfig().loss_variant == "code"  # methods.md §4.3: default to the code
    # The default call is the code variant, the hand-made Eq. 7 with logit 0 for own other positives.
    assert supmpn_loss(_batch(), positives=2, temperature=TAU).item() == pytest.approx(_eq7_by_hand(0.0))


def test_views_pick_the_first_p_and_q_slots():
    method = SupMPN(SupMPNConfig(positives=2, negatives=3))
    assert method.views() == ("anchor", "positive_1", "positive_2", "negative_1", "negative_2", "negative_3")
    with pytest.raises(ValueError, match="less than or equal to 5"):
        SupMPNConfig(positives=6)


def test_fill_slots_get_augmented_entailments_instead_of_anchor_copies():
    rows = [
        {
            "anchor": "a man plays a guitar on a stage",
            "positive_1": "a person is playing music",
            "positive_2": "a man plays a guitar on a stage",
            "positive_3": "a man plays a guitar on a stage",
            "negative_1": "nobody is playing",
        }
    ]
    method = SupMPN(SupMPNConfig(positives=3, negatives=1))
    assert method.fill_positives(rows, seed=0) == rows  # kind none: anchor copies stay (the default)
    deletion = SupMPN(
        SupMPNConfig(positives=3, negatives=1, positive_augmentation={"kind": "random_deletion"})
    )
    filled = deletion.fill_positives(rows, seed=0)[0]
    assert filled["positive_1"] == rows[0]["positive_1"] and filled["negative_1"] == rows[0]["negative_1"]
    for column in ("positive_2", "positive_3"):  # one of the entailment's 5 words deleted
        assert len(filled[column].split()) == 4 and set(filled[column].split()) < set(
            rows[0]["positive_1"].split()
        )
    assert deletion.fill_positives(rows, seed=0) == [filled]


def test_supmpn_trains_locally_with_every_slot(data_dir):
    from clsr.config.trial import TrialConfig
    from clsr.train.loop import fit
    from clsr.train.session import LocalSession

    trial = TrialConfig.model_validate(
        {
            "model": {"name": "minilm", "pooling": "avg", "max_seq_length": 16},
            "data": {"train": "nli_supmpn", "max_rows": 48},
            "trainer": {"batch_size": 4, "max_steps": 3, "eval_steps": 3, "lr": 1e-4},
            "method": {"name": "supmpn", "positives": 3, "negatives": 2, "loss_variant": "code"},
            # a seeded 300 pairs of STS-B dev and test: the full sets were most of this test's time
            "eval": {
                "dev_tasks": ["stsb"],
                "tasks": ["stsb"],
                "alignment_uniformity": False,
                "sts_max_pairs": 300,
            },
        }
    )
    session = LocalSession()
    final = fit(trial, session)
    assert [r["step"] for r in session.reports][:1] == [3]
    assert 60 < final["test_stsb"] < 95 and 60 < final["best_dev_stsb"] < 95


def test_paraphrased_rows_are_shared_per_row_set():
    from clsr.config.trial import TrialConfig

    def trial(seed: int, max_rows: int | None) -> TrialConfig:
        return TrialConfig.model_validate(
            {
                "model": {"name": "minilm", "pooling": "avg"},
                "data": {"train": "nli_supmpn", "max_rows": max_rows},
                "trainer": {"seed": seed},
                "method": {"name": "supmpn", "positive_augmentation": {"kind": "paraphrase"}},
            }
        )

    method = SupMPN(SupMPNConfig(positive_augmentation={"kind": "paraphrase"}))
    assert method.shared_key(trial(1, None)) == method.shared_key(trial(2, None))  # all rows: one set
    assert method.shared_key(trial(1, 64)) != method.shared_key(trial(2, 64))  # seeded subsets differ
    assert SupMPN(SupMPNConfig()).shared_key(trial(1, None)) is None  # nothing to share without PP
