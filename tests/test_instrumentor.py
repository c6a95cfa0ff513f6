"""The base of perfsdk's engine hooks (perfsdk/engines/instrumentor.py) and Monitor.count_error, on a real class
patched through wrapt and real installed distributions (wrapt, prometheus-client) as the "engine"."""

from __future__ import annotations

import logging
import threading
from typing import Any, ClassVar

import pytest
import wrapt

from perfsdk.engines.instrumentor import Instrumentor, Requirement, guard, installed_version, is_ours, unwrap, wrap
from perfsdk.testing import monitor_harness


class Engine:
    """What an engine hook patches: a class method called on every step."""

    def step(self, n: int) -> int:
        return n + 1


ORIGINAL = Engine.__dict__["step"]
SEEN: list[int] = []


def timed(wrapped: Any, instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    SEEN.append(args[0])
    return wrapped(*args, **kwargs)


class EngineHook(Instrumentor):
    name = "test engine hook"
    _instruments: ClassVar[tuple[str, ...]] = ("wrapt >= 1.14, < 3",)  # a real distribution, installed here
    installs = 0

    def _install(self) -> None:
        type(self).installs += 1
        wrap(Engine, "step", timed)

    def _uninstall(self) -> None:
        unwrap(Engine, "step")


class FutureEngineHook(Instrumentor):
    name = "future engine hook"
    _instruments: ClassVar[tuple[str, ...]] = ("prometheus-client >= 999",)

    def _install(self) -> None:  # never reached: the requirement is checked first
        wrap(Engine, "step", timed)

    def _uninstall(self) -> None:
        unwrap(Engine, "step")


class BrokenHook(Instrumentor):
    name = "broken hook"
    _instruments: ClassVar[tuple[str, ...]] = ("wrapt >= 1",)

    def _install(self) -> None:
        wrap(Engine, "step", timed)
        raise RuntimeError("half-way")

    def _uninstall(self) -> None:
        unwrap(Engine, "step")


@pytest.fixture(autouse=True)
def clean() -> Any:
    SEEN.clear()
    yield
    for hook in (EngineHook(), FutureEngineHook(), BrokenHook()):
        hook.uninstall()
    Engine.step = ORIGINAL  # type: ignore[method-assign]


def test_install_is_idempotent_and_uninstall_restores_the_original() -> None:
    hook = EngineHook()
    assert EngineHook() is hook  # one per process, as OpenTelemetry's instrumentors
    before = EngineHook.installs
    assert hook.install() and hook.install()
    assert EngineHook.installs == before + 1 and hook.installed
    assert is_ours(Engine.__dict__["step"]) and not is_ours(Engine.__dict__["step"].__wrapped__)  # wrapped once
    assert Engine().step(1) == 2 and SEEN == [1]
    hook.uninstall()
    hook.uninstall()
    assert Engine.__dict__["step"] is ORIGINAL and not hook.installed
    assert Engine().step(2) == 3 and SEEN == [1]


def test_the_wrapped_method_looks_like_the_original() -> None:
    import inspect

    EngineHook().install()
    assert inspect.signature(Engine.step) == inspect.signature(ORIGINAL)
    assert Engine.step.__name__ == "step" and Engine.step.__qualname__ == "Engine.step"


def test_requirements_are_checked_before_anything_is_patched(caplog: pytest.LogCaptureFixture) -> None:
    hook = FutureEngineHook()
    with caplog.at_level(logging.WARNING, logger="perfsdk"):
        assert not hook.install()
    assert Engine.__dict__["step"] is ORIGINAL
    assert (
        "is outside the range perfsdk's prometheus-client integration supports (prometheus-client>=999)" in caplog.text
    )
    assert "future engine hook is not installed" in caplog.text


def test_a_failing_install_is_undone_logged_and_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="perfsdk"):
        assert not BrokenHook().install()
    assert Engine.__dict__["step"] is ORIGINAL and not BrokenHook().installed
    assert "broken hook not installed" in caplog.text and "half-way" in caplog.text


def test_perfsdk_enabled_0_installs_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PERFSDK_ENABLED", "0")
    assert not EngineHook().install()
    assert Engine.__dict__["step"] is ORIGINAL


