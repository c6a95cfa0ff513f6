"""Weight-only int8 for the demo model, and what perfsdk's MBU then counts: the int8 bytes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from perfsdk import budget  # noqa: E402
from perfsdk.demo.model import MODEL_SIZES, ModelArgs, Transformer  # noqa: E402
from perfsdk.demo.quant import Int8Linear, int8_linear, quantize_int8, quantize_weight  # noqa: E402
from perfsdk.demo.rungs import build_engine, is_quantized, prepare_model, resolve_engine, skip_reason  # noqa: E402
from perfsdk.demo.stack import demo_model_spec  # noqa: E402
from perfsdk.errors import ConfigError  # noqa: E402

ARGS = ModelArgs(dim=64, n_layer=2, n_head=4, n_kv_head=2, intermediate_size=128)


def test_per_channel_int8_round_trips_within_half_a_step() -> None:
    w = torch.randn(48, 96, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.01, 3.0, 48)[:, None]
    q, scale = quantize_weight(w)
    assert q.dtype == torch.int8 and scale.shape == (48,)
    assert int(q.abs().max()) == 127  # each row's largest weight uses the whole range
    err = (q.float() * scale[:, None] - w).abs()
    assert bool((err <= scale[:, None] / 2 + 1e-6).all())  # rounding error at most half a step, per row


def test_int8_linear_matches_the_dequantised_weight() -> None:
    gen = torch.Generator().manual_seed(1)
    w = torch.randn(32, 64, generator=gen)
    q, scale = quantize_weight(w)
    x = torch.randn(3, 5, 64, generator=gen)
    ref = x @ (q.float() * scale[:, None]).T
    torch.testing.assert_close(int8_linear(x, q, scale), ref, rtol=1e-5, atol=1e-5)
    layer = Int8Linear(q, scale)
    torch.testing.assert_close(layer(x), ref, rtol=1e-5, atol=1e-5)


def test_quantize_int8_replaces_every_linear_and_the_spec_counts_int8_bytes() -> None:
    model = Transformer(ARGS, max_batch_slots=2, max_seq=64, seed=0)
    before_spec = demo_model_spec(model, "demo-test")
    x = torch.tensor([[256, 104, 105, 33]])
    ref = model(x)
    before, after = quantize_int8(model)
    assert is_quantized(model)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())
    linear = sum(
        n
        for n in (
            ARGS.dim * (ARGS.dim + 2 * ARGS.n_kv_head * ARGS.head_dim),
            ARGS.dim * ARGS.dim,
            ARGS.dim * 2 * ARGS.intermediate_size,
            ARGS.intermediate_size * ARGS.dim,
        )
    )
    linear = linear * ARGS.n_layer + ARGS.vocab_size * ARGS.dim
    assert before == 4 * linear  # float32 here
    scales = 4 * (
        (ARGS.dim + 2 * ARGS.n_kv_head * ARGS.head_dim + ARGS.dim + 2 * ARGS.intermediate_size + ARGS.dim)
        * ARGS.n_layer
        + ARGS.vocab_size
    )
    assert after == linear + scales
    spec = demo_model_spec(model, "demo-test")
    # the arithmetic is the same, the bytes are not: the floor and MBU follow the bytes
    assert spec.params == before_spec.params
    assert spec.dtype == "int8"
    assert spec.weight_bytes == before_spec.weight_bytes - before + after
    assert budget.decode_floor_s(spec, 1e12) < budget.decode_floor_s(before_spec, 1e12) / 2
    out = model(x)
    assert float((out - ref).norm() / ref.norm()) < 0.05  # int8 noise, not a different model


def test_rungs_resolve_skip_and_build() -> None:
    assert resolve_engine("auto", "cpu") == "eager"
    assert resolve_engine("auto", "cuda:0", "1b") == "compile"  # the fastest rungs on the H200
    assert resolve_engine("auto", "cuda:0", "8b") == "int8"
    with pytest.raises(ConfigError, match="graph"):
        resolve_engine("grpah", "cpu")
    assert skip_reason("compile", "cpu") is not None
    assert skip_reason("compile", "cuda") is None
    assert skip_reason("graph", "cpu") is None
    model = Transformer(ARGS, max_batch_slots=2, max_seq=64, seed=0)
    assert build_engine(model, "eager").name == "eager"
    assert build_engine(model, "graph").name == "graph"
    prepare_model(model, "int8")
    engine = build_engine(model, "int8")
    assert engine.name == "int8"
    assert getattr(engine, "compiled", None) is False  # on a CPU int8 builds on the graph rung
    with pytest.raises(ConfigError, match="int8"):
        build_engine(model, "graph")  # a quantised model cannot serve a bf16 rung


def test_8b_is_llama_3_8b_shaped() -> None:
    args = MODEL_SIZES["8b"]
    assert (args.dim, args.n_layer, args.n_head, args.n_kv_head, args.intermediate_size, args.vocab_size) == (
        4096,
        32,
        32,
        8,
        14336,
        128256,
    )
    assert args.num_params() == 8_030_261_248  # Llama-3-8B's count
