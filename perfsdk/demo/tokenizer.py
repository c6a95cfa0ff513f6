"""A deterministic byte-level tokenizer for the demo model.

Every UTF-8 byte is one token (ids 0-255), followed by a few special tokens::

    from perfsdk.demo.tokenizer import ByteTokenizer

    tok = ByteTokenizer()
    ids = tok.encode("hi")            # [BOS, 104, 105]
    tok.decode(ids)                   # "hi" (specials are dropped)
    tok.vocab_size                    # 260

No files, no downloads, no surprises: the same text always gives the same ids,
and the number of prompt tokens the server reports is ``len(text.encode()) + 1``.

The demo's model has random weights, so left to itself it would emit arbitrary
bytes, most of them invalid UTF-8. :func:`printable_token_ids` lists the ids the
sampler is allowed to pick (printable ASCII, newline and EOS) so that each
generated token is exactly one visible character and one streamed chunk.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["BOS_ID", "EOS_ID", "NUM_BYTES", "PAD_ID", "VOCAB_SIZE", "ByteTokenizer", "printable_token_ids"]

NUM_BYTES = 256
BOS_ID = 256
EOS_ID = 257
PAD_ID = 258
# one spare id keeps the vocabulary an even number; it is never produced
VOCAB_SIZE = 260


def printable_token_ids() -> list[int]:
    """Ids the demo sampler may emit: printable ASCII, ``\\n`` and EOS."""
    return [*range(32, 127), ord("\n"), EOS_ID]


class ByteTokenizer:
    """Bytes to ids and back; ``encode`` prepends BOS, ``decode`` drops specials."""

    vocab_size: int = VOCAB_SIZE
    bos_id: int = BOS_ID
    eos_id: int = EOS_ID
    pad_id: int = PAD_ID

    def encode(self, text: str, *, add_bos: bool = True) -> list[int]:
        ids = list(text.encode("utf-8"))
        return [BOS_ID, *ids] if add_bos else ids

    def decode(self, ids: Iterable[int]) -> str:
        data = bytes(i for i in ids if 0 <= i < NUM_BYTES)
        return data.decode("utf-8", errors="replace")

    def decode_token(self, token_id: int) -> str:
        """Text of one generated token ("" for specials); one char for the ids the sampler allows."""
        if 0 <= token_id < NUM_BYTES:
            return bytes([token_id]).decode("utf-8", errors="replace")
        return ""

    def apply_chat_template(self, messages: Iterable[tuple[str, str]]) -> str:
        """Render ``(role, content)`` pairs as plain text ending with the assistant's turn."""
        parts = [f"<|{role}|>\n{content}\n" for role, content in messages]
        return "".join(parts) + "<|assistant|>\n"
