"""The trace formats on the command line: `trace convert --to agentic-mooncake` of an
imported Claude Code log, and `--mooncake-rows` from `trace stats` to a run."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq

from tests.builders import write_jsonl
from tests.processes import run_cli
from tests.traces.formats import CUMULATIVE, DELTA, same_tree
from traces.importers import import_logs
from traces.io import read_trace, write_trace


def test_an_imported_claude_code_log_round_trips(
    tmp_path: Path, shared_data: Path
) -> None:
    log = shared_data / "tracelab" / "claude" / "trace.json"
    imported = import_logs("claude-code", [log]).trace
    native = write_trace(imported, tmp_path / "cc.jsonl")
    out = run_cli("trace", "convert", str(native), "--to", "agentic-mooncake",
                  "-o", str(tmp_path / "cc.agentic.jsonl"))  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "--trace-block-size 64" in out.stdout
    back = read_trace(tmp_path / "cc.agentic.jsonl")
    assert back.source_format == "agentic_mooncake"
    assert len(back) == len(imported)
    for a, b in zip(imported.sessions, back.sessions, strict=True):
        same_tree(a, b)
    out = run_cli("trace", "convert", str(native), "--to", "agentic-mooncake",
                  "-o", str(tmp_path / "cc.parquet"))  # fmt: skip
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1
    assert "use .jsonl, .jsonl.gz for agentic-mooncake" in out.stderr


def test_cli_warns_and_a_run_sends_the_delta_reading(tmp_path: Path) -> None:
    delta = write_jsonl(tmp_path / "delta.jsonl", DELTA)
    cumulative = write_jsonl(tmp_path / "cumulative.jsonl", CUMULATIVE)
    out = run_cli("trace", "stats", str(cumulative), "--json")
    assert out.returncode == 0, out.stderr
    assert out.stderr.startswith("warning: ")
    assert "look cumulative" in out.stderr
    total = json.loads(out.stdout)["total_input_tokens"]
    assert total == 1024 + 2048 + 2848 + 300 + 505
    out = run_cli("trace", "stats", str(cumulative), "--mooncake-rows", "cumulative")
    assert out.returncode == 0
    assert out.stderr == ""
    run_dir = tmp_path / "run"
    out = run_cli(
        "run", str(delta), "--virtual", "sim", "--concurrency", "2", "--quiet",
        "--think-scale", "0", "--out", str(run_dir),
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "session rows look delta" in out.stderr
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["config"]["mooncake_rows"] == "auto"
    assert any("look delta" in w for w in meta["warnings"])
    rows = pq.read_table(run_dir / "requests").to_pylist()
    sent = sorted(r["trace_input_tokens"] for r in rows)
    assert sent == sorted([1024, 2048, 2848, 300, 505])
