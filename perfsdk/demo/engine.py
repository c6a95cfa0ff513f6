"""A continuous-batching loop for the demo model, on its own thread.

The shape of vLLM's or SGLang's scheduler, in a page of code: requests wait in
a queue; between steps the engine admits as many as there are free KV-cache
slots, prefills them, then runs one batched decode step for every running
request. Requests join and leave between any two steps::

    import asyncio
    from perfsdk.demo.engine import Engine, SamplingParams
    from perfsdk.demo.model import ModelArgs, Transformer
    from perfsdk.demo.tokenizer import ByteTokenizer

    model = Transformer(ModelArgs.from_name("tiny"), max_batch_slots=8, max_seq=1024)
    with Engine(model, monitor=mon) as engine:           # mon: a perfsdk.Monitor, or None
        # from a thread: blocks until the request finishes
        out = engine.generate(ByteTokenizer().encode("hello"), SamplingParams(max_tokens=16))
        print(out.token_ids, out.finish_reason)

        # from asyncio: tokens arrive as they are sampled
        async def client() -> None:
            handle = engine.submit(ByteTokenizer().encode("hi"), SamplingParams(max_tokens=8))
            async for token_id in handle:
                ...
            print(handle.finish_reason)                   # "stop" | "length" | "abort"

Instrumentation, when a :class:`perfsdk.Monitor` is given: ``submit`` calls
``monitor.request(prompt_tokens=n)`` (the arrival, on the caller's thread); the
engine thread calls ``scheduled()`` on admission, ``tokens(1)`` for each
emitted token and ``finish(reason)`` once, and wraps each prefill in
``monitor.prefill(...)`` and each decode step in ``monitor.decode(...)``.

Tokens cross from the engine thread to asyncio with
``loop.call_soon_threadsafe`` into a per-request :class:`asyncio.Queue`; the
engine never touches the event loop otherwise. A request that is cancelled
(the HTTP client went away) is dropped between steps and its slot freed.

Why this module is over 500 lines: the engine is one scheduler loop and the hand-off to the event loop
(admission, prefill, the batched decode step, finishing, streaming to asyncio) that share one lock and one
set of slots; split up, a reader would follow the state across files to check that a slot is never lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import queue
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import torch

from perfsdk.demo.tokenizer import EOS_ID, printable_token_ids
from perfsdk.errors import ConfigError

if TYPE_CHECKING:
    from perfsdk.demo.model import Transformer

__all__ = ["Engine", "EngineStats", "GenerationHandle", "GenerationResult", "SamplingParams"]

log = logging.getLogger(__name__)


class _RequestRecorder(Protocol):
    """The part of ``perfsdk.monitor.Request`` the engine uses."""

    def scheduled(self) -> Any: ...
    def tokens(self, n: int = 1) -> Any: ...
    def finish(self, reason: str = "stop", error: BaseException | str | None = None) -> Any: ...


class _NullRecorder:
    def scheduled(self) -> None:
        return None

    def tokens(self, n: int = 1) -> None:
        return None

    def finish(self, reason: str = "stop", error: BaseException | str | None = None) -> None:
        return None


_NULL_RECORDER = _NullRecorder()


#: Smallest positive temperature: below it sampling is greedy in effect, and ``logits / t`` heads for
#: float overflow (``1e-300`` gives inf, then NaN probabilities). 0 means greedy.
MIN_TEMPERATURE = 1e-3
#: Seeds are what ``torch.Generator.manual_seed`` takes.
SEED_RANGE = (-(2**63), 2**64 - 1)


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` is greedy; ``seed`` makes sampling repeatable.

    Invalid values raise :class:`~perfsdk.errors.ConfigError` naming the field, here at construction,
    so that a bad request is refused before it reaches the engine thread.
    """

    max_tokens: int = 16
    temperature: float = 0.0
    seed: int | None = None
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ConfigError(f"max_tokens must be an integer, got {self.max_tokens!r}")
        if self.max_tokens < 1:
            raise ConfigError(f"max_tokens must be at least 1, got {self.max_tokens}")
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, int | float) or not math.isfinite(t):
            raise ConfigError(f"temperature must be a finite number, got {t!r}")
        if t < 0 or 0 < t < MIN_TEMPERATURE:
            raise ConfigError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE:g}, got {t!r}")
        if self.seed is not None:
            if isinstance(self.seed, bool) or not isinstance(self.seed, int):
                raise ConfigError(f"seed must be an integer, got {self.seed!r}")
            if not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]:
                raise ConfigError(f"seed must be within [-2**63, 2**64 - 1], got {self.seed}")
        if not isinstance(self.ignore_eos, bool):
            raise ConfigError(f"ignore_eos must be true or false, got {self.ignore_eos!r}")


