"""ModelSpec construction: known models, Hugging Face configs, torch modules, validation."""

from __future__ import annotations

from typing import Any

import pytest

from perfsdk.errors import ConfigError, UnknownModelError
from perfsdk.model import KNOWN_MODELS, ModelSpec, dtype_bytes

# Published totals (model cards): the table derives them from the configs, so these check the formula.
PUBLISHED_PARAMS = {
    "llama-2-7b": 6.74e9,
    "llama-2-13b": 13.0e9,
    "llama-2-70b": 69.0e9,
    "llama-3-8b": 8.03e9,
    "llama-3-70b": 70.6e9,
    "mistral-7b": 7.24e9,
    "mixtral-8x7b": 46.7e9,
    "qwen2.5-7b": 7.62e9,
    "qwen2.5-72b": 72.7e9,
    "llama-3.2-1b": 1.24e9,
    "tinyllama-1.1b": 1.10e9,
    "gemma-2-9b": 9.24e9,
    "llama-3.1-405b": 405.9e9,
}


@pytest.mark.parametrize("name", sorted(KNOWN_MODELS))
def test_known_models_match_published_sizes(name: str) -> None:
    spec = ModelSpec.named(name)
    assert spec.total_params == pytest.approx(PUBLISHED_PARAMS[name], rel=0.01)
    assert spec.weight_bytes == pytest.approx(2 * spec.params, rel=0.2)


def test_mixtral_counts_active_parameters() -> None:
    spec = ModelSpec.named("mixtral-8x7b")
    # 12.9 B active of 46.7 B (Mistral's announcement); params excludes the 131 M input embedding
    assert spec.weight_bytes / 2 == pytest.approx(12.9e9, rel=0.01)
    assert spec.total_params is not None and spec.total_params > 3 * spec.params


def test_named_is_forgiving_and_suggests() -> None:
    assert ModelSpec.named("Llama_3 8B".replace(" ", "-")).name == "llama-3-8b"
    assert ModelSpec.named("llama3-8b").name == "llama-3-8b"
    with pytest.raises(UnknownModelError, match=r"Did you mean: .*llama-3-8b"):
        ModelSpec.named("llama-3-8")


def test_from_hf_config_dict_and_object() -> None:
    cfg = dict(KNOWN_MODELS["llama-3-8b"], torch_dtype="float16")
    a = ModelSpec.from_hf_config(cfg)
    assert a.dtype == "float16" and a.kv_bytes_per_token == 131_072

    class FakeTransformersConfig:  # the duck type transformers.PretrainedConfig offers: to_dict()
        def to_dict(self) -> dict[str, object]:
            return cfg

    assert ModelSpec.from_hf_config(FakeTransformersConfig()) == a
    fp8_kv = ModelSpec.from_hf_config(cfg, dtype="bfloat16", kv_dtype="fp8")
    assert fp8_kv.kv_bytes_per_token == 65_536


def test_gpt_neox_layout() -> None:
    # pythia-1.4b config.json
    cfg = {
        "model_type": "gpt_neox",
        "hidden_size": 2048,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "intermediate_size": 8192,
        "vocab_size": 50304,
        "tie_word_embeddings": False,
    }
    spec = ModelSpec.from_hf_config(cfg)
    assert spec.total_params == pytest.approx(1.414e9, rel=0.01)  # Pythia's published 1,414,647,808
    assert spec.kv_heads == 16 and spec.head_dim == 128


@pytest.mark.parametrize(
    ("cfg", "msg"),
    [
        (
            {
                "model_type": "llama",
                "hidden_size": 4096,
                "num_attention_heads": 32,
                "vocab_size": 10,
                "intermediate_size": 1,
            },
            "num_hidden_layers",
        ),
        (dict(KNOWN_MODELS["llama-3-8b"], num_key_value_heads=7), "does not divide"),
        (dict(KNOWN_MODELS["llama-3-8b"], hidden_size=4095), "not divisible"),
        (dict(KNOWN_MODELS["llama-3-8b"], vocab_size=0), "vocab_size"),
    ],
)
def test_hf_config_errors_name_the_field(cfg: dict[str, object], msg: str) -> None:
    with pytest.raises(ConfigError, match=msg):
        ModelSpec.from_hf_config(cfg)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"params": 0, "weight_bytes": 1}, "params"),
        ({"params": 1, "weight_bytes": -1}, "weight_bytes"),
        ({"params": 1, "weight_bytes": 1, "layers": 0}, "layers"),
        ({"params": 1, "weight_bytes": 1, "head_dim": 2.5}, "head_dim"),
        ({"params": 1, "weight_bytes": 1, "heads": 32, "kv_heads": 6}, "kv_heads"),
        ({"params": 1, "weight_bytes": 1, "tp": 0}, "tp"),
    ],
)
def test_validation_names_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        ModelSpec(**kwargs)  # type: ignore[arg-type]


