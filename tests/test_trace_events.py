"""Reading traces as a stream (perfsdk.profiling.trace_events): same events as parsing the whole
document, whatever the layout and wherever the pieces are cut; bounded memory; clear errors.

The reference everywhere is the plain reading: ``json.loads`` of the whole file, every event dict
turned into an Event (``_reference``), which is what the analyser did before it streamed.
"""

from __future__ import annotations

import gzip
import json
import math
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

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
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": 10.0 * i, "dur": 4.0,
            "args": {"correlation": i, "stream": 7, **extra}}


def _launch(i: int) -> dict[str, Any]:
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
            "ts": 10.0 * i - 3, "dur": 2.0, "args": {"correlation": i}}


def _awkward_events() -> list[dict[str, Any]]:
    """Valid events whose text holds the byte patterns the reader cuts at."""
    events: list[dict[str, Any]] = [{"ph": "X", "cat": "user_annotation", "name": "perfsdk.decode", "pid": 1,
                                     "tid": 1, "ts": 0.0, "dur": 500.0}]
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
    events.append({"ph": "X", "cat": "kernel", "name": "no correlation", "pid": 0, "tid": 7, "ts": 400.0,
                   "dur": 1.0})
    events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,
                   "ts": 398.0, "dur": 1.0, "args": {"correlation": 99}})
    events += [5, "text", None, [1, 2]]  # not events: skipped as before
    events.append({"ph": "X", "cat": "kernel", "name": "args not an object", "pid": 0, "tid": 7, "ts": 450.0,
                   "dur": 1.0, "args": [1, 2]})
    return events


LAYOUTS: dict[str, str] = {
    "kineto-like": json.dumps({"schemaVersion": 1, "traceEvents": _awkward_events(), "traceName": "t"}, indent=2),
    "minified": json.dumps({"traceEvents": _awkward_events()}, separators=(",", ":")),
    "bare array": json.dumps(_awkward_events()),
    # the key's text inside a string before the real key, and arrays of objects after the events
    "decoy key": json.dumps({"note": '"traceEvents": [ {"ph": "X"} ]', "traceEvents": _awkward_events(),
                             "after": [{"x": 1}, {"y": [2]}]}),
    # two traceEvents keys: JSON parsers keep the last one
    "duplicate key": '{"traceEvents": [' + json.dumps(_kernel(1)) + '], "traceEvents": '
                     + json.dumps(_awkward_events()) + "}",
    "empty-looking gaps": '{"traceEvents" :\n [\n\n' + ",\n\n".join(json.dumps(e) for e in _awkward_events())
                          + "\n\n ]\n}",
}


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_streams_to_the_same_events(tmp_path: Path, layout: str, parser: te.Parser,
                                                 pieces: None) -> None:
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
def test_deep_nesting_is_a_clear_error(tmp_path: Path, text: str, parser: te.Parser,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    # before: a RecursionError traceback from json.loads
    path = _write(tmp_path, text)
    with pytest.raises(ConfigError, match="nested too deeply"):
        load_trace(path, parser=parser)
    assert main(["analyze", str(path)]) == 2
    assert "nested too deeply" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text",
    ["[1, 2, 3]", '{"traceEvents": []}', "[]", '{"traceEvents": [{"ph": "M", "name": "process_name"}]}',
     '[{"ph": "X", "cat": "kernel", "name": "k"}]'],  # no ts: not a timed event
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
    ],
    ids=["truncated", "bad element", "trailing text", "not a list"],
)
@pytest.mark.parametrize("parser", PARSERS)
def test_broken_documents_are_refused_as_before(tmp_path: Path, text: str, parser: te.Parser,
                                                pieces: None) -> None:
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

    proc = subprocess.run([sys.executable, "-c", _WITHOUT_MSGSPEC, str(path)], capture_output=True, text=True,
                          timeout=120, check=True)
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
