"""The seeds' numbers, reproduced by perfsdk.budget and perfsdk.model."""

from __future__ import annotations

import pytest

from perfsdk import budget
from perfsdk.errors import ConfigError
from perfsdk.model import ModelSpec

H100_BW = 3.35e12
H100_BF16 = 989e12

# Llama-3-8B-class in BF16 as the seed writes it: 8.0 B parameters, 32 layers, 8 KV heads, head_dim 128
SEED_8B = ModelSpec.from_params(8e9, 2, layers=32, heads=32, kv_heads=8, head_dim=128, kv_bytes=2)


def test_llama3_8b_kv_bytes_per_token() -> None:
    assert budget.kv_bytes_per_token(SEED_8B) == 131_072
    assert budget.kv_bytes_per_token(ModelSpec.named("llama-3-8b")) == 131_072


def test_decode_floor_8b_ctx4096_h100() -> None:
    floor_ms = budget.decode_floor_s(SEED_8B, H100_BW, context_tokens=4096) * 1e3
    assert floor_ms == pytest.approx(4.94, abs=0.01)  # seed: "~4.9 ms"
    # by hand: (8e9 * 2 + 131072 * 4096) / 3.35e12
    assert floor_ms == pytest.approx((16e9 + 131_072 * 4096) / 3.35e12 * 1e3)


def test_prefill_floor_8b_2048_tokens() -> None:
    no_attn = budget.prefill_floor_s(SEED_8B, H100_BF16, [2048], attention=False) * 1e3
    assert no_attn == pytest.approx(33.13, abs=0.01)  # seed: "~33 ms"
    with_attn = budget.prefill_floor_s(SEED_8B, H100_BF16, [2048]) * 1e3
    # attention adds 2 * 32 layers * 32 heads * 128 * 2048^2 = 1.1 TFLOP → ~1.1 ms
    assert with_attn - no_attn == pytest.approx(2 * 32 * 32 * 128 * 2048**2 / H100_BF16 * 1e3)
    assert with_attn == pytest.approx(34.24, abs=0.01)


# The seeds round a decode step to params x bytes: every weight, the whole input-embedding table included
SEED_7B = ModelSpec.from_params(ModelSpec.named("llama-2-7b").total_params or 0, 2)


def test_llama2_7b_floor_on_2tb_s() -> None:
    m = ModelSpec.named("llama-2-7b")
    assert m.total_params == pytest.approx(6.74e9, rel=1e-3)
    assert m.weight_bytes / 1e9 == pytest.approx(13.5, abs=0.05)  # seed: "13.5 GB"
    floor = budget.decode_floor_s(SEED_7B, 2e12)  # the seed's convention
    assert floor * 1e3 == pytest.approx(6.7, abs=0.05)
    assert budget.tokens_per_s(floor) == pytest.approx(148, abs=1)
    # what a step really reads: the untied 32,000 x 4,096 input table only one row per sequence
    assert m.embedding_bytes == 32_000 * 4096 * 2
    assert budget.decode_floor_s(m, 2e12) == pytest.approx((m.weight_bytes - m.embedding_bytes + 4096 * 2) / 2e12)


@pytest.mark.parametrize(("tokens_per_s", "expected_mbu"), [(25.5, 0.17), (107, 0.72)])
def test_seed_loop_mbu(tokens_per_s: float, expected_mbu: float) -> None:
    assert budget.mbu(budget.decode_step_bytes(SEED_7B), 1 / tokens_per_s, 2e12) == pytest.approx(
        expected_mbu, abs=0.005
    )


def test_untied_input_embedding_is_read_one_row_per_sequence() -> None:
    m = ModelSpec.named("llama-3-8b")  # untied: a 128,256 x 4,096 input table and a separate LM head
    table, row = 128_256 * 4096 * 2, 4096 * 2
    assert (m.embedding_bytes, m.embedding_row_bytes) == (table, row)
    assert m.embedding_bytes / m.weight_bytes == pytest.approx(1.05e9 / 16.06e9, rel=0.01)  # the issue's +7 %
    for batch in (1, 8, 64):
        assert budget.decode_step_bytes(m, 4096, batch) == pytest.approx(
            m.weight_bytes - table + batch * row + 131_072 * 4096
        )
    # prefill reads one row per new token; a mixed step one per new token and per decoding sequence
    assert budget.prefill_step_bytes(m, [100, 28]) == pytest.approx(m.weight_bytes - table + 128 * row + 131_072 * 128)
    assert budget.mixed_step_bytes(m, [100], 5000, decode_batch=4) == pytest.approx(
        m.weight_bytes - table + 104 * row + 131_072 * 5100
    )
    tied = ModelSpec.named("llama-3.2-1b")  # tied: the LM head reads the table whole, and it counts once
    assert tied.embedding_bytes == 0
    assert budget.decode_step_bytes(tied, 0, 8) == tied.weight_bytes
    per_gpu = m.with_tp(4)  # a vocabulary-parallel table: a quarter of it, and of a row on average, per GPU
    assert per_gpu.embedding_bytes == pytest.approx(table / 4)
    assert budget.decode_step_bytes(per_gpu, 0) == pytest.approx((m.weight_bytes - table + row) / 4)


