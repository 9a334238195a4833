"""Augmentations: PWVA operators and the partial choice (golden statistics on fixed seeds), EDA, back-translation."""

from __future__ import annotations

import math
from random import Random

import numpy as np
import pytest
import torch

from clsr.augment.back_translation import BackTranslationConfig, back_translate, back_translation_available
from clsr.augment.eda import (
    EDAConfig,
    clean_text,
    eda,
    random_deletion,
    random_insertion,
    random_swap,
    synonym_replacement,
    vector_synonyms,
    wordnet_synonyms,
)
from clsr.augment.pwva import (
    DEFAULT_PROBS,
    PWVAConfig,
    augment,
    choose_operators,
    gaussian_white_noise,
    ifft_op,
    random_background_noise,
    random_zero_setting,
)
from clsr.data.hub.model_registry import ModelUnavailableError
from clsr.data.sources import DataUnavailableError

D = 300


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def word_batch(n: int, seed: int = 1) -> torch.Tensor:
    """n copies of one fixed word vector with both signs and no zero coordinate."""
    w = torch.randn(D, generator=gen(seed))
    w = torch.where(w.abs() < 0.05, torch.full_like(w, 0.3), w)
    return w.expand(n, D).clone()


# --- operators ------------------------------------------------------------------------------------------


def test_config_defaults_and_validation():
    assert PWVAConfig().resolved_probs == (0.5, 0.2, 0.1, 0.2)
    assert (
        PWVAConfig(operators="clsep_code").resolved_probs
        == DEFAULT_PROBS["clsep_code"]
        == (0.3, 0.3, 0.2, 0.2)
    )
    for bad in (
        {"probs": (0.5, 0.5, 0.5, -0.5)},
        {"probs": (0.3, 0.3, 0.3, 0.3)},
        {"keep_prob": 1.1},
        {"dropout": 1.0},
    ):
        with pytest.raises(ValueError):
            PWVAConfig(**bad)
    with pytest.raises(ValueError):
        PWVAConfig(unknown=1)


def test_paper_ifft_is_identity():
    x = word_batch(50)
    out = ifft_op(x, "paper", PWVAConfig(), gen())
    assert torch.allclose(out, x, atol=1e-5)


def test_gclsr_ifft_removes_each_words_mean():
    x = torch.randn(20, D, generator=gen(3)) + torch.arange(20.0).unsqueeze(1)
    out = ifft_op(x, "gclsr_code", PWVAConfig(), gen())
    assert torch.equal(out, x - x.mean(dim=1, keepdim=True))
    assert out.mean(dim=1).abs().max().item() < 1e-5


def test_clsep_ifft_removes_one_mean_of_the_call():
    x = torch.randn(20, D, generator=gen(3)) + torch.arange(20.0).unsqueeze(1)
    out = ifft_op(x, "clsep_code", PWVAConfig(), gen())
    assert torch.equal(out, x - x.mean())
    assert abs(x.mean().item() - 9.5) < 0.1  # the word means differ, only the overall mean is removed


def test_gclsr_gwn_is_snr_scaled():
    x = word_batch(4000)
    rms = x[0].pow(2).mean().sqrt()
    ratio = (gaussian_white_noise(x, "gclsr_code", PWVAConfig(), gen()) - x).pow(2).mean(dim=1).sqrt() / rms
    low, high = 10 ** (-11 / 20), 10 ** (-6 / 20)  # 0.2818, 0.5012
    tol = 6 / math.sqrt(2 * D)  # sampling error of a 300-coordinate RMS, 6 sigma
    assert ratio.min().item() > low * (1 - tol) and ratio.max().item() < high * (1 + tol)
    analytic = sum(10 ** (-snr / 20) for snr in range(6, 12)) / 6  # 0.3831
    assert abs(ratio.mean().item() - analytic) < 0.01
    assert abs(analytic - 0.38314) < 1e-5


def test_paper_gwn_uses_noise_std():
    x = word_batch(1000)
    noise = gaussian_white_noise(x, "paper", PWVAConfig(noise_std=0.04), gen()) - x
    assert abs(noise.std().item() - 0.04) < 0.001 and abs(noise.mean().item()) < 0.001