@dataclass
class GenerationResult:
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int


@dataclass
class _Finish:
    reason: str
    error: str | None = None


class GenerationHandle:
    """One submitted request. Iterate it (``async for``) to receive token ids as they are sampled."""

    def __init__(
        self,
        request_id: str,
        prompt_ids: Sequence[int],
        params: SamplingParams,
        *,
        recorder: _RequestRecorder,
        deliver: Callable[[list[int | _Finish]], None],
        wake_engine: Callable[[], None],
    ) -> None:
        self.request_id = request_id
        self.prompt_ids = list(prompt_ids)
        self.params = params
        self.recorder = recorder
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.output_ids: list[int] = []
        self._deliver = deliver
        self._wake_engine = wake_engine
        self._cancelled = threading.Event()
        self._async_queue: asyncio.Queue[int | _Finish] | None = None
        # engine-thread state
        self.slot: int | None = None
        self.cache_len = 0
        self.last_token = 0
        self.generated = 0
        self.scheduled = 0  # tokens enqueued on the device (GraphEngine runs one step ahead of emission)
        self.generator: torch.Generator | None = None
        self.engine_done = False  # set by the engine thread; finish_reason is the consumer's view

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def cancelled(self) -> bool:
        return self._cancelled.is_set()

    def cancel(self) -> None:
        """Ask the engine to drop this request; its slot is freed before the next step. Idempotent."""
        if not self._cancelled.is_set():
            self._cancelled.set()
            self._wake_engine()

    def _received(self, item: int | _Finish) -> bool:
        """Book-keeping on the consumer side; True when the stream is over."""
        if isinstance(item, _Finish):
            self.finish_reason = item.reason
            self.error = item.error
            return True
        self.output_ids.append(item)
        return False

    async def __aiter__(self) -> AsyncIterator[int]:
        q = self._async_queue
        if q is None:
            raise RuntimeError("this request was submitted with generate(); iterate it only after submit()")
        while True:
            item = await q.get()
            if self._received(item):
                return
            yield item  # type: ignore[misc]


@dataclass
class EngineStats:
    """Counters the engine keeps for tests and the report (read them from any thread)."""

    submitted: int = 0
    finished: int = 0
    aborted: int = 0
    failed: int = 0  # requests that failed alone (their error isolated from the rest of the batch)
    prefill_steps: int = 0
    decode_steps: int = 0
    tokens_generated: int = 0
    max_running: int = 0
    batch_sizes: list[int] = field(default_factory=list)
    prefill_tokens: int = 0
    decode_context_tokens: int = 0  # Σ over decode steps of the batch's context lengths
    prefill_seconds: float = 0.0  # host clock around the model calls (exact on CPU, launch time on CUDA)
    decode_seconds: float = 0.0


