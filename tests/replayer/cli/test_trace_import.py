"""`replayer trace import`: the real command imports the shared Claude Code log, `trace
stats` reads the result and `run` replays it against the built-in simulator; then
skips, errors and the public-trace readers through the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
from click.testing import CliRunner, Result

from replayer.cli import main
from tests.builders import codex_record, codex_token_count, write_jsonl

# The shared Claude log's calls: input_tokens + cache_creation_input_tokens +
# cache_read_input_tokens of each assistant message (records 0007 ... 0057).
CLAUDE_INPUTS = [32272, 35740, 38592, 41131, 41589, 42876, 44901, 45279, 47508, 48305]
# Their cache_read_input_tokens: what Claude's provider served from cache.
CLAUDE_CACHED = [27217, 29380, 35738, 38590, 41129, 41587, 42874, 44770, 45277, 47506]


def _run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "replayer", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "Traceback" not in done.stdout + done.stderr
    return done


def _invoke(*args: str | Path) -> Result:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output
    return result


def test_cli_trace_import_stats_and_replay(shared_data: Path, tmp_path: Path) -> None:
    log = shared_data / "tracelab" / "claude" / "trace.json"
    out = tmp_path / "team.parquet"
    done = _run("trace", "import", "claude-code", log, "-o", out)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {out}: 1 sessions (0 subagent sessions), ")
    assert "10 calls from 1 files; hash ids: context-growth" in done.stdout
    stats = _run("trace", "stats", out, "--json")
    assert stats.returncode == 0, stats.stderr
    d = json.loads(stats.stdout)
    assert (d["sessions"], d["requests"]) == (1, 10)
    assert d["input_tokens"]["max"] == max(CLAUDE_INPUTS)
    run_dir = tmp_path / "run"
    # No waiting: the imported gaps' tool time (72 s) is kept unless scaled too.
    args = ["--quiet", "--think-scale", "0", "--tool-scale", "0"]
    args += ["--sim-args", "--speed 50"]
    done = _run("run", out, *args, "--out", run_dir)
    assert done.returncode == 0, done.stderr
    rows = pd.read_parquet(run_dir / "requests")
    assert (rows["status"] == "ok").all()
    assert sorted(rows["trace_input_tokens"]) == CLAUDE_INPUTS
    # analyze puts the simulator's hit beside what Claude's provider reported.
    analyzed = _run("analyze", run_dir, "--json")
    assert analyzed.returncode == 0, analyzed.stderr
    rates = json.loads(analyzed.stdout)["cache_hit_rate"]
    assert rates["provider"] == sum(CLAUDE_CACHED) / sum(CLAUDE_INPUTS)
    assert rates["server"] is not None
    text = _run("analyze", run_dir).stdout
    assert "cache hit: agent's provider (log)" in text


def test_cli_trace_import_then_calibrate(shared_data: Path, tmp_path: Path) -> None:
    logs = shared_data / "tracelab"
    out = tmp_path / "both.jsonl"
    assert (
        _invoke("trace", "import", "tracelab", logs / "sanitized", "-o", out).exit_code
        == 0
    )
    gen = tmp_path / "gen.jsonl"
    result = _invoke("generate", "--calibrate-from", out, "--sessions", "4", "-o", gen)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith(f"wrote {gen}: 4 sessions")


def test_cli_trace_import_reports_skips_on_stderr(tmp_path: Path) -> None:
    log = write_jsonl(
        tmp_path / "rollout.jsonl",
        [
            codex_record(0.0, "session_meta", {"id": "t1", "source": "cli"}),
            codex_record(0.0, "event_msg", {"type": "user_message", "message": "hi"}),
            codex_token_count(1.0, (1000, 0, 5), (1000, 0, 5)),
        ],
    )
    with log.open("a") as f:
        f.write('{"timestamp": "2026-')  # the agent is still writing
    out = tmp_path / "o.jsonl"
    result = _invoke("trace", "import", "codex", log, "-o", out, "--block-size", "16")
    assert result.exit_code == 0, result.output
    assert "1 calls" in result.stdout
    assert result.stderr == (
        "skipped 1 x partial last line (the log is still being written) "
        f"(first: {log}:4)\n"
    )
    assert out.is_file()


def test_cli_trace_import_errors_are_one_line(tmp_path: Path) -> None:
    out = tmp_path / "o.jsonl"
    missing = _invoke("trace", "import", "claude-code", tmp_path / "nope", "-o", out)
    assert missing.exit_code == 2
    assert missing.stderr == f"Error: {tmp_path / 'nope'}: no such file or folder\n"
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps({"session_id": "s", "output_tokens": -1}) + "\n")
    bad = _invoke("trace", "import", "tracelab", rows, "-o", out)
    assert bad.exit_code == 2
    assert bad.stderr.startswith(f"Error: {rows}:1, field 'input_tokens_total': ")
    assert len(bad.stderr.splitlines()) == 1
    tok = _invoke("trace", "import", "tracelab", rows, "-o", out, "--tokenizer", rows)
    assert tok.exit_code == 2
    two = _invoke("trace", "import", "bailian", rows, rows, "-o", out)
    assert two.exit_code == 2
    assert "takes one trace file" in two.stderr
    assert not out.exists()


def test_cli_trace_import_public_traces(tmp_path: Path) -> None:
    bailian = tmp_path / "qwen.jsonl"
    row = {
        "chat_id": 1,
        "parent_chat_id": -1,
        "timestamp": 0.0,
        "input_length": 33,
        "output_length": 4,
        "type": "text",
        "turn": 1,
        "hash_ids": [7, 8, 9],
    }
    bailian.write_text(json.dumps(row) + "\n")
    burst = tmp_path / "burst.csv"
    burst.write_text(
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5,ChatGPT,472,18,490,Conversation log\n"
    )
    for source, path in (("bailian", bailian), ("burstgpt", burst)):
        out = tmp_path / f"{source}.parquet"
        result = _invoke("trace", "import", source, path, "-o", out)
        assert result.exit_code == 0, result.output
        assert result.stdout == f"wrote {out}: 1 sessions, 1 requests\n"
        assert _invoke("trace", "validate", out).exit_code == 0
