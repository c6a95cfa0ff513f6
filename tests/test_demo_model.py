"""The demo model and tokenizer: cached decoding equals recomputation, sizes, validation."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from perfsdk.demo.model import MODEL_SIZES, ModelArgs, Transformer, default_size  # noqa: E402
from perfsdk.demo.tokenizer import BOS_ID, EOS_ID, ByteTokenizer, printable_token_ids  # noqa: E402
from perfsdk.errors import ConfigError  # noqa: E402

SMALL = ModelArgs(dim=64, n_layer=2, n_head=4, n_kv_head=2, intermediate_size=128)


def _model(args: ModelArgs = SMALL, slots: int = 4, max_seq: int = 128) -> Transformer:
    return Transformer(args, max_batch_slots=slots, max_seq=max_seq, seed=0)


def test_static_kv_cache_decode_equals_full_recompute_tiny() -> None:
    model = _model(MODEL_SIZES["tiny"], slots=2, max_seq=64)
    tokens = torch.randint(0, 256, (48,), generator=torch.Generator().manual_seed(1))
    full = model(tokens[None])[0]  # [48, vocab], no cache
    last = model.prefill(tokens[:32], slot=1)
    torch.testing.assert_close(last, full[31], rtol=1e-4, atol=1e-4)
    for i in range(32, 48):
        step = model.decode(tokens[i : i + 1], torch.tensor([1]), torch.tensor([i]))
        torch.testing.assert_close(step[0], full[i], rtol=1e-4, atol=1e-4)


def test_batched_decode_of_slots_at_different_positions_matches_each_sequence() -> None:
    model = _model()
    gen = torch.Generator().manual_seed(2)
    a = torch.randint(0, 256, (30,), generator=gen)
    b = torch.randint(0, 256, (12,), generator=gen)
    full_a, full_b = model(a[None])[0], model(b[None])[0]
    model.prefill(a[:20], slot=3)
    model.prefill(b[:5], slot=0)
    for k in range(7):
        out = model.decode(torch.stack([a[20 + k], b[5 + k]]), torch.tensor([3, 0]), torch.tensor([20 + k, 5 + k]))
        torch.testing.assert_close(out[0], full_a[20 + k], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(out[1], full_b[5 + k], rtol=1e-4, atol=1e-4)


def test_same_seed_same_weights_and_different_seed_differs() -> None:
    x = torch.tensor([[BOS_ID, 1, 2, 3]])
    torch.testing.assert_close(_model()(x), _model()(x))
    other = Transformer(SMALL, max_batch_slots=1, max_seq=8, seed=1)
    assert not torch.allclose(_model()(x), other(x))


def test_param_count_formula_matches_the_module() -> None:
    for args in (SMALL, MODEL_SIZES["tiny"]):
        model = Transformer(args, max_batch_slots=1, max_seq=4)
        assert sum(p.numel() for p in model.parameters()) == args.num_params()
    assert 10e6 <= MODEL_SIZES["tiny"].num_params() <= 20e6
    assert 0.9e9 <= MODEL_SIZES["1b"].num_params() <= 1.2e9


def test_default_size_depends_on_device() -> None:
    assert default_size("cpu") == "tiny"
    assert default_size("cuda:0") == "1b"


def test_bad_shapes_and_names_raise_config_error_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="n_head"):
        ModelArgs(dim=64, n_layer=1, n_head=5, n_kv_head=1, intermediate_size=8)
    with pytest.raises(ConfigError, match="n_kv_head"):
        ModelArgs(dim=64, n_layer=1, n_head=4, n_kv_head=3, intermediate_size=8)
    with pytest.raises(ConfigError, match="tiny"):
        ModelArgs.from_name("tinny")
    with pytest.raises(ConfigError, match="max_seq"):
        _model(max_seq=16).prefill(torch.zeros(17, dtype=torch.long), slot=0)


def test_tokenizer_round_trip_and_specials() -> None:
    tok = ByteTokenizer()
    ids = tok.encode("héllo")
    assert ids[0] == BOS_ID
    assert len(ids) == len("héllo".encode()) + 1
    assert tok.decode([*ids, EOS_ID]) == "héllo"
    assert tok.decode_token(EOS_ID) == ""
    allowed = printable_token_ids()
    assert EOS_ID in allowed
    assert all(len(tok.decode_token(i)) == 1 for i in allowed if i != EOS_ID)
    assert tok.apply_chat_template([("user", "hi")]).endswith("<|assistant|>\n")


def test_batched_prefill_of_padded_prompts_equals_one_at_a_time() -> None:
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 256, (n,), generator=gen) for n in (9, 3, 14)]
    one = _model()
    singles = [one.prefill(p, slot=i) for i, p in enumerate(prompts)]
    batched = _model()
    width = max(len(p) for p in prompts)
    tokens = torch.stack([torch.nn.functional.pad(p, (0, width - len(p))) for p in prompts])
    lengths = torch.tensor([len(p) for p in prompts])
    logits = batched.prefill_batch(tokens, lengths, torch.tensor([0, 1, 2]))
    for i in range(3):
        torch.testing.assert_close(logits[i], singles[i], rtol=1e-4, atol=1e-4)
    # and decoding after either gives the same next logits (the padding's cache rows are never read)
    step = torch.tensor([7, 8, 9])
    torch.testing.assert_close(
        batched.decode(step, torch.tensor([0, 1, 2]), lengths),
        one.decode(step, torch.tensor([0, 1, 2]), lengths),
        rtol=1e-4,
        atol=1e-4,
    )


def test_the_cache_has_a_scratch_slot_past_the_requests_slots() -> None:
    model = _model(slots=3)
    assert model.scratch_slot == 3
    assert model.layers[0].attention.k_cache.shape[0] == 4  # type: ignore[union-attr,index]
