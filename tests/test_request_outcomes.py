"""How a request ended (issue 20, item 14): ``perfsdk_requests_total{finish_reason}`` and the span's attribute.

Before, a client that hung up mid-stream was recorded as an error (``GeneratorExit``), a cancelled task as a
``CancelledError`` error, and no series said how requests ended, so nothing could alert on real failures.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from perfsdk.records import FINISH_REASONS
from perfsdk.testing import MonitorHarness, monitor_harness

REQUESTS = "perfsdk_requests_total"


def _by_reason(h: MonitorHarness) -> dict[str, float]:
    return {r: h.value(REQUESTS, finish_reason=r) or 0.0 for r in FINISH_REASONS}


def _only(h: MonitorHarness, **expected: float) -> None:
    assert _by_reason(h) == {r: expected.get(r, 0.0) for r in FINISH_REASONS}


def test_every_reason_has_a_series_at_zero_from_the_start() -> None:
    with monitor_harness() as h:
        h.flush()
        assert {r: h.value(REQUESTS, finish_reason=r) for r in FINISH_REASONS} == dict.fromkeys(FINISH_REASONS, 0.0)


def test_a_stream_closed_by_its_client_is_an_abort_not_an_error() -> None:
    with monitor_harness() as h:
        mon = h.monitor

        def stream() -> Iterator[int]:  # a streaming response's body, as a server writes it
            with mon.request(prompt_tokens=4) as req:
                for i in range(10):
                    req.tokens(1)
                    yield i

        body = stream()
        next(body)
        next(body)
        body.close()  # the client went away: the server closes the generator (GeneratorExit inside the with)
        _only(h, abort=1)
        [span] = [s for s in h.spans() if s.name.startswith("text_completion")]
        assert span.attributes["gen_ai.response.finish_reasons"] == ("abort",)
        assert "error.type" not in span.attributes and span.status.status_code.name == "UNSET"


def test_a_cancelled_task_is_cancelled_not_an_error() -> None:
    with monitor_harness() as h:
        mon = h.monitor
        started = asyncio.Event()

        async def handler() -> None:
            with mon.request(prompt_tokens=4) as req:
                req.tokens(1)
                started.set()
                await asyncio.sleep(60)

        async def main() -> None:
            task = asyncio.create_task(handler())
            await started.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        _only(h, cancelled=1)
        [span] = [s for s in h.spans() if s.name.startswith("text_completion")]
        assert span.attributes["gen_ai.response.finish_reasons"] == ("cancelled",)
        assert "error.type" not in span.attributes and span.status.status_code.name == "UNSET"


def test_real_errors_reasons_and_other_are_told_apart() -> None:
    with monitor_harness() as h:
        mon = h.monitor
        with pytest.raises(ValueError), mon.request(prompt_tokens=4):
            raise ValueError("the engine failed")
        with mon.request(prompt_tokens=4):
            pass
        mon.request(prompt_tokens=4).finish("length")
        mon.request(prompt_tokens=4).finish("tool_calls")
        mon.request(prompt_tokens=4).finish("repetition")  # vLLM's, outside the bounded set
        mon.request(prompt_tokens=4).finish("abort")
        mon.request(prompt_tokens=4).finish("stop", error=GeneratorExit())  # the same as a hang-up
        mon.request(prompt_tokens=4).finish("stop", error="timed out upstream")
        # what an engine timed itself (vLLM's stat logger passes stop/length/abort/error/repetition)
        mon.record_finished(e2e_s=0.5, output_tokens=3, finish_reason="abort")
        mon.record_finished(e2e_s=0.5, output_tokens=3, finish_reason="error", error="vllm: request error")
        mon.record_finished(e2e_s=0.5, output_tokens=3, finish_reason="LENGTH")
        _only(h, stop=1, length=2, tool_calls=1, abort=3, error=3, other=1)
        spans = [s for s in h.spans() if s.name.startswith("text_completion")]
        [other] = [s for s in spans if s.attributes["gen_ai.response.finish_reasons"] == ("other",)]
        assert other.attributes["perfsdk.raw_finish_reason"] == "repetition"
        errors = [s for s in spans if s.attributes["gen_ai.response.finish_reasons"] == ("error",)]
        assert len(errors) == 3 and all("error.type" in s.attributes for s in errors)
        assert all(s.status.status_code.name == "ERROR" for s in errors)


def test_a_client_that_disconnects_from_a_real_starlette_stream_is_not_an_error() -> None:
    """A real uvicorn server on loopback: the body is an async generator under ``with mon.request()``, the
    client reads two chunks and closes the connection; Starlette cancels the response."""
    pytest.importorskip("fastapi")
    httpx = pytest.importorskip("httpx")
    from fastapi import FastAPI
    from fastapi.responses import StreamingResponse

    from perfsdk.demo.server import DemoServer

    with monitor_harness() as h:
        mon = h.monitor
        app = FastAPI()
        ended = threading.Event()

        @app.get("/stream")
        async def stream() -> StreamingResponse:
            async def body() -> AsyncIterator[bytes]:
                try:
                    with mon.request(prompt_tokens=4) as req:
                        for _ in range(10_000):
                            req.tokens(1)
                            yield b"data: token\n\n"
                            await asyncio.sleep(0.01)
                finally:
                    ended.set()

            return StreamingResponse(body(), media_type="text/event-stream")

        with DemoServer(app, port=0) as server, httpx.Client(timeout=30) as client:
            with client.stream("GET", f"{server.base_url}/stream") as r:
                lines = r.iter_lines()
                assert next(lines).startswith("data:")
                assert next(lines) == "" and next(lines).startswith("data:")
            # leaving the block closed the connection mid-stream
            assert ended.wait(30)
        reasons: dict[str, Any] = _by_reason(h)
        assert reasons["error"] == 0, reasons
        assert reasons["abort"] + reasons["cancelled"] == 1, reasons
        [span] = [s for s in h.spans() if s.name.startswith("text_completion")]
        assert span.attributes["gen_ai.response.finish_reasons"][0] in ("abort", "cancelled")
        assert "error.type" not in span.attributes  # before: GeneratorExit or CancelledError, an error
