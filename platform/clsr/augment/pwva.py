"""Partial word-vector augmentation (PWVA) of GCLSR (Wang, Zhang, Lei & Peng, Appl. Sci. 2023, 13, 9873,
§3.1; ablated in its Table 10), methods.md §7.2.

For each real word vector ``w`` of a batch: pick one of four operators (GWN, RZS, IFFT, RBN) with
probabilities ``p1..p4``, then keep the original ``w`` with probability ``keep_prob``. Padding is
never augmented. The paper gives the operators but **no numbers** for ``p``, ``p1..p4``, λ or the
dropout rate; every default below says where it comes from (the GCLSR code, the CLSEP code of the
same first author, or our choice). Three operator sets (docs/methods.md §7.2):

* ``paper``: the operators as the paper writes them (GWN ``w + λN(0, I)``, RZS = dropout,
  IFFT = ``Re(IFFT(FFT(w)))``, RBN ``w + U(0, 0.1)``) with chosen values (λ = 0.04 ours, dropout
  0.3 from CLSEP, probabilities from the GCLSR code). As written, the paper's IFFT is an identity
  (up to rounding): a word that draws it is left unchanged, so with these operators ~10 % of the
  words picked for augmentation are not augmented;
* ``gclsr_code``: the GCLSR code (``augmentations/text_aug.py``, one word vector at a time):
  SNR-scaled GWN, RZS as short zeroed runs without rescaling, IFFT that removes the word's mean,
  RBN ``w + c·U(min w, 0.8 max w)``;
* ``clsep_code``: the CLSEP code of the same author (batched): GWN as GCLSR, dropout in slot 2,
  IFFT removing one mean over the call, RBN with one ``c`` per call.

Everything is vectorised over words (a loop over the four operators only), runs on ``x``'s device,
and is deterministic given a ``torch.Generator``. Draws are made on the generator's device, so a CPU
generator gives the same views on CPU and CUDA.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from torch import Tensor

Operators = Literal["paper", "gclsr_code", "clsep_code"]
Probs = tuple[float, float, float, float]

# GCLSR code: u > 0.8 → RZS, 0.6 < u < 0.8 → RBN, 0.5 < u < 0.6 → IFFT, else GWN; the paper gives no
# p1..p4, so its operators borrow these. CLSEP unsup. script: GWN 0.3, dropout 0.3, IFFT 0.2, RBN 0.2.
DEFAULT_PROBS: dict[str, Probs] = {
    "paper": (0.5, 0.2, 0.1, 0.2),
    "gclsr_code": (0.5, 0.2, 0.1, 0.2),
    "clsep_code": (0.3, 0.3, 0.2, 0.2),
}
OPERATOR_NAMES = ("GWN", "RZS", "IFFT", "RBN")

# GCLSR code constants (docs/methods.md §7.2).
SNR_DB_RANGE = (6, 11)  # integer SNR in dB, inclusive
RZS_RUNS_RANGE = (15, 19)  # number of zeroed runs per word, inclusive
RZS_LONG_RUN_PROB = 0.045  # a run covers 2 coordinates with this probability, else 1
RBN_SCALE_MAX = 0.01  # c ~ U(0, 0.01)
RBN_HIGH_FACTOR = 0.8  # u_d ~ U(min w, 0.8 max w)
PAPER_RBN_MAX = 0.1  # the paper's RBN: w + U(0, 0.1) (the one number its operators carry)


class PWVAConfig(BaseModel):
    """PWVA hyperparameters. The paper gives none of these numbers; each field says whose value it is."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    operators: Operators = Field(
        "paper",
        description="operator set: paper = the paper's §3.1 formulas with chosen values (its IFFT is an "
        "identity); gclsr_code / clsep_code = the operators of those codes (methods.md §7.2)",
    )
    keep_prob: float = Field(
        0.6,
        description="probability of keeping a real word's original vector, per view (0 = 'full'); the "
        "paper gives no p: 0.6 is the CLSEP code's (the GCLSR code's is in its unpublished data module)",
    )
    probs: Probs | None = Field(
        None,
        description="(GWN, RZS/dropout, IFFT, RBN); null = the operator set's own: the paper gives no "
        "p1..p4, so paper and gclsr_code use the GCLSR code's 0.5/0.2/0.1/0.2, clsep_code the CLSEP "
        "code's 0.3/0.3/0.2/0.2",
    )
    noise_std: float = Field(
        0.04,
        ge=0.0,
        description="λ of the paper's GWN w + λN(0, I) (operators: paper); the paper gives no λ and both "
        "codes scale the noise to each word's RMS instead: 0.04 is our choice",
    )
    dropout: float = Field(
        0.3,
        description="rate of the paper's RZS = Dropout(w) and of CLSEP's dropout (operators: paper, "
        "clsep_code); the paper gives no rate: 0.3 is the CLSEP code's",
    )

    @field_validator("keep_prob")
    @classmethod
    def _keep_in_unit(cls, value: float) -> float:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"keep_prob must be in [0, 1], got {value}")
        return value

    @field_validator("dropout")
    @classmethod
    def _dropout_range(cls, value: float) -> float:
        if not 0.0 <= value < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {value}")
        return value

    @model_validator(mode="after")
    def _probs_simplex(self) -> PWVAConfig:
        if self.probs is not None and (min(self.probs) < 0 or abs(sum(self.probs) - 1.0) > 1e-6):
            raise ValueError(f"probs must be >= 0 and sum to 1, got {self.probs}")
        return self

    @property
    def resolved_probs(self) -> Probs:
        return self.probs if self.probs is not None else DEFAULT_PROBS[self.operators]


