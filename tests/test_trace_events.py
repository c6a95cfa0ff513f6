"""Reading traces as a stream (perfsdk.profiling.trace_events): same events as parsing the whole
document, whatever the layout and wherever the pieces are cut; bounded memory; clear errors.

The reference everywhere is the plain reading: ``json.loads`` of the whole file, every event dict
turned into an Event (``_reference``), which is what the analyser did before it streamed.
"""

from __future__ import annotations

import gzip
import json
import math
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from perfsdk.cli import main
from perfsdk.errors import ConfigError
from perfsdk.profiling import trace_events as te
from perfsdk.profiling.analyze import analyze_trace
from perfsdk.profiling.trace_events import Trace, load_trace, read_trace_events

DATA = Path(__file__).parent / "data"
FIXTURES = sorted(DATA.glob("h200_*.pt.trace.json.gz"))
PARSERS = ["msgspec", "json"] if te.HAVE_MSGSPEC else ["json"]
DEEP = 100_000  # far beyond the interpreter's recursion limit


def _reference(path: Path) -> Trace:
    builder = te._Builder(str(path))
    for raw in read_trace_events(path):
        builder.add_dict(raw)
    return builder.finish()


def _same(a: Trace, b: Trace) -> None:
    assert a.gpu_ops == b.gpu_ops
    assert a.runtime == b.runtime
    assert a.annotations == b.annotations
    assert a.cpu_ops == b.cpu_ops
    assert a._launch_by_corr == b._launch_by_corr


