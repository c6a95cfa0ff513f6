"""How timed steps use CUDA events, on a CPU box: a scripted GPU stands in for the device.

The real driver path runs on an H200 in ``benchmarks/overhead.py``; here the Monitor's hot path, step
core and collector run for real against :class:`perfsdk.testing.ScriptedGpu` (both hot paths and both
cores: the C ones call it through C function pointers), whose events take the GPU clock of the moment they
are recorded; the insides are read through ``perfsdk.testing``'s probe. What is checked: device times come
from the events, a step that follows the previous one closely shares its boundary event (one record per
step), every event goes back to the pool exactly when nothing can still read it, and failures and overflow
lose none.
"""

from __future__ import annotations

import threading
from typing import Any

import pytest

from perfsdk import budget
from perfsdk.hardware import HardwareSpec
from perfsdk.hotpath import CUDA_ERROR_INVALID_CONTEXT
from perfsdk.model import ModelSpec
from perfsdk.monitor import Monitor
from perfsdk.recorder import Events
from perfsdk.testing import FakeClock, MonitorHarness, ScriptedGpu, monitor_harness, probe

MODEL = ModelSpec.named("llama-3-8b")
HW = HardwareSpec(name="test-gpu", memory_bandwidth=4.8e12, flops={"bf16": 1e15})
STEP = "perfsdk_step_seconds"

pytestmark = pytest.mark.usefixtures("each_hot_path")  # the C hot path and core, and the Python reference


def wire(h: MonitorHarness, gpu: ScriptedGpu, capacity: int = 64, chain_gap_us: float = 10.0) -> Events:
    """Rebuild the harness's Monitor on the CUDA path over *gpu*, as Monitor(timing='cuda') would on a GPU;
    its event pool, whichever core keeps it."""
    gpu.pool_capacity = capacity
    h.reopen(gpu=gpu, chain_gap_us=chain_gap_us)
    return h.probe.events


def seconds(mon: Monitor, phase: str = "decode") -> list[float]:
    """The step core's last step times of *phase* (stats())."""
    return list(probe(mon).recent(phase)[2])


class ThreadContextGpu(ScriptedGpu):
    """The driver's per-thread current context: a thread that never made one current gets 201."""

    def __init__(self, ensure: bool = True, capacity: int = 64) -> None:
        super().__init__(capacity)
        self.current = {threading.get_ident()}  # the main thread touched CUDA already
        self.context_calls = 0
        self.capture_checks = 0
        if ensure:
            self.ensure_context = self._ensure

    def _ensure(self) -> None:
        self.context_calls += 1
        self.current.add(threading.get_ident())

    def make_record_on(self) -> Any:
        inner = super().make_record_on()

        def record_on(ev: int, stream: int) -> int:
            if threading.get_ident() not in self.current:
                return CUDA_ERROR_INVALID_CONTEXT
            return int(inner(ev, stream))

        return record_on

    def is_capturing(self, stream: int) -> int:
        if threading.get_ident() not in self.current:
            return CUDA_ERROR_INVALID_CONTEXT
        self.capture_checks += 1
        return 0


def steps(h: MonitorHarness, gpu: ScriptedGpu, clock: FakeClock, gpu_ms: list[float], host_gap_s: float = 0.0) -> None:
    """Run decode steps whose device work takes *gpu_ms* each, *host_gap_s* apart on the host."""
    for ms in gpu_ms:
        with h.monitor.decode(batch=1, context_tokens=10):
            gpu.now_ms += ms
        clock.advance(host_gap_s)


def test_back_to_back_steps_share_boundary_events() -> None:
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        gpu = ScriptedGpu()
        pool = wire(h, gpu)
        steps(h, gpu, clock, [2.0, 3.0, 4.0, 5.0])
        assert h.monitor.flush(5)
        assert gpu.records == 5  # one start, then one end per step
        assert h.count(STEP, phase="decode") == 4
        assert h.sum(STEP, phase="decode") == pytest.approx(0.014)
        # only the last step's end is still held (the next step may start from it)
        assert pool.in_use == 1
        assert h.monitor.stats()["decode"]["mbu_mean"] == pytest.approx(
            sum(budget.decode_step_bytes(MODEL, 10) / (ms / 1e3 * 4.8e12) for ms in (2, 3, 4, 5)) / 4
        )


