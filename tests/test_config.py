"""Settings from arguments and the environment: perfsdk.config's one rule (issue 20, items 11 and 13).

Every ``PERFSDK_*`` variable is trimmed of ASCII whitespace and parsed the same way (integers in ASCII
digits, finite numbers in range); ``PROMETHEUS_MULTIPROC_DIR`` is checked when a Monitor is built.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import Any

import pytest

from perfsdk import assembly
from perfsdk.config import MonitorConfig, cache_dir, metrics_endpoint
from perfsdk.errors import ConfigError
from perfsdk.testing import monitor_harness

TTFT = "gen_ai_server_time_to_first_token_seconds"


# ---- issue 20, item 13: one rule for every environment variable (perfsdk.config) -------------------------
@pytest.mark.parametrize(
    ("name", "value", "field", "expected"),
    [
        ("PERFSDK_ENABLED", " true ", "enabled", True),  # was refused while PERFSDK_QUEUE_SIZE=" 12 " passed
        ("PERFSDK_ENABLED", "\tOFF\n", "enabled", False),
        ("PERFSDK_TIMING", " host ", "timing", "host"),  # was refused
        ("PERFSDK_HOT_PATH", " Python ", "hot_path", "python"),
        ("PERFSDK_NVTX", " false ", "nvtx", False),
        ("PERFSDK_QUEUE_SIZE", " 12 ", "queue_size", 12),
        ("PERFSDK_QUEUE_SIZE", "+12", "queue_size", 12),
        ("PERFSDK_STEP_SPAN_RATE", "\t.5\n", "step_span_rate", 0.5),
        ("PERFSDK_POLL_INTERVAL", " 5e-3 ", "poll_interval", 0.005),
        ("PERFSDK_SERVICE", "  svc  ", "service", "svc"),
        ("PERFSDK_METRICS_ADDR", " 127.0.0.1 ", "metrics_addr", "127.0.0.1"),
        ("PERFSDK_MODEL", " llama-3-8b ", "model", "llama-3-8b"),  # read by config.py, not by monitor.py
        ("PERFSDK_HARDWARE", " h100-sxm ", "hardware", "h100-sxm"),
        ("PERFSDK_RANK", " 3 ", "rank", 3),
        ("PERFSDK_RANK", "NONE", "rank", None),
        ("PERFSDK_QUEUE_SIZE", "   ", "queue_size", 65536),  # only whitespace: unset
    ],
)
def test_environment_values_are_trimmed_by_one_rule(name: str, value: str, field: str, expected: Any) -> None:
    assert getattr(MonitorConfig.from_env(environ={name: value}), field) == expected


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("PERFSDK_QUEUE_SIZE", "１２", "expected an integer within [1, 16777216] (ASCII digits), got '１２'"),
        ("PERFSDK_QUEUE_SIZE", "1_000", "expected an integer"),
        ("PERFSDK_QUEUE_SIZE", "12.0", "expected an integer"),
        ("PERFSDK_QUEUE_SIZE", "\u300012", "expected an integer"),  # an ideographic space is not trimmed
        ("PERFSDK_QUEUE_SIZE", "9" * 5000, "must be within [1, 16777216], got a 5000-digit number"),
        ("PERFSDK_EVENT_POOL_SIZE", "0", "must be within [1, 1048576], got 0"),
        ("PERFSDK_POLL_INTERVAL", "nan", "expected a number of seconds within [0.0001, 10], got 'nan'"),
        ("PERFSDK_POLL_INTERVAL", "inf", "expected a number of seconds"),
        ("PERFSDK_POLL_INTERVAL", "1e400", "must be a number of seconds within [0.0001, 10], got '1e400'"),
        ("PERFSDK_STEP_SPAN_RATE", "０.５", "expected a fraction"),
        ("PERFSDK_CHAIN_GAP_US", "1e5", "must be a number of microseconds within [0, 10000]"),
        ("PERFSDK_ENABLED", "maybe", "expected true or false"),
        ("PERFSDK_STRICT", "ｔｒｕｅ", "expected true or false"),
        ("PERFSDK_TIMING", "gpu", "expected one of 'auto', 'cuda', 'host'"),
        ("PERFSDK_METRICS_PORT", "65536", "must be within [0, 65535], got 65536"),
        ("PERFSDK_METRICS_PORT", "８０", "expected an integer within [0, 65535]"),
        ("PERFSDK_RANK", "-1", "must be within [0, 1048576], got -1"),
        ("PERFSDK_RANK", "first", "expected an integer"),
    ],
)
def test_bad_settings_from_the_environment_name_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ConfigError) as e:
        MonitorConfig.from_env(environ={name: value})
    assert str(e.value).startswith(f"{name} (environment): ")
    assert message in str(e.value)


def test_perfsdk_rank_sets_the_rank_label(monkeypatch: pytest.MonkeyPatch) -> None:
    """PERFSDK_RANK was read and never used (the Monitor's rank="auto" default hid it)."""
    monkeypatch.setenv("PERFSDK_RANK", "5")
    with monitor_harness() as h:
        assert h.monitor.rank == 5
        h.monitor.request(prompt_tokens=1).tokens(1)
        h.flush()
        assert h.registry.get_sample_value(f"{TTFT}_count", {"model": "unknown", "rank": "5"}) == 1
    with monitor_harness(rank=None) as h:  # an explicit argument wins
        assert h.monitor.rank is None


@pytest.mark.parametrize(("name", "value"), [("LOCAL_RANK", "１"), ("WORLD_SIZE", "two"), ("RANK", "9")])
def test_torchrun_variables_follow_the_same_rule(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv(name, value)
    cfg = MonitorConfig.from_env(environ={"PERFSDK_METRICS_PORT": "9400"})

    def read() -> object:
        return metrics_endpoint(cfg) if name == "LOCAL_RANK" else assembly.detect_rank("auto")

    with pytest.raises(ConfigError, match=f"^{name} \\(environment\\)"):
        read()


# ---- issue 20, item 11: PROMETHEUS_MULTIPROC_DIR checked when a Monitor is built ------------------------
def _read_only_dir(tmp_path: Any) -> str:
    d = tmp_path / "ro"
    d.mkdir()
    d.chmod(0o500)
    if not os.access(d, os.W_OK):
        return str(d)
    if os.path.isdir("/proc/sys") and not os.access("/proc/sys", os.W_OK):  # root: a directory nobody writes
        return "/proc/sys"
    pytest.skip("no read-only directory for this user")


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("missing", "does not exist"),
        ("read-only", "is not writable by this process"),
        ("plain file", "is not a directory"),
        ("space-padded", "has whitespace around it, and prometheus_client uses the value as written"),
        ("empty", "is set but empty"),
    ],
)
def test_bad_multiprocess_directory_is_a_config_error(tmp_path: Any, case: str, message: str) -> None:
    """Was a bare FileNotFoundError / PermissionError / NotADirectoryError from prometheus_client."""
    good = tmp_path / "mp"
    good.mkdir()
    (tmp_path / "file").write_text("")
    value = {
        "missing": str(tmp_path / "nope"),
        "read-only": _read_only_dir(tmp_path) if case == "read-only" else "",
        "plain file": str(tmp_path / "file"),
        "space-padded": f" {good} ",
        "empty": "",
    }[case]
    code = textwrap.dedent("""
        import perfsdk
        try:
            perfsdk.Monitor(hardware=None, otel=False)
        except perfsdk.ConfigError as e:
            print(e)
        else:
            print("accepted")
    """)
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": value}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("PROMETHEUS_MULTIPROC_DIR (environment): "), out.stdout + out.stderr
    assert message in out.stdout


def test_cache_dir_follows_the_same_rule(tmp_path: Any) -> None:
    assert cache_dir({"PERFSDK_CACHE_DIR": f"  {tmp_path}\n"}) == tmp_path
    assert cache_dir({"PERFSDK_CACHE_DIR": " "}).parts[-2:] == (".cache", "perfsdk")


def test_arguments_are_values_not_text() -> None:
    with pytest.raises(ConfigError, match=r"^queue_size: expected an integer"):
        MonitorConfig.from_env(environ={}, queue_size="12")
    with pytest.raises(ConfigError, match=r"^poll_interval: expected a finite number of seconds"):
        MonitorConfig.from_env(environ={}, poll_interval=10**400)
    # an argument wins over the environment, which is then not read at all
    assert MonitorConfig.from_env(environ={"PERFSDK_QUEUE_SIZE": "junk"}, queue_size=7).queue_size == 7
