# Type stub for the C extension perfsdk/_hotpath.c (built by setup.py; optional).
from collections.abc import Callable
from typing import Any

class LastEnd:
    ev: Any
    stream: Any
    t1: int
    seq: int
    def __init__(self, orphan: Callable[..., None], /) -> None: ...

class Step:
    @property
    def phase(self) -> str: ...
    @property
    def sizes(self) -> tuple[Any, Any, Any, Any]: ...
    def __enter__(self) -> Step: ...
    def __exit__(self, exc_type: Any, exc: Any, tb: Any, /) -> None: ...
    def __call__(self, fn: Callable[..., Any], /) -> Callable[..., Any]: ...

class Hot:
    window: Any
    last_exit: int
    dropped: int
    untimed: int
    def __init__(self, *, mon: Any, clock: Callable[[], int] | None, capturing: Callable[[], Any] | None,
                 is_capturing_fn: int, stream: Callable[[], Any], record_on: Callable[[Any, Any], Any], record_fn: int,
                 raise_for: Callable[[int], None], pool_pop: Callable[[], Any] | None,
                 pool_acquire: Callable[[], Any] | None, pool_release: Callable[[Any], None] | None,
                 queue: Any, queue_cap: int, local: Any, nvtx_on: bool, nvtx_push: Callable[..., Any],
                 nvtx_pop: Callable[[], Any], errors_record: Callable[[BaseException, str], None],
                 orphan: Callable[..., None], give_back: Callable[[Any], None], decorate: Callable[..., Any],
                 slow_step: Callable[..., Any], chain_gap_ns: int, every: int) -> None: ...
    def step(self, phase: str, batch: Any, tokens: Any, context_tokens: Any, seq_lens: Any, /) -> Any: ...
    def counts(self) -> tuple[int, int]: ...

def make_step(hot: Hot, phase: str, batch: Any, tokens: Any, context_tokens: Any, seq_lens: Any, /) -> Step: ...