def test_a_record_that_waits_for_the_launch_queue_still_chains() -> None:
    """Graphs replayed back to back fill the launch queue, so the exit's record waits (here 1 ms, far past
    chain_gap_us): the gap to the next step counts from the record's return, so it still shares the event."""
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        gpu = ScriptedGpu()
        wire(h, gpu)
        gpu.record_waits = (clock, 1e-3)
        steps(h, gpu, clock, [2.0, 3.0, 4.0, 5.0])
        assert h.monitor.flush(5)
        assert gpu.records == 5  # one start, then one end per step
        assert h.sum(STEP, phase="decode") == pytest.approx(0.014)


def test_gpu_work_queued_between_chained_steps_counts_in_the_later_step() -> None:
    """The documented cost of sharing a boundary: the gap's GPU work lands in the next step."""
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        gpu = ScriptedGpu()
        wire(h, gpu)
        steps(h, gpu, clock, [2.0])
        gpu.now_ms += 0.5  # e.g. a sampling kernel launched between the steps, within the gap
        steps(h, gpu, clock, [2.0])
        assert h.monitor.flush(5)
        assert sorted(seconds(h.monitor)) == pytest.approx([0.002, 0.0025])


@pytest.mark.parametrize("why", ["host gap", "chaining off", "other stream"])
def test_steps_that_do_not_follow_closely_get_their_own_start(why: str) -> None:
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        gpu = ScriptedGpu()
        pool = wire(h, gpu, chain_gap_us=0.0 if why == "chaining off" else 10.0)
        for _ in range(4):
            with h.monitor.decode(batch=1, context_tokens=10):
                gpu.now_ms += 2.0
            gpu.now_ms += 0.5  # GPU work between steps: not in any step when each has its own start
            if why == "host gap":
                clock.advance(20e-6)
            if why == "other stream":
                gpu.stream += 1
        assert h.monitor.flush(5)
        assert gpu.records == 8
        assert h.sum(STEP, phase="decode") == pytest.approx(0.008)
        assert pool.in_use == 1  # previous ends went back once the step after them was read


def test_nested_steps_give_back_the_inner_end() -> None:
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        gpu = ScriptedGpu()
        pool = wire(h, gpu)
        for _ in range(3):
            with h.monitor.mixed(prefill_seq_lens=[4], decode_batch=1, context_tokens=10):
                gpu.now_ms += 1.0
                with h.monitor.decode(batch=1, context_tokens=10):
                    gpu.now_ms += 2.0
            clock.advance(1e-3)
        assert h.monitor.flush(5)
        assert h.count(STEP, phase="decode") == 3
        assert h.count(STEP, phase="mixed") == 3
        assert h.sum(STEP, phase="decode") == pytest.approx(0.006)
        assert h.sum(STEP, phase="mixed") == pytest.approx(0.009)
        assert pool.in_use == 1


def test_an_exhausted_pool_counts_steps_without_timing_them_and_recovers() -> None:
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        gpu = ScriptedGpu()
        pool = wire(h, gpu, capacity=3)
        with h.probe.paused_core():  # nothing is read back meanwhile: the pool runs dry
            steps(h, gpu, clock, [1.0] * 5, host_gap_s=1e-3)
            assert h.monitor.stats()["untimed_steps_event_pool_empty"] == 4  # one step fits in 3 events
            assert pool.in_use <= 3
            with h.probe.hooks(clock=clock):  # the hot path bound again: what it counted stays counted
                assert h.monitor.stats()["untimed_steps_event_pool_empty"] == 4
        assert h.monitor.flush(5)
        for _ in range(3):  # each step read before the next: events come back in time
            steps(h, gpu, clock, [1.0], host_gap_s=1e-3)
            assert h.monitor.flush(5)
        assert h.count(STEP, phase="decode") == 4  # the first step and the three after recovery
        assert h.monitor.stats()["decode"]["steps"] == 8


def test_a_failed_record_or_read_loses_no_event() -> None:
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        gpu = ScriptedGpu()
        pool = wire(h, gpu, capacity=32)
        steps(h, gpu, clock, [1.0, 1.0], host_gap_s=1e-3)
        gpu.fail_record_after = gpu.records + 1  # the next step's start records, its end fails
        steps(h, gpu, clock, [1.0], host_gap_s=1e-3)
        gpu.fail_record_after = None
        assert h.monitor.flush(5)
        gpu.fail_elapsed = 1  # the next step's read fails
        steps(h, gpu, clock, [1.0] * 6, host_gap_s=1e-3)
        assert h.monitor.flush(5)
        stats = h.monitor.stats()
        assert stats["decode"]["steps"] == 8  # the failed-record step is not pushed; every other one is
        assert stats["internal_errors"] == 2  # the record, then the read
        assert h.count(STEP, phase="decode") == 2 + 5  # neither failed step has a time
        assert wait_until(lambda: pool.in_use == 1)  # all back but the last end


