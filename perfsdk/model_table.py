"""The models perfsdk knows by name (:meth:`perfsdk.model.ModelSpec.named`): each one's published
``config.json`` sizes, so the parameter counts are derived, not typed; and the aliases people write::

    KNOWN_MODELS["llama-3-8b"]["num_key_value_heads"]   # 8
    MODEL_ALIASES["llama-3.1-8b"]                         # "llama-3-8b"
"""

from __future__ import annotations

from typing import Any

__all__ = ["KNOWN_MODELS", "MODEL_ALIASES"]


def _llama(hidden: int, inter: int, layers: int, heads: int, kv: int, vocab: int, **extra: Any) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv,
        "vocab_size": vocab,
        "tie_word_embeddings": False,
        **extra,
    }


# Sizes from each model's published config.json (Hugging Face hub), so the parameter counts are
# derived, not typed: llama-2-7b → 6.74 B, llama-3-8b → 8.03 B, llama-3-70b → 70.6 B.
KNOWN_MODELS: dict[str, dict[str, Any]] = {
    "llama-2-7b": _llama(4096, 11008, 32, 32, 32, 32000),
    "llama-2-13b": _llama(5120, 13824, 40, 40, 40, 32000),
    "llama-2-70b": _llama(8192, 28672, 80, 64, 8, 32000),
    "llama-3-8b": _llama(4096, 14336, 32, 32, 8, 128256),
    "llama-3-70b": _llama(8192, 28672, 80, 64, 8, 128256),
    "llama-3.1-405b": _llama(16384, 53248, 126, 128, 8, 128256),
    "llama-3.2-1b": _llama(2048, 8192, 16, 32, 8, 128256, tie_word_embeddings=True, head_dim=64),
    "tinyllama-1.1b": _llama(2048, 5632, 22, 32, 4, 32000),
    "mistral-7b": {**_llama(4096, 14336, 32, 32, 8, 32000), "model_type": "mistral"},
    "mixtral-8x7b": {
        **_llama(4096, 14336, 32, 32, 8, 32000),
        "model_type": "mixtral",
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
    },
    "qwen2.5-7b": {**_llama(3584, 18944, 28, 28, 4, 152064), "model_type": "qwen2"},
    "qwen2.5-72b": {**_llama(8192, 29568, 80, 64, 8, 152064), "model_type": "qwen2"},
    "gemma-2-9b": {
        **_llama(3584, 14336, 42, 16, 8, 256000, head_dim=256, tie_word_embeddings=True),
        "model_type": "gemma2",
    },
}

MODEL_ALIASES: dict[str, str] = {
    "llama2-7b": "llama-2-7b",
    "llama-7b": "llama-2-7b",
    "llama3-8b": "llama-3-8b",
    "llama-3.1-8b": "llama-3-8b",
    "llama3-70b": "llama-3-70b",
    "llama-3.1-70b": "llama-3-70b",
    "llama-3.3-70b": "llama-3-70b",
    "mistral-7b-v0.1": "mistral-7b",
    "qwen2.5-72b-instruct": "qwen2.5-72b",
}
