"""What a model costs to run: :class:`ModelSpec`.

A ``ModelSpec`` holds exactly what the floors need — how many parameters do
arithmetic for each token, how many bytes of weights one decode step reads, and
the attention shape that sizes the KV cache — and nothing else::

    from perfsdk.model import ModelSpec

    spec = ModelSpec.named("llama-3-8b")                          # known table, bf16
    spec = ModelSpec.from_hf_config(hf_config, dtype="bfloat16")  # a transformers config or its dict
    spec = ModelSpec.from_module(model, layers=32, heads=32, kv_heads=8, head_dim=128)  # count a torch module
    spec = ModelSpec.from_params(7e9, bytes_per_param=2)          # only a size: decode floor without KV

    spec.kv_bytes_per_token     # 131_072 for Llama-3-8B in BF16
    spec.with_tp(4)             # the share of one GPU of four, tensor-parallel

Conventions (they are what the seeds and the MBU literature use):

* ``weight_bytes`` counts *every* stored weight, embedding table included (the
  model's size). What a step *reads* is every weight once **except an untied
  input embedding**, of which it reads one row per token it looks up (one per
  sequence in a decode step): ``embedding_bytes`` is that table (0 when tied —
  the LM head then reads the table whole, and it counts once), and
  ``embedding_row_bytes`` one row. :attr:`step_weight_bytes` is the rest. For
  Llama-3-8B the input table is 1.05 GB of 16.06 GB: counting it whole would
  overstate a decode step's bytes, and MBU, by 7 %. The seeds round a step to
  ``params × bytes``; :mod:`perfsdk.budget` says which convention it uses.
* ``params`` (for FLOPs, 2 per parameter per token) leaves out an *untied*
  input embedding, because a lookup does no arithmetic; a tied embedding is
  also the LM head and counts once.
* Mixture of experts: ``params`` and ``weight_bytes`` count the *active*
  parameters (shared weights plus ``num_experts_per_tok`` experts per layer).
  FLOPs are then exact; bytes are exact at batch 1 and a lower bound at larger
  batches, where different tokens pick different experts (``total_params``
  keeps the full count).
* Tensor parallelism: :meth:`with_tp` gives per-GPU figures — weights and
  FLOPs divide by the TP size, KV heads divide too (replicated when there are
  fewer KV heads than GPUs); an untied input embedding is split by vocabulary
  (vLLM's ``VocabParallelEmbedding``), so its table and, on average, its rows
  divide too.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from perfsdk.dtypes import dtype_bytes, quantized_weight_dtype
from perfsdk.errors import ConfigError, UnknownModelError, suggest
from perfsdk.model_table import KNOWN_MODELS, MODEL_ALIASES

__all__ = ["KNOWN_MODELS", "ModelSpec", "dtype_bytes", "quantized_weight_dtype"]


def _positive(field: str, value: float | None, *, integer: bool = False) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{field}: expected a number, got {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise ConfigError(f"{field}: must be a positive number, got {value!r}")
    if integer and int(value) != value:
        raise ConfigError(f"{field}: must be a whole number, got {value!r}")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """The sizes of a model that set its decode and prefill floors (see the module docstring)."""

    params: float
    """Parameters that do arithmetic for each token (FLOPs = 2 × params × tokens)."""
    weight_bytes: float
    """Bytes of weights read by one decode step (all GPUs together unless ``tp`` > 1 via :meth:`with_tp`)."""
    layers: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    kv_bytes: float = 2.0
    """Bytes per element of the KV cache (2 for bf16/fp16, 1 for fp8)."""
    tp: int = 1
    """Tensor-parallel size these figures are per GPU of (1: the whole model)."""
    name: str = ""
    dtype: str = "bfloat16"
    total_params: float | None = None
    """All parameters (differs from ``params`` for MoE and untied embeddings)."""
    embedding_bytes: float = 0.0
    """Bytes of the untied input-embedding tables within ``weight_bytes`` (0: tied, or not known). A step reads
    one row per token it looks up, not the table."""
    embedding_row_bytes: float = 0.0
    """Bytes one looked-up token reads from those tables."""

    def __post_init__(self) -> None:
        _positive("params", self.params)
        _positive("weight_bytes", self.weight_bytes)
        for f in ("embedding_bytes", "embedding_row_bytes"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
                raise ConfigError(f"{f}: must be a non-negative number, got {v!r}")
        if self.embedding_bytes >= self.weight_bytes:
            raise ConfigError(
                f"embedding_bytes: {self.embedding_bytes!r} must be less than weight_bytes "
                f"{self.weight_bytes!r} (the table is part of the weights)"
            )
        if self.embedding_row_bytes > self.embedding_bytes:
            raise ConfigError(
                f"embedding_row_bytes: a row ({self.embedding_row_bytes!r} B) cannot exceed its "
                f"table ({self.embedding_bytes!r} B)"
            )
        for f in ("layers", "heads", "kv_heads", "head_dim", "tp"):
            _positive(f, getattr(self, f), integer=True)
        _positive("kv_bytes", self.kv_bytes)
        _positive("total_params", self.total_params)
        if self.heads is not None and self.kv_heads is not None and self.heads % self.kv_heads:
            raise ConfigError(
                f"kv_heads: {self.kv_heads} KV heads do not divide {self.heads} attention heads "
                "(grouped-query attention needs heads to be a multiple of kv_heads)"
            )

    # ---- construction -------------------------------------------------
    @classmethod
    def from_params(
        cls,
        params: float,
        bytes_per_param: float = 2.0,
        *,
        layers: int | None = None,
        heads: int | None = None,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        kv_bytes: float = 2.0,
        name: str = "",
    ) -> ModelSpec:
        """A dense model known by its parameter count: weights read = params × bytes per param."""
        _positive("params", params)
        _positive("bytes_per_param", bytes_per_param)
        return cls(
            params=float(params),
            weight_bytes=float(params) * bytes_per_param,
            layers=layers,
            heads=heads,
            kv_heads=kv_heads if kv_heads is not None else heads,
            head_dim=head_dim,
            kv_bytes=kv_bytes,
            name=name,
            dtype=_dtype_for_bytes(bytes_per_param),
            total_params=float(params),
        )

    @classmethod
    def named(cls, name: str, dtype: str = "bfloat16", *, kv_dtype: str | None = None) -> ModelSpec:
        """A model from :data:`KNOWN_MODELS` (``"llama-3-8b"``, ``"mistral-7b"``, …)."""
        key = name.strip().lower().replace("_", "-").replace(" ", "-")
        key = MODEL_ALIASES.get(key, key)
        if key not in KNOWN_MODELS:
            raise UnknownModelError(
                f"model: unknown model {name!r}.{suggest(key, KNOWN_MODELS)} Known: {', '.join(sorted(KNOWN_MODELS))}. "
                "Or pass the sizes: ModelSpec.from_hf_config(config) / --params --layers --kv-heads --head-dim."
            )
        spec = cls.from_hf_config(KNOWN_MODELS[key], dtype=dtype, kv_dtype=kv_dtype)
        return dataclasses.replace(spec, name=key)

    @classmethod
    def from_hf_config(
        cls, config: Mapping[str, Any] | Any, dtype: str | None = None, *, kv_dtype: str | None = None
    ) -> ModelSpec:
        """Sizes from a Hugging Face config (a ``transformers`` config object or its ``to_dict()``).

        Handles Llama, Mistral, Qwen2/Qwen3, Gemma/Gemma2 and GPT-NeoX layouts, and the Mixtral and
        Qwen-MoE mixture-of-experts layouts (active parameters; see the module docstring). ``dtype``
        defaults to the stored weights' dtype: the quantized one its ``quantization_config`` describes
        (:func:`quantized_weight_dtype`), else its ``torch_dtype`` (or ``dtype``), else bfloat16;
        ``kv_dtype`` to the unquantized dtype.
        """
        cfg = _as_dict(config)
        text_cfg = cfg.get("text_config")
        if isinstance(text_cfg, Mapping) and "hidden_size" not in cfg:
            cfg = {**cfg, **text_cfg}  # multimodal wrappers keep the language model's sizes here
        model_type = str(cfg.get("model_type", "llama"))

        def need(*keys: str) -> Any:
            for k in keys:
                if cfg.get(k) is not None:
                    return cfg[k]
            raise ConfigError(
                f"HF config ({model_type}) is missing the field {keys[0]!r}"
                + (f" (or {', '.join(repr(k) for k in keys[1:])})" if len(keys) > 1 else "")
            )

        hidden = int(need("hidden_size", "d_model", "n_embd"))
        layers = int(need("num_hidden_layers", "n_layer", "num_layers"))
        heads = int(need("num_attention_heads", "n_head"))
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        vocab = int(need("vocab_size"))
        if cfg.get("head_dim") is not None:
            head_dim = int(cfg["head_dim"])
        else:
            if hidden % heads:
                raise ConfigError(
                    f"HF config: hidden_size {hidden} is not divisible by num_attention_heads {heads}; give head_dim"
                )
            head_dim = hidden // heads
        for f, v in (
            ("hidden_size", hidden),
            ("num_hidden_layers", layers),
            ("num_attention_heads", heads),
            ("num_key_value_heads", kv_heads),
            ("vocab_size", vocab),
            ("head_dim", head_dim),
        ):
            _positive(f"HF config {f}", v, integer=True)
        if heads % kv_heads:
            raise ConfigError(f"HF config: num_key_value_heads {kv_heads} does not divide num_attention_heads {heads}")

        q_out, kv_out = heads * head_dim, kv_heads * head_dim
        neox = model_type in ("gpt_neox", "gpt-neox")
        attn_bias = neox or bool(cfg.get("attention_bias")) or model_type in ("qwen2", "qwen2_moe")
        attn = hidden * q_out + 2 * hidden * kv_out + q_out * hidden
        if attn_bias:
            attn += q_out + 2 * kv_out + (hidden if neox else 0)

        inter = int(need("intermediate_size")) if not neox else int(cfg.get("intermediate_size") or 4 * hidden)
        # GPT-NeoX: two-matrix GELU MLP with biases; others gated (SwiGLU / GeGLU): gate, up, down
        dense_mlp = 2 * hidden * inter + inter + hidden if neox else 3 * hidden * inter
        norms_per_layer = 2 * hidden * (2 if neox else 1)  # LayerNorm has a bias, RMSNorm not
        if model_type.startswith(("gemma2", "gemma3")):
            norms_per_layer = 4 * hidden  # pre/post norms around attention and MLP

        experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts")
        active_mlp = total_mlp = dense_mlp
        if experts:
            k = int(need("num_experts_per_tok"))
            moe_inter = int(cfg.get("moe_intermediate_size") or inter)
            expert = 3 * hidden * moe_inter
            shared_inter = int(cfg.get("shared_expert_intermediate_size") or 0)
            shared = 3 * hidden * shared_inter + (hidden if shared_inter else 0)  # + shared-expert gate
            router = hidden * int(experts)
            total_mlp = int(experts) * expert + shared + router
            active_mlp = k * expert + shared + router

        per_layer_total = attn + total_mlp + norms_per_layer
        per_layer_active = attn + active_mlp + norms_per_layer
        tied = bool(cfg.get("tie_word_embeddings", not neox and model_type.startswith("gemma")))
        embed = vocab * hidden
        head = 0 if tied else vocab * hidden
        final_norm = hidden * (2 if neox else 1)
        total = layers * per_layer_total + embed + head + final_norm
        stored_active = layers * per_layer_active + embed + head + final_norm
        flops_params = stored_active - (0 if tied else embed)

        act = str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16").removeprefix("torch.")
        # a quantized checkpoint stores its weights narrower than it computes (every weight counted at the
        # quantized width: embeddings kept at 16 bits make this a slight underestimate)
        quant = quantized_weight_dtype(cfg.get("quantization_config")) if dtype is None else None
        dt = str(dtype or quant or act).removeprefix("torch.")
        wbytes = dtype_bytes(dt)
        kvb = dtype_bytes(kv_dtype) if kv_dtype else (dtype_bytes(act) if quant else wbytes)
        return cls(
            params=float(flops_params),
            weight_bytes=float(stored_active) * wbytes,
            layers=layers,
            heads=heads,
            kv_heads=kv_heads,
            head_dim=head_dim,
            kv_bytes=kvb,
            name=str(cfg.get("_name_or_path") or cfg.get("name") or model_type),
            dtype=dt,
            total_params=float(total),
            # untied: a step reads one row of the input table per token; tied: the LM head reads it whole
            embedding_bytes=0.0 if tied else float(embed) * wbytes,
            embedding_row_bytes=0.0 if tied else float(hidden) * wbytes,
        )

    @classmethod
    def from_module(
        cls,
        module: Any,
        *,
        layers: int | None = None,
        heads: int | None = None,
        kv_heads: int | None = None,
        head_dim: int | None = None,
        kv_bytes: float | None = None,
        name: str = "",
        exclude_embedding: bool = True,
    ) -> ModelSpec:
        """Count a torch module's parameters and their bytes (each tensor at its own dtype).

        Attention sizes are taken from the arguments, else from ``module.config`` when it has one (a
        ``transformers`` model). An ``nn.Embedding`` whose weight is not shared with another layer is
        left out of ``params`` (a lookup does no arithmetic) but kept in ``weight_bytes``.
        """
        seen: set[int] = set()
        total = nbytes = 0
        dtypes: dict[str, int] = {}
        for p in module.parameters():
            if id(p) in seen:
                continue
            seen.add(id(p))
            n = int(p.numel())
            total += n
            nbytes += n * int(p.element_size())
            dtypes[str(p.dtype)] = dtypes.get(str(p.dtype), 0) + n
        for b in module.buffers():  # quantised (int8/uint8-packed) weights often live in buffers
            if str(b.dtype) in ("torch.int8", "torch.uint8"):
                nbytes += int(b.numel()) * int(b.element_size())
        if total == 0:
            raise ConfigError("module: it has no parameters to count")
        lookup = 0
        table_bytes = row_bytes = 0
        shared_ids = _shared_weight_ids(module)
        for m in module.modules():
            if type(m).__name__ == "Embedding" and id(m.weight) not in shared_ids:
                w = m.weight
                if exclude_embedding:
                    lookup += int(w.numel())
                # a lookup reads one row per token (an untied table; a tied one is the LM head, read whole)
                table_bytes += int(w.numel()) * int(w.element_size())
                row_bytes += int(w.shape[-1]) * int(w.element_size())
        cfg = getattr(module, "config", None)
        if cfg is not None and layers is None:
            from_cfg = cls.from_hf_config(cfg)
            layers, heads = from_cfg.layers, from_cfg.heads
            kv_heads, head_dim = from_cfg.kv_heads, from_cfg.head_dim
        main_dtype = max(dtypes, key=lambda d: dtypes[d]).removeprefix("torch.")
        return cls(
            params=float(total - lookup),
            weight_bytes=float(nbytes),
            layers=layers,
            heads=heads,
            kv_heads=kv_heads if kv_heads is not None else heads,
            head_dim=head_dim,
            kv_bytes=kv_bytes if kv_bytes is not None else dtype_bytes(main_dtype),
            name=name or type(module).__name__,
            dtype=main_dtype,
            total_params=float(total),
            embedding_bytes=float(table_bytes) if table_bytes < nbytes else 0.0,
            embedding_row_bytes=float(row_bytes) if table_bytes < nbytes else 0.0,
        )

    # ---- derived ------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token occupies on one GPU: ``2 × layers × kv_heads × head_dim × kv_bytes``."""
        if self.layers is None or self.kv_heads is None or self.head_dim is None:
            raise ConfigError(
                f"model {self.name or '(unnamed)'}: the KV cache size needs layers, kv_heads and head_dim"
            )
        kv_heads_here = max(self.kv_heads // self.tp, 1)  # fewer KV heads than GPUs: replicated
        return 2.0 * self.layers * kv_heads_here * self.head_dim * self.kv_bytes

    @property
    def step_weight_bytes(self) -> float:
        """Weight bytes every step reads whole: :attr:`weight_bytes` less an untied input embedding's table
        (a step reads :attr:`embedding_row_bytes` per token of that instead)."""
        return self.weight_bytes - self.embedding_bytes

    @property
    def has_attention_shape(self) -> bool:
        return None not in (self.layers, self.heads, self.kv_heads, self.head_dim)

    def with_tp(self, tp: int) -> ModelSpec:
        """The per-GPU share of this model split over ``tp`` GPUs with tensor parallelism."""
        _positive("tp", tp, integer=True)
        if self.tp != 1:
            raise ConfigError(f"tp: this spec is already per GPU of tp={self.tp}")
        if self.heads is not None and self.heads % tp:
            raise ConfigError(f"tp: {tp} GPUs do not divide {self.heads} attention heads")
        return dataclasses.replace(
            self,
            params=self.params / tp,
            weight_bytes=self.weight_bytes / tp,
            tp=tp,
            embedding_bytes=self.embedding_bytes / tp,
            embedding_row_bytes=self.embedding_row_bytes / tp,
        )

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _dtype_for_bytes(b: float) -> str:
    return {4: "float32", 2: "bfloat16", 1: "int8", 0.5: "int4"}.get(b, f"{b}-byte")


def _as_dict(config: Mapping[str, Any] | Any) -> dict[str, Any]:
    if isinstance(config, Mapping):
        return dict(config)
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        d = to_dict()
        if isinstance(d, Mapping):
            return dict(d)
    if hasattr(config, "__dict__"):
        return dict(vars(config))
    raise ConfigError(f"HF config: expected a dict or a transformers config, got {type(config).__name__}")


def _shared_weight_ids(module: Any) -> set[int]:
    """Parameters that appear under more than one name (tied embedding and LM head)."""
    counts: dict[int, int] = {}
    for _, p in module.named_parameters(remove_duplicate=False):
        counts[id(p)] = counts.get(id(p), 0) + 1
    return {k for k, c in counts.items() if c > 1}
