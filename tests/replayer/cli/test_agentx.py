"""`replayer run --profile agentx` as a subprocess against the built-in simulated
endpoint: the profile's defaults resolved into run.json (an explicit flag wins), the
duplication check, and the exit status of --on-error abort-run."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from tests.processes import run_cli

WEKA = Path(__file__).resolve().parents[4] / "shared" / "data" / "weka"
TRACE = WEKA / "trace_0718.json"  # 8 requests, no subagents

pytestmark = pytest.mark.skipif(not TRACE.is_file(), reason="shared Weka data absent")


_cli = run_cli


def test_cli_agentx_profile_resolves_into_run_json(tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = _cli(
        "run", str(TRACE), "--profile", "agentx", "--concurrency", "2",
        "--duration", "2", "--cache-warmup", "0.5", "--on-error", "skip-session",
        "--block-tokens", "4", "--session-routing", "dynamo", "--hardware", "cpu",
        "--quiet", "--out", str(out), "--sim-args", "--speed 200",
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    meta = json.loads((out / "run.json").read_text())
    cfg = meta["config"]
    # The profile's defaults ...
    assert cfg["profile"] == "agentx"
    assert cfg["start_ratio"] == [0.25, 0.75]
    assert cfg["idle_skip_s"] == 10.0
    assert cfg["loop"] is True
    assert "max_error_rate" not in cfg  # the CLI's gate, not the replay's config
    assert cfg["endpoint"]["api"] == "chat"
    assert cfg["prompt"]["replay_markers"] is True
    # ... and the flags given explicitly, which win.
    assert cfg["duration_s"] == 2.0
    assert cfg["cache_warmup_s"] == 0.5
    assert cfg["on_error"] == "skip-session"
    assert cfg["session_header"] == "x-dynamo-session-id"
    assert meta["labels"]["hardware"] == "cpu"
    protocol = meta["protocol"]
    assert protocol["profile"] == "agentx"
    assert protocol["duplication_factor"] == 2.0  # two lanes, one distinct tree
    assert protocol["measure_start_ns"] > 0
    rows = pd.read_parquet(out / "requests")
    assert rows.primer.sum() == 2  # each lane's first tree primed once
    assert set(rows.replay_index) >= {0, 1}  # one tree, two lanes: two replays


def test_cli_agentx_clones_without_markers_exit_2(tmp_path: Path) -> None:
    res = _cli(
        "run", str(TRACE), "--profile", "agentx", "--concurrency", "2",
        "--no-replay-markers", "--duration", "1", "--quiet",
        "--out", str(tmp_path / "run"), "--sim-args", "--speed 200",
    )  # fmt: skip
    assert res.returncode == 2
    assert res.stderr.startswith("Error: ")
    assert "duplication factor 2.00" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_cli_agentx_abort_run_exits_1(tmp_path: Path) -> None:
    res = _cli(
        "run", str(TRACE), "--concurrency", "1", "--on-error", "abort-run",
        "--block-tokens", "4", "--quiet", "--out", str(tmp_path / "run"),
        "--sim-args", "--speed 200 --fail-rate 0.5 --seed 1",
    )  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert "--on-error abort-run" in res.stderr
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["protocol"]["aborted"]


def test_cli_agentx_profile_needs_lanes(tmp_path: Path) -> None:
    res = _cli(
        "run", str(TRACE), "--profile", "agentx", "--session-rate", "1",
        "--quiet", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    assert res.returncode == 2
    assert "--profile agentx keeps N session trees live" in res.stderr
    assert not (tmp_path / "run").exists()
