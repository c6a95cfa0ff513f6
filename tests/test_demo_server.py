"""The demo server over real HTTP on loopback: OpenAI routes, streaming, disconnects, and client/server agreement."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("torch")
pytest.importorskip("fastapi")
httpx = pytest.importorskip("httpx")

from perfsdk.demo.report import TTFT, histogram_buckets, histogram_count, histogram_quantile  # noqa: E402
from perfsdk.demo.stack import DemoStack, start_demo  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def demo() -> Iterator[DemoStack]:
    with start_demo(size="tiny", device="cpu", port=0, max_batch_slots=4, max_seq=512) as stack:
        yield stack


def _events(lines: Iterator[str]) -> list[Any]:
    out: list[Any] = []
    for line in lines:
        if line.startswith("data: "):
            data = line[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
    return out


def _wait_for(predicate: Any, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def test_health_models_and_metrics(demo: DemoStack) -> None:
    base = demo.server.base_url
    assert httpx.get(f"{base}/health").json()["status"] == "ok"
    models = httpx.get(f"{base}/v1/models").json()
    assert models["object"] == "list"
    assert [m["id"] for m in models["data"]] == [demo.model_name]
    metrics = httpx.get(f"{base}/metrics")
    assert metrics.status_code == 200
    assert metrics.headers["content-type"].startswith("text/plain")
    if demo.monitor is not None:
        assert "gen_ai_server_time_to_first_token_seconds" in metrics.text


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_non_streaming_response(demo: DemoStack, endpoint: str) -> None:
    body: dict[str, Any] = {"model": demo.model_name, "max_tokens": 7, "temperature": 0, "ignore_eos": True}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "hello"}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = "hello"
        path = "/v1/completions"
    r = httpx.post(demo.server.base_url + path, json=body, timeout=30)
    assert r.status_code == 200, r.text
    obj = r.json()
    choice = obj["choices"][0]
    text = choice["message"]["content"] if endpoint == "chat" else choice["text"]
    assert len(text) == 7
    assert choice["finish_reason"] == "length"
    assert obj["usage"]["completion_tokens"] == 7
    if endpoint == "completions":
        assert obj["usage"]["prompt_tokens"] == len(b"hello") + 1  # byte tokens + BOS
    again = httpx.post(demo.server.base_url + path, json=body, timeout=30).json()
    assert again["choices"][0] == choice  # greedy: the same text every time


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_streaming_sends_one_chunk_per_token_then_usage_then_done(demo: DemoStack, endpoint: str) -> None:
    body: dict[str, Any] = {"max_tokens": 9, "stream": True, "ignore_eos": True, "temperature": 0}
    if endpoint == "chat":
        body["messages"] = [{"role": "user", "content": "stream please"}]
        path = "/v1/chat/completions"
    else:
        body["prompt"] = "stream please"
        path = "/v1/completions"
    with httpx.stream("POST", demo.server.base_url + path, json=body, timeout=30) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        events = _events(r.iter_lines())
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    usage = chunks[-1]
    assert usage["choices"] == []
    assert usage["usage"]["completion_tokens"] == 9
    finish = chunks[-2]["choices"][0]
    assert finish["finish_reason"] == "length"
    token_chunks = chunks[:-2]
    if endpoint == "chat":
        texts = [c["choices"][0]["delta"]["content"] for c in token_chunks]
        assert token_chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        assert token_chunks[0]["object"] == "chat.completion.chunk"
    else:
        texts = [c["choices"][0]["text"] for c in token_chunks]
    assert len(texts) == 9
    assert all(len(t) == 1 for t in texts)


def test_bad_requests_get_openai_style_errors(demo: DemoStack) -> None:
    base = demo.server.base_url
    too_long = httpx.post(f"{base}/v1/completions", json={"prompt": "x", "max_tokens": 10_000})
    assert too_long.status_code == 400
    assert "max_seq" in too_long.json()["error"]["message"]
    wrong_model = httpx.post(f"{base}/v1/completions", json={"prompt": "x", "model": "gpt-5"})
    assert wrong_model.status_code == 404
    assert wrong_model.json()["error"]["param"] == "model"
    no_prompt = httpx.post(f"{base}/v1/completions", json={"max_tokens": 3})
    assert no_prompt.status_code == 400
    not_json = httpx.post(f"{base}/v1/chat/completions", content=b"{nope", headers={"content-type": "application/json"})
    assert not_json.status_code == 400


def test_client_disconnect_mid_stream_frees_the_slot_and_serving_continues(demo: DemoStack) -> None:
    engine = demo.engine
    aborted_before = engine.stats.aborted
    body = {"prompt": "never mind", "max_tokens": 400, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", demo.server.base_url + "/v1/completions", json=body, timeout=30) as r:
        lines = r.iter_lines()
        got: list[str] = []
        for line in lines:
            if line.startswith("data: "):
                got.append(line)
            if len(got) == 3:
                break
        assert engine.active_slots == 1
    # leaving the `with` closed the connection after 3 of 400 tokens
    assert _wait_for(lambda: engine.active_slots == 0), "the server kept the slot of a gone client"
    assert engine.stats.aborted == aborted_before + 1
    r2 = httpx.post(demo.server.base_url + "/v1/completions", json={"prompt": "still there?", "max_tokens": 4})
    assert r2.status_code == 200
    assert r2.json()["usage"]["completion_tokens"] <= 4
    assert engine.active_slots == 0


def test_client_and_server_agree_on_counts_and_ttft() -> None:
    from perfsdk.bench import BenchConfig, benchmark

    with start_demo(size="tiny", device="cpu", port=0, max_batch_slots=4, max_seq=512) as demo:
        result = benchmark(
            BenchConfig(
                base_url=demo.server.base_url,
                model=demo.model_name,
                num_prompts=16,
                request_rate=8.0,
                input_len="uniform:16-64",
                output_len="uniform:4-24",
                ignore_eos=True,
                seed=3,
                progress=False,
            ),
            progress=False,
        )
        assert demo.engine.wait_idle()
        assert demo.monitor.flush(timeout=10.0)
        reg = demo.monitor.registry
        ok = [r for r in result.records if r.ok]
        s = result.summary

        # counts agree exactly
        assert s["completed"] == len(ok) == 16
        assert histogram_count(reg, TTFT) == 16
        assert histogram_count(reg, "gen_ai_server_request_duration_seconds") == 16
        assert histogram_count(reg, "perfsdk_request_queue_seconds") == 16
        assert histogram_count(reg, "perfsdk_inter_token_latency_seconds") == sum(len(r.itl) for r in ok)
        assert s["total_output_tokens"] == demo.engine.stats.tokens_generated == sum(r.chunks for r in ok)
        assert all(r.usage_reported and r.output_tokens == r.chunks for r in ok)

        # TTFT: the client clock starts before the server's and stops after it, so for every bucket
        # bound the server has at least as many requests below it as the client does ...
        client_ttft = sorted(r.ttft for r in ok)
        buckets = histogram_buckets(reg, TTFT)
        for le, cum in buckets:
            assert cum >= sum(1 for t in client_ttft if t <= le), f"client faster than server below {le} s"
        # ... and the medians sit in the same bucket or the next one: the gap is HTTP and the hand-off
        # from the engine thread to the event loop, not a different measurement.
        rank = math.ceil(len(client_ttft) / 2)
        server_idx = next(i for i, (_, cum) in enumerate(buckets) if cum >= rank)
        client_idx = next(i for i, (le, _) in enumerate(buckets) if client_ttft[rank - 1] <= le)
        assert server_idx <= client_idx <= server_idx + 1, (buckets, client_ttft)
        assert histogram_quantile(reg, TTFT, 0.5) is not None


def test_profile_endpoint_captures_under_load_and_returns_the_verdict(demo: DemoStack, tmp_path: Any) -> None:
    """POST /debug/profile?wait=N: a real torch.profiler capture of the serving engine, diagnosed."""
    import threading

    demo.monitor.enable_profiler(
        directory=str(tmp_path / "traces"),
        steps=2,
        warmup=1,
        steady_window=4,
        steady_cv=0.5,
        warmup_steps=2,
        steady_timeout_s=10.0,
    )
    stop = threading.Event()

    def load() -> None:  # keep decode steps coming while the window waits for them
        while not stop.is_set():
            httpx.post(
                demo.server.base_url + "/v1/completions",
                timeout=30,
                json={"model": demo.model_name, "prompt": "hi", "max_tokens": 24, "ignore_eos": True},
            )

    threads = [threading.Thread(target=load) for _ in range(2)]
    for t in threads:
        t.start()
    try:
        r = httpx.post(demo.server.base_url + "/debug/profile", params={"steps": 2, "wait": 60}, timeout=90)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["accepted"] is True
    assert body["state"] == "done"
    result = body["result"]
    assert result["error"] is None
    assert result["trace"].endswith(".pt.trace.json.gz")
    assert (tmp_path / "traces").exists()
    assert result["verdict"].startswith("perfsdk profile:")
    assert isinstance(body["findings"], list)
    # a second window while none is running is accepted again; a bad mode is a 400
    assert httpx.post(demo.server.base_url + "/debug/profile", params={"mode": "bogus"}).status_code == 400


# ---- hostile input (issue 14, items 1 and 6): refused with 400/413 naming the field, never a 500 ----------


@pytest.mark.parametrize(
    ("field", "raw"),
    [
        ("temperature", "1e-300"),
        ("temperature", "Infinity"),
        ("temperature", "NaN"),
        ("temperature", "-1"),
        ("temperature", "7"),
        ("temperature", '"hot"'),
        ("seed", str(2**70)),
        ("seed", "1.5"),
        ("ignore_eos", '"yes"'),
        ("stream", "1"),
        ("max_tokens", "0"),
        ("max_tokens", "1e300"),
    ],
)
def test_bad_sampling_parameters_get_400_naming_the_field(demo: DemoStack, field: str, raw: str) -> None:
    # raw JSON text: Python's json module reads Infinity and NaN, as the server's parser does
    body = '{"prompt": "x", "max_tokens": 4, "%s": %s}' % (field, raw)  # noqa: UP031
    if field == "max_tokens":
        body = '{"prompt": "x", "max_tokens": %s}' % raw  # noqa: UP031
    r = httpx.post(
        demo.server.base_url + "/v1/completions",
        content=body.encode(),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == field
    assert field in err["message"]


def test_nested_json_and_bad_content_parts_get_400_not_500(demo: DemoStack) -> None:
    url = demo.server.base_url
    deep = b"[" * 100_000 + b"]" * 100_000  # 200 kB: under the size limit, over the parser's recursion limit
    r = httpx.post(url + "/v1/completions", content=deep, headers={"content-type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    assert "deeply" in r.json()["error"]["message"]
    nested_prompt = b'{"prompt": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    r = httpx.post(url + "/v1/completions", content=nested_prompt, headers={"content-type": "application/json"})
    assert r.status_code == 400
    part = {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}], "max_tokens": 2}
    r = httpx.post(url + "/v1/chat/completions", json=part, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "messages"
    assert "content[0]" in r.json()["error"]["message"]
    image = {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}
    assert httpx.post(url + "/v1/chat/completions", json=image, timeout=30).status_code == 400
    ok = {"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}], "max_tokens": 2}
    assert httpx.post(url + "/v1/chat/completions", json=ok, timeout=30).status_code == 200
    # and the server keeps serving on the same keep-alive connection
    with httpx.Client(base_url=url, timeout=30) as client:
        assert (
            client.post("/v1/completions", content=deep, headers={"content-type": "application/json"}).status_code
            == 400
        )
        assert client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_an_oversized_body_is_refused_before_it_is_read(demo: DemoStack) -> None:
    import socket

    host, port = demo.server.host, demo.server.port
    # Content-Length of 50 MB and not one byte of body: the answer must come from the header alone
    # (the server used to wait for the body, then parse and tokenize it)
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 50000000\r\n\r\n"
        )
        head = b""
        while b"exceeds the limit" not in head:
            data = s.recv(4096)
            if not data:
                break
            head += data
    assert head.startswith(b"HTTP/1.1 413"), head[:200]
    assert b"exceeds the limit" in head

    # a chunked body has no Content-Length: refused as soon as it passes the limit, memory flat
    before = _rss_bytes()
    chunk = b'{"prompt": "' + b"x" * (1 << 20)
    with socket.create_connection((host, port), timeout=30) as s:
        s.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        answer = b""
        try:
            for _ in range(50):  # 50 MB offered, 1 MB at a time
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                s.settimeout(0.05)
                try:
                    answer += s.recv(4096)
                except TimeoutError:
                    continue
                if answer:
                    break
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed while we were still sending
        s.settimeout(30)
        try:
            answer += s.recv(4096)
        except OSError:
            pass
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert _rss_bytes() - before < 32 << 20  # the 50 MB were never held
    after = httpx.post(demo.server.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert after.status_code == 200


def test_a_scrape_right_after_the_load_has_every_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 19: six streaming requests complete; /metrics read right after showed none of their TTFTs."""
    monkeypatch.setenv("PERFSDK_EXPORT_INTERVAL", "60")  # no export would carry them for a minute
    with start_demo(size="tiny", device="cpu", port=0, max_batch_slots=4, max_seq=512) as stack:
        assert stack.monitor is not None
        base = stack.server.base_url
        body = {"prompt": "fresh", "max_tokens": 4, "stream": True, "ignore_eos": True}
        for _ in range(6):
            with httpx.stream("POST", base + "/v1/completions", json=body, timeout=30) as r:
                assert _events(r.iter_lines())[-1] == "[DONE]"
        text = httpx.get(f"{base}/metrics", timeout=10).text
    counts = {
        line.split("{")[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.endswith(("_count", "")) and "_count{" in line and "phase" not in line
    }
    assert counts["gen_ai_server_time_to_first_token_seconds_count"] == 6
    assert counts["gen_ai_server_request_duration_seconds_count"] == 6


# ---- issue 20, item 7: undecodable input is a 400 on a connection that stays usable -------------------


def _exchange(sock: Any, reader: Any, body: bytes, path: str = "/v1/completions") -> tuple[int, dict[str, str], bytes]:
    """One HTTP/1.1 request on an open keep-alive socket; (status, headers, body) of its answer."""
    sock.sendall(
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    status_line = reader.readline()
    assert status_line, "the server closed the connection"
    status = int(status_line.split()[1])
    headers: dict[str, str] = {}
    while (line := reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers, reader.read(int(headers["content-length"]))


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/v1/completions", rb'{"prompt": "\ud800", "max_tokens": 2}', "prompt"),  # the reproduction
        ("/v1/completions", rb'{"prompt": ["ok \udfff"], "max_tokens": 2}', "prompt"),
        (
            "/v1/chat/completions",
            rb'{"messages": [{"role": "user", "content": "hi \ud83d"}], "max_tokens": 2}',
            "messages",
        ),
        ("/v1/chat/completions", rb'{"messages": [{"role": "\udc00", "content": "hi"}], "max_tokens": 2}', "messages"),
        (
            "/v1/chat/completions",
            rb'{"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}], "max_tokens": 2}',
            "messages",
        ),
        ("/v1/completions", rb'{"prompt": "x", "model": "\ud800"}', "model"),
        ("/v1/completions", b'{"prompt": "caf\xe9", "max_tokens": 2}', None),  # Latin-1, not UTF-8
        ("/v1/completions", b'{"prompt": "\xff\xfe"}', None),
        ("/v1/completions", b'\xef\xbb\xbf{"prompt": "\xc3\x28"}', None),  # a BOM, then a broken sequence
    ],
)
def test_undecodable_input_is_a_400_and_the_connection_stays_usable(
    demo: DemoStack, path: str, body: bytes, param: str | None
) -> None:
    """Before: a lone surrogate in a prompt raised UnicodeEncodeError in the tokenizer: a 500, ~110 lines of
    traceback in the log, and the keep-alive connection reset under the client's next request."""
    import logging
    import socket

    seen: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record)

    keep = Keep(logging.ERROR)
    loggers = [logging.getLogger(n) for n in ("uvicorn.error", "perfsdk.demo.server")]
    for lg in loggers:
        lg.addHandler(keep)
    try:
        with (
            socket.create_connection((demo.server.host, demo.server.port), timeout=30) as s,
            s.makefile("rb") as reader,
        ):
            status, headers, answer = _exchange(s, reader, body, path)
            assert status == 400, answer
            err = json.loads(answer)["error"]
            assert err["type"] == "invalid_request_error" and err["param"] == param
            assert "surrogate" in err["message"] or "UTF-8" in err["message"], err
            assert headers.get("connection", "").lower() != "close"
            # the same connection serves the next request
            status, _, answer = _exchange(s, reader, b'{"prompt": "x", "max_tokens": 2}')
            assert status == 200, answer
            assert json.loads(answer)["usage"]["completion_tokens"] <= 2
    finally:
        for lg in loggers:
            lg.removeHandler(keep)
    assert not seen, [r.getMessage() for r in seen]


