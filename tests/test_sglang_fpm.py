"""SGLang's forward-pass metrics into perfsdk steps: the mapping, and the subscriber on a real ZMQ socket.

The messages here are built by hand in SGLang's wire format (schema 1, msgpack maps); the same path
against SGLang's own publisher runs in its venv (tests/engines/test_sglang.py, scripts/test_engine.sh sglang).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from perfsdk import budget
from perfsdk.engines.sglang import FPM_VERSION, FpmSubscriber, load_model, step_from_fpm
from perfsdk.errors import ConfigError
from perfsdk.hardware import HardwareSpec
from perfsdk.model import ModelSpec
from perfsdk.testing import monitor_harness

MODEL = ModelSpec.named("llama-3-8b")
HW = HardwareSpec(name="test-gpu", memory_bandwidth=4.8e12, flops={"bf16": 1e15})
STEP = "perfsdk_step_seconds"


def fpm(
    wall: float,
    prefill_reqs: int = 0,
    prefill_tokens: int = 0,
    prefix: int = 0,
    decode_reqs: int = 0,
    decode_kv: int = 0,
    version: int = FPM_VERSION,
) -> dict[str, Any]:
    return {
        "version": version,
        "worker_id": "w",
        "dp_rank": 0,
        "counter_id": 0,
        "wall_time": wall,
        "scheduled_requests": {
            "num_prefill_requests": prefill_reqs,
            "sum_prefill_tokens": prefill_tokens,
            "var_prefill_length": 0.0,
            "sum_prefill_kv_tokens": prefix,
            "num_decode_requests": decode_reqs,
            "sum_decode_kv_tokens": decode_kv,
            "var_decode_kv_tokens": 0.0,
        },
        "queued_requests": {},
    }


def test_each_kind_of_forward_maps_to_its_step() -> None:
    assert step_from_fpm(fpm(0.02, decode_reqs=8, decode_kv=8000)) == (
        "decode",
        0.02,
        {"batch": 8, "context_tokens": 8000},
    )
    assert step_from_fpm(fpm(0.05, prefill_reqs=3, prefill_tokens=1000, prefix=64)) == (
        "prefill",
        0.05,
        {"batch": 3, "tokens": 1000, "context_tokens": 64, "seq_lens": [334, 333, 333]},
    )
    assert step_from_fpm(fpm(0.03, prefill_reqs=1, prefill_tokens=256, prefix=10, decode_reqs=7, decode_kv=7000)) == (
        "mixed",
        0.03,
        {"batch": 7, "context_tokens": 7010, "seq_lens": [256]},
    )
    assert step_from_fpm(fpm(0.0)) is None  # an idle heartbeat
    assert step_from_fpm(fpm(0.01)) is None  # GPU time but nothing scheduled
    with pytest.raises(ValueError, match="version 2"):
        step_from_fpm(fpm(0.02, decode_reqs=1, version=2))


def test_the_subscriber_records_what_a_publisher_sends(tmp_path: Any) -> None:
    zmq = pytest.importorskip("zmq")
    msgspec = pytest.importorskip("msgspec")
    base = f"ipc://{tmp_path}/fpm"
    ctx = zmq.Context.instance()
    pubs = []
    for rank in range(2):
        pub = ctx.socket(zmq.PUB)
        pub.bind(f"{base}.{rank}")
        pubs.append(pub)
    with monitor_harness(model=MODEL, hardware=HW) as h:
        sub = FpmSubscriber(h.monitor, base, dp_size=2)
        seqs = [0, 0]

        def send(rank: int, msg: dict[str, Any], skip: int = 0) -> None:
            seqs[rank] += skip
            msg = {**msg, "dp_rank": rank}
            pubs[rank].send_multipart((b"", seqs[rank].to_bytes(8, "big"), msgspec.msgpack.encode(msg)))
            seqs[rank] += 1

        deadline = time.monotonic() + 10  # ZMQ drops what a PUB sends before the SUB has joined
        while sub.received == 0 and time.monotonic() < deadline:
            send(0, fpm(0.0))
            time.sleep(0.01)
        send(0, fpm(0.02, decode_reqs=8, decode_kv=8000), skip=3)  # three lost on the wire
        send(1, fpm(0.05, prefill_reqs=2, prefill_tokens=1000))
        send(1, fpm(0.02, decode_reqs=1, version=9))  # another schema: skipped
        send(1, fpm(0.01, prefill_reqs=2))  # GPU time, no new tokens (DP-attention padding): nothing to cost
        deadline = time.monotonic() + 10
        while (sub.steps < 2 or not sub._warned_version or not sub.skipped) and time.monotonic() < deadline:
            time.sleep(0.01)
        sub.close()
        assert h.monitor.flush(5)
        assert sub.steps == 2 and sub.lost == 3 and sub.skipped == 1
        assert h.count(STEP, phase="decode") == 1 and h.count(STEP, phase="prefill") == 1
        assert h.sum("perfsdk_step_bandwidth_utilization", phase="decode") == pytest.approx(
            budget.decode_step_bytes(MODEL, 8000, 8) / (0.02 * 4.8e12)
        )
        assert h.sum("perfsdk_step_flops_utilization", phase="prefill") == pytest.approx(
            budget.prefill_flops(MODEL, [500, 500]) / (0.05 * 1e15)
        )
        assert h.monitor.stats()["internal_errors"] == 0
    for pub in pubs:
        pub.close(linger=0)


def test_bad_settings_are_config_errors() -> None:
    pytest.importorskip("zmq")
    with monitor_harness() as h:
        with pytest.raises(ConfigError, match="endpoint"):
            FpmSubscriber(h.monitor, "/tmp/no-scheme")
        with pytest.raises(ConfigError, match="dp_size"):
            FpmSubscriber(h.monitor, "ipc:///tmp/x", dp_size=0)
        with pytest.raises(ConfigError, match="cannot connect"):
            FpmSubscriber(h.monitor, "tcp://no-port")


def test_a_terminated_context_ends_the_subscriber_quietly() -> None:
    pytest.importorskip("zmq")
    with monitor_harness() as h:
        sub = FpmSubscriber(h.monitor, "ipc:///tmp/perfsdk-test-never-published")
        sub._ctx.term()  # what another component terminating a shared context would do
        sub._thread.join(5)
        assert not sub._thread.is_alive()
        assert h.monitor.stats()["internal_errors"] == 0


def test_the_model_comes_from_a_name_or_a_config(tmp_path: Any) -> None:
    import json

    assert load_model("llama-3-8b") == MODEL
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 512,
                "intermediate_size": 1376,
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "num_hidden_layers": 4,
                "vocab_size": 32000,
            }
        )
    )
    spec = load_model(str(tmp_path), tp=2)
    assert spec.tp == 2 and spec.layers == 4


@pytest.mark.parametrize("duration", ["nan", "-1", "0", "inf"])  # inf: use no --duration
def test_cli_duration_must_be_positive_and_finite(duration: str, capsys: pytest.CaptureFixture[str]) -> None:
    # before: nan, 0 and -1 stopped at once with exit 0, having watched nothing
    from perfsdk.cli import main

    args = [
        "sglang",
        "--fpm",
        "ipc:///tmp/perfsdk-test-unused",
        "--model",
        "llama-3-8b",
        "--hardware",
        "h200",
        "--port",
        "0",
        "--duration",
        duration,
    ]
    assert main(args) == 2
    assert "--duration" in capsys.readouterr().err
