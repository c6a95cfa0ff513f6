"""One base for perfsdk's engine hooks, in the manner of OpenTelemetry's ``BaseInstrumentor``.

A hook declares the engine releases it supports as data, patches through ``wrapt``, and undoes itself::

    class VllmWorkerInstrumentor(Instrumentor):
        name = "vLLM worker hook"
        _instruments = ("vllm >= 0.26, < 0.34",)

        def _install(self) -> None:    # patch: wrap(...)
            ...
        def _uninstall(self) -> None:  # undo exactly that: unwrap(...)
            ...

    hook = VllmWorkerInstrumentor()  # one per process (every call returns the same object)
    hook.install()                   # True when installed (now or before); never raises
    hook.uninstall()                 # idempotent; the engine as it was

:meth:`Instrumentor.install` does nothing under ``PERFSDK_ENABLED=0`` or when already installed; checks
the installed engine against ``_instruments`` (:meth:`Instrumentor.dependency_problem`) before anything is
patched, and on a mismatch logs which range it supports and patches nothing; runs ``_install`` inside a
guard — a failure is logged, whatever it had patched is undone, and the engine runs on untouched.

:func:`wrap` patches ``obj.name`` with ``wrapt.wrap_function_wrapper`` and marks the wrapper as perfsdk's;
:func:`unwrap` restores the original only where the attribute still carries that marker (another
library's wrapper, put on top later, is left alone). :func:`guard` runs a hook body so that nothing it does
wrong reaches the engine: the failure is counted in the Monitor's ``perfsdk_internal_errors_total``
(:meth:`perfsdk.Monitor.count_error`) and logged once per site.

The requirement syntax is PEP 440's, for the part the hooks need: a distribution name and comma-separated
``>=``, ``>``, ``<=``, ``<``, ``==``, ``!=`` clauses over release numbers (a local part such as ``+cu129``
and pre-release tags are ignored: ``0.33.0rc1`` counts as 0.33.0).
"""

from __future__ import annotations

import contextlib
import logging
import operator
import re
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as dist_version
from typing import TYPE_CHECKING, Any, ClassVar

import wrapt

from perfsdk.engines._common import count_error, enabled

if TYPE_CHECKING:
    from perfsdk.monitor import Monitor

__all__ = ["Instrumentor", "Requirement", "guard", "is_ours", "unwrap", "wrap"]

log = logging.getLogger("perfsdk")

_MARKER = "_perfsdk_hook"  # on perfsdk's wrapper functions: what unwrap restores
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    ">=": operator.ge,
    ">": operator.gt,
    "<=": operator.le,
    "<": operator.lt,
    "==": operator.eq,
    "!=": operator.ne,
}
_CLAUSE = re.compile(r"\s*(>=|<=|==|!=|>|<)\s*(\d+(?:\.\d+)*)\s*")
_RELEASE = re.compile(r"\s*v?(\d+(?:\.\d+)*)")


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


def _compare(op: str, version: tuple[int, ...], bound: tuple[int, ...]) -> bool:
    n = max(len(version), len(bound))  # 0.33 == 0.33.0
    return _OPS[op](version + (0,) * (n - len(version)), bound + (0,) * (n - len(bound)))


@dataclass(frozen=True)
class Requirement:
    """``"vllm >= 0.26, < 0.34"``: a distribution and the versions of it a hook supports."""

    name: str
    clauses: tuple[tuple[str, tuple[int, ...]], ...]

    @classmethod
    def parse(cls, text: str) -> Requirement:
        m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(.*)", text)
        if m is None or not m.group(2).strip():
            raise ValueError(f"not a requirement with a version range: {text!r}")
        clauses = []
        for part in m.group(2).split(","):
            c = _CLAUSE.fullmatch(part)
            if c is None:
                raise ValueError(f"{text!r}: cannot read the clause {part.strip()!r}")
            clauses.append((c.group(1), _release(c.group(2))))
        return cls(m.group(1), tuple(clauses))

    def __str__(self) -> str:
        return self.name + ",".join(f"{op}{'.'.join(map(str, v))}" for op, v in self.clauses)

    def problem(self, version: str | None) -> str | None:
        """None when *version* satisfies every clause, else a message naming the supported range."""
        m = _RELEASE.match(version or "")
        if m is None:
            return f"cannot read {self.name}'s version ({version!r}); perfsdk supports {self}"
        v = _release(m.group(1))
        if not all(_compare(op, v, bound) for op, bound in self.clauses):
            return f"{self.name} {version} is outside the range perfsdk's {self.name} integration supports ({self})"
        return None


def installed_version(name: str) -> str | None:
    """The version of distribution *name* as the engine reports it: its module's ``__version__`` if the engine
    is imported (it is, where its plugin loader calls a hook), else its distribution's metadata; None if absent."""
    module = sys.modules.get(name.replace("-", "_"))
    version = getattr(module, "__version__", None) if module is not None else None
    if isinstance(version, str) and version:
        return version
    try:
        return dist_version(name)
    except PackageNotFoundError:
        return None


