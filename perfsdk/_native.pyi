"""Types of ``perfsdk._native``, the C extension built from ``perfsdk/csrc/`` (the hot path and the step core).

Every class, method, attribute, function and constant the module defines is here, so that strict mypy checks
the Python code that calls into C. The Python references are :mod:`perfsdk.hotpath` (``Hot``, ``Step``,
``LastEnd``) and :mod:`perfsdk.stepcore` (``StepCore``); the struct sequences are the C twins of the
:mod:`perfsdk.records` types of the same names (the same fields, in the same order: ``tests/test_stepcore.py``).
Checked against the built module by mypy's stubtest (``tests/test_native.py``).
"""

from collections.abc import Callable, Sequence
from typing import Any, Final, TypeVar, final

from _typeshed import structseq
from typing_extensions import disjoint_base

from perfsdk.hotpath import HotState
from perfsdk.records import Request, StepRecord
from perfsdk.stepcost import StepCosts

_F = TypeVar("_F", bound=Callable[..., Any])

# ---- constants (the perfsdk.records values of the same names; tests/test_stepcore.py) ----------------
PREFILL: Final[int]
DECODE: Final[int]
MIXED: Final[int]
TIMED: Final[int]
HOST: Final[int]
UNTIMED: Final[int]
NO_TOKENS: Final[int]
UNSIZED: Final[int]
LENS_SQ_MAX: Final[int]
MAX_STEP_BOUNDS: Final[int]  # histogram bounds a StepCore holds at most (step time)
MAX_UTIL_BOUNDS: Final[int]  # ... (MBU and MFU)

# ---- what the step core hands back -------------------------------------------------------------
@final
class PhaseTotals(
    structseq[Any],
    tuple[int, int, tuple[int, ...], float, tuple[int, ...], float, tuple[int, ...], float, float, float, int],
):
    __match_args__: Final = (
        "steps",
        "errors",
        "step_counts",
        "step_sum",
        "mbu_counts",
        "mbu_sum",
        "mfu_counts",
        "mfu_sum",
        "bytes",
        "flops",
        "tokens",
    )
    @property
    def steps(self) -> int: ...
    @property
    def errors(self) -> int: ...
    @property
    def step_counts(self) -> tuple[int, ...]: ...
    @property
    def step_sum(self) -> float: ...
    @property
    def mbu_counts(self) -> tuple[int, ...]: ...
    @property
    def mbu_sum(self) -> float: ...
    @property
    def mfu_counts(self) -> tuple[int, ...]: ...
    @property
    def mfu_sum(self) -> float: ...
    @property
    def bytes(self) -> float: ...
    @property
    def flops(self) -> float: ...
    @property
    def tokens(self) -> int: ...

@final
class StepSample(structseq[Any], tuple[int, int, int, float | None, int, int, float | None, float | None, str | None]):
    __match_args__: Final = ("phase", "t0", "t1", "seconds", "batch", "tokens", "mbu", "mfu", "error")
    @property
    def phase(self) -> int: ...
    @property
    def t0(self) -> int: ...
    @property
    def t1(self) -> int: ...
    @property
    def seconds(self) -> float | None: ...
    @property
    def batch(self) -> int: ...
    @property
    def tokens(self) -> int: ...
    @property
    def mbu(self) -> float | None: ...
    @property
    def mfu(self) -> float | None: ...
    @property
    def error(self) -> str | None: ...

@final
class WindowFeedEntry(structseq[Any], tuple[float, int, float | None]):
    __match_args__: Final = ("seconds", "batch", "mbu")
    @property
    def seconds(self) -> float: ...
    @property
    def batch(self) -> int: ...
    @property
    def mbu(self) -> float | None: ...

@final
class ValueFeedEntry(structseq[Any], tuple[int, float, float | None, float | None]):
    __match_args__: Final = ("phase", "seconds", "mbu", "mfu")
    @property
    def phase(self) -> int: ...
    @property
    def seconds(self) -> float: ...
    @property
    def mbu(self) -> float | None: ...
    @property
    def mfu(self) -> float | None: ...

