"""GCLSR (Wang, Zhang, Lei & Peng, Appl. Sci. 2023), methods.md §7.

A TextCNN over frozen word vectors, trained SimSiam-style on two augmented views of each sentence:

* views: PWVA (partial word-vector augmentation, §7.2) applied twice to the sentence's word vectors,
  or a text-level alternative (EDA, back-translation) for the paper's Table 2; each view draws its
  own random vectors for out-of-vocabulary words (``oov_draw: per_view``, the paper's §5.7: random
  initialisation of "unrecognizable words" "can be regarded as a method of data augmentation"), so
  even "No Aug." views differ at OOV positions; ``shared`` draws once for both views (our reading
  of the code, whose data module is unpublished; with no augmentation the views are then equal);
* self-attention of word vectors (§7.3, paper Algorithm 1, training only): S = XXᵀ/√d with padding
  cells set to 1e-9 (no softmax), each word vector scaled by its row sum a_i = Σ_j S_ij;
* branch v: backbone → projector (3 FC, 4096) → z_v → predictor (4096→1024→4096) → p_v.

Grouped loss, paper Eq. 9 (with the stop-gradient of the code): split each 4096-d vector into M
groups of D coordinates (D = ``group_size``, code D = 16 ⇒ M = 256; "no grouping" is D = 4096):

    L = 1/(B·M) Σ_b Σ_g [ -½ cos(p1_bg, sg(z2_bg)) - ½ cos(p2_bg, sg(z1_bg)) ]

Optimisation (§7.6): SGD, LR = 0.03 × B/128 with 5 warm-up epochs then cosine decay, momentum 0.9
during warm-up and 0.8 after, weight decay 1e-3 on every parameter, and the predictor at a constant
LR of 1.0 (SimSiam's fixed predictor LR). Model selection on STS-B dev every epoch (the paper; the
code selected on the STS test sets). At test time the sentence embedding is the backbone output.

Paper vs code (§9): each difference is a field, paper by default. Code variant: region sizes
(1,1,1,6,10,15), 640 filters, ``projector_out_bn: true``, ``trainer.nesterov: true``,
``pwva.operators: gclsr_code``, ``oov_draw: shared``; the base LR 0.3 of the paper's §5.1 is
``trainer.lr: 0.3``.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

import numpy as np
import torch
import torch.nn.functional as F
from pydantic import Field, field_validator, model_validator
from torch import nn

from clsr.augment.back_translation import (
    BackTranslationConfig,
    back_translate,
    back_translation_available,
)
from clsr.augment.eda import EDAConfig, eda, vector_synonyms, wordnet_synonyms
from clsr.augment.pwva import PWVAConfig, augment
from clsr.config.model import TextCNNConfig
from clsr.config.trial import TrialConfig
from clsr.encoders.textcnn import TextCNNEncoder
from clsr.encoders.word_vectors import WordTable, build_word_table
from clsr.methods.base import Method, MethodConfig
from clsr.methods.losses import full_precision
from clsr.runtime.distributed import gather_with_grad

Augmentation = Literal["pwva", "full", "none", "eda", "back_translation"]
OOVDraw = Literal["per_view", "shared"]
TEXT_LEVEL = ("eda", "back_translation")


class GCLSRConfig(MethodConfig):
    name: str = "gclsr"
    augmentation: Augmentation = Field(
        "pwva",
        description="pwva (partial, the paper's), full (every word), none, or text-level eda / back_translation",
    )
    pwva: PWVAConfig = Field(default_factory=PWVAConfig)
    eda: EDAConfig = Field(default_factory=EDAConfig)
    back_translation: BackTranslationConfig = Field(default_factory=BackTranslationConfig)
    oov_draw: OOVDraw = Field(
        "per_view",
        description="random vectors of OOV words (model.oov: redraw): per_view = each view draws its own "
        "(paper §5.7: the random initialisation is an augmentation); shared = one draw for both views "
        "(our reading of the code, whose data module is unpublished)",
    )
    self_attention: bool = Field(True, description="Algorithm 1 on both views, training only (paper)")
    projector_dim: int = Field(4096, ge=2, description="width of the 3 projector layers (paper and code)")
    projector_out_bn: bool = Field(False, description="BN on the projector output (paper: no; code: yes)")
    predictor_hidden: int = Field(
        1024, ge=1, description="bottleneck of the 2-layer predictor (paper and code)"
    )
    group_size: int | None = Field(
        16, ge=1, description="coordinates per group D (paper Table 11 and code: 16); null = no grouping"
    )
    predictor_lr: float | Literal["decay"] = Field(
        1.0,
        description="constant absolute LR of the predictor (paper Table 6 and code: 1.0), or 'decay' to "
        "follow the base schedule",
    )

    @field_validator("predictor_lr")
    @classmethod
    def _positive_lr(cls, value: float | str) -> float | str:
        if isinstance(value, float | int) and value <= 0:
            raise ValueError("predictor_lr must be positive or 'decay'")
        return value

    @model_validator(mode="after")
    def _groups_divide(self) -> GCLSRConfig:
        if self.group_size is not None and self.projector_dim % self.group_size:
            raise ValueError(f"group_size {self.group_size} must divide projector_dim {self.projector_dim}")
        return self


# --- the pieces of Eq. 9 and Algorithm 1 ---------------------------------------------------------


def word_self_attention(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Algorithm 1: scale each word vector by the row sum of S = XXᵀ/√d, padding cells set to 1e-9."""
    scores = x @ x.transpose(1, 2) / math.sqrt(x.shape[-1])
    real = mask.unsqueeze(2) & mask.unsqueeze(1)
    scores = scores.masked_fill(~real, 1e-9)
    return x * scores.sum(dim=-1, keepdim=True)