class Engine:
    """Continuous batching over a :class:`~perfsdk.demo.model.Transformer`'s KV-cache slots.

    The ladder's first rung, ``eager``: each step is the model's eager forward (one kernel launch per
    op), prompts are prefilled one at a time, and each step's sampled ids are read back on the host
    before the next step is launched.
    """

    name = "eager"

    def __init__(
        self,
        model: Transformer,
        *,
        monitor: Any = None,
        seed: int = 0,
        max_batch_slots: int | None = None,
        idle_wait_s: float = 0.5,
    ) -> None:
        slots = model.max_batch_slots if max_batch_slots is None else max_batch_slots
        if not 0 < slots <= model.max_batch_slots:
            raise ConfigError(f"max_batch_slots must be in 1..{model.max_batch_slots}, got {slots}")
        self.model = model
        self.monitor = monitor
        self.max_batch_slots = slots
        self.max_seq = model.max_seq
        self.stats = EngineStats()
        self._seed = seed
        self._ids = itertools.count()
        self._idle_wait_s = idle_wait_s
        self._cv = threading.Condition()
        self._waiting: deque[GenerationHandle] = deque()
        self._running: list[GenerationHandle] = []
        self._free_slots: list[int] = list(range(slots - 1, -1, -1))
        self._active = 0  # slots in use, readable from any thread
        self._stop = False
        self._thread: threading.Thread | None = None
        device = model.device
        allowed = torch.full((model.args.vocab_size,), float("-inf"), device=device)
        allowed[printable_token_ids()] = 0.0
        self._allowed_bias = allowed
        no_eos = allowed.clone()
        no_eos[EOS_ID] = float("-inf")
        self._no_eos_bias = no_eos
        # Choose the instrumentation once (STYLE.md 3): a real phase or a null context.
        self._prefill_phase: Callable[..., AbstractContextManager[Any]]
        self._decode_phase: Callable[..., AbstractContextManager[Any]]
        if monitor is not None:
            self._prefill_phase = monitor.prefill
            self._decode_phase = monitor.decode
        else:
            self._prefill_phase = self._decode_phase = _null_phase

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> Engine:
        if self._thread is None:
            self._stop = False
            self._thread = threading.Thread(target=self._loop, name="perfsdk-demo-engine", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Abort everything in flight and join the engine thread."""
        with self._cv:
            self._stop = True
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ---- queries ---------------------------------------------------------------------------------

    @property
    def active_slots(self) -> int:
        """KV-cache slots held by running requests right now."""
        return self._active

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until no request is running or waiting; False on timeout."""
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._active or self._waiting:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cv.wait(min(left, 0.05))
        return True

    def warm_up(self, max_length: int | None = None) -> None:
        """Nothing to prepare for eager steps (the fast rungs compile and capture here)."""

    def _timing_shape(self, batch: int, context: int, steps: int) -> tuple[int, int]:
        if not 0 < batch <= self.max_batch_slots:
            raise ConfigError(f"batch must be in 1..{self.max_batch_slots}, got {batch}")
        if not 0 < steps < self.max_seq:
            raise ConfigError(f"steps must be in 1..{self.max_seq - 1}, got {steps}")
        with self._cv:
            if self._running or self._waiting:
                raise RuntimeError("time_decode needs an idle engine: it borrows the first KV-cache slots")
        # the last step sees `context` tokens (itself included), as far as max_seq allows
        last = min(max(context, steps), self.max_seq) - 1
        return batch, last - steps + 1

    @torch.inference_mode()
    def time_decode(self, batch: int, context: int, steps: int = 32, phase: Callable[..., Any] | None = None) -> float:
        """Run *steps* decode steps of *batch* sequences ending at *context* tokens, outside serving.

        The step is this engine's own (the same forward and the same per-step read of the sampled
        ids), on the first *batch* KV-cache slots, so the engine must be idle. *phase* wraps each step
        (pass ``monitor.decode`` to have perfsdk time it on the device); returns host seconds per step,
        the loop's pace: 1 / that is tokens per second per sequence.
        """
        b, p0 = self._timing_shape(batch, context, steps)
        phase = phase or _null_phase
        device = self.model.device
        t0 = time.perf_counter()
        for i in range(steps):
            # the same host-built inputs as _decode
            tokens = torch.tensor([ord("a")] * b, dtype=torch.long, device=device)
            slots = torch.tensor(list(range(b)), dtype=torch.long, device=device)
            positions = torch.tensor([p0 + i] * b, dtype=torch.long, device=device)
            with phase(batch=b, context_tokens=b * (p0 + i + 1)):
                logits = self.model.decode(tokens, slots, positions, max_position=p0 + i)
            (logits.float() + self._allowed_bias).argmax(dim=-1).tolist()
        return (time.perf_counter() - t0) / steps

    # ---- submission ------------------------------------------------------------------------------

    def submit(self, prompt_ids: Sequence[int], params: SamplingParams) -> GenerationHandle:
        """Queue a request from inside a running event loop; iterate the handle for its tokens."""
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[int | _Finish] = asyncio.Queue()

        def put_many(items: list[int | _Finish]) -> None:
            for item in items:
                q.put_nowait(item)

        def deliver(items: list[int | _Finish]) -> None:
            try:
                loop.call_soon_threadsafe(put_many, items)
            except RuntimeError:  # the loop closed under us: nobody is listening any more
                pass

        handle = self._enqueue(prompt_ids, params, deliver)
        handle._async_queue = q
        return handle

    def generate(self, prompt_ids: Sequence[int], params: SamplingParams, timeout: float = 60.0) -> GenerationResult:
        """Submit from a plain thread and block until the request finishes."""
        q: queue.SimpleQueue[int | _Finish] = queue.SimpleQueue()

        def deliver(items: list[int | _Finish]) -> None:
            for item in items:
                q.put(item)

        handle = self._enqueue(prompt_ids, params, deliver)
        deadline = time.monotonic() + timeout
        while True:
            try:
                item = q.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                handle.cancel()
                raise TimeoutError(f"request {handle.request_id} did not finish in {timeout} s") from None
            if handle._received(item):
                break
        return GenerationResult(handle.output_ids, handle.finish_reason or "abort", handle.prompt_tokens)

    def _enqueue(
        self, prompt_ids: Sequence[int], params: SamplingParams, deliver: Callable[[list[int | _Finish]], None]
    ) -> GenerationHandle:
        n = len(prompt_ids)
        if n == 0:
            raise ConfigError("prompt must contain at least one token")
        vocab = self.model.args.vocab_size
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in prompt_ids):
            # an out-of-range id would be a device-side assert on CUDA: the whole process's GPU state gone
            raise ConfigError(f"prompt: token ids must be integers in [0, {vocab})")
        if n + params.max_tokens > self.max_seq:
            raise ConfigError(
                f"prompt ({n} tokens) + max_tokens ({params.max_tokens}) exceeds the model's "
                f"max_seq of {self.max_seq} tokens"
            )
        if self._thread is None:
            raise RuntimeError("the engine is not running: call start() or use it as a context manager")
        recorder: _RequestRecorder = self.monitor.request(prompt_tokens=n) if self.monitor else _NULL_RECORDER
        rid = f"{next(self._ids)}"
        handle = GenerationHandle(rid, prompt_ids, params, recorder=recorder, deliver=deliver, wake_engine=self._wake)
        with self._cv:
            self.stats.submitted += 1
            self._waiting.append(handle)
            self._cv.notify_all()
        return handle

    def _wake(self) -> None:
        with self._cv:
            self._cv.notify_all()

    # ---- the engine thread -----------------------------------------------------------------------

    def _loop(self) -> None:
        with torch.inference_mode():
            while True:
                with self._cv:
                    while not self._stop and not self._waiting and not self._running:
                        self._cv.wait(self._idle_wait_s)
                    if self._stop:
                        break
                try:
                    self._step()
                except Exception as e:  # a bug in the demo must not wedge the server: fail what was in flight
                    log.exception("demo engine step failed; aborting the running requests")
                    for h in list(self._running):
                        self._finish(h, "abort", error=f"{type(e).__name__}: {e}")
        self._abort_all()

    def _step(self) -> None:
        self._reap_cancelled()
        admitted = self._admit()
        if admitted:
            self._isolated(self._prefill, admitted)
        batch = [h for h in self._running if not h.engine_done]
        if batch:
            self._isolated(self._decode, batch)

    def _isolated(self, phase: Callable[[list[GenerationHandle]], None], handles: list[GenerationHandle]) -> None:
        """Run a batched phase; if it raises, run each request alone so that only the culprit fails.

        A phase writes each sequence's KV-cache rows at fixed positions and emits nothing before its
        forward has succeeded, so running a request again after a failed batch is safe. Per-request work
        after the forward (sampling, emission) guards itself (:meth:`_fail`).
        """
        try:
            phase(handles)
            return
        except Exception as e:
            if len(handles) == 1:
                self._fail(handles[0], e)
                return
            log.warning(
                "demo engine: a batched %s of %d requests failed (%s: %s); retrying each alone",
                phase.__name__.lstrip("_"),
                len(handles),
                type(e).__name__,
                e,
            )
        for h in handles:
            if h.engine_done:
                continue
            try:
                phase([h])
            except Exception as e:
                self._fail(h, e)

    def _fail(self, h: GenerationHandle, e: BaseException) -> None:
        """End one request with its error; the others in its batch go on."""
        log.warning("demo engine: request %s failed alone: %s: %s", h.request_id, type(e).__name__, e)
        self.stats.failed += 1
        self._finish(h, "abort", error=f"{type(e).__name__}: {e}")

    def _reap_cancelled(self) -> None:
        with self._cv:
            dropped = [h for h in self._waiting if h.cancelled]
            for h in dropped:
                self._waiting.remove(h)
        for h in dropped:
            self._finish(h, "abort")
        for h in [h for h in self._running if h.cancelled]:
            self._finish(h, "abort")

    def _admit(self) -> list[GenerationHandle]:
        admitted: list[GenerationHandle] = []
        with self._cv:
            while self._waiting and self._free_slots:
                h = self._waiting.popleft()
                h.slot = self._free_slots.pop()
                self._running.append(h)
                admitted.append(h)
            self._active = len(self._running)
        self.stats.max_running = max(self.stats.max_running, len(self._running))
        for h in admitted:
            h.recorder.scheduled()
        return admitted

    def _prefill(self, admitted: list[GenerationHandle]) -> None:
        device = self.model.device
        lens = [h.prompt_tokens for h in admitted]
        rows = []
        # One perfsdk prefill step covers every sequence admitted together, as a real engine's batch does.
        t0 = time.perf_counter()
        with self._prefill_phase(tokens=sum(lens), batch=len(admitted), seq_lens=lens):
            for h in admitted:
                assert h.slot is not None
                ids = torch.tensor(h.prompt_ids, dtype=torch.long, device=device)
                rows.append(self.model.prefill(ids, h.slot))
        self.stats.prefill_seconds += time.perf_counter() - t0
        self.stats.prefill_steps += 1
        self.stats.prefill_tokens += sum(lens)
        for h in admitted:
            h.cache_len = h.prompt_tokens
            h.generator = self._generator_for(h)
        self._sample_and_emit(admitted, torch.stack(rows))

    def _decode(self, batch: list[GenerationHandle]) -> None:
        device = self.model.device
        tokens = torch.tensor([h.last_token for h in batch], dtype=torch.long, device=device)
        slots = torch.tensor([h.slot for h in batch], dtype=torch.long, device=device)
        lens = [h.cache_len for h in batch]
        positions = torch.tensor(lens, dtype=torch.long, device=device)
        context = sum(lens) + len(batch)
        t0 = time.perf_counter()
        with self._decode_phase(batch=len(batch), context_tokens=context):
            logits = self.model.decode(tokens, slots, positions, max_position=max(lens))
        self.stats.decode_seconds += time.perf_counter() - t0
        self.stats.decode_steps += 1
        self.stats.decode_context_tokens += context
        self.stats.batch_sizes.append(len(batch))
        for h in batch:
            h.cache_len += 1
        self._sample_and_emit(batch, logits)

    def _generator_for(self, h: GenerationHandle) -> torch.Generator | None:
        if h.params.temperature == 0:
            return None
        seed = h.params.seed if h.params.seed is not None else self._seed * 1_000_003 + int(h.request_id)
        return torch.Generator(device=self.model.device).manual_seed(seed)

    def _sample_and_emit(self, batch: list[GenerationHandle], logits: torch.Tensor) -> None:
        bias = torch.stack([self._no_eos_bias if h.params.ignore_eos else self._allowed_bias for h in batch])
        logits = logits.float() + bias
        greedy = logits.argmax(dim=-1).tolist()
        for i, h in enumerate(batch):
            token = greedy[i]
            if h.params.temperature > 0:
                try:
                    probs = torch.softmax(logits[i] / h.params.temperature, dim=-1)
                    token = int(torch.multinomial(probs, 1, generator=h.generator).item())
                except Exception as e:  # this request's sampling, not the batch's
                    self._fail(h, e)
                    continue
            self._emit(h, token)

    def _emit(self, h: GenerationHandle, token: int) -> None:
        """Hand one sampled token to its request: EOS ends it, ``max_tokens`` ends it after the token."""
        if token == EOS_ID:
            self._finish(h, "stop")
            return
        h.last_token = token
        h.generated += 1
        self.stats.tokens_generated += 1
        h.recorder.tokens(1)
        if h.generated >= h.params.max_tokens:
            self._finish(h, "length", last_token=token)
        else:
            h._deliver([token])

    def _finish(
        self, h: GenerationHandle, reason: str, error: str | None = None, last_token: int | None = None
    ) -> None:
        """Free the slot, record the end, then tell the consumer (with its last token, if any).

        The book-keeping comes first so that a consumer who sees the end also sees the slot freed.
        """
        if h.engine_done:
            return
        h.engine_done = True
        h.recorder.finish(reason, error=error)
        with self._cv:
            if h in self._running:
                self._running.remove(h)
            if h.slot is not None:
                self._free_slots.append(h.slot)
                h.slot = None
            self._active = len(self._running)
            self.stats.finished += 1
            if reason == "abort":
                self.stats.aborted += 1
            self._cv.notify_all()
        final: list[int | _Finish] = [] if last_token is None else [last_token]
        h._deliver([*final, _Finish(reason, error)])

    def _abort_all(self) -> None:
        with self._cv:
            pending = list(self._running) + list(self._waiting)
            self._waiting.clear()
        for h in pending:
            self._finish(h, "abort", error="engine stopped")


@contextlib.contextmanager
def _null_phase(**_: Any) -> Iterator[None]:
    yield
