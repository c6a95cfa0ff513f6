"""The C extension (``perfsdk._native``: hot path and step core): built where it should be, chosen as asked,
and exact with references and exceptions.

Its behaviour is tested where the Python reference's is: ``tests/test_monitor.py``,
``tests/test_cuda_steps.py`` and ``tests/test_stepcore.py`` run every test against both implementations.
What is here is what only an extension can get wrong: a missing build, reference counts, and exceptions
raised inside perfsdk's own callbacks.
"""

from __future__ import annotations

import gc
import os
import sys
import threading
from typing import Any

import pytest
from test_cuda_steps import wait_until, wire

import perfsdk
from perfsdk.errors import ConfigError
from perfsdk.hotpath import Step
from perfsdk.monitor import load_native
from perfsdk.testing import FakeClock, ScriptedGpu, monitor_harness

native = load_native()
needs_c = pytest.mark.skipif(native is None, reason="perfsdk._native is not built here")
STEP = "perfsdk_step_seconds"


def test_the_extension_is_built_in_ci() -> None:
    """CI installs perfsdk with a compiler: there, a missing extension is a build failure, not a skip."""
    if os.environ.get("CI") != "true":
        pytest.skip("only CI insists (a contributor's box may lack a compiler)")
    assert native is not None, "perfsdk._native did not build: see the pip install output"


@needs_c
@pytest.mark.parametrize(
    ("asked", "env", "got"),
    [(None, None, "c"), ("python", None, "python"), (None, "python", "python"), ("c", "python", "c")],
)
def test_hot_path_is_chosen_as_asked(
    asked: str | None, env: str | None, got: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    if env is None:
        monkeypatch.delenv("PERFSDK_HOT_PATH", raising=False)
    else:
        monkeypatch.setenv("PERFSDK_HOT_PATH", env)
    with monitor_harness(hot_path=asked) as h:
        assert h.monitor.hot_path == got
        step = h.monitor.decode(batch=1)
        assert isinstance(step, perfsdk.Step) and isinstance(step, perfsdk.Phase)  # the C Step is registered
        assert (type(step) is Step) == (got == "python")
        assert h.probe.core_implementation == got


def test_bad_hot_path_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="hot_path"):
        perfsdk.Monitor(hot_path="rust", prometheus=False, otel=False)
    if native is None:
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

        with pytest.raises(ConfigError, match="context_tokens"):
            mon.decode(batch=1, context_tokens=2**70)  # beyond any real step
        odd = mon.decode(batch=Index(), context_tokens=2**35)  # validated in Python, still a C step
        assert type(odd) is native.Step and odd.sizes[0] == 6 and odd.sizes[2] == 2**35
        assert type(mon.decode(batch=lambda: 3)) is Step  # a callable: decorator only, the Python object
        with mon.mixed(prefill_seq_lens=(4, 5), decode_batch=2, context_tokens=100):
            pass
        with mon.prefill(seq_lens=range(1, 4)):  # any sequence
            pass
        assert mon.flush(5)
        assert h.count(STEP, phase="mixed") == 1 and h.count(STEP, phase="prefill") == 1


@needs_c
def test_no_reference_is_leaked_or_lost() -> None:
    """Thousands of steps through every branch leave the events, the stream, the sizes and the Monitor with
    exactly the references they started with."""
    clock = FakeClock()
    with monitor_harness(hot_path="c", clock=clock) as h:
        gpu = ScriptedGpu()
        stream = 10**6 + 7  # an int object of its own (a stream handle), whose references can be counted
        gpu.make_stream = lambda: lambda: stream  # type: ignore[method-assign]
        pool = wire(h, gpu, capacity=64)
        mon = h.monitor
        seq_lens = [3, 4]
        objects = h.probe.hot_objects()
        parts = (objects["core"], objects["hot"], objects["state"], gpu)

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
        before = (
            sys.getrefcount(stream),
            sys.getrefcount(seq_lens),
            sys.getrefcount(mon),
            [sys.getrefcount(p) for p in parts],
            pool.in_use,
        )
        run(3000)
        assert mon.flush(5)
        gc.collect()
        after = (
            sys.getrefcount(stream),
            sys.getrefcount(seq_lens),
            sys.getrefcount(mon),
            [sys.getrefcount(p) for p in parts],
            pool.in_use,
        )
        assert after == before
        assert mon.stats()["internal_errors"] == 0


@needs_c
@pytest.mark.parametrize("where", ["nvtx_push", "nvtx_pop", "stream", "clock"])
def test_only_exceptions_are_swallowed_not_interrupts(where: str) -> None:
    """perfsdk's own failures are counted, never raised; KeyboardInterrupt still reaches the server, as
    ``except Exception`` lets it through in the Python path."""
    clock = FakeClock()
    with monitor_harness(hot_path="c", clock=clock) as h:
        gpu = ScriptedGpu()
        wire(h, gpu)
        mon = h.monitor
        raise_now: list[BaseException] = []

        def maybe_raise(*_: Any) -> Any:
            if raise_now:
                raise raise_now[0]
            return 7

        def failing_clock() -> int:
            maybe_raise()
            return clock()

        hooks: dict[str, Any] = {"clock": failing_clock} if where == "clock" else {where: maybe_raise}
        with h.probe.hooks(**hooks):
            raise_now.append(RuntimeError("perfsdk's own failure"))
            with mon.decode(batch=1):
                pass
            assert mon.stats()["internal_errors"] == 1
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
        gpu = ScriptedGpu()
        pool = wire(h, gpu)
        mon = h.monitor

        def serve() -> None:
            with mon.decode(batch=1):
                gpu.now_ms += 1.0
            local = h.probe.hot_objects()["state"].local
            assert type(local.h) is native.LastEnd and local.h.ev is not None

        t = threading.Thread(target=serve)
        t.start()
        t.join()
        assert mon.flush(5)
        with mon.decode(batch=1):  # the thread's end went back when the thread ended
            pass
        assert mon.flush(5)
        assert wait_until(lambda: pool.in_use == 1)  # only this thread's last end


@needs_c
def test_odd_writes_to_the_c_state_do_not_crash() -> None:
    """What Python code can do to the C objects' attributes is handled, not a crash."""
    clock = FakeClock()
    with monitor_harness(hot_path="c", clock=clock) as h:
        gpu = ScriptedGpu()
        wire(h, gpu)
        mon = h.monitor
        hot, state = h.probe.hot_objects()["hot"], h.probe.hot_objects()["state"]
        del hot.window  # a member set to NULL
        with mon.decode(batch=1):
            pass
        hot.window = None
        with mon.decode(batch=1):
            pass
        state.local.h.ev = None  # "none held", written from Python
        with mon.decode(batch=1):
            pass
        with pytest.raises(KeyError):  # not a phase name: refused by the validating path
            hot.step(b"decode", 1, None, 0, None)
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


@needs_c
@pytest.mark.slow
def test_the_stub_describes_the_extension_exactly() -> None:
    """``perfsdk/_native.pyi`` types every class, method, attribute, function and constant of ``perfsdk._native``,
    with the signatures the C code parses (mypy's stubtest imports the module and compares): strict mypy then
    checks the Python that calls into C."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    assert os.path.exists(os.path.join(root, "perfsdk", "_native.pyi"))  # stubtest finds nothing to check without
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, "-m", "mypy.stubtest", "perfsdk._native"],
        capture_output=True,
        text=True,
        env=env,
        cwd=root,
        timeout=240,
        check=False,
    )
    assert out.returncode == 0, out.stdout + out.stderr