# --- random draws on the generator's device, moved to the data's device ---------------------------


def _draw_device(generator: torch.Generator | None, device: torch.device) -> torch.device:
    return generator.device if generator is not None else device


def _uniform(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    """U[0, 1) float32 of ``shape`` on ``device``."""
    out = torch.rand(shape, generator=generator, device=_draw_device(generator, device))
    return out.to(device)


def _normal(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device) -> Tensor:
    out = torch.randn(shape, generator=generator, device=_draw_device(generator, device))
    return out.to(device)


def _randint(
    low: int, high: int, shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device
) -> Tensor:
    """Integers in ``[low, high)``."""
    out = torch.randint(low, high, shape, generator=generator, device=_draw_device(generator, device))
    return out.to(device)


# --- the four operators: (N, D) -> (N, D) ------------------------------------------------------------


def _snr_noise(w: Tensor, generator: torch.Generator | None) -> Tensor:
    """GCLSR GWN: noise std = RMS(w)·10^(−SNR/20) with an integer SNR in 6..11 dB per word."""
    snr = _randint(SNR_DB_RANGE[0], SNR_DB_RANGE[1] + 1, (w.shape[0], 1), generator, w.device).float()
    std = torch.sqrt(w.pow(2).mean(dim=1, keepdim=True) / torch.pow(10.0, snr / 10.0))
    return _normal(tuple(w.shape), generator, w.device) * std


def _dropout(w: Tensor, p: float, generator: torch.Generator | None) -> Tensor:
    """Inverted dropout with an explicit generator (F.dropout takes none)."""
    survive = _uniform(tuple(w.shape), generator, w.device) >= p
    return w * survive / (1.0 - p)


def gaussian_white_noise(
    x: Tensor, variant: Operators, cfg: PWVAConfig, gen: torch.Generator | None
) -> Tensor:
    """GWN. Paper: ``w + λN(0, I)``; code: SNR-scaled noise (6..11 dB per word)."""
    w = x.float()
    if variant == "paper":
        noise = cfg.noise_std * _normal(tuple(w.shape), gen, w.device)
    else:
        noise = _snr_noise(w, gen)
    return (w + noise).to(x.dtype)


def _zero_runs_mask(n: int, dim: int, gen: torch.Generator | None, device: torch.device) -> Tensor:
    """(n, dim) bool: 15–19 runs per word, each at a uniform start, of length 1 or 2 (clipped)."""
    max_runs = RZS_RUNS_RANGE[1]
    runs = _randint(RZS_RUNS_RANGE[0], max_runs + 1, (n, 1), gen, device)
    active = torch.arange(max_runs, device=device).unsqueeze(0) < runs
    starts = _randint(0, dim, (n, max_runs), gen, device)
    long_run = _uniform((n, max_runs), gen, device) < RZS_LONG_RUN_PROB
    # Inactive runs and coordinates past the end go to a spare column ``dim`` that is dropped.
    spare = torch.full_like(starts, dim)
    first = torch.where(active, starts, spare)
    second = torch.where(active & long_run, (starts + 1).clamp(max=dim), spare)
    zero = torch.zeros(n, dim + 1, dtype=torch.bool, device=device)
    zero.scatter_(1, first, True)
    zero.scatter_(1, second, True)
    return zero[:, :dim]


def random_zero_setting(
    x: Tensor, variant: Operators, cfg: PWVAConfig, gen: torch.Generator | None
) -> Tensor:
    """RZS. Paper and CLSEP: dropout(w, p) with 1/(1−p) rescale; GCLSR code: zeroed runs, no rescale."""
    w = x.float()
    if variant == "gclsr_code":
        out = w.masked_fill(_zero_runs_mask(w.shape[0], w.shape[1], gen, w.device), 0.0)
    else:
        out = _dropout(w, cfg.dropout, gen)
    return out.to(x.dtype)


def ifft_op(x: Tensor, variant: Operators, cfg: PWVAConfig, gen: torch.Generator | None) -> Tensor:
    """IFFT. Paper: Re(IFFT(FFT(w))) (identity up to rounding); GCLSR: w − mean(w) per word;
    CLSEP: w − one mean over all vectors of the call."""
    w = x.float()
    if variant == "paper":
        out = torch.fft.ifft(torch.fft.fft(w, dim=1), dim=1).real
    elif variant == "gclsr_code":
        # The code subtracts the mean before the FFT round trip and never adds it back.
        out = w - w.mean(dim=1, keepdim=True)
    else:
        out = w - w.mean()
    return out.to(x.dtype)


def random_background_noise(
    x: Tensor, variant: Operators, cfg: PWVAConfig, gen: torch.Generator | None
) -> Tensor:
    """RBN. Paper: w + U(0, 0.1); code: w + c·u, u_d ~ U(min w, 0.8 max w), c ~ U(0, 0.01)
    per word (GCLSR) or once per call (CLSEP)."""
    w = x.float()
    if variant == "paper":
        return (w + PAPER_RBN_MAX * _uniform(tuple(w.shape), gen, w.device)).to(x.dtype)
    low = w.amin(dim=1, keepdim=True)
    high = RBN_HIGH_FACTOR * w.amax(dim=1, keepdim=True)
    u = low + (high - low) * _uniform(tuple(w.shape), gen, w.device)
    c_rows = w.shape[0] if variant == "gclsr_code" else 1
    c = RBN_SCALE_MAX * _uniform((c_rows, 1), gen, w.device)
    return (w + c * u).to(x.dtype)


OperatorFn = Callable[[Tensor, Operators, PWVAConfig, torch.Generator | None], Tensor]
OPERATORS: tuple[OperatorFn, ...] = (
    gaussian_white_noise,
    random_zero_setting,
    ifft_op,
    random_background_noise,
)


# --- the partial choice --------------------------------------------------------------------------------


def choose_operators(
    n: int, probs: Probs, generator: torch.Generator | None = None, device: torch.device | str = "cpu"
) -> Tensor:
    """(n,) int64 operator indices drawn with ``probs`` (inverse CDF, so zero-prob ops never occur)."""
    device = torch.device(device)
    cdf = torch.tensor([math.fsum(probs[: k + 1]) for k in range(len(probs))], dtype=torch.float64)
    cdf[-1] = 1.0  # rounding must not leave u in (cdf[-1], 1)
    u = _uniform((n,), generator, device).double()
    return torch.searchsorted(cdf.to(device), u, right=True).clamp_(max=len(probs) - 1)


def augment(x: Tensor, mask: Tensor, cfg: PWVAConfig, generator: torch.Generator | None = None) -> Tensor:
    """One augmented view: per real word pick an operator with `probs`, then keep the original with keep_prob.

    ``x``: (B, L, D) word vectors; ``mask``: (B, L) bool, True = real word. Padding is returned as is.
    """
    batch, length, dim = x.shape
    # Autocast would run the operators' reductions/FFT in half precision; the math is float32.
    with torch.autocast(device_type=x.device.type, enabled=False):
        flat = x.reshape(-1, dim).float()
        n = flat.shape[0]
        chosen = choose_operators(n, cfg.resolved_probs, generator, x.device)
        keep = (_uniform((n,), generator, x.device) < cfg.keep_prob) | ~mask.reshape(-1).to(x.device)
        out = flat.clone()
        for k, operator in enumerate(OPERATORS):
            rows = torch.nonzero((chosen == k) & ~keep).squeeze(1)
            if rows.numel():
                out[rows] = operator(flat[rows], cfg.operators, cfg, generator)
    return out.reshape(batch, length, dim).to(x.dtype)
