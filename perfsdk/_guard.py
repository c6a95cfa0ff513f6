"""Instrumentation never breaks the host: count, log once, carry on.

Every entry point perfsdk exposes to serving code catches its *own* exceptions
and hands them to :meth:`ErrorGuard.record`; the count reaches
``perfsdk_internal_errors_total`` through the collector, and each distinct site
is logged once (with its traceback) so a persistent fault does not flood logs.
"""

from __future__ import annotations

import logging

__all__ = ["ErrorGuard"]

log = logging.getLogger("perfsdk")


class ErrorGuard:
    __slots__ = ("_logged", "count")

    def __init__(self) -> None:
        self.count = 0
        self._logged: set[str] = set()

    def log_once(self, where: str, message: str) -> None:
        """Log a failure counted elsewhere (the C step core counts its own), once per site."""
        if where not in self._logged:
            self._logged.add(where)
            log.error(
                "perfsdk internal error in %s: %s (counted in perfsdk_internal_errors_total; logged once "
                "per site; serving continues)",
                where,
                message,
            )

    def count_problem(self, where: str, message: str, n: int = 1) -> None:
        """Count *n* faults found at *where* with no exception to show (a negative duration), logging once."""
        self.count += n
        self.log_once(where, message)

    def reset(self) -> None:
        """Start over (a forked child: the parent's errors are the parent's to count and log)."""
        self.count = 0
        self._logged = set()

    def record(self, exc: BaseException, where: str) -> None:
        self.count += 1
        if where not in self._logged:
            self._logged.add(where)
            log.error(
                "perfsdk internal error in %s (counted in perfsdk_internal_errors_total; logged once per site; "
                "serving continues)",
                where,
                exc_info=(type(exc), exc, exc.__traceback__),
            )
