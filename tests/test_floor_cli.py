"""`perfsdk floor` end to end, through the real argument parser."""

from __future__ import annotations

import json

import pytest

from perfsdk.cli import main


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, float]:
    assert main(["floor", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def test_seed_8b_example(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(
        capsys,
        "--params",
        "8e9",
        "--bytes-per-param",
        "2",
        "--layers",
        "32",
        "--heads",
        "32",
        "--kv-heads",
        "8",
        "--head-dim",
        "128",
        "--ctx",
        "4096",
        "--batch",
        "1",
        "--prompt-tokens",
        "2048",
        "--bandwidth-tb-s",
        "3.35",
        "--tflops",
        "989",
        "--measured-ms",
        "9.8",
    )
    assert r["kv_bytes_per_token"] == 131_072
    assert r["decode_floor_ms"] == pytest.approx(4.94, abs=0.01)
    assert r["prefill_floor_no_attention_ms"] == pytest.approx(33.1, abs=0.1)
    assert r["prefill_floor_ms"] == pytest.approx(34.2, abs=0.1)
    assert r["mbu"] == pytest.approx(0.50, abs=0.01) and r["mbu_suspect"] is False
    for key in ("decode_tokens_per_s", "decode_step_bytes", "weight_bytes", "prefill_flops"):
        assert key in r


def test_named_model_and_suffix_counts(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "--params", "7B", "--bandwidth-tb-s", "2", "--measured-ms", str(1000 / 25.5))
    assert r["decode_tokens_per_s"] == pytest.approx(1e12 * 2 / 14e9, rel=1e-6)
    # the seed's int8 figure counts every weight (--params): ~296 tokens/s
    r = run_json(capsys, "--params", "6.74B", "--bytes-per-param", "1", "--bandwidth-tb-s", "2")
    assert r["decode_tokens_per_s"] == pytest.approx(296, abs=1.5)
    assert "params x bytes" in r["bytes_convention"]
    # the named model knows its untied input table: a step reads one row of it, so a little more is possible
    r = run_json(capsys, "--model", "llama-2-7b", "--bytes-per-param", "1", "--bandwidth-tb-s", "2")
    assert r["embedding_bytes"] == 32_000 * 4096
    assert r["decode_step_bytes"] == pytest.approx(r["weight_bytes"] - 32_000 * 4096 + 4096)
    assert r["decode_tokens_per_s"] == pytest.approx(2e12 / r["decode_step_bytes"])
    assert "one row per sequence" in r["bytes_convention"]


def test_a_step_faster_than_its_floor_says_the_measurement_or_peak_is_wrong(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["floor", "--model", "llama-3-8b", "--gpu", "h100-sxm", "--measured-ms", "2"]) == 0
    out = capsys.readouterr().out
    assert "MBU" in out and "suspect" in out
    assert "224" not in out.split("MBU", 1)[1].split("\n", 1)[0]  # not shown as a result, only in the warning
    assert "measurement or the peak (3.35 TB/s, h100-sxm datasheet) is wrong" in out
    r = run_json(capsys, "--model", "llama-3-8b", "--gpu", "h100-sxm", "--measured-ms", "2")
    assert r["mbu"] > 1 and r["mbu_suspect"] is True and len(r["warnings"]) == 1


def test_human_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "floor",
                "--params",
                "8B",
                "--layers",
                "32",
                "--heads",
                "32",
                "--kv-heads",
                "8",
                "--head-dim",
                "128",
                "--ctx",
                "4096",
                "--bandwidth-tb-s",
                "3.35",
                "--tflops",
                "989",
                "--measured-ms",
                "6",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "decode floor" in out and "MBU" in out and "82." in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--params", "8B"], "gpu: give --gpu"),
        (["--bandwidth-tb-s", "2"], "params: give --model"),
        (["--params", "8B", "--bandwidth-tb-s", "2", "--ctx", "100"], "ctx: the KV-cache term needs"),
        (["--model", "llama-3-8b", "--bandwidth-tb-s", "2", "--kv-heads", "5"], "kv_heads"),
        (["--model", "lama-3-8b", "--bandwidth-tb-s", "2"], "Did you mean"),
        (["--params", "8B", "--bandwidth-tb-s", "2", "--batch", "0"], "argument --batch: must be within [1, "),
        (["--params", "8B", "--bandwidth-tb-s", "2", "--measured-ms", "0"], "argument --measured-ms: must be"),
    ],
)
def test_errors_name_the_problem(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert main(["floor", *args]) == 2
    assert message in capsys.readouterr().err


def test_bad_count_is_an_argparse_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["floor", "--params", "eight", "--bandwidth-tb-s", "2"]) == 2
    assert "not a count" in capsys.readouterr().err


def test_named_moe_with_other_bytes_per_param_keeps_active_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    bf16 = run_json(capsys, "--model", "mixtral-8x7b", "--bandwidth-tb-s", "2")
    int8 = run_json(capsys, "--model", "mixtral-8x7b", "--bandwidth-tb-s", "2", "--bytes-per-param", "1")
    assert int8["weight_bytes"] == pytest.approx(bf16["weight_bytes"] / 2)


def test_heads_override_keeps_the_models_kv_heads(capsys: pytest.CaptureFixture[str]) -> None:
    r = run_json(capsys, "--model", "llama-3-8b", "--heads", "32", "--bandwidth-tb-s", "2", "--ctx", "10")
    assert r["kv_bytes_per_token"] == 131_072  # still 8 KV heads


_BASE = [
    "--params",
    "7B",
    "--layers",
    "32",
    "--heads",
    "32",
    "--kv-heads",
    "8",
    "--head-dim",
    "128",
    "--ctx",
    "100",
    "--gpu",
    "h100-sxm",
]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        # a peak divides every floor: 0 and inf divided by zero, -1 printed a negative floor, nan printed NaN
        (["--bandwidth-tb-s", "0"], "argument --bandwidth-tb-s: must be a number within [1e-06, 10000], got '0'"),
        (["--bandwidth-tb-s", "inf"], "argument --bandwidth-tb-s: expected a number within"),
        (["--bandwidth-tb-s", "-1"], "argument --bandwidth-tb-s: must be a number within"),
        (["--bandwidth-tb-s", "nan"], "argument --bandwidth-tb-s: expected a number within"),
        (["--tflops", "-1"], "argument --tflops: must be"),
        (["--tflops", "0"], "argument --tflops: must be"),  # silently dropped the prefill floor
        (["--tflops", "nan"], "argument --tflops: expected a number"),
        (["--measured-ms", "nan"], "argument --measured-ms: expected a number"),
        (["--measured-ms", "inf"], "argument --measured-ms: expected a number"),
        # finite inputs whose figures left the float range: an OverflowError traceback, or an inf floor
        (["--ctx", "1" + "0" * 400], "argument --ctx: must be within [0, 1000000000], got a 401-digit number"),
        (["--batch", "1" + "0" * 320], "argument --batch: must be within [1, 10000000], got a 321-digit number"),
        (["--bandwidth-tb-s", "1e-320"], "argument --bandwidth-tb-s: must be a number within"),
        # issue 20, item 11: a 1e300 TB/s peak made the floor 0 and tokens/s a ZeroDivisionError; 1e-300 printed
        # a 300-digit floor; 1e400 is not a number a float can hold
        (["--bandwidth-tb-s", "1e300", "--measured-ms", "1"], "argument --bandwidth-tb-s: must be a number within"),
        (["--bandwidth-tb-s", "1e-300", "--measured-ms", "1"], "argument --bandwidth-tb-s: must be a number within"),
        (["--bandwidth-tb-s", "1e400"], "argument --bandwidth-tb-s: must be a number within"),
        (["--tflops", "1e300"], "argument --tflops: must be a number within"),
        (["--measured-ms", "1e-300"], "argument --measured-ms: must be a number within"),
        (["--params", "1e300"], "argument --params: must be a count within [1, 1e+15]"),
        (["--params", "1e-300"], "argument --params: must be a count within"),
        (["--kv-bytes", "nan"], "argument --kv-bytes: expected a number"),
        (["--bytes-per-param", "inf"], "argument --bytes-per-param: expected a number"),
        (["--layers", "１２"], "argument --layers: expected an integer within [1, 100000] (ASCII digits)"),
        (["--prompt-tokens", "nan"], "argument --prompt-tokens: expected an integer"),
        (["--tp", "0"], "argument --tp: must be within [1, "),
    ],
)
def test_peaks_and_sizes_out_of_range_are_refused(
    capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    assert main(["floor", *_BASE, *args]) == 2
    captured = capsys.readouterr()
    assert message in captured.err
    assert captured.out == ""  # no table with a negative or NaN floor


def test_extreme_flags_in_range_print_readable_figures(capsys: pytest.CaptureFixture[str]) -> None:
    """Every flag at its bound at once: no overflow, and no figure printed with dozens of digits."""
    assert (
        main(
            [
                "floor",
                "--params",
                "1e15",
                "--bandwidth-tb-s",
                "1e-6",
                "--tflops",
                "1e-6",
                "--ctx",
                "1000000000",
                "--batch",
                "10000000",
                "--layers",
                "100000",
                "--heads",
                "100000",
                "--kv-heads",
                "100000",
                "--head-dim",
                "100000",
                "--prompt-tokens",
                "1000000000",
                "--kv-bytes",
                "64",
                "--bytes-per-param",
                "64",
                "--measured-ms",
                "1e-6",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "1.28e+30 ms/step" in out
    assert max(len(word) for word in out.split()) < 20


def test_a_huge_batch_is_computed_without_a_list_per_sequence(capsys: pytest.CaptureFixture[str]) -> None:
    one = run_json(capsys, *_BASE, "--batch", "1")
    many = run_json(capsys, *_BASE, "--batch", str(10**7))  # a list of 10**7 lengths: seconds and 80 MB
    assert many["prefill_flops"] == pytest.approx(one["prefill_flops"] * 10**7, rel=1e-12)
