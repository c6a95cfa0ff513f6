"""The C step wrappers (``perfsdk._hotpath``): built where they should be, chosen as asked, and exact with
references and exceptions.

Their behaviour is tested where the Python reference's is: ``tests/test_monitor.py`` and
``tests/test_cuda_steps.py`` run every test against both implementations. What is here is what only an
extension can get wrong: a missing build, reference counts, and exceptions raised inside perfsdk's own
callbacks.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from typing import Any

import pytest
from test_cuda_steps import FakeGpu, wait_until, wire

import perfsdk
from perfsdk.errors import ConfigError
from perfsdk.monitor import Phase, _load_hotpath
from perfsdk.testing import FakeClock, monitor_harness

hotpath = _load_hotpath()
needs_c = pytest.mark.skipif(hotpath is None, reason="perfsdk._hotpath is not built here")
STEP = "perfsdk_step_seconds"


def test_the_extension_is_built_in_ci() -> None:
    """CI installs perfsdk with a compiler: there, a missing extension is a build failure, not a skip."""
    if os.environ.get("CI") != "true":
        pytest.skip("only CI insists (a contributor's box may lack a compiler)")
    assert hotpath is not None, "perfsdk._hotpath did not build: see the pip install output"


@needs_c
@pytest.mark.parametrize(("asked", "env", "got"), [
    (None, None, "c"), ("python", None, "python"), (None, "python", "python"), ("c", "python", "c"),
])
def test_hot_path_is_chosen_as_asked(asked: str | None, env: str | None, got: str,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    if env is None:
        monkeypatch.delenv("PERFSDK_HOT_PATH", raising=False)
    else:
        monkeypatch.setenv("PERFSDK_HOT_PATH", env)
    with monitor_harness(hot_path=asked) as h:
        assert h.monitor.hot_path == got
        step = h.monitor.decode(batch=1)
        assert isinstance(step, Phase)  # the C Step is registered as a Phase
        assert (type(step) is Phase) == (got == "python")


def test_bad_hot_path_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="hot_path"):
        perfsdk.Monitor(hot_path="rust", prometheus=False, otel=False)
    if hotpath is None:
        with pytest.raises(ConfigError, match="not built"):
            perfsdk.Monitor(hot_path="c", prometheus=False, otel=False)


@needs_c
def test_odd_sizes_are_validated_like_the_python_path() -> None:
    with monitor_harness(hot_path="c") as h:
        mon = h.monitor
        with pytest.raises(ConfigError, match="batch"):
            mon.decode(batch=-1)
        with pytest.raises(ConfigError, match="context_tokens"):
            mon.decode(batch=1, context_tokens="many")  # type: ignore[arg-type]
        with pytest.raises(ConfigError, match="batch"):
            mon.decode(batch=True)

        class Index:  # an integer scalar that is not an int (numpy's, torch's)
            def __index__(self) -> int:
                return 6

        odd = mon.decode(batch=Index(), context_tokens=2**70)  # validated in Python, still a C step
        assert type(odd) is hotpath.Step and odd.sizes[0] == 6 and odd.sizes[2] == 2**70
        assert type(mon.decode(batch=lambda: 3)) is Phase  # a callable: decorator only, the Python object
        with mon.mixed(prefill_seq_lens=(4, 5), decode_batch=2, context_tokens=100):
            pass
        with mon.prefill(seq_lens=range(1, 4)):  # any sequence
            pass
        assert mon.flush(5)
        assert h.count(STEP, phase="mixed") == 1 and h.count(STEP, phase="prefill") == 1


class _Stream:
    """A stream handle whose references can be counted."""


@needs_c
def test_no_reference_is_leaked_or_lost() -> None:
    """Thousands of steps through every branch leave the events, the stream, the sizes and the Monitor with
    exactly the references they started with."""
    clock = FakeClock()
    with monitor_harness(hot_path="c", clock=clock) as h:
        gpu = FakeGpu()
        stream = _Stream()
        gpu.make_stream = lambda: (lambda: stream)  # type: ignore[method-assign]
        pool = wire(h, gpu, capacity=64)
        mon = h.monitor
        seq_lens = [3, 4]

        def run(n: int) -> None:
            for i in range(n):
                with mon.mixed(prefill_seq_lens=seq_lens, decode_batch=2, context_tokens=40):
                    gpu.now_ms += 1.0
                if i % 3 == 0:
                    clock.advance(0.001)  # past chain_gap_us: a fresh start
                if i % 7 == 0:
                    p = mon.decode(batch=1)
                    with p, p:  # re-entered while open
                        pass
                if i % 11 == 0:
                    try:
                        with mon.decode(batch=1):
                            raise ValueError("user error")
                    except ValueError:
                        pass

        run(300)  # warm: the pool reaches its working size
        assert mon.flush(5)
        gc.collect()
        before = (sys.getrefcount(stream), sys.getrefcount(seq_lens), sys.getrefcount(mon),
                  [sys.getrefcount(e) for e in pool._all])
        run(3000)
        assert mon.flush(5)
        gc.collect()
        after = (sys.getrefcount(stream), sys.getrefcount(seq_lens), sys.getrefcount(mon),
                 [sys.getrefcount(e) for e in pool._all])
        assert after == before
        assert mon.stats()["internal_errors"] == 0


@needs_c
@pytest.mark.parametrize("where", ["nvtx_push", "nvtx_pop", "stream", "record"])
def test_only_exceptions_are_swallowed_not_interrupts(where: str) -> None:
    """perfsdk's own failures are counted, never raised; KeyboardInterrupt still reaches the server, as
    ``except Exception`` lets it through in the Python path."""
    clock = FakeClock()
    with monitor_harness(hot_path="c", clock=clock) as h:
        gpu = FakeGpu()
        wire(h, gpu)
        mon = h.monitor
        raise_now: list[BaseException] = []

        def maybe_raise(*_: Any) -> Any:
            if raise_now:
                raise raise_now[0]
            return 7

        if where.startswith("nvtx"):
            mon._nvtx_on = True
            setattr(mon, "_" + where, maybe_raise)
        elif where == "stream":
            mon._stream = maybe_raise
        else:
            real = mon._record_on

            def record_on(ev: Any, s: Any) -> Any:
                maybe_raise()
                return real(ev, s)

            mon._record_on = record_on
        mon._bind_hot()
        raise_now.append(RuntimeError("perfsdk's own failure"))
        with mon.decode(batch=1):
            pass
        assert mon._errors.count == 1
        raise_now[0] = KeyboardInterrupt()
        with pytest.raises(KeyboardInterrupt), mon.decode(batch=1):
            pass
        raise_now.clear()
        clock.advance(0.01)
        with mon.decode(batch=1):
            gpu.now_ms += 2.0
        assert mon.flush(5)
        assert h.sum(STEP, phase="decode") >= 0.002  # the last step is timed normally


@needs_c
def test_a_thread_state_is_a_c_last_end_that_gives_its_event_back() -> None:
    clock = FakeClock()
    with monitor_harness(hot_path="c", clock=clock) as h:
        gpu = FakeGpu()
        pool = wire(h, gpu)
        mon = h.monitor

        def serve() -> None:
            with mon.decode(batch=1):
                gpu.now_ms += 1.0
            assert type(mon._local.h) is hotpath.LastEnd and mon._local.h.ev is not None

        t = threading.Thread(target=serve)
        t.start()
        t.join()
        assert mon.flush(5)
        with mon.decode(batch=1):  # the collector gives orphans back as it reads on
            pass
        assert mon.flush(5)
        assert wait_until(lambda: pool.in_use == 1)  # only this thread's last end


@needs_c
def test_odd_writes_to_the_c_state_do_not_crash() -> None:
    """What Python code can do to the C objects' attributes is handled, not a crash."""
    clock = FakeClock()
    with monitor_harness(hot_path="c", clock=clock) as h:
        gpu = FakeGpu()
        wire(h, gpu)
        mon = h.monitor
        del mon._hot.window  # a member set to NULL
        with mon.decode(batch=1):
            pass
        mon._hot.window = None
        with mon.decode(batch=1):
            pass
        mon._local.h.ev = None  # "none held", written from Python
        with mon.decode(batch=1):
            pass
        with pytest.raises(TypeError, match="str"):  # not a str: refused by the validating path
            mon._hot.step(b"decode", 1, None, 0, None)
        assert mon.flush(5)
        assert h.count(STEP, phase="decode") == 3
        assert mon.stats()["internal_errors"] == 0


@needs_c
def test_a_step_kept_in_a_cycle_with_its_monitor_is_collected() -> None:
    import weakref

    mon = perfsdk.Monitor(hot_path="c", prometheus=False, otel=False)
    mon.idle_step = mon.decode(batch=1)  # type: ignore[attr-defined]  # Monitor -> Step -> Hot -> Monitor
    mon.close()
    ref = weakref.ref(mon)
    del mon
    gc.collect()
    assert ref() is None
