"""The demo's OpenAI-compatible HTTP server: FastAPI on uvicorn, on loopback.

::

    from perfsdk.demo.server import DemoServer, create_app

    app = create_app(engine, monitor, model_name="demo-tiny")
    with DemoServer(app, port=0) as server:          # 0: an ephemeral port
        print(server.base_url)                        # http://127.0.0.1:54321

Routes (the subset of the OpenAI API that load generators and engines' benchmarks use):

- ``POST /v1/completions`` and ``POST /v1/chat/completions``: ``stream: true`` answers with
  Server-Sent Events, one ``data: {json}`` chunk per generated token, a chunk carrying
  ``finish_reason``, a last chunk with ``usage`` (always sent: it is cheap and lets a client check its
  own count), then ``data: [DONE]``. Without ``stream`` the answer is one JSON object. Accepted
  fields: ``prompt`` / ``messages``, ``max_tokens`` (chat: also ``max_completion_tokens``),
  ``temperature`` (default 1.0, 0 is greedy), ``seed`` and the vLLM extension ``ignore_eos``.
- ``GET /v1/models``, ``GET /health``;
- ``GET /metrics``: the monitor's Prometheus registry in the text exposition format;
- ``POST /debug/profile?steps=4&mode=torch[&wait=60]``: arm the monitor's profiler window
  (``Monitor.profile``), which records a few steps once traffic is steady; ``GET /debug/profile`` shows the
  window, the capture under way and the last result (verdict, trace, findings); ``DELETE /debug/profile``
  cancels the capture (:mod:`perfsdk.profiling.endpoint`, as the Monitor's own ``/profile``). With
  ``create_app(..., profile_token=T)`` POST and DELETE need ``Authorization: Bearer T``;
  :func:`perfsdk.demo.stack.start_demo` refuses to bind anything but loopback without a token.

A client that disconnects mid-stream cancels its request: Starlette cancels the streaming task, the
generator's ``finally`` calls :meth:`GenerationHandle.cancel` and the engine frees the slot before
its next step.

Hostile or broken input never reaches the engine and never costs more than a small, fixed amount of
memory: a body larger than ``max_body_bytes`` (default 1 MiB; the longest prompt the model takes is
``max_seq`` bytes of text) is refused with 413 from its ``Content-Length`` header, or as soon as a
chunked body passes the limit, before anything is parsed or tokenized. Everything else that is wrong
gets HTTP 400 with an OpenAI-style ``{"error": {"message", "type", "param"}}`` body naming the field, and
the connection stays open for the client's next request: a body that is not UTF-8, text that is not valid
Unicode (a lone surrogate such as ``"\\ud800"`` in a prompt, a message or any other field), JSON that does
not parse or nests too deeply, a ``temperature`` that is not 0 or within
[0.001, 2], a ``seed`` outside what ``torch.Generator`` takes, non-boolean flags, chat content parts
that are not ``{"type": "text", "text": "..."}``. A request that still fails inside the engine fails
alone (the engine retries its batch without it); the others keep streaming.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from perfsdk.demo.engine import MIN_TEMPERATURE, SEED_RANGE, Engine, GenerationHandle, SamplingParams
from perfsdk.demo.tokenizer import ByteTokenizer
from perfsdk.errors import ConfigError
from perfsdk.profiling import endpoint

__all__ = ["DemoServer", "create_app"]

log = logging.getLogger(__name__)

_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}
#: Request bodies above this are refused (413) before they are read: the longest prompt a demo model
#: takes is max_seq bytes of text, a few kB; JSON escapes make it at most ~6x that.
DEFAULT_MAX_BODY_BYTES = 1 << 20
#: OpenAI's range for temperature.
MAX_TEMPERATURE = 2.0


class _BadRequest(Exception):
    def __init__(self, message: str, param: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.status = status


def _error(message: str, *, param: str | None = None, status: int = 400) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    body = {"error": {"message": message, "type": kind, "param": param, "code": None}}
    return JSONResponse(body, status_code=status)


def _int_field(body: dict[str, Any], name: str, default: int | None) -> int | None:
    value = body.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadRequest(f"{name} must be an integer, got {_clip(value)}", name)
    return value


def _bool_field(body: dict[str, Any], name: str) -> bool:
    value = body.get(name, False)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise _BadRequest(f"{name} must be true or false, got {_clip(value)}", name)
    return value


def _clip(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _check_text(body: dict[str, Any]) -> None:
    """400 naming the field when any string in *body* is not valid Unicode (a lone surrogate: JSON's
    ``"\\ud800"`` escape parses, but no UTF-8 encodes it, so the tokenizer would fail on it later)."""
    for key, value in body.items():
        try:
            json.dumps({key: value}, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as e:
            bad = e.object[e.start : e.end] if isinstance(e.object, str) else ""
            where = ascii(bad) if bad else "a character"
            param = key if key.isascii() and key.isprintable() else None
            raise _BadRequest(f"{key!a} holds {where}, a lone surrogate: not valid Unicode text", param) from None
        except RecursionError:
            raise _BadRequest("the request body nests JSON too deeply") from None


def _sampling(body: dict[str, Any], *, chat: bool) -> SamplingParams:
    max_tokens = _int_field(body, "max_completion_tokens", None) if chat else None
    if max_tokens is None:
        max_tokens = _int_field(body, "max_tokens", 16)
    if max_tokens is not None and max_tokens < 1:
        raise _BadRequest(f"max_tokens must be at least 1, got {max_tokens}", "max_tokens")
    temperature = body.get("temperature", 1.0)
    if temperature is None:
        temperature = 1.0
    if isinstance(temperature, bool) or not isinstance(temperature, int | float):
        raise _BadRequest(f"temperature must be a number, got {_clip(temperature)}", "temperature")
    t = float(temperature)
    if not (t == 0 or MIN_TEMPERATURE <= t <= MAX_TEMPERATURE):  # NaN fails both
        raise _BadRequest(
            f"temperature must be 0 (greedy) or within [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], got {temperature!r}",
            "temperature",
        )
    seed = _int_field(body, "seed", None)
    if seed is not None and not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise _BadRequest(f"seed must be within [-2**63, 2**64 - 1], got {_clip(seed)}", "seed")
    n = _int_field(body, "n", 1)
    if n != 1:
        raise _BadRequest("only n=1 is supported by the demo server", "n")
    ignore_eos = _bool_field(body, "ignore_eos")
    _bool_field(body, "stream")
    try:
        return SamplingParams(
            max_tokens=16 if max_tokens is None else max_tokens, temperature=t, seed=seed, ignore_eos=ignore_eos
        )
    except ConfigError as e:  # the engine's own checks; the API's above are at least as strict
        raise _BadRequest(str(e), str(e).split(" ", 1)[0]) from None


def _prompt_text(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise _BadRequest("prompt must be a string (or a list of one string)", "prompt")
    return prompt


def _chat_text(body: dict[str, Any], tokenizer: ByteTokenizer) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _BadRequest("messages must be a non-empty list", "messages")
    turns: list[tuple[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise _BadRequest(f"messages[{i}] must be an object with a role", "messages")
        content = m.get("content", "")
        if content is None:
            content = ""
        if isinstance(content, list):  # content parts: text only (the demo model reads no images)
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise _BadRequest(
                        f'messages[{i}].content[{j}] must be {{"type": "text", "text": "..."}}, got {_clip(part)}',
                        "messages",
                    )
                texts.append(part["text"])
            content = "".join(texts)
        if not isinstance(content, str):
            raise _BadRequest(f"messages[{i}].content must be a string or a list of parts", "messages")
        turns.append((m["role"], content))
    return tokenizer.apply_chat_template(turns)


def create_app(
    engine: Engine,
    monitor: Any = None,
    *,
    model_name: str = "demo-tiny",
    tokenizer: ByteTokenizer | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    profile_token: str | None = None,
) -> FastAPI:
    """The FastAPI application serving *engine*; ``/metrics`` exports ``monitor.registry``.

    *profile_token*: when set, ``POST`` and ``DELETE /debug/profile`` need ``Authorization: Bearer <token>``.
    """
    if isinstance(max_body_bytes, bool) or not isinstance(max_body_bytes, int) or max_body_bytes < 1024:
        raise ConfigError(f"max_body_bytes must be an integer >= 1024, got {max_body_bytes!r}")
    if profile_token is not None and (not isinstance(profile_token, str) or not profile_token):
        raise ConfigError("profile_token must be a non-empty string or None")
    tok = tokenizer or ByteTokenizer()
    app = FastAPI(title="perfsdk demo", version="1", docs_url=None, redoc_url=None, openapi_url=None)
    created = int(time.time())
    registry = getattr(monitor, "registry", None)

    async def read_body(request: Request) -> dict[str, Any]:
        # the size first, from the header, before a byte of the body is read ...
        declared = request.headers.get("content-length")
        if declared is not None:
            try:
                size = int(declared)
            except ValueError:
                raise _BadRequest("the Content-Length header is not a number") from None
            if size > max_body_bytes:
                raise _BadRequest(
                    f"the request body ({size} bytes) exceeds the limit of {max_body_bytes} bytes", status=413
                )
        # ... then while reading (a chunked body has no Content-Length)
        chunks: list[bytes] = []
        total = 0
        async for chunk in request.stream():
            total += len(chunk)
            if total > max_body_bytes:
                raise _BadRequest(f"the request body exceeds the limit of {max_body_bytes} bytes", status=413)
            chunks.append(chunk)
        raw = b"".join(chunks)
        try:
            body = json.loads(raw)
        except UnicodeDecodeError as e:  # e.object: the bytes decoded (after a byte-order mark, if any)
            bad = e.object[e.start : e.start + 1].hex() if isinstance(e.object, bytes) else "?"
            raise _BadRequest(
                f"the request body is not UTF-8 text (byte 0x{bad} at offset {e.start}, as {e.encoding})"
            ) from None
        except json.JSONDecodeError:
            raise _BadRequest("the request body is not valid JSON") from None
        except RecursionError:  # [[[[...]]]] deeper than the parser's recursion limit
            raise _BadRequest("the request body nests JSON too deeply") from None
        if not isinstance(body, dict):
            raise _BadRequest("the request body must be a JSON object")
        _check_text(body)
        model = body.get("model")
        if model is not None and model != model_name:
            raise _BadRequest(
                f"The model `{_clip(model)}` does not exist; this server has `{model_name}`.", "model", 404
            )
        return body

    def submit(text: str, params: SamplingParams) -> GenerationHandle:
        try:
            return engine.submit(tok.encode(text), params)
        except ConfigError as e:  # too long for the model's context, or an empty prompt
            param = "max_tokens" if "max_tokens" in str(e) else "prompt"
            raise _BadRequest(str(e), param) from None

    @app.exception_handler(_BadRequest)
    async def bad_request(_: Request, exc: _BadRequest) -> JSONResponse:
        return _error(exc.message, param=exc.param, status=exc.status)

    @app.exception_handler(Exception)
    async def server_error(_: Request, exc: Exception) -> JSONResponse:
        # a bug in the demo: the client gets a JSON error, not a traceback (the log has it)
        log.error("demo server: unhandled %s: %s", type(exc).__name__, exc, exc_info=exc)
        return _error(f"internal error: {type(exc).__name__}", status=500)

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "model": model_name, "active_slots": engine.active_slots}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        card = {"id": model_name, "object": "model", "created": created, "owned_by": "perfsdk"}
        return {"object": "list", "data": [{**card, "max_model_len": engine.max_seq}]}

    @app.get("/metrics")
    async def metrics() -> Response:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

        if monitor is None:
            return Response(generate_latest(registry or CollectorRegistry()), media_type=CONTENT_TYPE_LATEST)
        # drained (every finished request and step is in it), in a worker thread: the event loop serves tokens
        body, ctype = await asyncio.to_thread(monitor.metrics_text)
        return Response(body, media_type=ctype)

    profile_path = "/debug/profile"

    def _unauthorized(request: Request) -> JSONResponse | None:
        if endpoint.bearer_ok(profile_token, request.headers.get("authorization")):
            return None
        return _error(
            f"missing or wrong bearer token: POST and DELETE {profile_path} need 'Authorization: Bearer <token>'",
            status=401,
        )

    @app.get("/debug/profile")
    async def profile_status() -> Response:
        """The window's state, the capture under way and the last result (verdict, trace, findings)."""
        if monitor is None:
            return _error("this server runs without a perfsdk monitor", status=501)
        code, info = endpoint.status(monitor)
        return JSONResponse(info, status_code=code)

    @app.delete("/debug/profile")
    async def profile_cancel(request: Request) -> Response:
        """Cancel the capture under way."""
        if (denied := _unauthorized(request)) is not None:
            return denied
        if monitor is None:
            return _error("this server runs without a perfsdk monitor", status=501)
        code, info = endpoint.cancel(monitor, profile_path)
        return JSONResponse(info, status_code=code)

    @app.post("/debug/profile")
    async def profile(request: Request, steps: int = 4, mode: str = "torch", wait: float = 0.0) -> Response:
        """Arm the monitor's profiler window; with ``wait=SECONDS``, answer with its verdict."""
        if (denied := _unauthorized(request)) is not None:
            return denied
        if monitor is None:
            return _error("this server runs without a perfsdk monitor", status=501)
        code, info, handle = endpoint.arm(monitor, steps, mode, profile_path)
        if code == 400:
            return _error(info["error"])
        if code != 202:
            return JSONResponse(info, status_code=code)
        if wait > 0:
            result = await asyncio.to_thread(handle.wait, min(wait, 300.0))
            info = handle.to_dict()  # the state after the wait, not the one at arming
            if result is not None:
                info["result"] = {k: v for k, v in result.to_dict().items() if k != "diagnosis"}
                if result.diagnosis is not None:
                    info["findings"] = result.diagnosis.get("findings", [])
        return JSONResponse(info, status_code=202 if "result" not in info else 200)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        body = await read_body(request)
        handle = submit(_prompt_text(body), _sampling(body, chat=False))
        return await _respond(handle, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        body = await read_body(request)
        handle = submit(_chat_text(body, tok), _sampling(body, chat=True))
        return await _respond(handle, body, chat=True)

    async def _respond(handle: GenerationHandle, body: dict[str, Any], *, chat: bool) -> Response:
        rid = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:16]}"
        if body.get("stream"):
            stream = _stream_events(handle, tok, rid=rid, model=model_name, chat=chat)
            return StreamingResponse(stream, media_type="text/event-stream", headers=_SSE_HEADERS)
        try:
            async for _ in handle:
                pass
        finally:
            handle.cancel()  # no-op when finished; frees the slot if this handler was cancelled
        if handle.error:
            return _error(handle.error, status=500)
        text = tok.decode(handle.output_ids)
        reason = handle.finish_reason or "abort"
        if chat:
            message = {"role": "assistant", "content": text}
            choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": reason}
            obj = "chat.completion"
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}
            obj = "text_completion"
        return JSONResponse(
            {
                "id": rid,
                "object": obj,
                "created": int(time.time()),
                "model": model_name,
                "choices": [choice],
                "usage": _usage(handle),
            }
        )

    return app