@final
class StepTotals(
    structseq[Any],
    tuple[
        tuple[PhaseTotals, PhaseTotals, PhaseTotals],
        tuple[StepSample, ...],
        tuple[WindowFeedEntry, ...],
        tuple[ValueFeedEntry, ...],
        int,
    ],
):
    __match_args__: Final = ("phases", "samples", "window_feed", "value_feed", "value_feed_dropped")
    @property
    def phases(self) -> tuple[PhaseTotals, PhaseTotals, PhaseTotals]: ...
    @property
    def samples(self) -> tuple[StepSample, ...]: ...
    @property
    def window_feed(self) -> tuple[WindowFeedEntry, ...]: ...
    @property
    def value_feed(self) -> tuple[ValueFeedEntry, ...]: ...
    @property
    def value_feed_dropped(self) -> int: ...

@final
class RecentSteps(structseq[Any], tuple[int, int, tuple[float, ...], tuple[float, ...], tuple[float, ...]]):
    __match_args__: Final = ("steps", "errors", "seconds", "mbu", "mfu")
    @property
    def steps(self) -> int: ...
    @property
    def errors(self) -> int: ...
    @property
    def seconds(self) -> tuple[float, ...]: ...
    @property
    def mbu(self) -> tuple[float, ...]: ...
    @property
    def mfu(self) -> tuple[float, ...]: ...

# ---- the step core ----------------------------------------------------------------------------
@disjoint_base
class StepCore:
    """The step core in C (perfsdk.stepcore.PyStepCore's algorithm, on a thread without the GIL)."""

    def __new__(
        cls,
        costs: StepCosts,
        capacity: int,
        span_rate: float,
        poll_interval: float,
        events: Any,  # perfsdk.cuda_driver.DriverAddresses (or a scripted GPU's), or None: host timing
        event_capacity: int,
        event_prefill: int,
        new_event: Callable[[], int] | None,
        destroy_event: Callable[[int], object] | None,
        step_bounds: Sequence[float],
        util_bounds: Sequence[float],
        *,
        recent: int,
        samples: int,
        window_feed: int,
        value_feed: int,
        idle_max: float,
    ) -> StepCore: ...
    def start(self) -> None: ...
    def stop(self, timeout: float | None = None, /) -> bool: ...
    def sync(self, timeout: float | None = None, /) -> bool: ...
    def pause(self, paused: bool, /) -> None: ...
    def take(self) -> StepTotals: ...
    def recent(self, phase: int, /) -> RecentSteps: ...
    def take_errors(self) -> list[tuple[str, str]]: ...
    def push(self, record: StepRecord, /) -> bool: ...
    def close_events(self) -> None: ...
    def reserve(self, n: int, /) -> None: ...
    def after_fork(self, drop_events: bool, /) -> None: ...
    @property
    def pushed(self) -> int: ...
    @property
    def done(self) -> int: ...
    @property
    def dropped(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def waiting(self) -> int: ...
    @property
    def errors(self) -> int: ...
    @property
    def dropped_samples(self) -> int: ...
    @property
    def events_in_use(self) -> int: ...
    @property
    def events_free(self) -> int: ...
    @property
    def events_created(self) -> int: ...
    feed_window: bool
    feed_values: bool
    @property
    def alive(self) -> bool: ...

# ---- the hot path -----------------------------------------------------------------------------
@final
class LastEnd:
    """One serving thread's last timed step: its end event, stream, exit time and exit number."""

    def __new__(cls, core: StepCore | None, /) -> LastEnd: ...
    ev: int | None  # the event slot; only None may be written (the thread lets go of it)
    @property
    def t1(self) -> int: ...
    @property
    def seq(self) -> int: ...

@final
class Step:
    """One prefill, decode or mixed step (perfsdk.hotpath.Step's algorithm, in C)."""

    def __enter__(self) -> Step: ...
    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any, /) -> None: ...
    def __call__(self, fn: _F, /) -> _F: ...
    def tokens(self, requests: Sequence[Request], n: int = 1) -> None: ...
    @property
    def phase(self) -> str: ...
    @property
    def sizes(self) -> tuple[Any, Any, Any, Any]: ...

@final
class Hot:
    """One Monitor's hot path, bound from a perfsdk.hotpath.HotState."""

    def __new__(cls, state: HotState, /) -> Hot: ...
    def step(self, phase: str, batch: Any, tokens: Any, context_tokens: Any, seq_lens: Any, /) -> Any: ...
    window: Any  # the profiler window, or None
    @property
    def last_exit(self) -> int: ...
    @property
    def event_pool_empty(self) -> int: ...

def make_step(
    hot: Hot, phase: str, batch: int, tokens: int | None, context_tokens: int, seq_lens: Sequence[int] | None, /
) -> Step: ...
