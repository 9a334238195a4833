"""Back-translation (Sennrich et al., 2016; the text-level baseline of GCLSR Table 2): en → pivot → en.

Two Marian models (Helsinki-NLP/opus-mt, Tiedemann & Thottingal 2020) through transformers, batched
``generate``. They need the Hugging Face hub (or local folders) and ``sentencepiece``/``sacremoses``;
every loading failure becomes :class:`ModelUnavailableError` with the ways out.
"""

from __future__ import annotations

from typing import Any

import torch
from pydantic import BaseModel, ConfigDict
from tqdm.auto import tqdm

from clsr.data.hub.model_registry import ModelUnavailableError, resolve_model_path

MAX_TOKENS = 512  # Marian's position limit


class BackTranslationConfig(BaseModel):
    """Pivot language and the two translation models (default: opus-mt en↔pivot)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    pivot: str = "de"
    forward_model: str | None = None  # default f"Helsinki-NLP/opus-mt-en-{pivot}"
    backward_model: str | None = None  # default f"Helsinki-NLP/opus-mt-{pivot}-en"
    batch_size: int = 64
    num_beams: int = 1

    def model_ids(self) -> tuple[str, str]:
        forward = self.forward_model or f"Helsinki-NLP/opus-mt-en-{self.pivot}"
        backward = self.backward_model or f"Helsinki-NLP/opus-mt-{self.pivot}-en"
        return forward, backward


def unavailable(model_id: str, err: Exception) -> ModelUnavailableError:
    """The loading error as one message: what is missing and how to proceed offline."""
    return ModelUnavailableError(
        f"back-translation cannot load {model_id!r} ({type(err).__name__}: {err}). It needs the Hugging Face "
        "hub (or a local folder given as method.back_translation.forward_model/backward_model), plus "
        "`pip install sentencepiece sacremoses`; offline, drop the back-translation points of the study "
        "(e.g. run with --smoke, which skips them)."
    )


def _load(model_id: str, device: str) -> tuple[Any, Any]:
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    path = resolve_model_path(model_id)
    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSeq2SeqLM.from_pretrained(path)
    except Exception as err:  # OSError offline, ImportError/ValueError without sentencepiece
        raise unavailable(model_id, err) from err
    return tokenizer, model.to(device).eval()


@torch.inference_mode()
def _translate(
    sentences: list[str],
    tokenizer: Any,
    model: Any,
    cfg: BackTranslationConfig,
    device: str,
    desc: str | None,
) -> list[str]:
    """Translate in batches of similar length (less padding), returned in the input order."""
    order = sorted(range(len(sentences)), key=lambda i: len(sentences[i]))
    out: list[str] = [""] * len(sentences)
    starts = range(0, len(order), cfg.batch_size)
    for start in tqdm(starts, desc=desc, disable=desc is None):
        ids = order[start : start + cfg.batch_size]
        batch = tokenizer(
            [sentences[i] for i in ids],
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=MAX_TOKENS,
        ).to(device)
        generated = model.generate(**batch, num_beams=cfg.num_beams, max_new_tokens=MAX_TOKENS)
        for i, text in zip(ids, tokenizer.batch_decode(generated, skip_special_tokens=True), strict=True):
            out[i] = text
    return out


def back_translate(
    sentences: list[str], cfg: BackTranslationConfig, device: str = "cpu", progress: bool = True
) -> list[str]:
    """English → ``cfg.pivot`` → English, one output per input sentence."""
    forward_id, backward_id = cfg.model_ids()
    forward = _load(forward_id, device)
    backward = _load(backward_id, device)
    pivot = _translate(sentences, *forward, cfg, device, f"en→{cfg.pivot}" if progress else None)
    return _translate(pivot, *backward, cfg, device, f"{cfg.pivot}→en" if progress else None)


def back_translation_available(cfg: BackTranslationConfig) -> str | None:
    """None when both models' config and tokenizer load, else the ModelUnavailableError message."""
    from transformers import AutoConfig, AutoTokenizer

    for model_id in cfg.model_ids():
        path = resolve_model_path(model_id)
        try:
            AutoConfig.from_pretrained(path)
            AutoTokenizer.from_pretrained(path)
        except Exception as err:
            return str(unavailable(model_id, err))
    return None
