"""The AgentX validity verdict: a crafted run that passes every gate, then one crafted
run per gate that trips it alone; the headline over the measured window only; and
`compare` refusing to put an AgentX-profile run beside one without the profile."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from analysis.load import load_run
from analysis.summary import summarize
from replayer.cli import main
from replayer.records import RequestRecord
from tests.analysis.conftest import run_meta, write_run_dir
from tests.builders import timed_record

WINDOW_S = 1000.0
START_S = 100.0  # the window opens after 100 s of warm-up


def _protocol(**kw: Any) -> dict[str, Any]:
    return {"profile": "agentx", "window_s": WINDOW_S, "aborted": None, **kw}


def _meta(**kw: Any) -> dict[str, Any]:
    return run_meta(
        measure_start_ns=int(START_S * 1e9),
        protocol=kw.pop("protocol", _protocol()),
        **kw,
    )


def _rows(n: int = 100, **kw: Any) -> list[RequestRecord]:
    """n ok measured requests spread evenly over the window (1 s each, the last
    ending at its very end), plus two warm-up rows: a primer and a warm-up turn."""
    step_ms = WINDOW_S * 1000 / n
    rows = [
        timed_record(
            start_ms=START_S * 1000 + (k + 1) * step_ms - 1000,
            ttft_ms=100,
            e2e_ms=1000,
            out=10,
            session_id=f"s{k % 4}",
            request_index=k,
            prompt_tokens=1000,
            cached_tokens=800,
            ideal_cached_tokens=900,
            **kw,
        )
        for k in range(n)
    ]
    warm = [
        timed_record(
            start_ms=0, ttft_ms=5000, e2e_ms=5000, out=1, warmup=True, primer=True
        ),
        timed_record(start_ms=6000, ttft_ms=50000, e2e_ms=90000, out=1, warmup=True),
    ]
    return warm + rows


def _failed(k: int) -> RequestRecord:
    return timed_record(
        start_ms=START_S * 1000 + k * 1000,
        ttft_ms=1,
        e2e_ms=1,
        out=1,
        status="http_error",
        http_status=500,
        error_message="injected",
        request_index=1000 + k,
    )


def _overflow(k: int) -> RequestRecord:
    return timed_record(
        start_ms=k * 10,
        ttft_ms=1,
        e2e_ms=1,
        out=1,
        status="http_error",
        http_status=400,
        error_message="This model's maximum context length is 131072 tokens. "
        "However, you requested 140000 tokens.",
        warmup=True,
        request_index=2000 + k,
    )


def _verdict(tmp_path: Path, rows: list[RequestRecord], **meta: Any) -> dict[str, Any]:
    write_run_dir(tmp_path / "run", rows, meta=_meta(**meta))
    return summarize(load_run(tmp_path / "run")).as_dict()


def test_validity_a_clean_agentx_run_is_valid(tmp_path: Path) -> None:
    s = _verdict(tmp_path, _rows())
    assert s["valid"] is True, s["invalid_reasons"]
    assert s["invalid_reasons"] == []
    assert s["window"]["start_s"] == START_S
    assert s["window"]["length_s"] == WINDOW_S
    assert s["window"]["coverage"] == pytest.approx(1.0)
    # The headline over the window only: the warm-up rows' 5 s and 90 s E2E (at
    # one token) would drag E2E/OSL far down.
    # E2E/OSL = 1 s / 10 tokens for every measured row → 10 tok/s/user.
    assert s["e2e_norm_interactivity_tok_s"] == pytest.approx(10.0)
    head = s["agentx"]
    assert head["e2e_norm_interactivity_tok_s"] == pytest.approx(10.0)
    assert head["prefix_hit"]["theoretical"] == 0.9
    assert head["prefix_hit"]["server"] == 0.8
    # At the server's block size (here the trace's 64): 896 of 900 in whole blocks.
    assert head["prefix_hit"]["theoretical_server_blocks"] == pytest.approx(0.896)
    assert s["warmup"] == 2


Trip = Callable[[list[RequestRecord]], tuple[list[RequestRecord], dict[str, Any]]]
TRIPS: dict[str, Trip] = {
    # 2 context overflows in 102 + 2 sent requests: > 1% (warm-up ones count too).
    "context_overflow_rate_exceeded": lambda r: ([*r, _overflow(0), _overflow(1)], {}),
    "window_too_short": lambda r: (r, {"protocol": _protocol(window_s=899.0)}),
    # The server went quiet after 90% of the window.
    "insufficient_metric_coverage": lambda r: (
        [x for x in r if (x.end_ns or 0) <= (START_S + 0.9 * WINDOW_S) * 1e9],
        {},
    ),
    # 12 failures beside 100 ok: 10.7% > 10%.
    "error_rate_exceeded": lambda r: (r + [_failed(k) for k in range(12)], {}),
    "not_agentx_profile": lambda r: (r, {"protocol": _protocol(profile=None)}),
    "run_cancelled": lambda r: (r, {"interrupted": True}),
    "run_aborted": lambda r: (r, {"protocol": _protocol(aborted="request 3 failed")}),
}


@pytest.mark.parametrize("reason", list(TRIPS))
def test_validity_each_gate_trips_alone(tmp_path: Path, reason: str) -> None:
    rows, meta = TRIPS[reason](_rows())
    s = _verdict(tmp_path, rows, **meta)
    assert s["valid"] is False
    assert s["invalid_reasons"] == [reason]


def test_validity_gates_at_their_limits_pass(tmp_path: Path) -> None:
    # Exactly 10% errors (90 ok + 10 failed) and exactly 900 s: both pass.
    rows = _rows(90) + [_failed(k) for k in range(10)]
    s = _verdict(tmp_path, rows, protocol=_protocol(window_s=900.0))
    assert "error_rate_exceeded" not in s["invalid_reasons"]
    assert "window_too_short" not in s["invalid_reasons"]
    assert s["agentx"]["gates"]["error_rate"] == pytest.approx(0.10)


def test_validity_analyze_prints_and_carries_the_verdict(tmp_path: Path) -> None:
    run = write_run_dir(
        tmp_path / "run",
        TRIPS["window_too_short"](_rows())[0],
        meta=_meta(protocol=_protocol(window_s=899.0)),
    )
    res = CliRunner().invoke(main, ["analyze", str(run), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["valid"] is False
    assert out["invalid_reasons"] == ["window_too_short"]
    assert out["window"]["length_s"] == 899.0
    assert math.isfinite(out["e2e_norm_interactivity_tok_s"])
    text = CliRunner().invoke(main, ["analyze", str(run)])
    assert "AgentX not valid (window_too_short)" in text.output


def test_validity_compare_refuses_mixed_profiles(tmp_path: Path) -> None:
    a = write_run_dir(tmp_path / "a", _rows(), meta=_meta())
    b = write_run_dir(
        tmp_path / "b", _rows(), meta=_meta(protocol=_protocol(profile=None))
    )
    refused = CliRunner().invoke(main, ["compare", str(a), str(b)])
    assert refused.exit_code == 2
    assert "warning: A" in refused.output
    assert "--mixed-profiles" in refused.output
    forced = CliRunner().invoke(
        main, ["compare", str(a), str(b), "--mixed-profiles", "--resamples", "100"]
    )
    assert forced.exit_code == 0, forced.output
    same = CliRunner().invoke(main, ["compare", str(a), str(a), "--resamples", "100"])
    assert same.exit_code == 0
    assert "warning" not in same.output