def _usage(handle: GenerationHandle) -> dict[str, int]:
    n = len(handle.output_ids)
    return {"prompt_tokens": handle.prompt_tokens, "completion_tokens": n, "total_tokens": handle.prompt_tokens + n}


async def _stream_events(
    handle: GenerationHandle, tok: ByteTokenizer, *, rid: str, model: str, chat: bool
) -> AsyncIterator[str]:
    created = int(time.time())
    obj = "chat.completion.chunk" if chat else "text_completion"

    def event(choices: list[dict[str, Any]], usage: dict[str, int] | None = None) -> str:
        payload = {"id": rid, "object": obj, "created": created, "model": model, "choices": choices, "usage": usage}
        return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"

    def choice(text: str, reason: str | None, first: bool) -> dict[str, Any]:
        if chat:
            delta: dict[str, str] = {"content": text} if text or not reason else {}
            if first:  # the role rides on the first token so that every content chunk is one token
                delta["role"] = "assistant"
            return {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        return {"index": 0, "text": text, "logprobs": None, "finish_reason": reason}

    try:
        first = True
        async for token_id in handle:
            yield event([choice(tok.decode_token(token_id), None, first)])
            first = False
        if handle.error:
            yield f"data: {json.dumps({'error': {'message': handle.error, 'type': 'server_error'}})}\n\n"
        else:
            yield event([choice("", handle.finish_reason or "abort", first)])
        yield event([], _usage(handle))
        yield "data: [DONE]\n\n"
    finally:
        # The client went away (Starlette cancelled us) or we are done; either way the slot is freed.
        handle.cancel()


class DemoServer:
    """Run an ASGI app with uvicorn on a background thread; a context manager.

    ``port=0`` asks the OS for a free port; :attr:`port` and :attr:`base_url` say which one it gave.
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning") -> None:
        if not 0 <= port <= 65535:
            raise ConfigError(f"port must be in 0..65535, got {port}")
        self.host = host
        self.requested_port = port
        self.port = port
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_level=log_level,
            access_log=False,
            lifespan="off",
            timeout_graceful_shutdown=3,
        )
        self._server = uvicorn.Server(config)
        self._thread: threading.Thread | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, timeout: float = 30.0) -> DemoServer:
        self._thread = threading.Thread(target=self._run, name="perfsdk-demo-uvicorn", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive():
                raise ConfigError(
                    f"port: cannot listen on {self.host}:{self.requested_port} (in use?); pass --port 0 for a free one"
                )
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(f"the demo server did not start within {timeout} s")
            time.sleep(0.01)
        sockets = [s for srv in self._server.servers for s in srv.sockets]
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        return self

    def _run(self) -> None:
        try:
            self._server.run()
        except SystemExit:  # uvicorn exits when it cannot bind; start() reports that
            pass

    def serve_forever(self) -> None:
        """Block until the server stops (Ctrl-C in the main thread raises KeyboardInterrupt)."""
        while self._thread is not None and self._thread.is_alive():
            self._thread.join(0.5)

    def stop(self, timeout: float = 10.0) -> None:
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> DemoServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