def grouped_simsiam_loss(
    p1: torch.Tensor, p2: torch.Tensor, z1: torch.Tensor, z2: torch.Tensor, group_size: int | None
) -> torch.Tensor:
    """Eq. 9: symmetric negative cosine per D-coordinate group, stop-gradient on z, mean over all."""
    d = group_size or p1.shape[-1]

    def groups(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(t.shape[0], -1, d)

    cos_12 = F.cosine_similarity(groups(p1), groups(z2.detach()), dim=-1)
    cos_21 = F.cosine_similarity(groups(p2), groups(z1.detach()), dim=-1)
    return -(0.5 * cos_12 + 0.5 * cos_21).mean()


def _mlp(sizes: Sequence[int], final_bn: bool) -> nn.Sequential:
    """Linear layers with BN + ReLU between them; the last one optionally BN, never ReLU."""
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        layers.append(nn.Linear(n_in, n_out))
        last = i == len(sizes) - 2
        if not last:
            layers += [nn.BatchNorm1d(n_out), nn.ReLU(inplace=True)]
        elif final_bn:
            layers.append(nn.BatchNorm1d(n_out))
    return nn.Sequential(*layers)


class GCLSRModel(nn.Module):
    """Backbone + projector + predictor; ``forward`` returns (p1, p2, z1, z2) of the two views."""

    def __init__(self, encoder: TextCNNEncoder, cfg: GCLSRConfig):
        super().__init__()
        self.cfg = cfg
        self.encoder = encoder
        width = cfg.projector_dim
        self.projector = _mlp([encoder.dim, width, width, width], final_bn=cfg.projector_out_bn)
        self.predictor = _mlp([width, cfg.predictor_hidden, width], final_bn=False)

    def _view(self, vectors: torch.Tensor, mask: torch.Tensor, word_augment: bool) -> tuple:
        if word_augment:
            vectors = augment(vectors, mask, self._pwva())
        if self.cfg.self_attention:
            vectors = word_self_attention(vectors, mask)
        z = self.projector(self.encoder.features(vectors))
        return self.predictor(z), z

    def _pwva(self) -> PWVAConfig:
        if self.cfg.augmentation == "full":
            return self.cfg.pwva.model_copy(update={"keep_prob": 0.0})
        return self.cfg.pwva

    def forward(
        self,
        ids: torch.Tensor,
        mask: torch.Tensor,
        ids2: torch.Tensor | None = None,
        mask2: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, ...]:
        word_augment = self.cfg.augmentation in ("pwva", "full")
        first, second = self.word_views(ids, ids2)
        p1, z1 = self._view(first, mask, word_augment)
        if ids2 is None:
            p2, z2 = self._view(second, mask, word_augment)
        else:  # a text-level view (EDA, back-translation) has words of its own, never word-augmented
            p2, z2 = self._view(second, mask2, False)
        return p1, p2, z1, z2

    def word_views(
        self, ids: torch.Tensor, ids2: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The two views' word vectors before PWVA; ``oov_draw`` decides whether OOV draws are shared."""
        first = self.encoder.embed_words(ids)
        if ids2 is not None:
            return first, self.encoder.embed_words(ids2)
        if self.cfg.oov_draw == "shared":
            return first, first
        return first, self.encoder.embed_words(ids)


# --- data ------------------------------------------------------------------------------------------


@dataclass
class GCLSRShared:
    """Built once per study: the word table and the encoded training corpus (and its translations)."""

    table: WordTable
    texts: list[str]
    ids: np.ndarray
    mask: np.ndarray
    translated: list[str] = field(default_factory=list)


class WordViewBatcher:
    """Row indices → padded word ids of one or two views (a text-level augmentation makes the second)."""

    def __init__(self, shared: GCLSRShared, cfg: GCLSRConfig, seed: int):
        self.shared, self.cfg = shared, cfg
        self.rng = random.Random(seed)
        self.synonyms: Callable[[str], Sequence[str]] | None = None
        if cfg.augmentation == "back_translation":
            self.view2 = shared.table.encode(shared.translated)

    def __len__(self) -> int:
        return len(self.shared.texts)

    def _eda_synonyms(self) -> Callable[[str], Sequence[str]]:
        if self.synonyms is None:
            table = self.shared.table
            self.synonyms = (
                wordnet_synonyms()
                if self.cfg.eda.synonyms == "wordnet"
                else vector_synonyms(table.words, table.vectors[2:], self.cfg.eda.neighbours)
            )
        return self.synonyms

    def collate(self, indices: Sequence[int]) -> dict[str, Any]:
        batch: dict[str, Any] = {"num_rows": len(indices)}
        if self.cfg.augmentation == "eda":  # two independent EDA sentences per row (Table 2, "+EDA")
            synonyms = self._eda_synonyms()
            views = [
                self.shared.table.encode(
                    [eda(self.shared.texts[i], self.cfg.eda, synonyms, self.rng) for i in indices]
                )
                for _ in range(2)
            ]
            (ids, mask), (ids2, mask2) = views
            return batch | _tensors(ids=ids, mask=mask, ids2=ids2, mask2=mask2)
        batch |= _tensors(ids=self.shared.ids[indices], mask=self.shared.mask[indices])
        if self.cfg.augmentation == "back_translation":  # original and its round trip through a pivot
            batch |= _tensors(ids2=self.view2[0][indices], mask2=self.view2[1][indices])
        return batch


def _tensors(**arrays: np.ndarray) -> dict[str, torch.Tensor]:
    return {k: torch.as_tensor(np.asarray(v)) for k, v in arrays.items()}


def evaluation_texts(trial: TrialConfig) -> list[str]:
    """Every sentence the trial is scored on (STS, transfer, FAQ), so the word table holds their words."""
    from clsr.data.sources import resolve_data_dir
    from clsr.data.sts import load_sts
    from clsr.data.tasks import split_eval_tasks
    from clsr.data.transfer import load_transfer

    data_dir = resolve_data_dir(trial.data.data_dir)
    sts_tasks, transfer_tasks, faq_tasks = split_eval_tasks(trial.eval.builtin_tasks())
    splits = [(task, "test") for task in sts_tasks]
    splits += [(task, "dev") for task in trial.eval.dev_tasks] + [("stsb", "dev")]
    texts: list[str] = []
    for task, split in dict.fromkeys(splits):
        sts = load_sts(task, split, data_dir)
        texts += sts.sentences1 + sts.sentences2
    for task in transfer_tasks:
        for part in load_transfer(task, data_dir).splits.values():
            texts += [*part.sentences, *(part.sentences2 or ())]
    return texts + _faq_texts(faq_tasks, data_dir) + _custom_texts(trial)


def _custom_texts(trial: TrialConfig) -> list[str]:
    """The texts of the eval.custom tasks the trial scores (their words join the table too)."""
    from clsr.eval.custom import task_texts

    return [text for name, task in trial.eval.custom_tasks().items() for text in task_texts(name, task)]


def _faq_texts(faq_tasks: list[str], data_dir: Any) -> list[str]:
    """Queries and candidates of the FAQ sets; sets only implied by the ``faq`` group may be missing."""
    from clsr.data.faq import load_faq
    from clsr.data.sources import DataUnavailableError
    from clsr.eval.faq import expand_faq_tasks

    if not faq_tasks:
        return []
    names, optional = expand_faq_tasks(faq_tasks)
    texts: list[str] = []
    for name in names:
        try:
            faq = load_faq(name, data_dir)
        except DataUnavailableError:
            if name in optional:
                continue
            raise
        texts += faq.queries + faq.candidates()
    return texts


# --- the method --------------------------------------------------------------------------------


class GCLSR(Method):
    name = "gclsr"
    Config = GCLSRConfig
    encoder_type = "textcnn"
    paper = "GCLSR (Wang et al., 2023); grouped SimSiam loss Eq. 9, PWVA §3.1, self-attention Alg. 1"
    paper_defaults: ClassVar = {
        "model": {"type": "textcnn", "vectors": "word2vec-google-news-300", "max_words": 64},
        "data": {"train": "wiki1m", "max_rows": 10000, "subset_seed": 2},
        "trainer": {
            "optimizer": "sgd",
            "lr": 0.03,
            "lr_reference_batch": 128,
            "batch_size": 512,
            "epochs": 20,
            "schedule": "cosine",
            "warmup_epochs": 5,
            "momentum": 0.9,
            "momentum_after_warmup": 0.8,
            "weight_decay": 0.001,
            "no_decay": [],
            "max_grad_norm": None,
            "eval_epochs": 1,
            "seed": 2,
        },
        "eval": {"dev_tasks": ["stsb"], "select_on": "stsb", "tasks": ["sts"]},
    }

    def views(self) -> tuple[str, ...]:
        return ("text",)

    def trial_problems(self, trial: TrialConfig) -> list[str]:
        """EDA's words are drawn by the batcher's own generator, which no checkpoint keeps: a resumed
        trial would draw its first batches' words again."""
        if trial.trainer.deterministic and self.cfg.augmentation == "eda":
            return [
                "method.augmentation 'eda' draws its words from a generator no checkpoint keeps, so a "
                "resumed trial differs: with trainer.deterministic: true use pwva, full, none or "
                "back_translation (allowed), or trainer.deterministic: false"
            ]
        return []

    def shared_key(self, trial: TrialConfig) -> str:
        text_level = (
            self.cfg.back_translation.model_dump() if self.cfg.augmentation == "back_translation" else None
        )
        model = trial.model.model_dump(
            include={"vectors", "vectors_format", "tokenization", "max_words", "oov"}
        )
        subset_seed = trial.data.subset_seed if trial.data.subset_seed is not None else trial.trainer.seed
        return json.dumps(
            [
                self.name,
                trial.data.model_dump(),
                subset_seed,
                model,
                trial.eval.tasks,
                trial.eval.dev_tasks,
                text_level,
            ],
            sort_keys=True,
        )

    def prepare_shared(self, trial: TrialConfig) -> GCLSRShared:
        from clsr.data.training import training_rows

        texts = [row["text"] for row in training_rows(trial)]
        translated: list[str] = []
        if self.cfg.augmentation == "back_translation":
            device = "cuda" if torch.cuda.is_available() else "cpu"
            translated = back_translate(texts, self.cfg.back_translation, device=device)
        m = trial.model
        table = build_word_table(
            m.vectors,
            texts + translated + evaluation_texts(trial),
            fmt=m.vectors_format,
            tokenization=m.tokenization,
            max_words=m.max_words,
            oov=m.oov,
            data_dir=trial.data.data_dir,
        )
        ids, mask = table.encode(texts)
        return GCLSRShared(table, texts, ids, mask, translated)

    def unavailable(self, trial: TrialConfig) -> str | None:
        from clsr.encoders.word_vectors import named_vectors_unavailable

        vectors = getattr(trial.model, "vectors", None)
        if vectors and (why := named_vectors_unavailable(vectors, trial.data.data_dir)):
            return why
        if self.cfg.augmentation == "back_translation":
            return back_translation_available(self.cfg.back_translation)
        return None

    def text_pipeline(self, trial: TrialConfig, shared: GCLSRShared) -> GCLSRShared:
        return shared

    def prepare_rows(
        self, rows: list[dict[str, str]], pipeline: GCLSRShared, trial: TrialConfig
    ) -> WordViewBatcher:
        self.check_columns(rows)
        if [r["text"] for r in rows] != pipeline.texts:
            raise RuntimeError("the shared word table was built for other training rows; rebuild it")
        return WordViewBatcher(pipeline, self.cfg, trial.trainer.seed)

    def build_model(self, model_cfg: TextCNNConfig, pipeline: GCLSRShared = None) -> nn.Module:
        model = GCLSRModel(TextCNNEncoder(model_cfg, pipeline.table), self.cfg)
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            model = nn.SyncBatchNorm.convert_sync_batchnorm(model)  # BN over the global batch, as on 1 GPU
        return model

    def param_group_lrs(self) -> dict[str, float]:
        return {} if self.cfg.predictor_lr == "decay" else {"predictor.": float(self.cfg.predictor_lr)}

    def fixed_lr_prefixes(self) -> tuple[str, ...]:
        return () if self.cfg.predictor_lr == "decay" else ("predictor.",)

    def training_loss(self, model: nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        outputs = model(batch["ids"], batch["mask"], batch.get("ids2"), batch.get("mask2"))
        embeddings = gather_with_grad(torch.stack(outputs, dim=1)).float()
        with full_precision(embeddings):  # the cosines of the loss in float32 under bf16 autocast
            return self.loss_from_embeddings(embeddings)

    def loss_from_embeddings(self, embeddings: torch.Tensor) -> torch.Tensor:
        """``embeddings``: (rows, 4, dim) holding p1, p2, z1, z2 of every row of the global batch."""
        p1, p2, z1, z2 = embeddings.unbind(dim=1)
        return grouped_simsiam_loss(p1, p2, z1, z2, self.cfg.group_size)

    def export_model(self, model: nn.Module, pipeline: GCLSRShared, trial: TrialConfig, folder: Path) -> None:
        """Save the TextCNN backbone (conv banks, the trial's word table, its config) in ``folder``; no
        sentence-transformers equivalent exists, ``clsr.encoders.export.load_textcnn`` loads it."""
        from clsr.encoders.export import save_textcnn

        encoder = model.encoder if hasattr(model, "encoder") else model
        save_textcnn(encoder, pipeline.table, trial.model, folder, method=self.name)

    def make_embedder(
        self, model: nn.Module, pipeline: GCLSRShared, batch_size: int = 128, precision: str = "auto"
    ) -> Callable[[list[str]], np.ndarray]:
        """TextCNN scores in float32 whatever ``precision`` says (a small CNN: autocast gains nothing)."""
        from clsr.encoders.embed import textcnn_embedder

        encoder = model.encoder if hasattr(model, "encoder") else model
        return textcnn_embedder(encoder, pipeline.table, batch_size=max(batch_size, 512))