def test_uninstall_restores_only_what_carries_perfsdks_marker() -> None:
    hook = EngineHook()
    hook.install()
    ours = Engine.__dict__["step"]
    wrapt.wrap_function_wrapper(Engine, "step", lambda wrapped, instance, args, kwargs: wrapped(*args, **kwargs))
    theirs = Engine.__dict__["step"]
    hook.uninstall()
    assert Engine.__dict__["step"] is theirs and theirs.__wrapped__ is ours  # another library's, left alone
    assert not unwrap(Engine, "step")  # the top is not perfsdk's


def test_an_instance_patch_is_undone_by_deleting_it() -> None:
    engine = Engine()
    wrap(engine, "step", timed)
    assert "step" in vars(engine) and engine.step(5) == 6 and SEEN == [5]
    assert Engine().step(1) == 2 and SEEN == [5]  # only this instance
    assert unwrap(engine, "step") and "step" not in vars(engine)
    assert engine.step(7) == 8 and SEEN == [5]


@pytest.mark.parametrize(
    ("version", "problem"),
    [
        ("0.26.0", None),
        ("0.33.9", None),
        ("0.33.0+cu129", None),
        ("0.30.0rc1", None),
        ("0.26", None),
        ("0.25.9", "vllm 0.25.9 is outside the range perfsdk's vllm integration supports (vllm>=0.26,<0.34)"),
        ("0.34.0", "outside"),
        ("1.0.0", "outside"),
        (None, "cannot read vllm's version (None)"),
        ("dev", "cannot read vllm's version ('dev'); perfsdk supports vllm>=0.26,<0.34"),
    ],
)
def test_a_requirement_reads_release_numbers(version: str | None, problem: str | None) -> None:
    got = Requirement.parse("vllm >= 0.26, < 0.34").problem(version)
    assert got is None if problem is None else problem in (got or "")


@pytest.mark.parametrize("text", ["vllm", "vllm ~= 0.26", "vllm >= 0.26,", ">= 0.26"])
def test_a_requirement_that_cannot_be_read_is_refused(text: str) -> None:
    with pytest.raises(ValueError, match=r"requirement|clause"):
        Requirement.parse(text)


def test_installed_versions_come_from_the_module_or_the_distribution() -> None:
    assert installed_version("wrapt") == wrapt.__version__
    from importlib.metadata import version

    assert installed_version("prometheus-client") == version("prometheus-client")
    assert installed_version("no-such-distribution-here") is None


def test_monitor_count_error_counts_and_logs_once_per_site(caplog: pytest.LogCaptureFixture) -> None:
    with monitor_harness() as h, caplog.at_level(logging.ERROR, logger="perfsdk"):
        mon = h.monitor
        for i in range(3):
            mon.count_error(ValueError(f"bad {i}"), "my engine hook")
        mon.count_error(KeyError("other"), "my stat logger")
        assert mon.flush(5)
        assert h.value("perfsdk_internal_errors_total") == 4
        assert mon.stats()["internal_errors"] == 4
        assert caplog.text.count("perfsdk internal error in my engine hook") == 1
        assert "bad 0" in caplog.text and "bad 1" not in caplog.text  # the first traceback, once
        assert caplog.text.count("perfsdk internal error in my stat logger") == 1


def test_guard_keeps_a_hook_body_failure_from_the_engine() -> None:
    with monitor_harness() as h:
        ran = []
        with guard(h.monitor, "engine hook body"):
            ran.append(1)
            raise RuntimeError("perfsdk bug")
        with guard(None, "before a Monitor exists"):  # logged alone
            raise RuntimeError("early")
        assert ran == [1] and h.monitor.stats()["internal_errors"] == 1
        with pytest.raises(KeyboardInterrupt), guard(h.monitor, "engine hook body"):
            raise KeyboardInterrupt  # not an Exception: the engine's to handle


def test_concurrent_installs_patch_once() -> None:
    before = EngineHook.installs
    threads = [threading.Thread(target=EngineHook().install) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert EngineHook.installs == before + 1 and not is_ours(Engine.__dict__["step"].__wrapped__)
