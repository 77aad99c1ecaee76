"""`analyze` says when a run did not end well, and `compare` warns when two runs
are not alike (trace, server, client limits)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from replayer.cli import main
from replayer.records import RequestRecord
from tests.analysis.conftest import run_meta

MS = 1_000_000
_ABORT = "request 3 of session s failed (--on-error abort-run)"


def _rows(rec: Callable[..., RequestRecord], n: int = 30) -> list[RequestRecord]:
    return [
        rec(
            session_id=f"s{i % 3}", request_index=i, scheduled_ns=i * 100 * MS,
            start_ns=i * 100 * MS, first_token_ns=i * 100 * MS + 20 * MS,
            end_ns=i * 100 * MS + 90 * MS, ttft_ns=20 * MS, e2e_ns=90 * MS,
            tpot_ns=10 * MS, chunk_times_ns=[20 * MS + k * 10 * MS for k in range(8)],
            output_tokens=8,
        )
        for i in range(n)
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"interrupted": True}, "interrupted (Ctrl-C or SIGTERM)"),
        (
            {"error": "the server at http://h:1 stopped answering: 20 requests"},
            "stopped by an error: the server at http://h:1 stopped answering: "
            "20 requests",
        ),
        (
            {"protocol": {"aborted": _ABORT}},
            f"stopped: {_ABORT}",
        ),
        ({"end_unix_ns": None}, "no end time: the run crashed or was killed"),
    ],
    ids=["interrupted", "error", "aborted", "crashed"],
)
def test_analyze_says_why_a_run_is_incomplete(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
    overrides: dict[str, Any],
    reason: str,
) -> None:
    run = make_run_dir(tmp_path / "r", _rows(rec), meta=run_meta(**overrides))
    res = CliRunner().invoke(main, ["analyze", str(run), "--json"])
    assert res.exit_code == 0, res.output
    info = json.loads(res.output)["run"]
    assert info["complete"] is False
    assert info["incomplete_reason"] == reason
    text = CliRunner().invoke(main, ["analyze", str(run)]).output
    said = [line for line in text.splitlines() if "incomplete run" in line]
    assert said == [f"r: incomplete run: {reason}"]


def test_analyze_a_run_that_ended_well_is_complete(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    run = make_run_dir(tmp_path / "r", _rows(rec), meta=run_meta(interrupted=False))
    res = CliRunner().invoke(main, ["analyze", str(run), "--json"])
    info = json.loads(res.output)["run"]
    assert info["complete"] is True
    assert info["incomplete_reason"] is None
    assert "incomplete" not in CliRunner().invoke(main, ["analyze", str(run)]).output


def test_compare_warns_when_the_runs_are_not_alike(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    rows = _rows(rec)
    a = make_run_dir(tmp_path / "a", rows, meta=run_meta())
    twin = make_run_dir(tmp_path / "twin", rows, meta=run_meta())
    other = run_meta(
        trace={**run_meta()["trace"], "content_hash": "y" * 64},
        simulated=False,
        endpoint="http://10.0.0.2:8000",
        labels={**run_meta()["labels"], "engine": "sglang"},
        client_check={"limited": True, "reasons": ["loop lag P99 80 ms > 50 ms"]},
    )
    b = make_run_dir(tmp_path / "b", rows, meta=other)
    alike = CliRunner().invoke(main, ["compare", str(a), str(twin), "--json"])
    assert alike.exit_code == 0, alike.output
    assert json.loads(alike.stdout)["warnings"] == []
    assert alike.stderr == ""
    res = CliRunner().invoke(main, ["compare", str(a), str(b), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert {"a", "b", "figures", "resamples", "seed", "confidence"} <= set(out)
    warnings = out["warnings"]
    assert len(warnings) == 3, warnings
    assert warnings[0].startswith("A and B replayed different traces")
    assert warnings[1] == (
        "A and B ran against different servers (simulated: True vs False; "
        "engine: None vs sglang)"
    )
    assert warnings[2].startswith("B was CLIENT-LIMITED (loop lag P99 80 ms")
    text = CliRunner().invoke(main, ["compare", str(a), str(b)])
    assert text.exit_code == 0, text.output
    assert text.stderr.splitlines() == [f"warning: {w}" for w in warnings]
    assert "B is" in text.stdout


def test_compare_simulated_runs_by_their_settings_not_their_port(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    rows = _rows(rec)

    def sim(path: str, args: str, port: int, **more: Any) -> Path:
        meta = run_meta(endpoint=f"http://127.0.0.1:{port}", sim={"args": args}, **more)
        return make_run_dir(tmp_path / path, rows, meta=meta)

    a = sim("a", "--speed 50", 40001)
    same = sim("same", "--speed 50", 40002)
    slower = sim("slower", "--speed 2", 40003, interrupted=True)

    def warnings(x: Path, y: Path) -> list[str]:
        res = CliRunner().invoke(main, ["compare", str(x), str(y), "--json"])
        assert res.exit_code == 0, res.output
        return list(json.loads(res.stdout)["warnings"])

    assert warnings(a, same) == []
    assert warnings(a, slower) == [
        "A and B ran against different servers (simulator: --speed 50 vs --speed 2)",
        "B is an incomplete run: interrupted (Ctrl-C or SIGTERM)",
    ]
