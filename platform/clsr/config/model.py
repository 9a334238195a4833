"""The ``model`` section of a trial, for either encoder: which model, how it pools, how long its inputs
are. Plain pydantic: no torch here, so reading and checking a study's sections does not import it."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

PoolingName = Literal[
    "cls", "cls_before_pooler", "avg", "mean", "avg_first_last", "avg_first_last_emb", "avg_top2"
]
POOLINGS: tuple[str, ...] = PoolingName.__args__
PACKED_ATTENTION = ("flash_attention_2", "sdpa_packed")  # kernels that take packed rows
PAPER_REGION_SIZES = [1, 1, 1, 6, 15, 20]
CODE_REGION_SIZES = [1, 1, 1, 6, 10, 15]


class ModelConfig(BaseModel):
    """The ``model`` section of a trial: which encoder, how it pools, how long its inputs are."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["transformer"] = "transformer"
    name: str = Field(
        "bert-base-uncased", description="hub id, local folder, or a short name such as 'minilm'"
    )
    pooling: PoolingName | Literal["auto"] = Field(
        "cls",
        description="how token vectors become one sentence vector; auto: a sentence-transformers model's "
        "own Pooling (cls → cls_before_pooler, mean → avg; its Normalize does not change cosine), "
        "resolved when the study is validated and recorded as the value it resolved to",
    )
    mlp_only_train: bool = False
    max_seq_length: int = Field(32, ge=4, le=8192)
    dropout: float | None = Field(None, ge=0.0, lt=1.0, description="override hidden+attention dropout")
    attention_dropout: float | None = Field(
        None, description="override the attention-probability dropout only (applied after `dropout`)"
    )
    drophead: float | None = Field(
        None, description="DropHead (Zhou et al. 2020): drop whole attention heads in training, p per head"
    )
    attention: Literal["auto", "sdpa", "eager", "flash_attention_2", "sdpa_packed"] | None = Field(
        "auto",
        description="attention kernel. auto: on a CPU, sdpa_packed for BERT and RoBERTa encoders (MiniLM "
        "is one) unless drophead or trainer.compile is set, else transformers' default; chosen where the "
        "model loads (`study validate` says which). sdpa: PyTorch's scaled_dot_product_attention; eager: "
        "the plain matmul-softmax; flash_attention_2: FlashAttention-2 (CUDA GPUs with the flash-attn "
        "package); sdpa_packed: sdpa on packed rows (any device). The last two pack a forward pass's "
        "sentences into one row without padding (position ids per sentence), so only attention sees "
        "padding (sdpa_packed) or none does (flash_attention_2). None: transformers' default for the "
        "model (one padded sdpa pass where supported). On CPUs sdpa_packed is the faster "
        "(docs/performance.md)",
    )
    init_checkpoint: str | None = Field(
        None,
        description="start from the weights of a trainer checkpoint folder (local or s3://) of a model "
        "with this name and pooling, e.g. filled by needs from an upstream trial (RCL's FAQ entropy "
        "models start from the fold's Eq. 1 model); None: the pretrained model.name",
    )
    init_weights: Literal["best", "last"] = Field(
        "best", description="which weights of init_checkpoint: best (best dev score) or last"
    )

    @model_validator(mode="after")
    def _own_pooling(self) -> ModelConfig:
        if self.pooling == "auto":  # only read on request: the model's small module files, never weights
            from clsr.data.hub.st_modules import NotSentenceTransformers, own_pooling

            try:
                self.pooling = own_pooling(self.name)
            except NotSentenceTransformers as err:
                raise ValueError(f"model.pooling auto: {err}") from None
        return self

    @model_validator(mode="after")
    def _packing_has_no_drophead(self) -> ModelConfig:
        if self.attention == "auto" and self.drophead:
            self.attention = None  # DropHead draws its heads per row: one padded pass
        if self.attention in PACKED_ATTENTION and self.drophead:
            raise ValueError(
                f"model.drophead does not combine with model.attention {self.attention}: its sentences "
                "are packed into one row, and DropHead draws its heads per row; use sdpa with drophead"
            )
        return self

    @field_validator("attention_dropout", "drophead")
    @classmethod
    def _probability(cls, value: float | None, info: ValidationInfo) -> float | None:
        if value is not None and not 0.0 <= value < 1.0:
            raise ValueError(f"model.{info.field_name} is a probability in [0, 1) (given: {value})")
        return value


class TextCNNConfig(BaseModel):
    """The ``model`` section when ``type: textcnn``."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    type: Literal["textcnn"] = "textcnn"
    vectors: str = Field(
        "word2vec-google-news-300",
        description="named vectors, a word2vec/GloVe file, or a transformer whose input embeddings to use",
    )
    vectors_format: Literal["auto", "word2vec_bin", "word2vec_text", "glove", "transformer"] = "auto"
    tokenization: Literal["auto", "words", "wordpiece"] = Field(
        "auto", description="auto: wordpiece for transformer vectors, else the GCLSR code's word rule"
    )
    max_words: int = Field(
        64, ge=1, le=100_000, description="sentences are truncated / padded to this many words"
    )
    freeze_vectors: bool = Field(True, description="the paper looks vectors up and never trains them")
    oov: Literal["redraw", "fixed"] = Field(
        "redraw", description="redraw: a fresh U(±√(3/d)) vector per call (code); fixed: one per word"
    )
    region_sizes: list[int] = Field(default_factory=lambda: list(PAPER_REGION_SIZES), min_length=1)
    filters: int = Field(300, ge=1, le=100_000, description="filters per region size (paper 300, code 640)")

    @model_validator(mode="after")
    def _regions_fit(self) -> TextCNNConfig:
        if min(self.region_sizes) < 1:
            raise ValueError(f"region sizes must be >= 1 (given: {self.region_sizes})")
        if max(self.region_sizes) > self.max_words:
            raise ValueError(
                f"region size {max(self.region_sizes)} exceeds max_words {self.max_words}; raise max_words"
            )
        return self
