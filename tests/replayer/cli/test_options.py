"""The options run, sweep, capacity and demo share (replayer/cli/options.py): one
mapping to the config, so `--profile agentx` resolves alike in every command, and
the order of who wins (flag > --config file > profile > the command's default)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from replayer.cli import main
from tests.builders import growing_session, trace_of
from traces.io import write_trace

# Fast: every command replays in virtual time, one short measured window.
_AGENTX = [
    "--profile", "agentx", "--virtual", "sim", "--duration", "2",
    "--cache-warmup", "0.5", "--quiet",
]  # fmt: skip


def _trace(tmp_path: Path) -> Path:
    trace = trace_of(
        *(growing_session(f"s{k}", 4, think=1.0, block_size=16) for k in range(2))
    )
    return write_trace(trace, tmp_path / "t.jsonl")


def _invoke(*args: str, env: dict[str, str] | None = None) -> None:
    res = CliRunner(env=env).invoke(main, list(args))
    assert res.exit_code == 0, res.output


def _run_config(tmp_path: Path, command: str, *extra: str) -> dict[str, Any]:
    """Run ``command`` with ``extra`` options; the config of (one of) its runs."""
    out = tmp_path / command
    if command == "run":
        _invoke("run", str(_trace(tmp_path)), "--out", str(out), *extra)
        found = [out / "run.json"]
    elif command == "sweep":
        _invoke(
            "sweep", str(_trace(tmp_path)), "--concurrency", "2", "--out", str(out),
            *extra,
        )  # fmt: skip
        found = [out / "c2" / "run.json"]
    elif command == "capacity":
        _invoke(
            "capacity", str(_trace(tmp_path)), "--slo", "ttft=100s", "--start", "2",
            "--max-cells", "1", "--out", str(out), *extra,
        )  # fmt: skip
        found = sorted(out.glob("*/run.json"))
    else:
        # The demo replays where it says: REPLAYER_ENDPOINT is `run`'s (and the
        # studies'), not the demo's.
        _invoke(
            "demo", "--sessions", "2", "--concurrency", "2", "--out", str(out),
            *extra, env={"REPLAYER_ENDPOINT": "http://127.0.0.1:9"},
        )  # fmt: skip
        found = sorted(out.glob("runs/*/run.json"))
    assert len(found) == 1, found
    config: dict[str, Any] = json.loads(found[0].read_text())["config"]
    return config


@pytest.mark.parametrize("command", ["run", "sweep", "capacity", "demo"])
def test_cli_options_profile_agentx_applies_in_every_command(
    tmp_path: Path, command: str
) -> None:
    extra = ["--concurrency", "2"] if command == "run" else []
    cfg = _run_config(tmp_path, command, *_AGENTX, *extra)
    # The profile's defaults ...
    assert cfg["profile"] == "agentx"
    assert cfg["start_ratio"] == [0.25, 0.75]
    assert cfg["idle_skip_s"] == 10.0
    assert cfg["loop"] is True
    assert cfg["on_error"] == "continue"
    assert cfg["think_scale"] == 1.0  # demo's own default is 0.1: the profile wins
    assert cfg["endpoint"]["api"] == cfg["prompt"]["api"] == "chat"
    assert cfg["prompt"]["replay_markers"] is True
    # ... the flags typed beside it, which win over it ...
    assert cfg["cache_warmup_s"] == 0.5
    assert cfg["duration_s"] == 2.0
    # ... and the command's own schedule.
    assert cfg["schedule"] == {"kind": "concurrency", "concurrency": 2}
    assert "max_error_rate" not in cfg  # the CLI's gate, not the replay's config


def test_cli_options_demo_keeps_its_own_defaults_without_a_profile(
    tmp_path: Path,
) -> None:
    cfg = _run_config(tmp_path, "demo", "--virtual", "sim", "--quiet")
    assert cfg["profile"] is None
    assert cfg["think_scale"] == 0.1
    assert cfg["sim_args"][:2] == ["--speed", "20"]
    assert cfg["start_ratio"] is None
    assert cfg["endpoint"]["api"] == "completions"


def test_cli_options_flag_beats_file_beats_profile(tmp_path: Path) -> None:
    toml = tmp_path / "c.toml"
    toml.write_text(
        'profile = "agentx"\nduration = 3\ncache-warmup = 0.5\n'
        'on_error = "skip-session"\nidle-skip = 4\nvirtual = "sim"\nquiet = true\n'
        "concurrency = 2\n"
    )
    cfg = _run_config(tmp_path, "run", "--config", str(toml), "--duration", "1.5")
    assert cfg["duration_s"] == 1.5  # typed
    assert cfg["cache_warmup_s"] == 0.5  # the file's
    assert cfg["on_error"] == "skip-session"
    assert cfg["idle_skip_s"] == 4.0
    assert cfg["start_ratio"] == [0.25, 0.75]  # the profile's: neither sets it
    assert cfg["endpoint"]["api"] == "chat"
    assert cfg["schedule"] == {"kind": "concurrency", "concurrency": 2}
