"""Synthetic prompts of a target token length.

perfsdk's demo server uses a byte-level tokenizer (one byte is one token), so a
prompt of *n* ASCII bytes is exactly *n* prompt tokens there. Against a server
with an unknown tokenizer the length is approximate (a BPE tokenizer packs
several letters into a token); the benchmark therefore reports the prompt
tokens the server states in its ``usage`` block when it sends one, and falls
back to the target length only when it does not.

Each prompt starts with a distinct request number and is otherwise random
lowercase words, so two requests never share a long prefix that a prefix cache
could reuse (that would flatter TTFT)::

    text = synthetic_prompt(128, random.Random(0), index=3)
    assert len(text.encode()) == 128
"""

from __future__ import annotations

import random
import string

__all__ = ["synthetic_prompt"]

_LETTERS = string.ascii_lowercase


def synthetic_prompt(n_tokens: int, rng: random.Random, *, index: int = 0) -> str:
    """ASCII text of exactly *n_tokens* bytes: ``"<index> "`` then random words."""
    head = f"{index} "
    if n_tokens <= len(head):
        return head[:n_tokens]
    parts = [head]
    remaining = n_tokens - len(head)
    while remaining > 0:
        word_len = min(remaining, rng.randint(2, 8))
        parts.append("".join(rng.choices(_LETTERS, k=word_len)))
        remaining -= word_len
        if remaining > 0:
            parts.append(" ")
            remaining -= 1
    return "".join(parts)
