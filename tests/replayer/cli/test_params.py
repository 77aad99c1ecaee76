"""Bad flag values are one-line usage errors (exit 2), never a traceback or a silent
no-op: the option types of replayer/cli/params.py, and the checks after parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from replayer.cli import main
from tests.builders import growing_session, request, session, trace_of
from traces.io import write_trace


def _invoke(*args: str | Path) -> Result:
    return CliRunner().invoke(main, [str(a) for a in args])


def _usage_error(res: Result, *needles: str) -> None:
    assert res.exit_code == 2, res.output
    assert "Traceback" not in res.output
    assert not isinstance(res.exception, Exception) or isinstance(
        res.exception, SystemExit
    ), res.exception
    error = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1, res.output
    for needle in needles:
        assert needle in error[0], res.output


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    return write_trace(
        trace_of(growing_session("a", 2), growing_session("b", 2)),
        tmp_path / "t.jsonl",
    )


_LIST_OR_FACTOR = [
    *(("sweep", "--concurrency", v, "expected a list like 1,2,4,8")
      for v in ("1,,2", "1,2,", ",1", " , ")),
    *(("run", "--output-scale", v, "")
      for v in ("inf", "nan", "-inf", "1e308", "0", "-1")),
]  # fmt: skip


@pytest.mark.parametrize(("command", "flag", "value", "says"), _LIST_OR_FACTOR)
def test_cli_empty_list_values_and_non_finite_output_scale(
    trace: Path, tmp_path: Path, command: str, flag: str, value: str, says: str
) -> None:
    out = tmp_path / "out"
    res = _invoke(command, trace, "--virtual", "sim", flag, value, "--out", out)
    _usage_error(res, flag, says, repr(value) if says else "")
    assert not out.exists()


_RUN_FLOATS = [
    "--think-scale", "--think-cap", "--tool-scale", "--duration", "--warmup",
    "--idle-skip", "--cache-warmup", "--speedup", "--session-rate", "--connect-timeout",
    "--read-timeout", "--request-timeout", "--max-error-rate", "--burstiness",
]  # fmt: skip


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "NaN"])
@pytest.mark.parametrize("flag", _RUN_FLOATS)
def test_cli_run_float_flags_reject_nan_and_inf(
    trace: Path, tmp_path: Path, flag: str, value: str
) -> None:
    out = tmp_path / "run"
    res = _invoke("run", trace, "--virtual", "sim", "--out", out, flag, value)
    _usage_error(res, f"'{flag}'", "not a finite number")
    assert not out.exists()


@pytest.mark.parametrize(
    "args",
    [
        ["capacity", "{trace}", "--slo", "ttft=1s", "--out", "{out}", "--growth"],
        ["capacity", "{trace}", "--slo", "ttft=1s", "--out", "{out}", "--percentile"],
        ["trace", "cache-curve", "{trace}", "--think-scale"],
        [
            "trace",
            "cache-curve",
            "{trace}",
            "--bytes-per-token",
            "2",
            "--server-kv-gib",
        ],
        ["generate", "-o", "{out}", "--session-rate"],
    ],
    ids=lambda a: " ".join(a[:2] + a[-1:]),
)
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_cli_other_float_flags_reject_nan_and_inf(
    trace: Path, tmp_path: Path, args: list[str], value: str
) -> None:
    out = tmp_path / "out.jsonl"
    argv = [a.format(trace=trace, out=out) for a in args]
    _usage_error(_invoke(*argv, value), f"'{args[-1]}'", "not a finite number")
    assert not out.exists()


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "{trace}", "--virtual", "sim", "--seed", "-1"],
        ["generate", "-o", "{out}", "--seed", "-1"],
        ["run", "{trace}", "--virtual", "sim", "--block-tokens", "100000000"],
        ["run", "{trace}", "--virtual", "sim", "--concurrency", "1000000000"],
        ["run", "{trace}", "--virtual", "sim", "--ray-workers", "100000"],
        ["generate", "-o", "{out}", "--sessions", "10000000000"],
        ["trace", "cache-curve", "{trace}", "--block-tokens", "100000000"],
        ["sweep", "{trace}", "--concurrency", "1,1000000000", "--out", "{out}"],
    ],
    ids=lambda a: " ".join(a[-2:]),
)
def test_cli_integers_have_bounds(trace: Path, tmp_path: Path, argv: list[str]) -> None:
    out = tmp_path / "out.jsonl"
    res = _invoke(*[a.format(trace=trace, out=out) for a in argv])
    _usage_error(res)
    assert not out.exists()


@pytest.mark.parametrize(
    ("value", "needle"),
    [("0-1", "at least 256"), ("0-100", "at least 256"), ("5-99999999", "<= MAX")],
)
def test_cli_token_range_rejects_meaningless_ranges(
    trace: Path, tmp_path: Path, value: str, needle: str
) -> None:
    res = _invoke("run", trace, "--virtual", "sim", "--token-range", value)
    _usage_error(res, "'--token-range'", needle.replace("<= MAX", "MAX <="))


def test_cli_endpoint_that_does_not_parse_is_one_line(trace: Path) -> None:
    res = _invoke("run", trace, "--endpoint", "http://[::1", "--model", "m")
    _usage_error(res, "'--endpoint'", "not a URL")
    res = _invoke("run", trace, "--endpoint", "http://h:port/?key=s3cret")
    _usage_error(res, "'--endpoint'", "not a URL")
    assert "s3cret" not in res.output


def test_cli_sim_args_with_an_unclosed_quote_is_one_line(trace: Path) -> None:
    res = _invoke("run", trace, "--virtual", "sim", "--sim-args", '--speed "10')
    _usage_error(res, "'--sim-args'", "no closing quotation")


def test_cli_prompt_beyond_memory_is_refused_before_the_run(tmp_path: Path) -> None:
    # 100,000 blocks scaled to a million tokens each: 1e11 tokens, TBs to build.
    big = trace_of(
        session("s", [request(blocks=100_000, block_size=64)], block_size=64)
    )
    path = write_trace(big, tmp_path / "big.jsonl")
    out = tmp_path / "run"
    res = _invoke(
        "run", path, "--virtual", "sim", "--block-tokens", "1048576", "--out", out
    )
    _usage_error(res, "session s request 0", "lower --block-tokens")
    assert not out.exists()


def test_cli_generate_calibrate_from_a_trace_without_requests(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text(json.dumps({"id": "a", "block_size": 64, "requests": []}) + "\n")
    out = tmp_path / "g.jsonl"
    res = _invoke("generate", "-o", out, "--calibrate-from", empty)
    _usage_error(res, str(empty), "no requests")
    assert not out.exists()


@pytest.mark.parametrize("value", [2**63, 2**64 - 1, 2**41])
def test_cli_trace_validate_huge_token_counts(tmp_path: Path, value: int) -> None:
    path = tmp_path / "big.jsonl"
    req = {"t": 0, "type": "n", "in": value, "out": value, "hash_ids": []}
    path.write_text(json.dumps({"id": "a", "block_size": 64, "requests": [req]}))
    res = _invoke("trace", "validate", path)
    assert res.exit_code == 1, res.output
    assert "Traceback" not in res.output
    assert f"request 0, field 'in': must be <= 1,099,511,627,776 (got {value})" in (
        res.output
    )
    assert "field 'out'" in res.output


def test_cli_run_scaled_gap_past_int64_ns_waits_instead_of_wrapping(
    tmp_path: Path,
) -> None:
    # 9e7 s (within a trace's bound) x --think-scale 1000 = 9e10 s: more ns than an
    # int64 holds. It wrapped to a gap of 0 (with numpy's warning); it outlasts the run.
    path = write_trace(
        trace_of(growing_session("a", 2, think=9e7)), tmp_path / "t.jsonl"
    )
    out = tmp_path / "run"
    res = _invoke("run", path, "--virtual", "sim", "--quiet", "--think-scale", "1000",
                  "--duration", "5", "--out", out)  # fmt: skip
    assert res.exit_code == 0, res.output
    assert "1 requests (1 ok" in res.output
