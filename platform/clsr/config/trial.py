"""The resolved configuration of one trial: small validated sections with defaults written once.

Precedence when a study is resolved (lowest first): these class defaults, the method's paper
defaults (``Method.paper_defaults``), the study's ``base``, the ablation point, the seed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from clsr.config.custom_task import CustomTask, check_name
from clsr.config.model import ModelConfig, TextCNNConfig

MODEL_TYPES = ("transformer", "textcnn")
# trainer.length_group_size: auto. CPU: best of 16/32/48/64/96 for MiniLM on NLI triplets (bench train).
# GPU: one pass (None). On an H100, BERT-base simcse_sup at batch 512 (1,536 sentences) took 0.114 s a
# step in one pass (54 % padding), 0.447 s in groups of 256 and 0.815 s in groups of 64: the card runs
# padding almost for free, while every group is another sequence of small kernels.
AUTO_LENGTH_GROUP: dict[str, int | None] = {"cpu": 32, "cuda": None}
# Upper bounds no real study reaches; they turn a typo (1e30) into a message instead of a crash later.
SEED_LIMIT = 2**32  # seeds are 0 <= seed < 2**32 (numpy's and torch's seeding accept them all)
MAX_BATCH = 1_000_000  # rows per batch (trainer/eval batch_size, GradCache chunks, length groups)
MAX_STEPS = 10**9  # optimiser steps (max_steps, warm-up, evaluation and logging intervals)
MAX_EPOCHS = 10_000
MAX_ROWS = 10**10  # data.max_rows and other row/example counts


def check_seed(seed: int) -> int:
    if not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"a seed is a whole number from 0 to 2**32 - 1 = {SEED_LIMIT - 1}")
    return seed


Seed = Annotated[int, AfterValidator(check_seed)]


def _model_type(value: Any) -> str:
    return value.get("type", "transformer") if isinstance(value, dict) else value.type


# ``model.type`` picks the encoder: a Hugging Face transformer (default) or a TextCNN over word vectors.
AnyModelConfig = Annotated[
    Annotated[ModelConfig, Tag("transformer")] | Annotated[TextCNNConfig, Tag("textcnn")],
    Discriminator(_model_type),
]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


FAQ_PREFIX = "faq:"  # data.train: faq:<set> trains on an FAQ set's fold (clsr.data.faq.fold_split)


Scalar = str | int | float | bool


class DataConfig(Section):
    train: str = Field(
        "wiki1m",
        description="what to train on: a catalogue set (clsr.data.catalog, docs/data.md); faq:<stackfaq|faqir|cough> "
        "(query, relevant FAQ item) rows of data.fold's training queries (RCL Table 2); a local file "
        "(.csv, .tsv, .jsonl, .json, .parquet, .txt: one sentence a line) or folder (files of one kind, or "
        "a dataset saved with save_to_disk; relative paths from the folder `platform` runs in); or a hub "
        "data set id owner/name (with data.config, data.split, data.revision)",
    )
    data_dir: str | None = Field(None, description="local data folder; default: $CLSR_DATA_DIR, else the hub")
    config: str | None = Field(None, description="a hub data set's configuration (subset) name")
    split: str = Field("train", description="the split of a hub data set or a saved DatasetDict")
    revision: str | None = Field(None, description="a hub data set's revision: branch, tag or commit")
    columns: dict[str, str] | None = Field(
        None,
        description="the method's views read from the data's columns, {view: column}, e.g. {anchor: "
        "sentence1, positive: sentence2, negative: hard_neg}; unmapped views are read from same-named columns",
    )
    filter: dict[str, Scalar | list[Scalar]] | None = Field(
        None,
        description="keep the rows whose column equals the value (or one of the values), e.g. {label: 0}; "
        "values compare as text",
    )
    max_rows: int | None = Field(
        None, ge=1, le=MAX_ROWS, description="seeded random subset of the training rows (at most 10**10)"
    )
    subset_seed: Seed | None = Field(
        None, description="seed of the max_rows subset; default trainer.seed (a fixed value keeps one sample)"
    )
    fold: int | None = Field(
        None,
        ge=0,
        le=4,
        description="with train faq:<set>: the cross-validation fold 0-4 whose queries are the test part "
        "(RCL: 5-fold; dev = 10 % of the other folds, methods.md §6.5's proposal)",
    )

    @field_validator("train")
    @classmethod
    def _known_source(cls, train: str) -> str:
        """A catalogue name, faq:<set>, a path (made absolute: trials run in other folders) or owner/name."""
        from clsr.data.catalog import DATASETS
        from clsr.data.external import HUB_ID, absolute_local, looks_like_path

        if train in DATASETS or train.startswith(FAQ_PREFIX):
            return train
        if looks_like_path(train):
            return absolute_local(train)  # a missing one: said by study validate
        if "/" in train and HUB_ID.match(train):
            return train
        raise ValueError(
            f"{train!r} is not a catalogue set ({', '.join(DATASETS)}), faq:<set>, an existing file or "
            f"folder, or a hub data set id owner/name"
        )

    @model_validator(mode="after")
    def _fold_with_faq(self) -> DataConfig:
        from clsr.data.faq import FAQ_TASKS

        faq = self.train.startswith(FAQ_PREFIX)
        if faq and self.train[len(FAQ_PREFIX) :] not in FAQ_TASKS:
            raise ValueError(
                f"data.train {self.train!r}: allowed FAQ sets are faq:{', faq:'.join(FAQ_TASKS)}"
            )
        if faq != (self.fold is not None):
            raise ValueError(
                "data.fold (0-4) goes with data.train: faq:<set>, and faq:<set> needs a data.fold"
            )
        return self

    @model_validator(mode="after")
    def _source_options_with_external_data(self) -> DataConfig:
        """config, revision, columns and filter describe a file or hub source, not a catalogue set."""
        given = [k for k in ("config", "revision", "columns", "filter") if getattr(self, k) is not None]
        given += ["split"] if self.split != "train" else []
        if given and not self.external():
            raise ValueError(
                f"data.{given[0]} applies to a file, folder or hub data set in data.train, not to "
                f"{self.train!r} (a catalogue or FAQ set has fixed columns); remove it"
            )
        return self

    def faq_set(self) -> str | None:
        """The FAQ set trained on (train: faq:<set>), else None."""
        return self.train[len(FAQ_PREFIX) :] if self.train.startswith(FAQ_PREFIX) else None

    def external(self) -> bool:
        """A file, folder or hub data set (read by clsr.data.external), not a catalogue or FAQ set."""
        from clsr.data.catalog import DATASETS

        return self.train not in DATASETS and self.faq_set() is None


class TrainerConfig(Section):
    epochs: float = Field(1.0, gt=0, le=MAX_EPOCHS, description="training epochs (at most 10,000)")
    max_steps: int | None = Field(
        None,
        ge=0,
        le=MAX_STEPS,
        description="stop after this many optimiser steps (at most 10**9); 0: an evaluation-only point that "
        "trains nothing and scores its starting model (our choice: e.g. a paper's untrained baseline row)",
    )
    stop_when_loss_stalls: int | None = Field(
        None,
        ge=1,
        le=MAX_STEPS,
        description="stop once the training loss has not gone below its lowest value for N optimiser steps "
        "(default: the method's own rule, e.g. rcl_entropy's early_stop_patience)",
    )
    batch_size: int = Field(
        64,
        ge=2,
        le=MAX_BATCH,
        description="global batch: rows per optimiser step over all workers (at most 1,000,000)",
    )
    grad_accum_steps: int = Field(1, ge=1, le=MAX_BATCH)
    gradcache_chunk_rows: int | None = Field(
        None,
        ge=1,
        le=MAX_BATCH,
        description="GradCache (Gao et al. 2021): encode each worker's micro-batch in chunks of N rows "
        "(activations of one chunk in memory at a time), same loss and gradients; None: off",
    )
    length_group_size: int | Literal["auto"] | None = Field(
        "auto",
        description="encode a forward pass's sentences sorted by length in groups of N, each padded to its "
        "own longest sentence: the same embeddings with ~10 % padding instead of ~50 % on NLI triplets; "
        "auto: 32 on CPU, one pass on a GPU (each measured best); None: one pass padded to the batch's longest",
    )
    compile: bool = Field(
        False,
        description="torch.compile the transformer backbone for training steps, with widths padded to a "
        "multiple of 8 (shape buckets) so it compiles once per bucket, not every step; evaluation stays eager",
    )
    compile_mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = (
        "default"
    )
    optimizer: Literal["adamw", "sgd"] = "adamw"
    lr: float = Field(3e-5, gt=0)
    lr_reference_batch: int | None = Field(
        None,
        ge=1,
        le=MAX_BATCH,
        description="linear scaling rule: the LR used is lr × batch_size / lr_reference_batch",
    )
    weight_decay: float = Field(0.0, ge=0)
    no_decay: list[str] = Field(default_factory=lambda: ["bias", "LayerNorm.weight", "LayerNorm.bias"])
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = Field(1e-8, gt=0)
    momentum: float = Field(
        0.9, ge=0, lt=1, description="SGD momentum (during warm-up, if momentum_after_warmup)"
    )
    momentum_after_warmup: float | None = Field(None, ge=0, lt=1, description="SGD momentum after warm-up")
    nesterov: bool = False
    lr_by_module: dict[str, float] = Field(
        default_factory=dict, description="absolute LR for parameters whose name starts with a prefix"
    )
    fixed_lr_modules: list[str] = Field(
        default_factory=list, description="name prefixes whose LR stays constant (no warm-up, no decay)"
    )
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS)
    warmup_ratio: float = Field(0.0, ge=0, lt=1)
    warmup_epochs: float = Field(0.0, ge=0, le=MAX_EPOCHS, description="warm-up length in epochs")
    max_grad_norm: float | None = Field(1.0, gt=0)
    precision: Literal["auto", "fp32", "bf16", "fp16"] = Field(
        "auto", description="auto = bf16 autocast on a GPU that supports it, fp32 on CPU"
    )
    eval_steps: int = Field(
        125, ge=1, le=MAX_STEPS, description="evaluate on the dev set every N optimiser steps"
    )
    eval_epochs: float | None = Field(
        None, gt=0, le=MAX_EPOCHS, description="evaluate every N epochs (replaces eval_steps)"
    )
    log_every: int = Field(
        10,
        ge=1,
        le=MAX_STEPS,
        description="read per-step metrics back from the device every N steps (they reach MLflow with "
        "the next checkpoint)",
    )
    checkpoint_every: int = Field(
        1,
        ge=1,
        le=MAX_STEPS,
        description="write the resumable checkpoint at every N-th evaluation (and always at the last); "
        "a lost worker resumes from the last one written",
    )
    checkpoint_upload: Literal["async", "sync"] = Field(
        "async",
        description="async: Ray Train copies each checkpoint to the study's storage in the background "
        "while training goes on (it counts once copied; a lost worker resumes from the last one that "
        "was); sync: training waits for the copy. In-process trials (workers_per_trial: 0) always wait",
    )
    seed: Seed = Field(42, description="0 <= seed < 2**32")
    deterministic: bool = Field(
        False,
        description="bitwise-reproducible training on one machine: PyTorch's deterministic algorithms, "
        "cuDNN without autotuning, the cuBLAS workspace set, and the random generators reseeded from "
        "(seed, rank, step) before every step, so a rerun or a resumed trial gives the same weights; "
        "settings that cannot be are refused (docs/training.md, Determinism)",
    )

    @model_validator(mode="after")
    def _one_warmup(self) -> TrainerConfig:
        given = [k for k in ("warmup_steps", "warmup_ratio", "warmup_epochs") if getattr(self, k)]
        if len(given) > 1:
            raise ValueError(f"set one of warmup_steps, warmup_ratio, warmup_epochs (given: {given})")
        if self.momentum_after_warmup is not None and self.optimizer != "sgd":
            raise ValueError("momentum_after_warmup needs optimizer: sgd")
        return self

    @field_validator("length_group_size")
    @classmethod
    def _positive_group(cls, value: int | str | None) -> int | str | None:
        if isinstance(value, int) and not 1 <= value <= MAX_BATCH:
            raise ValueError(
                f"trainer.length_group_size is 'auto', null or a positive integer up to {MAX_BATCH:,} "
                f"(given: {value})"
            )
        return value

    def resolved_length_group_size(self) -> int | None:
        """``length_group_size`` with ``auto`` resolved for the device this process trains on."""
        if self.length_group_size != "auto":
            return self.length_group_size
        import torch

        return AUTO_LENGTH_GROUP["cuda" if torch.cuda.is_available() else "cpu"]

    def scaled_lr(self) -> float:
        """The base LR actually used: ``lr``, or ``lr × batch_size / lr_reference_batch``."""
        return self.lr * self.batch_size / self.lr_reference_batch if self.lr_reference_batch else self.lr


def _builtin_names() -> list[str]:
    from clsr.data.faq import FAQ_TASKS
    from clsr.data.sts import STS_TASKS
    from clsr.data.tasks import TASK_GROUPS
    from clsr.data.transfer import TRANSFER_TASKS

    return [*TASK_GROUPS, "faq", *STS_TASKS, *TRANSFER_TASKS, *FAQ_TASKS]


class EvalConfig(Section):
    dev_tasks: list[Literal["stsb", "sickr", "faq"]] = Field(
        default_factory=lambda: ["stsb"],
        description="dev splits scored every eval_steps; faq: MAP of the dev queries of the FAQ set and "
        "fold trained on (data.train faq:<set>), as RCL selects its FAQ models",
    )
    select_on: Literal["stsb", "sickr", "faq"] = Field(
        "stsb", description="dev task that picks the best checkpoint"
    )

    @model_validator(mode="after")
    def _select_on_scored(self) -> EvalConfig:
        if self.dev_tasks and self.select_on not in self.dev_tasks:
            raise ValueError(f"select_on {self.select_on!r} must be one of dev_tasks {self.dev_tasks}")
        return self

    tasks: list[str] = Field(
        default_factory=lambda: ["sts"],
        description="final test evaluation: groups 'sts'/'transfer'/'faq', task names "
        "(sts12…sickr, mr…mrpc, stackfaq/faqir/cough) or names of eval.custom tasks",
    )
    custom: dict[str, CustomTask] = Field(
        default_factory=dict,
        description="your own evaluation sets by name (type sts, retrieval or classification; "
        "clsr.eval.custom), scored when eval.tasks names them",
    )
    transfer_mode: Literal["test", "fast"] = Field(
        "test",
        description="transfer tasks: 'test' = SentEval's 10-fold protocol, 'fast' = SimCSE's 'fasttest' "
        "(5 folds, RMSprop classifier)",
    )
    transfer_classifier: Literal["senteval_pytorch", "liblinear", "lbfgs"] = Field(
        "senteval_pytorch",
        description="transfer tasks: SentEval's PyTorch logistic regression (default: the setting SimCSE "
        "reports, released code), its scikit-learn liblinear path, or L-BFGS (our choice, fastest)",
    )
    transfer_device: Literal["cpu", "auto"] = Field(
        "cpu",
        description="transfer tasks, senteval_pytorch: where its classifier fits run. 'cpu': one thread "
        "each over the trial's CPUs (the same scores on any machine); 'auto': the trial's GPU when it "
        "has one, as SentEval ran them, the fits of a stack one kernel per step (float rounding differs "
        "from the CPU's)",
    )
    transfer_max_examples: int | None = Field(
        None,
        ge=1,
        le=MAX_ROWS,
        description="transfer tasks: seeded stratified cap on every split (smoke runs)",
    )
    sts_max_pairs: int | None = Field(
        None,
        ge=10,
        le=MAX_ROWS,
        description="STS and SICK-R, dev and test, and the STS-B dev pairs of alignment/uniformity: "
        "seeded cap on each split's pairs, every subset in proportion (smoke runs; not comparable with "
        "the papers)",
    )
    faq_max_queries: int | None = Field(
        None,
        ge=1,
        le=MAX_ROWS,
        description="FAQ retrieval, dev and test: seeded subsample of the queries (smoke runs)",
    )
    faq_max_items: int | None = Field(
        None,
        ge=1,
        le=MAX_ROWS,
        description="FAQ retrieval, dev and test: seeded subset of the collection, relevant items kept "
        "(smoke runs)",
    )
    truncate_dims: list[Annotated[int, Field(ge=1)]] = Field(
        default_factory=list,
        description="final STS test: also score the first d coordinates of the embedding for each d "
        "(metrics <metric>_dim<d>, e.g. test_sts_avg_dim64): Matryoshka representations; a d at or above "
        "the embedding's size scores all of it",
    )
    batch_size: int = Field(128, ge=1, le=MAX_BATCH)
    alignment_uniformity: bool = Field(True, description="Wang & Isola metrics on STS-B dev")
    log_model: bool = Field(
        True,
        description="log the best model to the trial's MLflow run as 'model/' (sentence-transformers "
        "format for transformer encoders) so users can load it without clsr",
    )

    @model_validator(mode="after")
    def _known_tasks(self) -> EvalConfig:
        from clsr.data.tasks import split_eval_tasks

        for name in self.custom:
            check_name(name)
        split_eval_tasks(self.builtin_tasks())  # raises with the allowed names
        if clash := sorted(set(self.custom) & set(_builtin_names())):
            raise ValueError(f"eval.custom: {clash} are built-in task names; rename the custom task(s)")
        return self

    def builtin_tasks(self) -> list[str]:
        return [t for t in self.tasks if t not in self.custom]

    def custom_tasks(self) -> dict[str, CustomTask]:
        """The custom tasks eval.tasks names, in its order."""
        return {t: self.custom[t] for t in self.tasks if t in self.custom}


class TrialConfig(Section):
    """Everything one trial needs. ``method`` holds ``name`` plus the method's own hyperparameters."""

    model: AnyModelConfig = Field(default_factory=ModelConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    method: dict[str, Any]
    eval: EvalConfig = Field(default_factory=EvalConfig)

    @field_validator("model", mode="before")
    @classmethod
    def _known_model_type(cls, model: Any) -> Any:
        kind = model.get("type", "transformer") if isinstance(model, dict) else "transformer"
        if kind not in MODEL_TYPES:
            raise ValueError(f"model.type must be one of {', '.join(MODEL_TYPES)} (given: {kind!r})")
        return model

    @field_validator("method")
    @classmethod
    def _method_section(cls, method: dict[str, Any]) -> dict[str, Any]:
        """Validate the hyperparameters with the method's own Config class and fill its defaults."""
        from clsr.config.methods import BUILT_IN, get_method
        from clsr.suggest import closest

        name = method.get("name", "")
        cls = get_method(name)
        config = cls.Config
        for key in method:
            if key not in config.model_fields:
                allowed = sorted(config.model_fields)
                of = "" if name in BUILT_IN else f" of {cls.__name__}.Config ({name.rpartition(':')[0]})"
                raise ValueError(f"unknown key {key!r}{of}{closest(key, allowed)}")
        return config(**method).model_dump()

    @model_validator(mode="after")
    def _packed_rows_are_not_compiled(self) -> TrialConfig:
        attention = getattr(self.model, "attention", None)
        if self.trainer.compile and attention == "auto":
            self.model.attention = None  # compiled shapes stay fixed: padded rows
            return self
        if self.trainer.compile and attention in ("flash_attention_2", "sdpa_packed"):
            raise ValueError(
                f"trainer.compile: true does not combine with model.attention {attention} (packed rows "
                "change shape every step); set trainer.compile: false, or use sdpa"
            )
        return self

    @model_validator(mode="after")
    def _gradcache_fits_method(self) -> TrialConfig:
        """Refuse GradCache when the study is validated, not when the trial starts."""
        from clsr.config.methods import get_method

        chunk = self.trainer.gradcache_chunk_rows
        method = get_method(self.method["name"])
        if chunk is not None and not method.gradcache_supported():
            raise ValueError(
                f"trainer.gradcache_chunk_rows={chunk}: method {method.name!r} has no in-batch-negative "
                f"loss over one encoder pass, so GradCache does not apply; unset it for this method"
            )
        return self

    @model_validator(mode="after")
    def _method_takes_the_trial(self) -> TrialConfig:
        """What a method cannot train as written (``Method.trial_problems``): said for every resolved trial."""
        from clsr.config.methods import get_method

        method = get_method(self.method["name"])
        if problems := method(method.Config(**self.method)).trial_problems(self):
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _deterministic_can_be(self) -> TrialConfig:
        from clsr.config.determinism import nondeterministic_settings
        from clsr.data.external import looks_like_path

        if not self.trainer.deterministic:
            return self
        t, data = self.trainer, self.data
        hub = data.train if data.external() and not looks_like_path(data.train) else None  # owner/name
        if problems := nondeterministic_settings(t.compile_mode if t.compile else None, hub, data.revision):
            raise ValueError("; ".join(problems))
        return self

    @model_validator(mode="after")
    def _data_has_method_columns(self) -> TrialConfig:
        """The catalogue set has every column the method encodes: said now, not when the trial loads it."""
        from clsr.config.methods import get_method
        from clsr.data.catalog import DATASETS

        method, spec = get_method(self.method["name"]), DATASETS.get(self.data.train)
        faq = self.data.faq_set() is not None  # an FAQ fold's rows are (query, relevant item) pairs
        if (spec is None and not faq) or method.encoder_type != "transformer":
            return self
        columns = ("anchor", "positive") if faq else spec.columns
        needed = method(method.Config(**self.method)).required_columns()
        if missing := [c for c in needed if c not in columns]:
            fits = [name for name, s in DATASETS.items() if set(needed) <= set(s.columns)]
            raise ValueError(
                f"data.train: {self.data.train!r} lacks columns {missing} that method {method.name!r} needs "
                f"with these settings (allowed: {', '.join(fits) or 'none of the catalogue sets'}"
                f"{'; for an FAQ set, method.hard_negatives: false' if faq else ''})"
            )
        return self

    @model_validator(mode="after")
    def _evaluation_only_needs_a_pretrained_encoder(self) -> TrialConfig:
        """``max_steps: 0`` scores the starting model; a word-vector TextCNN starts from random filters."""
        from clsr.config.methods import get_method

        method = get_method(self.method["name"])
        if self.trainer.max_steps == 0 and method.encoder_type != "transformer":
            raise ValueError(
                f"trainer.max_steps: 0 (evaluation only) scores a pretrained starting model; method "
                f"{method.name!r} trains a {method.encoder_type} encoder from random weights: set "
                f"trainer.max_steps >= 1"
            )
        return self

    @model_validator(mode="after")
    def _faq_dev_needs_faq_training(self) -> TrialConfig:
        if "faq" in self.eval.dev_tasks and self.data.faq_set() is None:
            raise ValueError(
                "eval.dev_tasks 'faq' scores the dev queries of data.train: faq:<set>; train on one"
            )
        return self

    @model_validator(mode="after")
    def _compile_needs_a_transformer(self) -> TrialConfig:
        if self.trainer.compile and self.model.type != "transformer":
            raise ValueError(
                f"trainer.compile applies to transformer encoders; model.type is {self.model.type!r}: "
                f"set trainer.compile: false"
            )
        return self

    @model_validator(mode="before")
    @classmethod
    def _encoder_fits_method(cls, doc: Any) -> Any:
        """A method trains one kind of encoder; say so before the model section's own field errors."""
        from clsr.config.methods import METHODS

        if not isinstance(doc, dict) or not isinstance(doc.get("method"), dict):
            return doc
        method = METHODS.get(doc["method"].get("name"))
        model = doc.get("model") if isinstance(doc.get("model"), dict) else {}
        kind = model.get("type", "transformer")
        if method is not None and kind in MODEL_TYPES and kind != method.encoder_type:
            raise ValueError(
                f"method {method.name!r} trains a {method.encoder_type} encoder: set model.type: "
                f"{method.encoder_type} (given: {kind})"
            )
        return doc