def test_gclsr_rzs_zeroes_short_runs_without_rescaling():
    x = torch.arange(1.0, D + 1).expand(5000, D).clone()
    out = random_zero_setting(x, "gclsr_code", PWVAConfig(), gen())
    zero = out == 0
    frac = zero.float().mean().item()
    assert 0.05 < frac < 0.06, frac
    assert torch.equal(out[~zero], x[~zero])
    per_word = zero.sum(dim=1)
    assert per_word.min().item() >= 1 and per_word.max().item() <= 2 * 19


def test_paper_rzs_is_dropout_with_rescale():
    p = 0.3
    x = word_batch(2000)
    out = random_zero_setting(x, "paper", PWVAConfig(dropout=p), gen())
    zero = out == 0
    assert abs(zero.float().mean().item() - p) < 0.005
    assert torch.allclose(out[~zero], x[~zero] / (1 - p))


def test_gclsr_rbn_within_analytic_bounds():
    x = word_batch(3000)
    noise = random_background_noise(x, "gclsr_code", PWVAConfig(), gen()) - x
    w_min, w_max = x[0].min().item(), x[0].max().item()
    assert w_min < 0 < w_max
    assert noise.min().item() >= 0.01 * w_min - 1e-6 and noise.max().item() <= 0.01 * 0.8 * w_max + 1e-6
    # c is per word: the largest |noise| of a word varies a lot between words
    peak = noise.abs().amax(dim=1)
    assert peak.max().item() > 0.9 * 0.01 * max(-w_min, 0.8 * w_max) and peak.min().item() < 0.001


def test_clsep_rbn_draws_one_scale_per_call():
    x = torch.full((3000, D), 1.0)  # u ~ U(1, 0.8): noise / c spans (0.8, 1]
    noise = random_background_noise(x, "clsep_code", PWVAConfig(), gen()) - x
    assert noise.max().item() <= noise.min().item() / 0.8 + 1e-7


def test_paper_rbn_is_uniform_0_to_0_1():
    x = word_batch(1000)
    noise = random_background_noise(x, "paper", PWVAConfig(), gen()) - x
    assert noise.min().item() >= -1e-6 and noise.max().item() <= 0.1 + 1e-6
    assert abs(noise.mean().item() - 0.05) < 0.001


# --- the partial choice ---------------------------------------------------------------------------------


def test_choose_operators_matches_probs():
    probs = (0.5, 0.2, 0.1, 0.2)
    chosen = choose_operators(50_000, probs, gen())
    freq = torch.bincount(chosen, minlength=4).double() / chosen.numel()
    assert torch.allclose(freq, torch.tensor(probs, dtype=torch.float64), atol=0.02)
    assert set(choose_operators(10_000, (0.0, 1.0, 0.0, 0.0), gen()).tolist()) == {1}
    assert set(choose_operators(10_000, (0.5, 0.5, 0.0, 0.0), gen()).tolist()) == {0, 1}


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(8, 12, 16, generator=gen(5))
    lengths = torch.tensor([12, 1, 5, 7, 12, 3, 9, 2])
    return x, torch.arange(12).unsqueeze(0) < lengths.unsqueeze(1)


def test_augment_padding_and_keep_extremes():
    x, mask = padded_batch()
    full = augment(x, mask, PWVAConfig(keep_prob=0.0, probs=(1, 0, 0, 0)), gen())
    assert torch.equal(full[~mask], x[~mask])
    assert bool((full != x).any(dim=-1)[mask].all())
    assert torch.equal(augment(x, mask, PWVAConfig(keep_prob=1.0), gen()), x)


def test_augment_changes_one_minus_keep_prob_of_real_words():
    x = torch.randn(200, 100, 8, generator=gen(2))
    mask = torch.ones(200, 100, dtype=torch.bool)
    out = augment(x, mask, PWVAConfig(keep_prob=0.6, probs=(1, 0, 0, 0)), gen())
    changed = (out != x).any(dim=-1).float().mean().item()
    assert abs(changed - 0.4) < 0.02


@pytest.mark.parametrize("operators", ["paper", "gclsr_code", "clsep_code"])
def test_augment_is_deterministic_per_seed(operators):
    x, mask = padded_batch()
    cfg = PWVAConfig(operators=operators, keep_prob=0.3)
    a, b = augment(x, mask, cfg, gen(7)), augment(x, mask, cfg, gen(7))
    assert torch.equal(a, b)
    assert not torch.equal(a, augment(x, mask, cfg, gen(8)))