class Instrumentor:
    """The lifecycle every engine hook shares (module docstring); a subclass writes ``_install``/``_uninstall``.

    One object per subclass and process (``Instrumentor()`` returns it), as OpenTelemetry's instrumentors.
    """

    name: ClassVar[str] = "engine hook"
    _instruments: ClassVar[tuple[str, ...]] = ()
    _instance: ClassVar[Instrumentor | None] = None
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __new__(cls) -> Any:
        if cls.__dict__.get("_instance") is None:
            with Instrumentor._lock:
                if cls.__dict__.get("_instance") is None:
                    obj = super().__new__(cls)
                    obj._installed = False
                    cls._instance = obj
        return cls.__dict__["_instance"]

    _installed: bool

    @property
    def installed(self) -> bool:
        """Whether :meth:`install` has patched the engine (in this process) and :meth:`uninstall` has not undone it."""
        return self._installed

    @classmethod
    def requirements(cls) -> tuple[Requirement, ...]:
        return tuple(Requirement.parse(r) for r in cls._instruments)

    def dependency_problem(self, versions: dict[str, str | None] | None = None) -> str | None:
        """None when every ``_instruments`` requirement is met, else why not (the first that is not).

        *versions*: ``{distribution: version}`` to check instead of what is installed.
        """
        for req in self.requirements():
            given = versions is not None and req.name in versions
            problem = req.problem(versions[req.name] if versions is not None and given else installed_version(req.name))
            if problem is not None:
                return problem
        return None

    def install(self) -> bool:
        """Patch the engine; True when it is patched (by this call or an earlier one). Never raises."""
        with Instrumentor._lock:
            if self._installed:
                return True
            try:
                if not enabled():
                    return False
                problem = self.dependency_problem()
            except Exception as e:  # a bad PERFSDK_ENABLED, an engine that cannot say its version
                log.error("perfsdk: %s not installed: %s", self.name, e)
                return False
            if problem is not None:
                log.warning(
                    "perfsdk: %s: the %s is not installed (no device-time steps, MBU or MFU)", problem, self.name
                )
                return False
            try:
                self._install()
            except Exception as e:
                log.error("perfsdk: %s not installed (the engine runs on without it): %s", self.name, e)
                with contextlib.suppress(Exception):
                    self._uninstall()
                return False
            self._installed = True
            return True

    def uninstall(self) -> None:
        """Undo :meth:`install` (idempotent): restore what perfsdk patched, where it still carries perfsdk's
        marker, and let go of whatever the hook attached since. Never raises."""
        with Instrumentor._lock:
            if not self._installed:
                return
            self._installed = False
            try:
                self._uninstall()
            except Exception as e:
                log.error("perfsdk: %s not fully removed: %s", self.name, e)

    def _install(self) -> None:
        raise NotImplementedError

    def _uninstall(self) -> None:
        raise NotImplementedError


def wrap(obj: Any, name: str, wrapper: Callable[[Any, Any, tuple[Any, ...], dict[str, Any]], Any]) -> Any:
    """``obj.name`` wrapped by *wrapper* ``(wrapped, instance, args, kwargs)`` through
    ``wrapt.wrap_function_wrapper``, marked as perfsdk's (:func:`unwrap` removes it). Returns the wrapper object."""
    with contextlib.suppress(AttributeError, TypeError):  # a bound method takes no attributes: mark its function
        setattr(getattr(wrapper, "__func__", wrapper), _MARKER, True)
    return wrapt.wrap_function_wrapper(obj, name, wrapper)


def is_ours(attr: Any) -> bool:
    """Whether *attr* is a wrapper :func:`wrap` made."""
    if not isinstance(attr, wrapt.FunctionWrapper):
        return False
    w = getattr(attr, "_self_wrapper", None)
    return bool(getattr(getattr(w, "__func__", w), _MARKER, False))


def unwrap(obj: Any, name: str) -> bool:
    """Put back what :func:`wrap` replaced at ``obj.name``, only if the attribute there is still perfsdk's
    wrapper; True when it did. An instance attribute is deleted (the class's method shows again)."""
    attr = obj.__dict__.get(name) if hasattr(obj, "__dict__") else None
    if attr is None:
        attr = getattr(obj, name, None)
    if attr is None or not is_ours(attr):
        return False
    if not isinstance(obj, type) and name in getattr(obj, "__dict__", {}):
        delattr(obj, name)
    else:
        setattr(obj, name, attr.__wrapped__)
    return True


@contextlib.contextmanager
def guard(monitor: Monitor | None, where: str) -> Iterator[None]:
    """Run a hook body so that nothing it raises reaches the engine: an ``Exception`` is counted in
    *monitor*'s ``perfsdk_internal_errors_total`` and logged once per *where* (logged alone without one)."""
    try:
        yield
    except Exception as e:
        count_error(monitor, e, where)