# ---- issue 20, items 7 and 15: the profile endpoint's status, cancel and token ---------------------------


def test_profile_endpoint_shows_the_window_and_cancels_the_capture(demo: DemoStack, tmp_path: Any) -> None:
    base = demo.server.base_url + "/debug/profile"
    # a gate that stays shut (10,000 warm-up steps, ten minutes): the capture stays armed whatever traffic comes
    demo.monitor.enable_profiler(
        directory=str(tmp_path / "traces"), steps=2, warmup_steps=10_000, steady_timeout_s=600.0
    )
    r = httpx.get(base)
    assert r.status_code == 200 and r.json()["enabled"] is True and r.json()["state"] == "idle"
    first = httpx.post(base, params={"steps": 2})  # no traffic: it stays armed
    assert first.status_code == 202, first.text
    second = httpx.post(base)
    assert second.status_code == 409
    assert "GET /debug/profile" in second.json()["see"] and "DELETE /debug/profile" in second.json()["see"]
    status = httpx.get(base).json()
    assert status["state"] == "armed" and status["current"]["id"] == first.json()["id"]
    cancelled = httpx.delete(base)
    assert cancelled.status_code == 200 and cancelled.json()["cancelled"] is True
    assert httpx.get(base).json()["state"] == "idle"
    again = httpx.delete(base)
    assert again.status_code == 409 and "no capture" in again.json()["reason"]


