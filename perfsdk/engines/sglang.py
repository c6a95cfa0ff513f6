"""perfsdk beside SGLang: MBU and MFU of every forward pass, from SGLang's Forward Pass Metrics feed.

The out-of-process option. With perfsdk installed in SGLang's environment, its in-process hook
(:mod:`perfsdk.engines.sglang_hook`) gives device-time steps with exact per-sequence sizes on SGLang's own
``/metrics`` instead; use this subscriber when the server image cannot change, or to read the numbers in
another process or host (``docs/sglang.md`` compares the two).

SGLang's scheduler can publish one message per iteration — its Forward Pass Metrics, the feed NVIDIA
Dynamo's planner reads — on a ZMQ PUB socket per data-parallel rank: the GPU time of the forward
(CUDA events, first start to last end) and what it computed (prefill requests and tokens, the cached
prefix they read, decode requests and the KV tokens they attend over). perfsdk subscribes and turns each
message into a step with MBU and MFU against the GPU's datasheet::

    sglang serve --model-path meta-llama/Llama-3.1-8B-Instruct --enable-metrics \\
        --enable-forward-pass-metrics --forward-pass-metrics-ipc-name ipc:///tmp/sglang-fpm
    perfsdk sglang --fpm ipc:///tmp/sglang-fpm --model /models/Llama-3.1-8B-Instruct \\
        --hardware h200 --port 9400        # --model: the model directory or config.json, or a known name

``http://127.0.0.1:9400/metrics`` then carries ``perfsdk_step_seconds{phase}``,
``perfsdk_step_bandwidth_utilization`` (decode MBU), ``perfsdk_step_flops_utilization`` (prefill and
mixed MFU) and the byte, FLOP and token counters, under the labels the Grafana dashboard in
``integrations/grafana`` reads. Latencies (TTFT, ITL, end-to-end) stay SGLang's own ``sglang:*``
metrics on its ``/metrics`` (``--enable-metrics``). In Python: :class:`FpmSubscriber`.

The mapping (:func:`step_from_fpm`): prefill tokens and decode requests in one forward make a
``mixed`` step, either alone a ``prefill`` or ``decode`` step; the decode KV tokens are the decode
steps' context, the prefill requests' cached prefix theirs. SGLang reports sums, so prefill tokens are
split evenly over the prefill requests for the attention FLOPs, and so is their cached prefix (its KV
is read and attended to). In a mixed forward the prefill's prefix is costed as decode context, which
undercounts its attention FLOPs. Messages with no GPU time (idle
heartbeats; SGLang drops spans over several streams) make no step; messages with GPU time but nothing
perfsdk can cost (an extend batch that computed no new tokens, as with data-parallel attention's
padding) are counted as ``skipped``; messages lost on the wire (ZMQ drops when a subscriber is slow)
are counted from SGLang's sequence numbers. Speculative decoding: a decode step's batch is its request
count, not the tokens it verified.

Wire format: SGLang's ``ForwardPassMetrics`` (schema version 1) as msgpack maps, decoded by field name;
another version is skipped with one warning. Needs ``pyzmq`` and ``msgspec`` (``perfsdk[sglang]``);
SGLang itself need not be installed where this runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from perfsdk.engines import split_evenly
from perfsdk.engines._common import count_error
from perfsdk.errors import ConfigError, MissingDependencyError

if TYPE_CHECKING:
    from perfsdk.monitor import Monitor

__all__ = ["FPM_VERSION", "FpmSubscriber", "load_model", "step_from_fpm"]

log = logging.getLogger("perfsdk")

FPM_VERSION = 1  # SGLang's sglang.srt.observability.forward_pass_metrics.FPM_VERSION this reads


def step_from_fpm(msg: Mapping[str, Any]) -> tuple[str, float, dict[str, Any]] | None:
    """``(phase, seconds, sizes)`` for ``Monitor.record_step`` from one decoded message, or None.

    None: a heartbeat or a message without GPU time. Raises ``ValueError`` for another schema version.
    """
    version = msg.get("version", FPM_VERSION)
    if version != FPM_VERSION:
        raise ValueError(f"SGLang forward-pass metrics version {version}; perfsdk reads version {FPM_VERSION}")
    seconds = msg.get("wall_time") or 0.0
    if not seconds > 0:
        return None
    s = msg.get("scheduled_requests") or {}
    prefill_reqs = int(s.get("num_prefill_requests", 0))
    prefill_tokens = int(s.get("sum_prefill_tokens", 0))
    prefix_tokens = int(s.get("sum_prefill_kv_tokens", 0))
    decode_reqs = int(s.get("num_decode_requests", 0))
    decode_ctx = int(s.get("sum_decode_kv_tokens", 0))
    if prefill_tokens and decode_reqs:
        return (
            "mixed",
            float(seconds),
            {
                "batch": decode_reqs,
                "context_tokens": decode_ctx + prefix_tokens,
                "seq_lens": split_evenly(prefill_tokens, prefill_reqs),
            },
        )
    if prefill_tokens:
        return (
            "prefill",
            float(seconds),
            {
                "batch": max(prefill_reqs, 1),
                "tokens": prefill_tokens,
                "context_tokens": prefix_tokens,
                "seq_lens": split_evenly(prefill_tokens, prefill_reqs),
            },
        )
    if decode_reqs:
        return "decode", float(seconds), {"batch": decode_reqs, "context_tokens": decode_ctx}
    return None


def _zmq_msgspec() -> tuple[Any, Any]:
    try:
        import msgspec
        import zmq
    except ImportError as e:
        raise MissingDependencyError(e.name or "pyzmq", "SGLang's forward-pass metrics", extra="sglang") from None
    return zmq, msgspec


class FpmSubscriber:
    """Subscribe to SGLang's forward-pass metrics and record every forward as a step of *monitor*.

    *endpoint*: ``--forward-pass-metrics-ipc-name`` as given to SGLang; rank *r* of *dp_size* publishes
    on ``{endpoint}.{r}``. A daemon thread receives and records; :meth:`close` stops it.
    """

    def __init__(self, monitor: Monitor, endpoint: str, dp_size: int = 1, *, start: bool = True) -> None:
        if not isinstance(endpoint, str) or "://" not in endpoint:
            raise ConfigError(f"endpoint: expected a ZMQ address such as ipc:///tmp/sglang-fpm, got {endpoint!r}")
        if type(dp_size) is not int or dp_size < 1:
            raise ConfigError(f"dp_size: must be an integer >= 1, got {dp_size!r}")
        self._zmq, self._msgspec = _zmq_msgspec()
        self.monitor = monitor
        self.endpoints = [f"{endpoint}.{r}" for r in range(dp_size)]
        self.received = 0  # messages, heartbeats included
        self.steps = 0
        self.lost = 0  # gaps in SGLang's per-rank sequence numbers
        self.skipped = 0  # GPU time, but nothing to cost
        self._last_seq: dict[bytes, int] = {}
        self._warned_version = False
        self._stop = threading.Event()
        self._ctx = self._zmq.Context()  # its own: another component terminating a shared one cannot stop it
        self._sock = self._ctx.socket(self._zmq.SUB)
        self._sock.setsockopt(self._zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(self._zmq.RCVHWM, 100_000)
        try:
            for ep in self.endpoints:
                self._sock.connect(ep)
        except self._zmq.ZMQError as e:
            self._sock.close(linger=0)
            self._ctx.term()
            raise ConfigError(f"endpoint: cannot connect to {ep!r}: {e}") from None
        self._thread = threading.Thread(target=self._run, name="perfsdk-sglang-fpm", daemon=True)
        if start:
            self._thread.start()

    def _run(self) -> None:
        zmq, sock = self._zmq, self._sock
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        while not self._stop.is_set():
            try:
                if not poller.poll(100):
                    continue
                frames = sock.recv_multipart(zmq.NOBLOCK)
                self.handle(frames)
            except zmq.Again:
                continue
            except zmq.ContextTerminated:
                break
            except Exception as e:  # a bad message never stops the subscriber
                if self._stop.is_set():
                    break
                count_error(self.monitor, e, "sglang forward-pass metrics")
                time.sleep(0.01)  # a persistent fault must not spin a core
        sock.close(linger=0)  # the context is close()'s to end (or already ended by whoever terminated it)

    def handle(self, frames: Sequence[bytes]) -> None:
        """One ZMQ message: ``(topic, 8-byte big-endian sequence number, msgpack payload)``."""
        self.received += 1
        if len(frames) >= 3:
            payload, seq = frames[2], int.from_bytes(frames[1], "big")
        else:
            payload, seq = frames[-1], None
        msg = self._msgspec.msgpack.decode(payload)
        if not isinstance(msg, Mapping):
            raise ValueError("SGLang forward-pass metrics: expected a msgpack map")
        if seq is not None:
            key = f"{msg.get('worker_id', '')}/{msg.get('dp_rank', 0)}".encode()
            last = self._last_seq.get(key)
            if last is not None and seq > last + 1:
                self.lost += seq - last - 1
            self._last_seq[key] = seq
        try:
            step = step_from_fpm(msg)
        except ValueError as e:
            if not self._warned_version:
                self._warned_version = True
                log.warning("perfsdk: %s: skipping these messages", e)
            return
        if step is not None:
            phase, seconds, sizes = step
            self.monitor.record_step(phase, seconds, **sizes)
            self.steps += 1
        elif (msg.get("wall_time") or 0.0) > 0:
            self.skipped += 1

    def close(self, timeout: float = 2.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        if not self._sock.closed and not self._thread.is_alive():
            self._sock.close(linger=0)
        if not self._ctx.closed and self._sock.closed:
            self._ctx.term()


# ---- perfsdk sglang ---------------------------------------------------------
def load_model(model: str, tp: int = 1) -> Any:
    """A ModelSpec from a known name, a model directory or a config.json path, split over *tp* GPUs."""
    import json
    from pathlib import Path

    from perfsdk.model import ModelSpec

    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    spec = ModelSpec.from_hf_config(json.loads(path.read_text())) if path.is_file() else ModelSpec.named(model)
    return spec.with_tp(tp) if tp > 1 else spec