def wait_until(cond: Any, timeout: float = 5.0) -> bool:
    """The idle collector gives back dropped or failed steps' events on its next idle pass."""
    import time

    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_overflowed_steps_give_their_events_back_when_the_collector_catches_up() -> None:
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock, queue_size=2) as h:
        gpu = ScriptedGpu()
        pool = wire(h, gpu, capacity=64)
        with h.probe.paused_core():
            steps(h, gpu, clock, [1.0] * 10, host_gap_s=1e-3)  # 2 queued, 8 dropped
            assert h.monitor.stats()["dropped_records"] == 8
        assert h.monitor.flush(5)
        assert wait_until(lambda: pool.in_use == 1)


def test_the_collector_waits_once_for_a_run_of_queued_steps() -> None:
    """Five steps queued before the GPU finishes any: one wait (on the newest) resolves all five."""

    class InOrderGpu(ScriptedGpu):
        def __init__(self) -> None:
            super().__init__()
            self.recorded: list[int] = []
            self.done: set[int] = set()

        def make_record_on(self) -> Any:
            inner = super().make_record_on()

            def record_on(ev: int, stream: int) -> int:
                self.recorded.append(ev)
                self.done.discard(ev)
                return int(inner(ev, stream))

            return record_on

        def query(self, ev: int) -> bool:
            return ev in self.done

        def wait(self, ev: int) -> None:
            self.waits += 1
            upto = max(i for i, e in enumerate(self.recorded) if e == ev)
            self.done.update(self.recorded[: upto + 1])

    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        gpu = InOrderGpu()
        wire(h, gpu)
        with h.probe.paused_core():  # queue all five before the core looks at any
            steps(h, gpu, clock, [1.0, 2.0, 3.0, 4.0, 5.0], host_gap_s=1e-3)
        assert h.monitor.flush(5)
        assert gpu.waits == 1
        assert h.count(STEP, phase="decode") == 5
        assert h.sum(STEP, phase="decode") == pytest.approx(0.015)


def test_events_that_are_not_blocking_sync_are_waited_for_by_polling() -> None:
    """perfsdk's own events are default (spinning) events: the core queries them every poll interval and
    never calls synchronize; every step is still read, with its device time."""

    class PollingGpu(ScriptedGpu):
        poll_wait = True

        def __init__(self) -> None:
            super().__init__()
            self.queries: dict[int, int] = {}

        def query(self, ev: int) -> bool:
            self.queries[ev] = self.queries.get(ev, 0) + 1
            return self.queries[ev] % 3 == 0  # "not ready" twice, then done

        def wait(self, ev: int) -> None:
            raise AssertionError("synchronize on an event that is not blocking-sync would spin a CPU")

    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        gpu = PollingGpu()
        pool = wire(h, gpu)
        steps(h, gpu, clock, [1.0, 2.0, 3.0, 4.0, 5.0], host_gap_s=1e-3)
        assert h.monitor.flush(5)
        assert h.count(STEP, phase="decode") == 5
        assert h.sum(STEP, phase="decode") == pytest.approx(0.015)
        assert h.monitor.stats()["internal_errors"] == 0
        assert sum(gpu.queries.values()) > 5
        assert wait_until(lambda: pool.in_use == 1)


def test_a_thread_that_ends_gives_back_its_last_end() -> None:
    """A thread per request (generate() in a Thread): each thread's last end event comes back."""
    import threading

    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        gpu = ScriptedGpu()
        pool = wire(h, gpu, capacity=8)
        for _ in range(12):
            t = threading.Thread(target=steps, args=(h, gpu, clock, [1.0, 1.0]))
            t.start()
            t.join()
            assert h.monitor.flush(5)
        assert h.count(STEP, phase="decode") == 24  # capacity 8 would have run dry after 4 threads
        assert wait_until(lambda: pool.in_use == 0)


def test_an_untimed_step_is_not_folded_into_the_next_timed_one() -> None:
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock, timing_every=2) as h:
        gpu = ScriptedGpu()
        wire(h, gpu)
        steps(h, gpu, clock, [2.0] * 6)  # back to back, 2 ms of GPU work each; every other one timed
        assert h.monitor.flush(5)
        secs = list(seconds(h.monitor))
        assert secs == pytest.approx([0.002] * 3)


