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
