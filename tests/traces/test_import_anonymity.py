"""Anonymized by construction: a unique string is planted in every string field of
real logs (ids, text, paths, tool names and inputs, model, versions, ...), the logs
are imported, and every byte of the output (JSONL and Parquet, with and without a
tokenizer) is searched for them."""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.builders import (
    claude_assistant,
    claude_user,
    codex_record,
    codex_token_count,
    iso,
    record_view,
    write_jsonl,
)
from traces.importers import import_logs
from traces.importers.anonymize import Anonymizer, is_public_model_name
from traces.io import write_trace
from traces.model import Trace

# Keys whose values are the logs' schema words (record kinds), or times, which the
# importers must read; every other string value is planted.
_SCHEMA_KEYS = frozenset({"type", "role", "subtype", "timestamp", "event_type"})
# Maps whose keys are data, not schema (Claude Code keys file backups by path).
_DATA_KEYED = frozenset({"trackedFileBackups", "toolStats"})


class _Planter:
    """Replaces each distinct string by a unique planted one (the same string by the
    same plant, so links between records survive)."""

    def __init__(self) -> None:
        self.table: dict[str, str] = {}

    def plant(self, value: str) -> str:
        if value not in self.table:
            self.table[value] = f"PLANTED{len(self.table):05d}x{secrets.token_hex(6)}"
        return self.table[value]

    def __call__(self, obj: Any, data_keys: bool = False) -> Any:
        if isinstance(obj, dict):
            return {
                (self.plant(k) if data_keys else k): (
                    v if k in _SCHEMA_KEYS else self(v, k in _DATA_KEYED)
                )
                for k, v in obj.items()
            }
        if isinstance(obj, list):
            return [self(v) for v in obj]
        if isinstance(obj, str):
            return self.plant(obj)
        return obj


def _dump(path: Path) -> bytes:
    data = path.read_bytes()
    if path.suffix == ".parquet":
        table = pq.read_table(path)
        rows = json.dumps(table.to_pylist(), default=str).encode()
        meta = b"".join(k + v for k, v in (table.schema.metadata or {}).items())
        data += rows + meta
    return data


def _assert_clean(out: Path, planter: _Planter) -> None:
    data = _dump(out)
    low = data.lower()
    assert b"planted" not in low
    leaked = [v for v in planter.table.values() if v.lower().encode() in low]
    assert leaked == []
    # Only relative times: no date from the logs (all are in 2026).
    assert b"2026-" not in data


def _claude_logs(tmp_path: Path, shared_data: Path, planter: _Planter) -> list[Path]:
    records = record_view(shared_data / "tracelab" / "claude" / "trace.json")
    task = {
        "type": "tool_use",
        "id": "toolu_spawn",
        "name": "Task",
        "input": {"prompt": "look", "subagent_type": "my-private-agent"},
    }
    spawn = claude_assistant(2000.0, "msg_spawn", [task], (10, 0, 50000, 9))
    result = claude_user(
        2010.0,
        [{"type": "tool_result", "tool_use_id": "toolu_spawn", "content": "ok"}],
        toolUseResult={
            "agentId": "a7",
            "status": "completed",
            "agentType": "my-private-agent",
            "totalDurationMs": 9000,
            "toolStats": {"Read": 1},
        },
    )
    session = records[3]["sessionId"]
    for rec in (spawn, result):
        rec.update(sessionId=session, cwd="/home/alice/secret-project", version="2.1.0")
    boundary = {
        "type": "system",
        "subtype": "compact_boundary",
        "sessionId": session,
        "timestamp": iso(2020.0),
        "content": "Conversation compacted",
    }
    after = claude_assistant(2030.0, "msg_after", [], (10, 1000, 9000, 5))
    after["sessionId"] = session
    child = [
        claude_user(2001.0, "look", session=session, sidechain=True, agent="a7"),
        claude_assistant(
            2002.0,
            "msg_child",
            [{"type": "text", "text": "found /home/alice/.ssh"}],
            (3, 0, 100, 7),
            session=session,
            sidechain=True,
            agent="a7",
            model="acme-internal-llm",
        ),
    ]
    main = [*records, spawn, result, boundary, after]
    main_log = write_jsonl(tmp_path / "claude" / "main.jsonl", map(planter, main))
    # A live log: the last line is still being written, secrets and all.
    with main_log.open("a") as f:
        f.write(json.dumps(planter(claude_user(2040.0, "half a secret")))[:40])
    agent_log = write_jsonl(tmp_path / "claude" / "agent-a7.jsonl", map(planter, child))
    return [main_log, agent_log]


