"""The ladder's static engine (GraphEngine) on a CPU: the same tokens as the eager engine, sampling on the
device that is repeatable per request whatever batch it shares, and the host one step behind."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch")

from perfsdk.demo.engine import Engine, SamplingParams  # noqa: E402
from perfsdk.demo.graph_engine import GraphEngine, sample_tokens  # noqa: E402
from perfsdk.demo.model import ModelArgs, Transformer  # noqa: E402
from perfsdk.demo.tokenizer import EOS_ID, ByteTokenizer, printable_token_ids  # noqa: E402
from perfsdk.errors import ConfigError  # noqa: E402

ARGS = ModelArgs(dim=64, n_layer=2, n_head=4, n_kv_head=2, intermediate_size=128)
TOK = ByteTokenizer()
PROMPTS = ["hello there", "a", "the quick brown fox jumps", "xyz", "another prompt", "!"]


@pytest.fixture
def model() -> Transformer:
    return Transformer(ARGS, max_batch_slots=4, max_seq=256, seed=0)


def _run_all(engine: Engine, prompts: list[str], params: SamplingParams) -> list[list[int]]:
    async def go() -> list[list[int]]:
        handles = [engine.submit(TOK.encode(p), params) for p in prompts]
        out = []
        for h in handles:
            out.append([t async for t in h])
        return out

    return asyncio.run(go())


def test_greedy_tokens_equal_the_eager_engine_under_continuous_batching(model: Transformer) -> None:
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    with Engine(model) as eager:
        expected = _run_all(eager, PROMPTS, params)
    with GraphEngine(model) as fast:
        fast.warm_up()
        got = _run_all(fast, PROMPTS, params)
        stats = fast.stats
    assert got == expected
    assert all(len(t) == 24 for t in got)
    # six prompts on four slots: requests joined and left between steps, prefilled in groups
    assert stats.max_running == 4
    assert stats.prefill_steps < len(PROMPTS)
    assert set(stats.batch_sizes) == {4, 2}  # four at once, then the two that waited
    assert fast.cuda_graphs is False  # a CPU: the same static step without capture


def test_seeded_sampling_is_repeatable_and_independent_of_the_batch(model: Transformer) -> None:
    hot = SamplingParams(max_tokens=20, temperature=1.0, seed=7, ignore_eos=True)
    with GraphEngine(model) as fast:
        alone = fast.generate(TOK.encode("seeded"), hot).token_ids
        again = fast.generate(TOK.encode("seeded"), hot).token_ids

        async def crowded() -> list[int]:  # the same request beside three others
            others = [
                fast.submit(TOK.encode(f"other {i}"), SamplingParams(max_tokens=30, temperature=0.7)) for i in range(3)
            ]
            h = fast.submit(TOK.encode("seeded"), hot)
            out = [t async for t in h]
            for o in others:
                async for _ in o:
                    pass
            return out

        beside = asyncio.run(crowded())
        other_seed = fast.generate(
            TOK.encode("seeded"), SamplingParams(max_tokens=20, temperature=1.0, seed=8, ignore_eos=True)
        ).token_ids
    assert alone == again == beside
    assert other_seed != alone


def test_sampler_greedy_eos_mask_and_distribution() -> None:
    allowed = torch.tensor([*[i for i in printable_token_ids() if i != EOS_ID], EOS_ID])
    vocab = 260
    logits = torch.full((3, vocab), -5.0)
    logits[0, ord("q")] = 9.0
    logits[1, EOS_ID] = 9.0  # EOS is the favourite, but row 1 forbids it
    logits[2, ord("a")] = 1.0
    logits[2, ord("b")] = 1.0 + float(torch.log(torch.tensor(3.0)))  # b three times as likely as a
    temp = torch.tensor([0.0, 0.0, 1.0])
    no_eos = torch.tensor([False, True, False])
    eos_col = len(allowed) - 1
    picked = sample_tokens(logits, allowed, eos_col, temp, torch.tensor([1, 2, 3]), torch.tensor([5, 5, 5]), no_eos)
    assert picked[0] == ord("q")
    assert picked[1] != EOS_ID
    # row 2 over many (seed, position) draws: only a or b (the rest is e^-6 less likely), about 1:3
    n = 4000
    rows = logits[2:3].expand(n, vocab)
    draws = sample_tokens(
        rows, allowed, eos_col, torch.ones(n), torch.full((n,), 11), torch.arange(n), torch.zeros(n, dtype=torch.bool)
    )
    share_b = float((draws == ord("b")).float().mean())
    assert set(draws.tolist()) <= set(allowed.tolist())
    assert 0.70 < share_b < 0.80, share_b  # 0.75 expected; binomial sd 0.007


def test_one_step_late_emission_drops_the_token_after_eos(model: Transformer) -> None:
    # greedy, EOS allowed: these prompts hit EOS (the eager engine says where); the static engine has
    # launched the next step before it sees the EOS, and must drop that step's token
    prompts = ["hello there", "the quick brown fox jumps", "!", "end"]
    params = SamplingParams(max_tokens=200)
    with Engine(model) as eager:
        expected = [eager.generate(TOK.encode(p), params) for p in prompts]
    with GraphEngine(model) as fast:
        got = [fast.generate(TOK.encode(p), params) for p in prompts]
        assert fast.wait_idle()
        assert fast.active_slots == 0
    assert all(r.finish_reason == "stop" and len(r.token_ids) < 200 for r in expected)
    assert [(r.token_ids, r.finish_reason) for r in got] == [(r.token_ids, r.finish_reason) for r in expected]


def test_cancel_frees_the_slot_and_time_decode_needs_an_idle_engine(model: Transformer) -> None:
    with GraphEngine(model) as fast:

        async def cancel_after_three() -> str | None:
            h = fast.submit(TOK.encode("cancel me"), SamplingParams(max_tokens=200, ignore_eos=True))
            n = 0
            async for _ in h:
                n += 1
                if n == 3:
                    h.cancel()
            return h.finish_reason

        assert asyncio.run(cancel_after_three()) == "abort"
        assert fast.wait_idle()
        assert fast.active_slots == 0
        per_step = fast.time_decode(2, 64, 8)
        assert per_step > 0
        # the borrowed slots are given back: serving goes on with the same tokens as before
        assert fast.generate(TOK.encode("next"), SamplingParams(max_tokens=5)).finish_reason == "length"
    with pytest.raises(ConfigError, match="batch"):
        fast.time_decode(9, 64, 8)


def test_bad_settings_raise_config_error(model: Transformer) -> None:
    with pytest.raises(ConfigError, match="cuda_graphs"):
        GraphEngine(model, cuda_graphs=True)
    with pytest.raises(ConfigError, match="int8_kernel"):
        GraphEngine(model, int8_kernel="fast")
    with pytest.raises(ConfigError, match="batch_sizes"):
        GraphEngine(model, batch_sizes=[1, 2])
    with pytest.raises(ConfigError, match="max_prefill_tokens"):
        GraphEngine(model, max_prefill_tokens=16)
    with pytest.raises(ConfigError, match="attention: expected"):
        GraphEngine(model, attention="flash")
    with pytest.raises(ConfigError, match="needs CUDA and Triton"):
        GraphEngine(model, attention="triton")  # a CPU model: the fused kernel cannot run


def test_the_fused_attention_is_chosen_only_where_it_can_run(model: Transformer) -> None:
    plain = GraphEngine(model)
    assert (plain.attention, plain.attention_rejected) == ("torch", None)  # not compiled: nothing to choose
    asked = GraphEngine(model, attention="torch")
    assert (asked.attention, asked.attention_rejected) == ("torch", None)
    # compile=True on a CPU: auto falls back to the torch attention and says why (nothing is compiled
    # until the first step, which this test never runs)
    compiled = GraphEngine(model, compile=True)
    assert (compiled.attention, compiled.attention_rejected) == ("torch", "needs CUDA and Triton")


@pytest.fixture
def two_engines(model: Transformer) -> Iterator[tuple[Engine, Engine]]:
    with Engine(model) as a, GraphEngine(model) as b:
        yield a, b


def test_time_decode_runs_each_engines_own_step(two_engines: tuple[Engine, Engine]) -> None:
    seen: list[tuple[int, int]] = []

    class Phase:
        def __init__(self, batch: int, context_tokens: int) -> None:
            seen.append((batch, context_tokens))

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    for engine in two_engines:
        seen.clear()
        engine.time_decode(3, 100, 5, phase=Phase)
        # five steps of three sequences ending at context 100 (each step's own token included)
        assert seen == [(3, 3 * c) for c in range(96, 101)]
