"""The fused decode attention's Triton kernels against the torch decode attention, in Triton's CPU
interpreter (``TRITON_INTERPRET=1``): grouped-query, multi-query and one-to-one heads, both chunk sizes the
kernel picks, rows with one key and with none, shuffled slots.

Runs where Triton is installed (``pip install triton``; the CI image has no Triton, so there it is skipped);
on a GPU the same check runs inside :class:`perfsdk.demo.graph_engine.GraphEngine` before the kernel is used,
and ``benchmarks/ladder.py`` times it.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("TRITON_INTERPRET", "1")  # before Triton decorates the kernels
torch = pytest.importorskip("torch")
pytest.importorskip("triton")

from perfsdk.demo.attention_triton import check, fused_decode_attention  # noqa: E402
from perfsdk.demo.graph_engine import decode_attention  # noqa: E402

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1" and not torch.cuda.is_available(),
    reason="Triton kernels need a GPU or TRITON_INTERPRET=1",
)


@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 2), (8, 1), (4, 4)])
def test_the_fused_kernels_agree_with_the_torch_attention(heads: int, kv_heads: int) -> None:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert check(decode_attention, heads, kv_heads, 16, torch.float32, device) is None


def test_the_check_catches_a_wrong_answer() -> None:
    def wrong(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        return decode_attention(q, k, v, m) * 1.1

    why = check(wrong, 4, 2, 16, torch.float32, "cpu")
    assert why is not None and "relative error" in why


def test_a_padding_row_gives_zeros_and_the_cache_must_be_contiguous() -> None:
    q = torch.randn(2, 1, 4, 16)
    k = torch.randn(3, 2, 64, 16)
    mask = torch.zeros(2, 64, dtype=torch.bool)
    mask[0, :10] = True
    out = fused_decode_attention(q, k, k.clone(), torch.tensor([2, 0]), mask)
    assert out.shape == (2, 1, 64)
    assert torch.count_nonzero(out[1]) == 0
    with pytest.raises(ValueError, match="contiguous"):
        fused_decode_attention(q, k.transpose(-1, -2), k, torch.tensor([2, 0]), mask[:, :16])


def test_the_custom_op_registers_once_and_its_fake_matches() -> None:
    from perfsdk.demo.attention_triton import attention_op

    op = attention_op()
    assert attention_op() is op
    q, k = torch.randn(2, 1, 4, 16), torch.randn(3, 2, 64, 16)
    args = (q, k, k.clone(), torch.tensor([2, 0]), torch.ones(2, 64, dtype=torch.bool))
    torch.library.opcheck(op, args, test_utils=("test_schema", "test_faketensor"))