def _codex_logs(tmp_path: Path, shared_data: Path, planter: _Planter) -> list[Path]:
    records = record_view(shared_data / "tracelab" / "codex" / "trace.json")
    parent_id = records[0]["payload"]["id"]
    source = {"subagent": {"thread_spawn": {"parent_thread_id": parent_id, "depth": 1}}}
    meta = {"id": "child-thread", "source": source, "cwd": "/home/bob/x"}
    child = [
        codex_record(5.0, "session_meta", meta),
        codex_record(5.0, "turn_context", {"model": "gpt-5.4", "cwd": "/home/bob"}),
        codex_record(
            5.1,
            "response_item",
            {
                "type": "function_call",
                "name": "exec_command",
                "arguments": '{"cmd": "cat ~/.aws/credentials"}',
                "call_id": "call_x",
            },
        ),
        codex_token_count(5.2, (4000, 0, 10), (4000, 0, 10)),
    ]
    for rec in child:  # the child runs while the parent's first tool runs
        rec["timestamp"] = records[15]["timestamp"]
    parent_log = write_jsonl(tmp_path / "codex" / "parent.jsonl", map(planter, records))
    child_log = write_jsonl(tmp_path / "codex" / "child.jsonl", map(planter, child))
    return [parent_log, child_log]


def _tracelab_logs(tmp_path: Path, shared_data: Path, planter: _Planter) -> list[Path]:
    path = shared_data / "tracelab" / "sanitized" / "round_trace.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    return [write_jsonl(tmp_path / "tracelab" / "rows.jsonl", map(planter, rows))]


def _tokenizer(shared_data: Path) -> Path | None:
    path = shared_data.parent / "models" / "tiny-random-llama" / "tokenizer.json"
    return path if path.is_file() else None


def _check(trace: Trace, source: str) -> None:
    """The planted logs still import as real traffic (so a clean output means
    something): calls, and for the agent logs a subagent."""
    assert trace.request_count() >= 9
    if source != "tracelab":
        assert any(s.subagents for s in trace.sessions)


_BUILDERS = {
    "claude-code": _claude_logs,
    "codex": _codex_logs,
    "tracelab": _tracelab_logs,
}


@pytest.mark.parametrize(
    ("source", "with_tokenizer"),
    [
        ("claude-code", False),
        ("claude-code", True),
        ("codex", False),
        ("codex", True),
        ("tracelab", False),  # rows hold no text to tokenize
    ],
)
def test_import_output_holds_no_planted_string(
    source: str, with_tokenizer: bool, shared_data: Path, tmp_path: Path
) -> None:
    tokenizer = _tokenizer(shared_data) if with_tokenizer else None
    if with_tokenizer and tokenizer is None:
        pytest.skip("no tokenizer sample beside the shared data")
    planter = _Planter()
    logs = _BUILDERS[source](tmp_path, shared_data, planter)
    assert len(planter.table) > 40  # secrets were planted in many fields
    res = import_logs(source, logs, tokenizer=tokenizer)
    _check(res.trace, source)
    for name in ("out.jsonl", "out.parquet"):
        _assert_clean(write_trace(res.trace, tmp_path / name), planter)


def test_import_model_names_pass_only_when_public() -> None:
    for name in (
        "claude-opus-4-5-20251101",
        "claude-3-5-sonnet-20241022",
        "gpt-5.4",
        "gpt-5.1-codex-max",
        "o3-mini",
        "qwen3-coder-plus",
        "anthropic/claude-sonnet-4",
    ):
        assert is_public_model_name(name), name
    for name in (
        "claude-PLANTED00001",
        "acme-internal-llm",
        "gpt-4-alice",
        "/home/alice/model",
        "claude-opus-4-5 secret",
        "",
    ):
        assert not is_public_model_name(name), name
    anon = Anonymizer(b"k")
    assert anon.model("gpt-5.4") == "gpt-5.4"
    assert anon.model("acme-internal-llm") == anon.model("acme-internal-llm")
    assert anon.model("acme-internal-llm").startswith("model-")  # type: ignore[union-attr]
    assert anon.subagent_type("my-private-agent") == "custom"
    assert anon.subagent_type("Explore") == "Explore"
    assert anon.stop("a secret") is None