def test_two_threads_on_one_stream_do_not_chain_across_each_other() -> None:
    import threading

    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        gpu = ScriptedGpu()
        wire(h, gpu)
        steps(h, gpu, clock, [2.0])
        other = threading.Thread(target=steps, args=(h, gpu, clock, [3.0]))  # same stream, in between
        other.start()
        other.join()
        steps(h, gpu, clock, [2.0])
        assert h.monitor.flush(5)
        secs = sorted(seconds(h.monitor))
        assert secs == pytest.approx([0.002, 0.002, 0.003])


def test_a_step_of_another_thread_during_the_end_record_breaks_the_chain() -> None:
    """A record that releases the GIL (torch's events do) lets another thread run a whole step on the same
    stream between this step's end record and its exit number; the next step must not start at that end."""
    import threading

    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        gpu = ScriptedGpu()
        record_on = gpu.make_record_on()
        cut_in = [False]

        def record_releasing_the_gil(ev: int, stream: int) -> int:
            r = record_on(ev, stream)
            if cut_in[0]:
                cut_in[0] = False
                other = threading.Thread(target=steps, args=(h, gpu, clock, [5.0]))
                other.start()
                other.join()  # the other thread's 5 ms step runs inside this record
            return r

        gpu.make_record_on = lambda: record_releasing_the_gil  # type: ignore[method-assign]
        wire(h, gpu)
        steps(h, gpu, clock, [1.0])
        with h.monitor.decode(batch=1, context_tokens=10):
            gpu.now_ms += 1.0
            cut_in[0] = True  # at this step's end record
        steps(h, gpu, clock, [2.0])
        assert h.monitor.flush(5)
        secs = sorted(seconds(h.monitor))
        assert secs == pytest.approx([0.001, 0.001, 0.002, 0.005])  # not 0.007: no chain over the 5 ms


def test_a_clock_failing_at_exit_gives_the_events_back() -> None:
    class BrokenClock(FakeClock):
        fail = False

        def __call__(self) -> int:
            if self.fail:
                raise RuntimeError("clock source gone")
            return self.now_ns

    clock = BrokenClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        gpu = ScriptedGpu()
        pool = wire(h, gpu, capacity=8)
        for _ in range(5):
            clock.advance(0.01)  # a fresh start each time: two events per step
            with h.monitor.decode(batch=1):
                clock.fail = True
            clock.fail = False
        assert h.monitor.stats()["internal_errors"] == 5
        assert h.monitor.flush(5)
        steps(h, gpu, clock, [1.0])
        assert h.monitor.flush(5)
        assert wait_until(lambda: pool.in_use == 1)  # all back but the last end, held for the next start
        assert h.count(STEP, phase="decode") == 1


def test_failing_nvtx_pop_or_event_creation_loses_no_event() -> None:
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:

        class Gpu(ScriptedGpu):
            fail_at: int | None = None  # the n-th event made fails

            def new(self) -> int:
                if self.fail_at is not None and self.made + 1 == self.fail_at:
                    self.fail_at = None
                    raise RuntimeError("cuEventCreate: out of memory")
                return super().new()

        gpu = Gpu()
        gpu.pool_prefill = 0  # every event is made when a step first needs it
        gpu.fail_at = 2  # the first step's end is made, its start fails
        pool = wire(h, gpu, capacity=32)
        mon = h.monitor
        steps(h, gpu, clock, [1.0], host_gap_s=1e-3)
        assert mon.flush(5)
        assert h.count(STEP, phase="decode") == 0 and mon.stats()["internal_errors"] == 1
        assert pool.in_use == 0  # the end went back

        def bad_pop() -> None:
            raise RuntimeError("nvtx exploded")

        with h.probe.hooks(nvtx_push=lambda *a: None, nvtx_pop=bad_pop):
            steps(h, gpu, clock, [1.0] * 5, host_gap_s=1e-3)
        assert mon.flush(5)
        assert h.count(STEP, phase="decode") == 5  # a failing NVTX pop does not cost the step its time
        assert mon.stats()["internal_errors"] == 6
        assert wait_until(lambda: pool.in_use == 1)  # only the last end, held for the next start