def test_int8_floor_and_mbu() -> None:
    m = ModelSpec.from_params(ModelSpec.named("llama-2-7b").total_params or 0, bytes_per_param=1)
    assert budget.tokens_per_s(budget.decode_floor_s(m, 2e12)) == pytest.approx(296, abs=1.5)
    achieved = 157.4 * m.weight_bytes  # bytes/s
    assert achieved / 1e12 == pytest.approx(1.06, abs=0.005)
    assert budget.mbu(m.weight_bytes, 1 / 157.4, 2e12) == pytest.approx(0.53, abs=0.005)


@pytest.mark.parametrize(("step_ms", "expected"), [(9.8, 0.50), (6.0, 0.80)])
def test_worked_h100_example(step_ms: float, expected: float) -> None:
    step_bytes = budget.decode_step_bytes(SEED_8B, 4096)
    assert budget.mbu(step_bytes, step_ms / 1e3, H100_BW) == pytest.approx(expected, abs=0.025)


def test_batch_and_context_scale_kv_not_weights() -> None:
    m = SEED_8B
    one = budget.decode_step_bytes(m, 1024)
    eight = budget.decode_step_bytes(m, 8 * 1024)
    assert eight - one == pytest.approx(7 * 1024 * 131_072)
    assert budget.decode_step_bytes(m) == m.weight_bytes


def test_tensor_parallel_divides_weights_flops_and_kv_heads() -> None:
    m = ModelSpec.named("llama-3-70b")
    m4 = m.with_tp(4)
    assert m4.weight_bytes == pytest.approx(m.weight_bytes / 4)
    assert budget.kv_bytes_per_token(m4) == pytest.approx(budget.kv_bytes_per_token(m) / 4)
    assert budget.prefill_flops(m4, [512]) == pytest.approx(budget.prefill_flops(m, [512]) / 4)
    # 8 KV heads over 16 GPUs: each GPU keeps one (replicated), not half
    m16 = m.with_tp(16)
    assert budget.kv_bytes_per_token(m16) == 2 * 80 * 1 * 128 * 2


def test_prefill_attention_is_per_sequence() -> None:
    m = SEED_8B
    one_long = budget.attention_flops(m, [2048])
    two_short = budget.attention_flops(m, [1024, 1024])
    assert one_long == pytest.approx(2 * two_short)


def test_mixed_step_is_sum_of_parts() -> None:
    m = SEED_8B
    flops = budget.mixed_step_flops(m, [256], decode_batch=4, decode_context_tokens=4000)
    assert flops == pytest.approx(budget.prefill_flops(m, [256]) + budget.decode_flops(m, 4, 4000))
    b = budget.mixed_step_bytes(m, [256], 4000)
    assert b == pytest.approx(m.weight_bytes + 131_072 * (4000 + 256))


def test_mfu() -> None:
    flops = budget.prefill_flops(SEED_8B, [2048], attention=False)
    assert budget.mfu(flops, 0.0662, H100_BF16) == pytest.approx(0.5, abs=0.001)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda: budget.mbu(1e9, 0, 1e12), "seconds"),
        (lambda: budget.mbu(1e9, 1e-3, -1), "bandwidth"),
        (lambda: budget.decode_step_bytes(SEED_8B, -5), "context_tokens"),
        (lambda: budget.prefill_flops(SEED_8B, [-1]), "seq_lens"),
        (lambda: budget.mfu(1.0, 1.0, float("nan")), "peak_flops"),
        (lambda: budget.attention_flops(ModelSpec.from_params(1e9), [10]), "attention FLOPs need layers"),
        (lambda: budget.decode_step_bytes(ModelSpec.from_params(1e9), 10), "needs layers, kv_heads and head_dim"),
    ],
)
def test_bad_input_names_the_field(call: object, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        call()  # type: ignore[operator]


def test_prefill_attention_over_a_cached_prefix() -> None:
    m = ModelSpec.named("llama-3-8b")
    per_token = m.layers * m.heads * m.head_dim  # type: ignore[operator]
    # one sequence, 100 new tokens after a 1,000-token cached prefix: 4·n·c per head-dim on top of n²
    assert budget.attention_flops(m, [100], cached_tokens=1000) == pytest.approx(
        2.0 * per_token * 100**2 + 4.0 * per_token * 100 * 1000
    )
    # two sequences sharing 2,000 cached tokens in all: spread evenly
    assert budget.attention_flops(m, [100, 300], cached_tokens=2000) == pytest.approx(
        2.0 * per_token * (100**2 + 300**2) + 4.0 * per_token * 1000 * (100 + 300)
    )
    assert budget.prefill_flops(m, [100], cached_tokens=1000) - budget.prefill_flops(m, [100]) == pytest.approx(
        4.0 * per_token * 100 * 1000
    )
    with pytest.raises(ConfigError, match="cached_tokens"):
        budget.attention_flops(m, [10], cached_tokens=-1)
