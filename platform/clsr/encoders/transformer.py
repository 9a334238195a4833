"""A Hugging Face transformer plus a pooler: the encoder every transformer-based method trains."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from clsr.config.model import PACKED_ATTENTION, ModelConfig
from clsr.data.hub.model_registry import describe_load_failure, resolve_model_path
from clsr.encoders.dropout_masks import use_uniform_dropout
from clsr.encoders.packing import attention_plan, register_sdpa_packed
from clsr.encoders.pooling import Pooler

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# Config attributes that hold dropout rates in the common architectures (BERT, RoBERTa, MPNet, DistilBERT).
_DROPOUT_ATTRS = ("hidden_dropout_prob", "attention_probs_dropout_prob", "dropout", "attention_dropout")
# trainer.compile: sequence widths are padded up to a multiple of this (shape buckets, few recompiles)
COMPILE_WIDTH_MULTIPLE = 8
# The subset that holds the attention-probability dropout (BERT/RoBERTa/MPNet, DistilBERT).
_ATTENTION_DROPOUT_ATTRS = ("attention_probs_dropout_prob", "attention_dropout")


def load_tokenizer(name: str) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer  # here: validating a study (the driver) never loads a model

    path = resolve_model_path(name)
    try:
        return AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise describe_load_failure(name, err) from err


def check_flash_attention() -> None:
    """FlashAttention-2 runs on CUDA GPUs with the ``flash-attn`` package only: say so before loading."""
    import importlib.util

    if not torch.cuda.is_available():
        raise ValueError(
            "model.attention flash_attention_2 needs a CUDA GPU, and this trial runs on the CPU; use "
            "sdpa (PyTorch's fused attention) here, or give the study GPUs (resources.gpus_per_worker: 1)"
        )
    if importlib.util.find_spec("flash_attn") is None:
        raise ValueError(
            "model.attention flash_attention_2 needs the flash-attn package (pip install flash-attn "
            "--no-build-isolation, built for this torch and CUDA); or use sdpa"
        )


def choose_attention(attention: str | None, model_type: str | None, on_gpu: bool) -> str | None:
    """``auto``: packed rows with ``sdpa_packed`` on a CPU for the encoders packing knows (measured
    faster there: docs/performance.md), else transformers' default (one padded SDPA pass where the
    model supports it). Drophead and compile have turned ``auto`` into None before this."""
    if attention != "auto":
        return attention
    return "sdpa_packed" if not on_gpu and model_type in PACKABLE_MODEL_TYPES else None


def _load_backbone(
    name: str, dropout: float | None, attention_dropout: float | None = None, attention: str | None = None
) -> tuple[nn.Module, str | None]:
    """The pretrained backbone with the attention kernel asked for (``auto`` chosen here, where the
    model's type and the process's device are known); returns it and the kernel it runs."""
    from transformers import AutoConfig, AutoModel
    from transformers.utils import logging as hf_logging

    path = resolve_model_path(name)
    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise describe_load_failure(name, err) from err
    if dropout is not None:
        for attr in _DROPOUT_ATTRS:
            if hasattr(config, attr):
                setattr(config, attr, dropout)
    if attention_dropout is not None:
        attrs = [attr for attr in _ATTENTION_DROPOUT_ATTRS if hasattr(config, attr)]
        if not attrs:
            raise ValueError(
                f"model.attention_dropout: the config of {name!r} ({type(config).__name__}) has none of "
                f"{_ATTENTION_DROPOUT_ATTRS}; leave attention_dropout unset for this model"
            )
        for attr in attrs:
            setattr(config, attr, attention_dropout)
    attention = choose_attention(attention, getattr(config, "model_type", None), torch.cuda.is_available())
    kwargs: dict[str, Any] = {"config": config}
    if attention == "flash_attention_2":
        check_flash_attention()
    if attention is not None:
        kwargs["attn_implementation"] = register_sdpa_packed() if attention == "sdpa_packed" else attention
    hf_logging.set_verbosity_error()  # the load report lists BERT's unused pretrained pooler: expected
    hf_logging.disable_progress_bar()
    # BERT's pretrained pooler is never used (SimCSE adds its own MLP); leaving it out keeps DDP from
    # complaining about parameters without gradients.
    try:
        return AutoModel.from_pretrained(path, add_pooling_layer=False, **kwargs), attention
    except TypeError:
        return AutoModel.from_pretrained(path, **kwargs), attention


class DropHead:
    """DropHead (Zhou et al., 2020) as a forward hook: in training, each attention head of each sequence
    is dropped with probability ``p`` and the kept heads are rescaled by ``heads / kept`` (the paper's
    rescaling), so the per-sequence sum of head scales stays ``heads``. A draw that drops every head
    keeps them all, unscaled: each head's expected scale is then exactly 1. Off in eval mode.

    The hook sees the concatenated per-head context ``(..., heads · head_dim)`` before the output
    projection: the output of a BERT-family ``*SelfAttention`` module, or the input of the projection
    inside MPNet's / DistilBERT's attention (``o`` / ``out_lin``).
    """

    def __init__(self, p: float, heads: int):
        self.p, self.heads = p, heads

    def mask(self, leading: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """Scales of shape ``(*leading, heads)``: 0 for a dropped head, ``heads / kept`` for a kept one."""
        keep = torch.rand(*leading, self.heads, device=device) >= self.p
        keep |= ~keep.any(-1, keepdim=True)  # every head dropped: keep them all instead
        return (keep * (self.heads / keep.sum(-1, keepdim=True))).to(dtype)

    def apply(self, context: torch.Tensor) -> torch.Tensor:
        """``context``: ``(batch, seq, heads · head_dim)``; one draw per sequence and head."""
        scales = self.mask((context.size(0),), context.device, context.dtype)
        per_head = context.unflatten(-1, (self.heads, -1))
        return (per_head * scales[:, None, :, None]).flatten(-2)

    def output_hook(self, module: nn.Module, args: Any, output: Any) -> Any:
        if not module.training or self.p == 0:
            return output
        if isinstance(output, tuple):
            return (self.apply(output[0]), *output[1:])
        return self.apply(output)

    def input_hook(self, module: nn.Module, args: tuple) -> Any:
        if not module.training or self.p == 0:
            return None
        return (self.apply(args[0]), *args[1:])


def add_drophead(backbone: nn.Module, p: float) -> list[Any]:
    """Hook DropHead into every self-attention layer of ``backbone``; returns the hook handles."""
    handles = []
    for module in backbone.modules():
        if not type(module).__name__.endswith("SelfAttention"):
            continue
        heads = getattr(module, "num_attention_heads", None) or getattr(module, "n_heads", None)
        if heads is None:
            continue
        drop = DropHead(p, heads)
        projection = next((getattr(module, n) for n in ("o", "out_lin") if hasattr(module, n)), None)
        if projection is not None:  # MPNet, DistilBERT: the output projection sits inside the module
            handles.append(projection.register_forward_pre_hook(drop.input_hook))
        else:  # BERT family: the module returns the concatenated heads, projected by the next module
            handles.append(module.register_forward_hook(drop.output_hook))
    if not handles:
        raise ValueError(
            f"model.drophead: no self-attention layers found in {type(backbone).__name__}; "
            f"DropHead supports BERT-family, MPNet and DistilBERT encoders"
        )
    return handles


class TransformerEncoder(nn.Module):
    """``forward(input_ids, attention_mask) -> (batch, dim)`` sentence embeddings."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.backbone, self.attention = _load_backbone(
            cfg.name, cfg.dropout, cfg.attention_dropout, cfg.attention
        )
        if cfg.drophead:
            add_drophead(self.backbone, cfg.drophead)
        use_uniform_dropout(self.backbone)  # the same dropout, its CPU masks drawn faster
        hidden = self.backbone.config.hidden_size
        init_std = getattr(self.backbone.config, "initializer_range", 0.02)
        self.pooler = Pooler(cfg.pooling, hidden, mlp_only_train=cfg.mlp_only_train, init_std=init_std)
        self._compiled: Callable[..., Any] | None = None  # set by compile_for_training
        # the sentences packed into one row for a variable-length attention kernel (clsr.encoders.packing)
        self.packed = self.attention in PACKED_ATTENTION
        self.first_position = (
            first_position(self.backbone.config, self.attention, cfg.name) if self.packed else 0
        )
        # FlashAttention's varlen kernel takes the longest sentence (a host sync per forward pass);
        # sdpa_packed's buckets size themselves
        self.pass_longest = self.attention == "flash_attention_2"

    def compile_for_training(
        self, mode: str = "default", width_multiple: int = COMPILE_WIDTH_MULTIPLE
    ) -> None:
        """``torch.compile`` the backbone for training steps. Widths are padded up to a multiple of
        ``width_multiple`` (shape buckets) and shapes are static, so each (rows, width) bucket compiles
        once instead of every step. Evaluation (eval mode: any width up to 512) runs the plain backbone,
        and the state dict keeps its keys (the compiled wrapper is not a submodule)."""
        import torch._dynamo

        # buckets: ceil(max_seq_length / width_multiple) widths × a few group sizes per run
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        self._width_multiple = width_multiple
        object.__setattr__(self, "_compiled", torch.compile(self.backbone, mode=mode, dynamic=False))

    @property
    def dim(self) -> int:
        return self.backbone.config.hidden_size

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, length_group_size: int | None = None
    ) -> torch.Tensor:
        """Pooled embeddings; with ``length_group_size`` the sentences are encoded in groups of that many
        of similar length, each cut to its own longest sentence (same embeddings, less padding)."""
        if self.packed:  # no padding to group away
            return self.encode_packed(input_ids, attention_mask)
        if not length_group_size or input_ids.size(0) <= length_group_size:
            return self.encode(input_ids, attention_mask)
        return encode_in_length_groups(self.encode, input_ids, attention_mask, length_group_size)

    def encode(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        backbone = self.backbone
        if self._compiled is not None and self.training:
            backbone = self._compiled
            extra = -input_ids.size(1) % self._width_multiple
            if extra:  # the next shape bucket: padding id 0 under a zero mask changes nothing
                input_ids = nn.functional.pad(input_ids, (0, extra))
                attention_mask = nn.functional.pad(attention_mask, (0, extra))
        out = backbone(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_hidden_states=self.pooler.needs_all_layers,
        )
        hidden_states = out.hidden_states if self.pooler.needs_all_layers else (out.last_hidden_state,)
        return self.pooler(hidden_states, attention_mask)

    def encode_packed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The batch's real tokens as one row, without padding: each sentence's position ids start at 0,
        and its cumulative lengths (``cu_seq_lens``) keep attention inside it in FlashAttention-2's
        variable-length kernel or in ``sdpa_packed`` (transformers' padding-free path). The hidden
        states are put back into the padded layout for pooling, so the embeddings equal the padded
        pass's (tested)."""
        real = attention_mask.bool()
        lengths = real.sum(dim=1)
        starts = nn.functional.pad(lengths.cumsum(0), (1, 0))
        cu_seq_lens = starts.to(torch.int32)
        flat = input_ids[real].unsqueeze(0)  # row after row, each sentence's tokens in order
        # each sentence's positions from its model's first (RoBERTa's: after the padding id)
        offsets = starts[:-1].repeat_interleave(lengths, output_size=flat.size(1)) - self.first_position
        positions = torch.arange(flat.size(1), device=flat.device) - offsets
        passed: dict[str, Any] = {}
        if self.attention == "sdpa_packed":  # one plan for every layer of this forward pass
            passed["attention_plan_"] = attention_plan(cu_seq_lens)
        if self.pass_longest:
            longest = int(lengths.max())
            passed.update(max_length_q=longest, max_length_k=longest)
        out = self.backbone(
            input_ids=flat,
            position_ids=positions.unsqueeze(0),
            cu_seq_lens_q=cu_seq_lens,
            cu_seq_lens_k=cu_seq_lens,
            output_hidden_states=self.pooler.needs_all_layers,
            **passed,
        )
        packed = out.hidden_states if self.pooler.needs_all_layers else (out.last_hidden_state,)
        return self.pooler(tuple(unpack(h, real) for h in packed), attention_mask)


# model types whose absolute position ids are known: BERT's start at 0, RoBERTa's after the padding id
# (transformers numbers padded positions from ``padding_idx + 1``)
PACKABLE_MODEL_TYPES = {"bert": False, "roberta": True, "xlm-roberta": True}


def first_position(config: Any, attention: str | None, name: str) -> int:
    """The position id of a sentence's first token in the padded path, which packing must reproduce;
    other model types (relative position biases, rotary embeddings) are refused."""
    model_type = getattr(config, "model_type", None)
    if model_type not in PACKABLE_MODEL_TYPES:
        raise ValueError(
            f"model.attention {attention} packs sentences for {', '.join(PACKABLE_MODEL_TYPES)} "
            f"encoders; {name!r} is a {model_type!r} model: use sdpa"
        )
    return config.pad_token_id + 1 if PACKABLE_MODEL_TYPES[model_type] else 0


def unpack(packed: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """``(1, tokens, dim)`` hidden states back to ``(rows, width, dim)``, zeros at the padding."""
    padded = packed.new_zeros(*real.shape, packed.size(-1))
    padded[real] = packed[0]
    return padded


def encode_in_length_groups(
    encode: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    group_size: int,
) -> torch.Tensor:
    """``encode`` the rows sorted by length, ``group_size`` at a time, each group cut to the last real
    token of its longest row; the pooled rows come back in input order.

    A forward pass of SimCSE-sup triplets padded to its longest sentence is about half padding (NLI
    premises are ~2× longer than hypotheses); groups of similar length cut that to ~10 %, and every
    layer's cost with it. Cutting at the last real token (not the count of real tokens) keeps this exact
    whichever side the padding is on.
    """
    positions = torch.arange(1, attention_mask.size(1) + 1, device=attention_mask.device)
    extent = (attention_mask * positions).amax(dim=1)  # index of the last real token + 1
    order = torch.argsort(extent, stable=True)
    sorted_extent = extent[order].tolist()  # one host sync per forward pass
    pooled = []
    for start in range(0, len(sorted_extent), group_size):
        rows = order[start : start + group_size]
        width = max(sorted_extent[min(start + group_size, len(sorted_extent)) - 1], 1)
        pooled.append(encode(input_ids[rows, :width], attention_mask[rows, :width]))
    return torch.cat(pooled)[torch.argsort(order)]
