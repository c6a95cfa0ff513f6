"""A scripted OpenAI-compatible SSE server on loopback, for the bench tests.

It serves ``/v1/completions`` and ``/v1/chat/completions`` from a background
thread with its own event loop, so a blocking ``benchmark()`` call in the test
thread can talk to it over real HTTP. Each request's behaviour comes from
``plan``, indexed by the order in which requests arrive (modulo its length):

``ok``           role chunk (chat), then ``max_tokens`` one-byte tokens, usage, ``[DONE]``
``http500``      HTTP 500 with a JSON error body
``malformed``    two good tokens, then ``data: {not json``
``cut``          two good tokens, then the TCP connection is closed mid-stream
``no_done``      all tokens and usage, a clean end of the body, but no ``[DONE]``
``error_event``  one token, then ``data: {"error": {...}}``
``stall``        one token, then silence until the client goes away (or ``stall_s``)

Hostile responses (each must cost one failed request, never the run):

``deep``           one token, then ``data: [[[…]]]`` nested 100,000 deep
``deep_error``     one token, then an error event whose message is nested 50,000 deep
``long_line``      one token, then one ``data:`` line of 1 MiB
``huge_usage``     every token, then ``usage.completion_tokens`` with 401 digits
``negative_usage`` every token, then ``usage.completion_tokens: -5``
``giant_event``    one token, then one event of 17 MiB of valid JSON over many ``data:`` lines
``escape_error``   one token, then an error message with a terminal escape and a lone surrogate
``rot13_500``      HTTP 500 whose Content-Type declares ``charset=rot13`` (not a text codec)
``huge_500``       HTTP 500 with a 64 MiB body
``endless``        one token, then text chunks as fast as the socket takes them, never ``[DONE]``, until
                   the client goes (or ``stall_s``); the chunks go out a thousand to a write
``flood``          ``flood_chunks`` one-byte text chunks (a thousand to a write) whatever ``max_tokens``
                   says, then usage and ``[DONE]``

The server counts requests, the requests in flight (and the maximum), how
many clients disconnected while it was still streaming to them, and the text
chunks it sent on ``endless`` and ``flood`` streams (``hostile_chunks_sent``).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

__all__ = ["HOSTILE", "FakeOpenAIServer", "unused_port"]

_DEPTH = 100_000  # far beyond the interpreter's recursion limit (1,000)
_BATCH = 1000  # events per write on the endless and flood streams: many tiny chunks per TCP segment

#: Raw ``data:`` payloads of the hostile stream behaviours, sent after one good token (the ``*_usage``
#: ones after every token, in place of the usage event).
HOSTILE: dict[str, list[str]] = {
    "deep": ["[" * _DEPTH + "]" * _DEPTH],
    "deep_error": ['{"error": {"message": ' + '{"m": ' * (_DEPTH // 2) + "1" + "}" * (_DEPTH // 2) + "}}"],
    # one line of 1 MiB: beyond aiohttp's 512 KiB line limit, which raises its own LineTooLong
    "long_line": ['{"choices": [{"index": 0, "text": "' + "x" * 2**20 + '"}]}'],
    "huge_usage": ['{"choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": 1' + "0" * 400 + "}}"],
    "negative_usage": ['{"choices": [], "usage": {"prompt_tokens": 16, "completion_tokens": -5}}'],
    # 17 MiB of valid JSON, the newlines between array items splitting it into data: lines
    "giant_event": [
        '{"choices": [{"index": 0, "text": "x"}], "pad": [' + ("0," * 2048 + "\n") * (17 * 2**20 // 4097) + "0]}"
    ],
    "escape_error": ['{"error": {"message": "bad\\u001b[2J\\ud800 thing"}}'],
}


def unused_port() -> int:
    """A loopback port nobody listens on (bound and released), for the server-down case."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class FakeOpenAIServer:
    def __init__(
        self,
        plan: Sequence[str] = ("ok",),
        *,
        token_delay_s: float = 0.002,
        first_token_delay_s: float = 0.0,
        stall_s: float = 30.0,
        send_usage: bool = True,
        flood_chunks: int = 200_000,
    ) -> None:
        self.plan = list(plan)
        self.token_delay_s = token_delay_s
        self.first_token_delay_s = first_token_delay_s
        self.stall_s = stall_s
        self.send_usage = send_usage
        self.flood_chunks = flood_chunks
        self.hostile_chunks_sent = 0
        self._lock = threading.Lock()
        self.requests = 0
        self.in_flight = 0
        self.max_in_flight = 0
        self.disconnects = 0
        self.bodies: list[dict[str, Any]] = []
        self.behaviours: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- lifecycle ---------------------------------------------------------------------------

    def __enter__(self) -> FakeOpenAIServer:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake server did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None
        assert self._runner is not None
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        assert self._thread is not None
        self._thread.join(10)

    def _serve(self, ready: threading.Event) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        app = web.Application()
        app.router.add_post("/v1/completions", self._handle)
        app.router.add_post("/v1/chat/completions", self._handle)
        self._runner = web.AppRunner(app, handle_signals=False, access_log=None)
        loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        loop.run_until_complete(site.start())
        self.port = int(self._runner.addresses[0][1])
        ready.set()
        loop.run_forever()
        loop.close()

    def wait_for_disconnects(self, n: int, limit_s: float = 10.0) -> int:
        """Poll until *n* disconnects were seen (or *limit_s* passed); returns the count."""
        deadline = time.monotonic() + limit_s
        while self.disconnects < n and time.monotonic() < deadline:
            time.sleep(0.01)
        return self.disconnects

    # -- the handler -------------------------------------------------------------------------

    def _leave(self, state: dict[str, bool]) -> None:
        with self._lock:
            if not state["left"]:
                state["left"] = True
                self.in_flight -= 1

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        chat = request.path.endswith("/chat/completions")
        with self._lock:
            behaviour = self.plan[self.requests % len(self.plan)]
            self.requests += 1
            self.bodies.append(body)
            self.behaviours.append(behaviour)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        state = {"left": False}
        try:
            return await self._respond(request, body, chat, behaviour, state)
        except (ConnectionResetError, ConnectionError):
            with self._lock:
                self.disconnects += 1
            raise
        finally:
            self._leave(state)

    async def _respond(
        self, request: web.Request, body: dict[str, Any], chat: bool, behaviour: str, state: dict[str, bool]
    ) -> web.StreamResponse:
        if behaviour == "http500":
            return web.json_response({"error": {"message": "engine exploded", "code": 500}}, status=500)
        if behaviour == "rot13_500":
            rot13 = {"Content-Type": "text/plain; charset=rot13"}  # a codec, but not a text encoding
            return web.Response(status=500, body=b"engine exploded", headers=rot13)
        if behaviour == "huge_500":
            return web.Response(status=500, body=b"engine exploded " + b"x" * (64 * 2**20), content_type="text/plain")
        max_tokens = int(body.get("max_tokens", 16))
        prompt = body["messages"][-1]["content"] if chat else body["prompt"]
        rid = f"cmpl-{self.requests}"
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)

        def encode(obj: Any) -> bytes:
            data = obj if isinstance(obj, str) else json.dumps(obj)
            # a payload with newlines is one event over several data: lines, as SSE defines it
            return ("data: " + data.replace("\n", "\ndata: ") + "\n\n").encode()

        async def send(obj: Any) -> None:
            await resp.write(encode(obj))

        def chunk(text: str) -> dict[str, Any]:
            if chat:
                choice: dict[str, Any] = {"index": 0, "delta": {"content": text}, "finish_reason": None}
                return {"id": rid, "object": "chat.completion.chunk", "choices": [choice]}
            return {"id": rid, "object": "text_completion", "choices": [{"index": 0, "text": text}]}

        if chat:  # real servers open with a role-only delta; it must not count as the first token
            await send({"id": rid, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        await asyncio.sleep(self.first_token_delay_s)
        for i in range(max_tokens):
            if i:
                await asyncio.sleep(self.token_delay_s)
            if behaviour == "malformed" and i == 2:
                await send("{not json")
                await self._wait_gone(request, 5.0)
                return resp
            if behaviour == "cut" and i == 2:
                assert request.transport is not None
                request.transport.close()
                return resp
            if behaviour == "error_event" and i == 1:
                await send({"error": {"message": "KV cache exhausted", "code": 503}})
                await resp.write_eof()
                return resp
            if behaviour == "stall" and i == 1:
                await self._wait_gone(request, self.stall_s)
                return resp
            if behaviour == "endless" and i == 1:
                await self._endless(request, resp, encode(chunk("x")))
                return resp
            if behaviour == "flood" and i == 1:
                event = encode(chunk("x"))
                try:
                    for start in range(0, self.flood_chunks, _BATCH):
                        k = min(_BATCH, self.flood_chunks - start)
                        await resp.write(event * k)
                        self._count_hostile(k)
                except ConnectionError:  # the client hung up on the flood, as it should
                    self._count_disconnect()
                    return resp
                break  # then usage and [DONE], as a stream that ends would
            if behaviour in HOSTILE and not behaviour.endswith("_usage") and i == 1:
                for data in HOSTILE[behaviour]:
                    await send(data)
                await self._wait_gone(request, 5.0)  # the client must hang up on it
                return resp
            await send(chunk("ab"[i % 2]))
        if behaviour.endswith("_usage"):
            for data in HOSTILE[behaviour]:
                await send(data)
        elif self.send_usage and (body.get("stream_options") or {}).get("include_usage"):
            n_prompt = len(prompt.encode())
            usage = {"prompt_tokens": n_prompt, "completion_tokens": max_tokens}
            await send({"id": rid, "choices": [], "usage": {**usage, "total_tokens": n_prompt + max_tokens}})
        # leave before [DONE] so a client that starts its next request on [DONE] never sees us in flight
        self._leave(state)
        if behaviour != "no_done":
            await send("[DONE]")
        await resp.write_eof()
        return resp

    def _count_hostile(self, k: int) -> None:
        with self._lock:
            self.hostile_chunks_sent += k

    def _count_disconnect(self) -> None:
        with self._lock:
            self.disconnects += 1

    async def _endless(self, request: web.Request, resp: web.StreamResponse, event: bytes) -> None:
        """Text chunks until the client disconnects (counted) or ``stall_s`` passes; never [DONE]."""
        deadline = time.monotonic() + self.stall_s
        batch = event * _BATCH
        while time.monotonic() < deadline:
            if request.transport is None or request.transport.is_closing():
                self._count_disconnect()
                return
            try:
                await resp.write(batch)
            except ConnectionError:  # the client closed the connection while we wrote
                self._count_disconnect()
                return
            self._count_hostile(_BATCH)
            await asyncio.sleep(0)  # let the loop see the client go

    async def _wait_gone(self, request: web.Request, limit_s: float) -> None:
        """Hold the stream open until the client disconnects (counted) or *limit_s* passes."""
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            if request.transport is None or request.transport.is_closing():
                with self._lock:
                    self.disconnects += 1
                return
            await asyncio.sleep(0.005)