@pytest.fixture(params=[None, (1, 4096), (200, 97)], ids=["default", "tiny-pieces", "odd-reads"])
def pieces(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut after (almost) every event and read a few bytes at a time: every boundary case gets hit."""
    if request.param is not None:
        piece, read = request.param
        monkeypatch.setattr(te, "_PIECE", piece)
        monkeypatch.setattr(te, "_READ", read)


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("path", FIXTURES, ids=lambda p: p.name.split(".")[0])
def test_the_real_traces_stream_to_the_same_events(path: Path, parser: te.Parser, pieces: None) -> None:
    streamed = load_trace(path, parser=parser)
    assert streamed.gpu_ops  # a real GPU trace
    _same(streamed, _reference(path))


def _kernel(i: int, name: str = "void gemv_kernel", **extra: Any) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "kernel",
        "name": name,
        "pid": 0,
        "tid": 7,
        "ts": 10.0 * i,
        "dur": 4.0,
        "args": {"correlation": i, "stream": 7, **extra},
    }


def _launch(i: int) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "cuda_runtime",
        "name": "cudaLaunchKernel",
        "pid": 1,
        "tid": 1,
        "ts": 10.0 * i - 3,
        "dur": 2.0,
        "args": {"correlation": i},
    }


def _awkward_events() -> list[dict[str, Any]]:
    """Valid events whose text holds the byte patterns the reader cuts at."""
    events: list[dict[str, Any]] = [
        {"ph": "X", "cat": "user_annotation", "name": "perfsdk.decode", "pid": 1, "tid": 1, "ts": 0.0, "dur": 500.0}
    ]
    for i in range(1, 40):
        events.append(_launch(i))
        if i % 5 == 0:
            events.append(_kernel(i, name='odd}, {"name": "x"}] name'))  # a cut pattern inside a string
        elif i % 5 == 1:
            events.append(_kernel(i, shapes=[{"a": 1}, {"b": [{"c": 2}]}]))  # "}," and "}]" inside args
        elif i % 5 == 2:
            events.append(_kernel(i, **{"graph id": 3, "bytes": "0x10"}))
        else:
            events.append(_kernel(i))
    events.append({"ph": "f", "cat": "ac2g", "id": 99, "pid": 0, "tid": 7, "ts": 400.0})
    events.append({"ph": "X", "cat": "kernel", "name": "no correlation", "pid": 0, "tid": 7, "ts": 400.0, "dur": 1.0})
    events.append(
        {
            "ph": "X",
            "cat": "cuda_runtime",
            "name": "cudaLaunchKernel",
            "pid": 1,
            "tid": 1,
            "ts": 398.0,
            "dur": 1.0,
            "args": {"correlation": 99},
        }
    )
    events += [5, "text", None, [1, 2]]  # not events: skipped as before
    events.append(
        {
            "ph": "X",
            "cat": "kernel",
            "name": "args not an object",
            "pid": 0,
            "tid": 7,
            "ts": 450.0,
            "dur": 1.0,
            "args": [1, 2],
        }
    )
    return events


LAYOUTS: dict[str, str] = {
    "kineto-like": json.dumps({"schemaVersion": 1, "traceEvents": _awkward_events(), "traceName": "t"}, indent=2),
    "minified": json.dumps({"traceEvents": _awkward_events()}, separators=(",", ":")),
    "bare array": json.dumps(_awkward_events()),
    # the key's text inside a string before the real key, and arrays of objects after the events
    "decoy key": json.dumps(
        {"note": '"traceEvents": [ {"ph": "X"} ]', "traceEvents": _awkward_events(), "after": [{"x": 1}, {"y": [2]}]}
    ),
    # two traceEvents keys: JSON parsers keep the last one
    "duplicate key": '{"traceEvents": ['
    + json.dumps(_kernel(1))
    + '], "traceEvents": '
    + json.dumps(_awkward_events())
    + "}",
    "empty-looking gaps": '{"traceEvents" :\n [\n\n'
    + ",\n\n".join(json.dumps(e) for e in _awkward_events())
    + "\n\n ]\n}",
}


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_streams_to_the_same_events(tmp_path: Path, layout: str, parser: te.Parser, pieces: None) -> None:
    path = tmp_path / "t.json"
    path.write_text(LAYOUTS[layout])
    streamed = load_trace(path, parser=parser)
    _same(streamed, _reference(path))
    assert len(streamed.gpu_ops) == 41
    # and gzip reads the same
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    _same(load_trace(gz, parser=parser), streamed)


def test_nan_timestamps_are_skipped_not_carried(tmp_path: Path) -> None:
    # json.loads takes NaN and Infinity (msgspec does not: the reader falls back for that piece)
    events = [_kernel(1), {**_kernel(2), "ts": math.nan}, {**_kernel(3), "dur": math.inf}, _kernel(4)]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    for parser in PARSERS:
        assert [op.correlation for op in load_trace(path, parser=parser).gpu_ops] == [1, 4]


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "t.json"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "text",
    [
        "[" * DEEP + "]" * DEEP,
        '{"traceEvents": [' + "[" * DEEP + "]" * DEEP + "]}",
        '{"traceEvents": [' + json.dumps(_kernel(1))[:-1] + ', "deep": ' + "[" * DEEP + "]" * DEEP + "}]}",
    ],
    ids=["document", "element", "inside an event"],
)
@pytest.mark.parametrize("parser", PARSERS)
def test_deep_nesting_is_a_clear_error(
    tmp_path: Path, text: str, parser: te.Parser, capsys: pytest.CaptureFixture[str]
) -> None:
    # before: a RecursionError traceback from json.loads
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_trace(path, parser=parser)
    assert main(["analyze", str(path)]) == 2
    assert "nested too deeply" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text",
    [
        "[1, 2, 3]",
        '{"traceEvents": []}',
        "[]",
        '{"traceEvents": [{"ph": "M", "name": "process_name"}]}',
        '[{"ph": "X", "cat": "kernel", "name": "k"}]',
    ],  # no ts: not a timed event
)
def test_a_document_without_timed_events_is_not_a_trace_with_steps(
    tmp_path: Path, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # before: exit 0 and "findings: none above thresholds"
    path = _write(tmp_path, text)
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert "not a profiler trace with steps" in err
    with pytest.raises(ConfigError, match="not a profiler trace with steps"):
        analyze_trace([])


@pytest.mark.parametrize(
    "text",
    [
        '{"traceEvents": [' + json.dumps(_kernel(1)) + ", " + json.dumps(_kernel(2))[:-3],  # truncated
        '{"traceEvents": [' + json.dumps(_kernel(1)) + ", {oops}, " + json.dumps(_kernel(2)) + "]}",
        '{"traceEvents": [' + json.dumps(_kernel(1)) + "]} trailing",
        '{"traceEvents": 5}',
        '{"traceEvents": [' + json.dumps(_kernel(1)) + ", ]}",
    ],
    ids=["truncated", "bad element", "trailing text", "not a list", "trailing comma"],
)
@pytest.mark.parametrize("parser", PARSERS)
def test_broken_documents_are_refused_as_before(tmp_path: Path, text: str, parser: te.Parser, pieces: None) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match=r"trace: .* (is not a JSON chrome trace|has no 'traceEvents' list)"):
        load_trace(path, parser=parser)


def _tiled_trace(path: Path, copies: int) -> None:
    """The eager fixture's events repeated *copies* times, shifted in time and in ids."""
    events = read_trace_events(DATA / "h200_eager.pt.trace.json.gz")
    span = max(e["ts"] + e.get("dur", 0) for e in events if "ts" in e) - min(e["ts"] for e in events if "ts" in e)
    out = []
    for k in range(copies):
        for raw in events:
            e = dict(raw)
            if "ts" in e:
                e["ts"] = e["ts"] + k * (span + 100.0)
            if isinstance(e.get("id"), int):
                e["id"] += k * 10**6
            if isinstance(e.get("args"), dict) and isinstance(e["args"].get("correlation"), int):
                e["args"] = {**e["args"], "correlation": e["args"]["correlation"] + k * 10**6}
            out.append(e)
    path.write_text(json.dumps({"traceEvents": out}, indent=1))


@pytest.mark.skipif(not te.HAVE_MSGSPEC, reason="the memory bound is for the msgspec reader")
def test_memory_while_reading_stays_below_one_and_a_half_times_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # before: json.loads held the whole document as dicts, ~6x the file. Counted by tracemalloc
    # (allocations, not time), on a file many times the reader's piece and read sizes (made small
    # here so that a few MB show what a few hundred do with the default sizes)
    monkeypatch.setattr(te, "_READ", 2**18)
    monkeypatch.setattr(te, "_PIECE", 2**17)
    path = tmp_path / "big.json"
    copies = 15
    _tiled_trace(path, copies)
    size = path.stat().st_size
    assert size > 10 * (te._READ + te._PIECE)
    tracemalloc.start()
    try:
        diag = analyze_trace(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(diag.steps) == 4 * copies
    assert peak < 1.5 * size, f"peak {peak / 2**20:.1f} MiB for a {size / 2**20:.1f} MiB file"


_WITHOUT_MSGSPEC = """
import json, sys
sys.modules["msgspec"] = None  # import msgspec now raises ImportError: the standard library parses
from perfsdk.profiling import trace_events
from perfsdk.profiling.analyze import analyze_trace
from perfsdk.errors import MissingDependencyError
assert not trace_events.HAVE_MSGSPEC
try:
    trace_events.load_trace(sys.argv[1], parser="msgspec")
except MissingDependencyError as e:
    assert "msgspec" in str(e)
else:
    raise AssertionError("parser='msgspec' without msgspec must say what is missing")
print(json.dumps(analyze_trace(sys.argv[1]).to_dict()))
"""


@pytest.mark.parametrize("path", FIXTURES[:2], ids=lambda p: p.name.split(".")[0])
def test_without_msgspec_the_standard_library_gives_the_same_diagnosis(path: Path) -> None:
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", _WITHOUT_MSGSPEC, str(path)], capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(proc.stdout) == analyze_trace(path).to_dict()


@pytest.mark.parametrize("parser", PARSERS)
def test_recorded_shapes_of_matrix_products_are_kept(tmp_path: Path, parser: te.Parser) -> None:
    """torch.profiler(record_shapes=True) writes "Input Dims" / "Input type": kept for the matrix products
    (what perfsdk.profiling.bandwidth prices kernels from), dropped for every other operator."""
    torch = pytest.importorskip("torch")
    from torch.profiler import profile, record_function

    x, w, b = torch.randn(8, 64), torch.randn(32, 64), torch.randn(32)
    with profile(record_shapes=True) as prof, record_function("perfsdk.decode"):
        torch.nn.functional.linear(x, w, b).relu()
        torch.bmm(torch.randn(2, 3, 4), torch.randn(2, 4, 5))
    path = tmp_path / "shapes.json"
    prof.export_chrome_trace(str(path))
    trace = load_trace(path, parser=parser)
    shaped = {e.name: (e.input_dims, e.input_types) for e in trace.cpu_ops if e.input_dims is not None}
    assert shaped["aten::linear"] == (((8, 64), (32, 64), (32,)), ("float", "float", "float"))
    assert shaped["aten::bmm"] == (((2, 3, 4), (2, 4, 5)), ("float", "float"))
    assert "aten::relu" not in shaped and set(shaped) <= te.SHAPED_OPS
    assert trace.cpu_ops == _reference(path).cpu_ops  # the streamed reading keeps the same shapes


# ---- hostile files: limits, linear work, odd values (issue 20, items 4 and 11) ---------------------


def _member(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9)


def _bomb(bulk: bytes, copies: int, before: bytes = b"", after: bytes = b"") -> bytes:
    """A .gz of ``before + bulk * copies + after``: concatenated gzip members (every gzip reader joins
    them), so 1 GiB of padding costs about a megabyte and no time to build."""
    return _member(before) + _member(bulk) * copies + _member(after)


_TWO = (json.dumps(_kernel(1)) + ", " + json.dumps(_kernel(2))).encode()
_HEAD = b'{"traceEvents": ['


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize(
    "parts",
    [
        (b"", b" ", _HEAD + _TWO + b"]}"),  # the bomb: 1 GiB of whitespace before the document
        (_HEAD + _TWO + b', {"ph": "X", "cat": "kernel", "name": "', b"a", b'"}]}'),  # 1 GiB in one string
        (_HEAD + _TWO + b",", b" ", _TWO + b"]}"),  # between two events
        (b'{"note": "', b"a", b'", ' + _HEAD[1:] + _TWO + b"]}"),  # before the array
    ],
    ids=["leading whitespace", "one string", "between events", "before the array"],
)
def test_a_compression_bomb_is_refused_at_the_limit_having_read_no_further(
    tmp_path: Path, parts: tuple[bytes, bytes, bytes], parser: te.Parser, capsys: pytest.CaptureFixture[str]
) -> None:
    # before: a 1 MB .gz holding 1 GiB of leading whitespace took 209 s and 4.2 GB (no limit, quadratic)
    before, fill, after = parts
    path = tmp_path / "bomb.json.gz"
    path.write_bytes(_bomb(fill * 2**20, 1024, before, after))  # 1 GiB of JSON once decompressed
    assert path.stat().st_size < 2**21
    limit = 4 * 2**20
    tracemalloc.start()
    try:
        with pytest.raises(te.TraceTooLargeError, match=r"more than 4 MiB of JSON once decompressed"):
            load_trace(path, parser=parser, max_bytes=limit)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # nothing past the limit was read: memory stays at a few times it, not at the bomb's GiB
    assert peak < 4 * limit + 2 * te._READ, f"peak {peak / 2**20:.1f} MiB"
    assert main(["analyze", str(path), "--max-size", "4MiB"]) == 2
    err = capsys.readouterr().err
    assert "more than 4 MiB of JSON once decompressed" in err and "--max-size" in err
    with pytest.raises(te.TraceTooLargeError):
        read_trace_events(path, max_bytes=limit)  # the whole-document reader is bounded as well


def test_the_limit_is_on_decompressed_bytes_and_configurable(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text(LAYOUTS["kineto-like"])
    size = path.stat().st_size
    assert len(load_trace(path, max_bytes=size).gpu_ops) == 41  # exactly the limit: read
    assert load_trace(path).read_stats.bytes_read == size
    with pytest.raises(te.TraceTooLargeError, match=rf"of JSON in the file \({size - 1} bytes, the limit\)"):
        load_trace(path, max_bytes=size - 1)
    assert len(load_trace(path, max_bytes=None).gpu_ops) == 41
    gz = tmp_path / "t.json.gz"
    gz.write_bytes(gzip.compress(path.read_bytes()))
    assert gz.stat().st_size < size // 2
    with pytest.raises(te.TraceTooLargeError):  # counted after decompression, not on the .gz
        load_trace(gz, max_bytes=size - 1)
    assert te.DEFAULT_MAX_BYTES == 2 * 2**30
    for bad in (0, -1, 1.5, True, "1GiB"):
        with pytest.raises(ConfigError, match="max_bytes"):
            load_trace(path, max_bytes=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("flag", "ok"),
    [
        ("8GiB", True),
        ("500MB", True),
        ("1.5G", True),
        ("1048576", True),
        (" 20 kib ", True),
        ("nan", False),
        ("inf", False),
        ("-1", False),
        ("0", False),
        ("1e400", False),
        ("12 parsecs", False),
        ("", False),
    ],
)
def test_max_size_flag(tmp_path: Path, flag: str, ok: bool, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "t.json"
    path.write_text(LAYOUTS["kineto-like"])
    if ok:
        assert main(["analyze", str(path), "--max-size", flag]) == 0
        return
    assert main(["analyze", str(path), "--max-size", flag]) == 2  # argparse's exit code, returned by main
    assert "--max-size" in capsys.readouterr().err


# Files whose bulk (n bytes) sits where the old reader rescanned it: its work grew as n squared over
# the read size (128 MiB: 5.1 s, 256 MiB: 17.8 s, 1 GiB: 209 s). Each holds kernels 1 and 2 (and,
# for some, 3) whatever n is.
_K3 = json.dumps(_kernel(3)).encode()
SHAPES: dict[str, Any] = {
    "leading whitespace": lambda n: b" " * n + _HEAD + _TWO + b"]}",
    "whitespace between events": lambda n: _HEAD + _TWO + b"," + b"\n" * n + _K3 + b"]}",
    "whitespace after a brace": lambda n: _HEAD + _TWO + b" " * n + b"," + _K3 + b"]}",
    "whitespace after the array": lambda n: _HEAD + _TWO + b"]" + b"\t" * n + b"}",
    "one long string": lambda n: _HEAD + _TWO + b', {"ph": "i", "name": "' + b"a" * n + b'"}]}',
    "cut patterns in a string": lambda n: (
        _HEAD + _TWO + b', {"ph": "i", "name": "' + b'}, {\\"x\\": 1}] ' * (n // 15) + b'"}, ' + _K3 + b"]}"
    ),
    "a string ending the array": lambda n: _HEAD + _TWO + b', {"ph": "i", "name": "' + b"}]" * (n // 2) + b'"}]}',
    "nested objects": lambda n: (
        _HEAD + _TWO + b', {"ph": "i", "args": {' + b'"k": {"a": 1}, ' * (n // 16) + b'"z": 0}}, ' + _K3 + b"]}"
    ),
    "a long string before the array": lambda n: b'{"note": "' + b"a" * n + b'", ' + _HEAD[1:] + _TWO + b"]}",
}


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("shape", SHAPES)
def test_reading_work_grows_linearly_with_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shape: str, parser: te.Parser
) -> None:
    # The reader's work counted (bytes scanned for boundaries, whitespace and string ends; bytes given
    # to the parser, failed tries included) on files 1, 2 and 4 MiB long, with reads and pieces made
    # small (64 and 32 KiB) so that a few MiB show what hundreds do with the default sizes: it stays
    # within a small multiple of the bytes read, so doubling the file doubles the work.
    monkeypatch.setattr(te, "_READ", 2**16)
    monkeypatch.setattr(te, "_PIECE", 2**15)
    work = []
    for mib in (1, 2, 4):
        path = tmp_path / f"{mib}.json"
        path.write_bytes(SHAPES[shape](mib * 2**20))
        trace = load_trace(path, parser=parser)
        assert [op.correlation for op in trace.gpu_ops][:2] == [1, 2]
        stats = trace.read_stats
        assert stats.streamed and stats.bytes_read == path.stat().st_size
        assert stats.bytes_scanned <= 3 * stats.bytes_read, stats
        assert stats.bytes_parsed <= 4 * stats.bytes_read, stats
        assert stats.parses <= 16, stats
        work.append(stats.bytes_scanned + stats.bytes_parsed)
    assert work[2] / work[0] < 4.5, work  # linear: 4x the file, 4x the work (quadratic would be 16x)


@pytest.mark.parametrize("place", ["before the document", "between events", "after the array"])
def test_whitespace_is_dropped_as_it_is_passed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, place: str) -> None:
    # before: all of it was kept in the buffer (and copied at every read): 1 GiB of padding, 4.2 GB.
    # Reads and pieces made small, so that 16 MiB stand for GiBs
    monkeypatch.setattr(te, "_READ", 2**16)
    monkeypatch.setattr(te, "_PIECE", 2**15)
    n = 16 * 2**20
    path = tmp_path / "padded.json"
    body = _HEAD + _TWO + b"]}"
    path.write_bytes(
        {
            "before the document": b" " * n + body,
            "between events": _HEAD + _TWO + b"," + b" " * n + _K3 + b"]}",
            "after the array": _HEAD + _TWO + b"]" + b" " * n + b"}",
        }[place]
    )
    tracemalloc.start()
    try:
        trace = load_trace(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(trace.gpu_ops) >= 2
    # the reader's own buffer, counted as it grows: exact whatever else the process allocates meanwhile
    assert trace.read_stats.buffer_peak < 4 * te._READ, trace.read_stats
    # and the whole process's peak (other threads of earlier tests may add a little: a looser bound)
    assert peak < 32 * te._READ, f"peak {peak / 2**20:.1f} MiB for {n / 2**20:.0f} MiB of whitespace"


def _long_int() -> str:
    digits = sys.get_int_max_str_digits()
    if digits == 0:
        pytest.skip("this interpreter has no limit on int conversion")
    return "9" * (digits + 700)


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("where", ["ts", "args", "after the array", "before the array", "bare array"])
def test_a_number_past_pythons_int_limit_is_a_clear_error(
    tmp_path: Path, where: str, parser: te.Parser, capsys: pytest.CaptureFixture[str]
) -> None:
    # before: ValueError traceback ("Exceeds the limit (4300 digits) for integer string conversion")
    big = _long_int()
    k1, k2 = json.dumps(_kernel(1)), json.dumps(_kernel(2))
    text = {
        "ts": '{"traceEvents": [' + k1 + ', {"ph": "X", "cat": "kernel", "ts": ' + big + ', "dur": 1}]}',
        "args": '{"traceEvents": [' + k1 + ", " + k2.replace('"correlation": 2', '"correlation": ' + big) + "]}",
        "after the array": '{"traceEvents": [' + k1 + '], "n": ' + big + "}",
        "before the array": '{"n": ' + big + ', "traceEvents": [' + k1 + "]}",
        "bare array": "[" + k1 + ", " + big + "]",
    }[where]
    path = _write(tmp_path, text)
    at = text.index(big)
    message = f"holds a number of more than {sys.get_int_max_str_digits()} digits .* at byte {at}"
    with pytest.raises(ConfigError, match=message):
        load_trace(path, parser=parser)
    assert main(["analyze", str(path)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"at byte {at}" in err


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("where", ["in an event", "before the array"])
def test_bytes_that_are_not_utf8_are_a_clear_error(
    tmp_path: Path, where: str, parser: te.Parser, capsys: pytest.CaptureFixture[str]
) -> None:
    # before: UnicodeDecodeError traceback from the streamed pieces
    k1 = json.dumps(_kernel(1)).encode()
    raw = (
        _HEAD + k1 + b', {"ph": "X", "name": "k\xff", "ts": 1}]}'
        if where == "in an event"
        else b'{"n": "\xff", ' + _HEAD[1:] + k1 + b"]}"
    )
    path = tmp_path / "t.json"
    path.write_bytes(raw)
    at = raw.index(b"\xff")
    with pytest.raises(ConfigError, match=f"not UTF-8 .*byte {at}"):
        load_trace(path, parser=parser)
    assert main(["analyze", str(path)]) == 2
    assert "Traceback" not in capsys.readouterr().err


@pytest.mark.parametrize("parser", PARSERS)
def test_odd_numbers_the_parsers_differ_on_read_the_same(tmp_path: Path, parser: te.Parser) -> None:
    # msgspec refuses NaN, Infinity, 1e999 and integers past 64 bits; json takes them: the reader
    # gives the same events either way (non-finite times skipped, big ids kept)
    events = [
        _kernel(1),
        {**_kernel(2), "ts": "__NAN__"},
        {**_kernel(3), "dur": "__NINF__"},
        {**_kernel(4), "ts": "__HUGE__"},
        _kernel(5, extra=2**70),
        {**_kernel(6), "args": {"correlation": 2**70}},
    ]
    text = json.dumps({"traceEvents": events})
    for token, literal in (("__NAN__", "NaN"), ("__NINF__", "-Infinity"), ("__HUGE__", "1e999")):
        text = text.replace(f'"{token}"', literal)
    path = _write(tmp_path, text)
    assert [op.correlation for op in load_trace(path, parser=parser).gpu_ops] == [1, 5, 2**70]


@pytest.mark.parametrize("parser", PARSERS)
def test_deep_nesting_in_the_events_says_where(tmp_path: Path, parser: te.Parser) -> None:
    text = '{"traceEvents": [' + json.dumps(_kernel(1)) + ", " + "[" * DEEP + "]" * DEEP + "]}"
    with pytest.raises(ConfigError, match=r"nested too deeply .*from byte \d+"):
        load_trace(_write(tmp_path, text), parser=parser)


# Any document, cut anywhere: the stream gives the events the whole parse gives, or both refuse it.
_SPACES = st.text(alphabet=" \t\r\n", max_size=3)
_AWKWARD = st.sampled_from(["k", 'odd}, {"name": "x"}] n', "}}]],,{{", 'a"b\\c', "\u00e9}]", '\\"}, ', "x" * 40])
_VALUES = st.recursive(
    st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.none(), st.booleans(), _AWKWARD),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(["a", "b}", "c]"]), inner, max_size=3),
    max_leaves=6,
)
_EVENT = st.fixed_dictionaries(
    {
        "ph": st.just("X"),
        "cat": st.sampled_from(["kernel", "cuda_runtime", "cpu_op", "other"]),
        "name": _AWKWARD,
        "ts": st.floats(0, 1e6),
        "dur": st.floats(0, 10),
    },
    optional={
        "args": st.dictionaries(st.sampled_from(["correlation", "stream", "shapes", "x"]), _VALUES, max_size=3),
        "extra": _VALUES,
    },
)


def _spaced(value: Any, space: st.DataObject) -> str:
    """JSON text of *value* with whitespace drawn between every token."""
    gap = lambda: space.draw(_SPACES)  # noqa: E731
    if isinstance(value, dict):
        body = ("," + gap()).join(json.dumps(k) + gap() + ":" + gap() + _spaced(v, space) for k, v in value.items())
        return "{" + gap() + body + gap() + "}"
    if isinstance(value, list):
        return "[" + gap() + ("," + gap()).join(_spaced(v, space) for v in value) + gap() + "]"
    return json.dumps(value)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    events=st.lists(_EVENT, max_size=12),
    form=st.sampled_from(["kineto", "bare", "tail"]),
    cut=st.sampled_from([None, "truncate", "insert", "delete"]),
    where=st.floats(0, 1),
    sizes=st.tuples(st.sampled_from([1, 7, 64, 4 * 2**20]), st.sampled_from([1, 5, 97, 8 * 2**20])),
    data=st.data(),
)
def test_any_document_streams_to_what_the_whole_parse_gives(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    events: list[dict[str, Any]],
    form: str,
    cut: str | None,
    where: float,
    sizes: tuple[int, int],
    data: st.DataObject,
) -> None:
    monkeypatch.setattr(te, "_PIECE", sizes[0])
    monkeypatch.setattr(te, "_READ", sizes[1])
    doc: Any = events if form == "bare" else {"schemaVersion": 1, "traceEvents": events}
    if form == "tail":
        doc["after"] = [{"x": "}]"}, {"y": [{"z": 1}]}]
    text = _spaced(doc, data)
    k = int(where * len(text))
    if cut == "truncate":
        text = text[:k]
    elif cut == "insert":
        text = text[:k] + data.draw(st.sampled_from(["}", "]", ",", '"', "\\", "x", "}, ]"])) + text[k:]
    elif cut == "delete":
        text = text[:k] + text[k + 1 :]
    path = tmp_path / "t.json"
    path.write_text(text)
    try:
        reference: Trace | None = _reference(path)
    except ConfigError:
        reference = None
    for parser in PARSERS:
        if reference is None:
            with pytest.raises(ConfigError):
                load_trace(path, parser=parser)
        else:
            _same(load_trace(path, parser=parser), reference)