def test_augment_keeps_dtype_under_autocast():
    x, mask = padded_batch()
    with torch.autocast(device_type="cpu", dtype=torch.bfloat16):
        out = augment(x.bfloat16(), mask, PWVAConfig(operators="gclsr_code", keep_prob=0.0), gen())
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    assert torch.equal(out[~mask], x.bfloat16()[~mask])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_augment_on_cuda_matches_cpu_with_a_cpu_generator():
    x, mask = padded_batch()
    cfg = PWVAConfig(operators="gclsr_code", keep_prob=0.2)
    cpu = augment(x, mask, cfg, gen(3))
    cuda = augment(x.cuda(), mask.cuda(), cfg, gen(3))
    assert cuda.device.type == "cuda"
    assert torch.allclose(cuda.cpu(), cpu, atol=1e-5)
    cuda_gen = torch.Generator(device="cuda").manual_seed(3)
    assert augment(x.cuda(), mask.cuda(), cfg, cuda_gen).device.type == "cuda"


# --- EDA ------------------------------------------------------------------------------------------------

VOCAB = ["the", "happy", "glad", "car", "auto", "sad", "a"]
VECTORS = np.array(
    [[0, 0, 1.0], [1, 0.1, 0], [1, 0.2, 0], [0, 1, 0.1], [0.1, 1, 0.1], [-1, 0, 0], [0, 0.1, 1.0]]
)


def test_clean_text_as_eda():
    assert clean_text("Hello, World! It's 3pm-ish\tok") == "hello world its pm ish ok"


def test_vector_synonyms_are_nearest_by_cosine():
    synonyms = vector_synonyms(VOCAB, VECTORS, neighbours=2)
    # cosines checked by hand: happy·glad 0.995, happy·auto 0.197, happy·car 0.099; car·a 0.198 > car·glad 0.195
    assert synonyms("happy") == ["glad", "auto"]
    assert synonyms("car") == ["auto", "a"]
    assert synonyms("unknown") == []


def test_sr_replaces_with_nearest_and_skips_stop_words():
    synonyms = vector_synonyms(VOCAB, VECTORS, neighbours=1)
    out = synonym_replacement(["the", "happy", "car", "the"], 5, synonyms, Random(0))
    assert out == ["the", "glad", "auto", "the"]  # "the" has a neighbour ("a") but is a stop word


def test_ri_rd_rs():
    synonyms = vector_synonyms(VOCAB, VECTORS, neighbours=1)
    words = ["the", "happy", "car", "is", "sad", "today"]
    inserted = random_insertion(words, 2, synonyms, Random(0))
    assert len(inserted) == 8 and sorted(set(inserted) - set(words)) <= ["auto", "glad", "happy"]
    one = random_deletion(words, 1.0, Random(0))
    assert len(one) == 1 and one[0] in words
    assert random_deletion(words, 0.0, Random(0)) == words
    swapped = random_swap(words, 3, Random(0))
    assert sorted(swapped) == sorted(words) and swapped != words


def test_eda_is_deterministic_and_uses_all_ops():
    synonyms = vector_synonyms(VOCAB, VECTORS, neighbours=1)
    sentence = "The happy car is sad today, and the auto is glad!"
    first, second = (
        [eda(sentence, EDAConfig(), synonyms, rng) for _ in range(40)] for rng in (Random(1), Random(1))
    )
    assert first == second
    lengths = {len(s.split()) for s in first}
    assert {11, 12} <= lengths and min(lengths) < 11  # RS/SR keep the 11 words, RI adds one, RD drops some
    assert eda("?!", EDAConfig(), synonyms, Random(0)) == ""


def test_wordnet_missing_says_how_to_proceed():
    try:
        lookup = wordnet_synonyms()
    except DataUnavailableError as err:
        assert "synonyms: vectors" in str(err) and "nltk.downloader wordnet" in str(err)
    else:
        assert "glad" in lookup("happy")


# --- back-translation -----------------------------------------------------------------------------------


def test_back_translation_offline_raises_with_the_model_id(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = BackTranslationConfig()
    assert cfg.model_ids() == ("Helsinki-NLP/opus-mt-en-de", "Helsinki-NLP/opus-mt-de-en")
    message = back_translation_available(cfg)
    if message is None:
        pytest.skip("the opus-mt models are in the local cache")
    assert "Helsinki-NLP/opus-mt-en-de" in message and "--smoke" in message
    with pytest.raises(ModelUnavailableError, match="Helsinki-NLP/opus-mt-en-de") as err:
        back_translate(["a sentence"], cfg, progress=False)
    assert "sentencepiece" in str(err.value)