def test_the_profile_endpoint_needs_the_token_when_one_is_set(demo: DemoStack, tmp_path: Any) -> None:
    from perfsdk.demo.server import DemoServer, create_app
    from perfsdk.errors import ConfigError

    demo.monitor.enable_profiler(directory=str(tmp_path / "traces"), warmup_steps=10_000, steady_timeout_s=600.0)
    app = create_app(demo.engine, demo.monitor, model_name=demo.model_name, profile_token="s3cret")
    with DemoServer(app, port=0) as server:
        url = server.base_url + "/debug/profile"
        for method in ("POST", "DELETE"):
            assert httpx.request(method, url).status_code == 401
            assert httpx.request(method, url, headers={"Authorization": "Bearer nope"}).status_code == 401
        assert demo.monitor.profile_status()["state"] == "idle"
        assert httpx.get(url).status_code == 200  # status is open, like /metrics
        ok = {"Authorization": "Bearer s3cret"}
        assert httpx.post(url, headers=ok).status_code == 202
        assert httpx.delete(url, headers=ok).status_code == 200
        # the rest of the API needs no token
        assert httpx.post(server.base_url + "/v1/completions", json={"prompt": "x", "max_tokens": 2}).status_code == 200
    # off loopback without a token: refused before anything is built
    with pytest.raises(ConfigError, match=r"--host: .*0\.0\.0\.0.*token"):
        start_demo(size="tiny", device="cpu", host="0.0.0.0")