def test_tp_must_divide_heads() -> None:
    with pytest.raises(ConfigError, match="do not divide 32 attention heads"):
        ModelSpec.named("llama-3-8b").with_tp(3)


def test_dtype_bytes() -> None:
    assert dtype_bytes("torch.bfloat16") == 2 and dtype_bytes("int4") == 0.5
    with pytest.raises(ConfigError, match="Did you mean"):
        dtype_bytes("bfloat61")


def test_from_module_counts_torch_parameters() -> None:
    torch = pytest.importorskip("torch")
    emb = torch.nn.Embedding(100, 16)
    net = torch.nn.Sequential(emb, torch.nn.Linear(16, 32, bias=False), torch.nn.Linear(32, 100, bias=False))
    net = net.to(torch.bfloat16)
    spec = ModelSpec.from_module(net, layers=1, heads=2, kv_heads=1, head_dim=8)
    assert spec.total_params == 1600 + 512 + 3200
    assert spec.params == 512 + 3200  # the lookup does no arithmetic
    assert spec.weight_bytes == 2 * (1600 + 512 + 3200)
    assert spec.kv_bytes == 2 and spec.dtype == "bfloat16"
    # a tied embedding is also the LM head: it counts once, and for FLOPs
    head = torch.nn.Linear(16, 100, bias=False)
    head.weight = emb.weight
    tied = torch.nn.ModuleDict({"emb": emb, "head": head})
    spec2 = ModelSpec.from_module(tied)
    assert spec2.total_params == 1600 and spec2.params == 1600
    # what a step reads: the untied table one row per token, the tied one whole (it is the LM head)
    assert (spec.embedding_bytes, spec.embedding_row_bytes) == (2 * 1600, 2 * 16)
    assert spec.step_weight_bytes == 2 * (512 + 3200)
    assert (spec2.embedding_bytes, spec2.embedding_row_bytes) == (0, 0)


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"embedding_bytes": -1.0}, "embedding_bytes"),
        ({"embedding_bytes": 10.0}, "less than weight_bytes"),
        ({"embedding_bytes": 4.0, "embedding_row_bytes": 5.0}, "cannot exceed its table"),
    ],
)
def test_embedding_sizes_are_checked(fields: dict[str, float], problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        ModelSpec(params=1, weight_bytes=10, **fields)


@pytest.mark.parametrize(
    ("qcfg", "dtype"),
    [
        ({"quant_method": "fp8"}, "fp8"),
        ({"quant_method": "awq", "bits": 4}, "int4"),
        ({"quant_method": "gptq", "bits": 8}, "int8"),
        (
            {"quant_method": "compressed-tensors", "config_groups": {"g": {"weights": {"num_bits": 4, "type": "int"}}}},
            "int4",
        ),
        (
            {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": {"weights": {"num_bits": 8, "type": "float"}}},
            },
            "fp8",
        ),
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "int4"),
        ({"quant_method": "mxfp4"}, "mxfp4"),
        ({"quant_method": "something-new"}, None),
        ({}, None),
        (None, None),
    ],
)
def test_quantized_checkpoints_are_sized_at_their_stored_width(qcfg: Any, dtype: str | None) -> None:
    from perfsdk.model import quantized_weight_dtype

    assert quantized_weight_dtype(qcfg) == dtype
    base = ModelSpec.from_hf_config(KNOWN_MODELS["llama-3-8b"])
    spec = ModelSpec.from_hf_config({**KNOWN_MODELS["llama-3-8b"], "quantization_config": qcfg})
    if dtype is None:
        assert spec.weight_bytes == base.weight_bytes
    else:
        assert spec.dtype == dtype
        assert spec.weight_bytes == pytest.approx(base.weight_bytes * dtype_bytes(dtype) / 2)
        assert spec.kv_bytes == base.kv_bytes  # the KV cache stays at the model's compute dtype