def test_close_while_a_step_is_open_destroys_nothing_in_use() -> None:
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:

        class Gpu(ScriptedGpu):
            def __init__(self) -> None:
                super().__init__()
                self.dead: set[int] = set()
                self.recorded_dead: list[int] = []

            def destroy(self, ev: int) -> None:
                self.dead.add(ev)

            def make_record_on(self) -> Any:
                inner = super().make_record_on()

                def record_on(ev: int, stream: int) -> int:
                    if ev in self.dead:
                        self.recorded_dead.append(ev)
                        return 400  # CUDA_ERROR_INVALID_HANDLE, at best
                    return int(inner(ev, stream))

                return record_on

        gpu = Gpu()
        pool = wire(h, gpu, capacity=32)
        steps(h, gpu, clock, [1.0, 1.0])
        with h.monitor.decode(batch=1, context_tokens=10):  # the engine thread mid-step...
            h.monitor.close()  # ...while shutdown closes the Monitor
        assert gpu.recorded_dead == []
        assert gpu.dead  # the free ones were destroyed
        assert pool.in_use >= 1


def test_a_failed_wait_on_the_newest_step_is_not_blamed_on_the_oldest() -> None:
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:

        class Gpu(ScriptedGpu):
            bad: int | None = None

            def query(self, ev: int) -> bool:
                return False  # nothing reports done: the core must wait

            def wait(self, ev: int) -> None:
                if ev is self.bad:
                    raise RuntimeError("CUDA error while waiting")

        gpu = Gpu()
        wire(h, gpu)
        with h.probe.paused_core():
            steps(h, gpu, clock, [1.0] * 3, host_gap_s=1e-3)
            gpu.bad = max(gpu.t_ms, key=gpu.t_ms.__getitem__)  # the newest step's end: recorded at the latest GPU time
        assert h.monitor.flush(5)
        assert h.count(STEP, phase="decode") == 2  # only the step whose own end failed is untimed
        assert h.monitor.stats()["internal_errors"] == 1


# ---- a new thread whose first CUDA call is a perfsdk step ---------------------------------------
def _steps_on_a_new_thread(h: MonitorHarness, gpu: ScriptedGpu, clock: FakeClock, n: int) -> None:
    t = threading.Thread(target=steps, args=(h, gpu, clock, [2.0] * n))
    t.start()
    t.join()


def test_first_step_on_a_new_thread_is_timed(each_hot_path: str) -> None:
    """A thread with no current CUDA context: the C path's cuStreamIsCapturing and both paths' cuEventRecord
    answer 201 (CUDA_ERROR_INVALID_CONTEXT); the context is made current once and the step is timed."""
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        gpu = ThreadContextGpu()
        wire(h, gpu)
        _steps_on_a_new_thread(h, gpu, clock, 3)
        assert h.count(STEP, phase="decode") == 3
        assert h.sum(STEP, phase="decode") == pytest.approx(0.006)
        assert h.monitor.stats()["internal_errors"] == 0
        assert gpu.context_calls == 1  # once for the thread, then its context stays current
        if each_hot_path == "c":
            assert gpu.capture_checks == 3  # the C path asks the driver about the step's stream


def test_without_a_way_to_make_the_context_current_the_step_is_lost_and_counted() -> None:
    """The control: the same GPU with no ensure_context loses the new thread's steps, loudly."""
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock) as h:
        gpu = ThreadContextGpu(ensure=False)
        wire(h, gpu)
        _steps_on_a_new_thread(h, gpu, clock, 2)
        assert h.count(STEP, phase="decode") == 0
        assert h.monitor.stats()["internal_errors"] == 2


def test_a_negative_device_time_is_counted_and_never_observed() -> None:
    """A device time that reads negative (events recorded out of order on the GPU's clock): the step counts,
    untimed; the fault is counted in perfsdk_internal_errors_total (issue 20, item 12)."""
    clock = FakeClock()
    with monitor_harness(model=MODEL, hardware=HW, clock=clock, strict=False) as h:
        gpu = ScriptedGpu()
        wire(h, gpu)
        steps(h, gpu, clock, [2.0, -1.5, 3.0], host_gap_s=0.001)  # the second step's end reads before its start
        assert h.monitor.flush(10)
        assert h.count(STEP, phase="decode") == 2
        assert h.sum(STEP, phase="decode") == pytest.approx(0.005)
        assert h.monitor.stats()["decode"]["steps"] == 3
        assert h.value("perfsdk_internal_errors_total") == 1
        assert h.probe.events.in_use <= 1  # its events went back all the same (the thread holds its last end)
