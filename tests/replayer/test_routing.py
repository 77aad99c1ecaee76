"""Session routing on the wire (docs/agentx.md, "Session routing"): the real CLI
replays a tree with subagents against a recording server on 127.0.0.1, which checks
the exact header names and values of every request, and the session token echo."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest
from click.testing import CliRunner, Result

from replayer.cli import main
from tests.builders import agent_tree, trace_of
from tests.fakes import FakeLLM, serve_in_thread
from traces.io import write_trace
from traces.model import Session

ROUTING = {
    "x-dynamo-session-id",
    "x-dynamo-parent-session-id",
    "x-dynamo-session-final",
    "x-claude-code-session-id",
    "x-claude-code-agent-id",
    "x-claude-code-parent-agent-id",
    "session-id",
    "x-session-token",
}


def _sessions(root: Session) -> dict[str, tuple[str | None, int]]:
    """Each session of the tree: (its parent's id, its request count)."""
    out: dict[str, tuple[str | None, int]] = {root.session_id: (None, 0)}
    stack = [root]
    while stack:
        s = stack.pop()
        out[s.session_id] = (out[s.session_id][0], len(s.requests))
        for sub in s.subagents:
            out[sub.session.session_id] = (s.session_id, 0)
            stack.append(sub.session)
    return out


def _run(tmp_path: Path, fake: FakeLLM, root: Session, *flags: str) -> Result:
    trace = write_trace(trace_of(root), tmp_path / "t.jsonl")
    with serve_in_thread(fake) as url:
        return CliRunner().invoke(
            main,
            [
                "run", str(trace), "--endpoint", url, "--model", "fake-model",
                "--think-scale", "0", "--out", str(tmp_path / "run"), "--quiet",
                *flags,
            ],
        )  # fmt: skip


def _routing(sent: list[tuple[str, str]]) -> dict[str, str]:
    """The routing headers of one request, exact names kept."""
    return {k: v for k, v in sent if k.lower() in ROUTING}


def test_dynamo_full_stamps_session_parent_and_final(tmp_path: Path) -> None:
    root = agent_tree("t")
    fake = FakeLLM()
    res = _run(tmp_path, fake, root, "--session-routing", "dynamo-full")
    assert res.exit_code == 0, res.output
    tree = _sessions(root)
    assert fake.requests == sum(n for _, n in tree.values()) == 10
    seen: dict[str, int] = {}
    for sent in fake.raw_headers:
        headers = _routing(sent)
        sid = headers["X-Dynamo-Session-ID"].removesuffix("#0")
        parent, n = tree[sid]
        k = seen[sid] = seen.get(sid, -1) + 1
        expected = {"X-Dynamo-Session-ID": f"{sid}#0"}
        if parent is not None:
            expected["X-Dynamo-Parent-Session-ID"] = f"{parent}#0"
        if k == n - 1:
            expected["X-Dynamo-Session-Final"] = "true"
        assert headers == expected
    assert seen == {sid: n - 1 for sid, (_, n) in tree.items()}
    # Exactly one final per session: 4 sessions.
    finals = [h for h in fake.raw_headers if "X-Dynamo-Session-Final" in dict(h)]
    assert len(finals) == len(tree) == 4
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["config"]["session_routing"] == "dynamo-full"


@pytest.mark.parametrize("how", ["flag", "imported"])
def test_agent_native_claude_code_headers(tmp_path: Path, how: str) -> None:
    root = agent_tree("t")
    if how == "imported":  # an imported Claude Code log: its root says so
        root = replace(root, extra={"imported_from": "claude-code"})
        flags = ["--session-routing", "agent-native"]
    else:
        flags = ["--session-routing", "agent-native", "--agent-native", "claude"]
    fake = FakeLLM()
    res = _run(tmp_path, fake, root, *flags)
    assert res.exit_code == 0, res.output
    tree = _sessions(root)
    agents = []
    for sent in fake.raw_headers:
        headers = _routing(sent)
        sid = headers["x-claude-code-agent-id"].removesuffix("#0")
        parent, _ = tree[sid]
        expected = {
            "x-claude-code-session-id": "t#0",  # the tree: one Claude Code session
            "x-claude-code-agent-id": f"{sid}#0",
        }
        if parent is not None:
            expected["x-claude-code-parent-agent-id"] = f"{parent}#0"
        assert headers == expected
        agents.append(sid)
    assert sorted(agents) == sorted(
        sid for sid, (_, n) in tree.items() for _ in range(n)
    )


@pytest.mark.parametrize("how", ["flag", "imported"])
def test_agent_native_codex_headers(tmp_path: Path, how: str) -> None:
    if how == "imported":  # an imported Codex log: its root says so
        root = replace(agent_tree("t"), extra={"imported_from": "codex"})
        flags = ["--session-routing", "agent-native"]
    else:
        root = agent_tree("t")
        flags = ["--session-routing", "agent-native", "--agent-native", "codex"]
    fake = FakeLLM()
    res = _run(tmp_path, fake, root, *flags)
    assert res.exit_code == 0, res.output
    assert fake.requests == 10
    assert [_routing(sent) for sent in fake.raw_headers] == [{"session-id": "t#0"}] * 10


def test_agent_native_needs_an_agent(tmp_path: Path) -> None:
    fake = FakeLLM()
    res = _run(tmp_path, fake, agent_tree("t"), "--session-routing", "agent-native")
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1
    assert "--agent-native claude|codex" in lines[0]
    assert fake.requests == 0
    res = _run(tmp_path, fake, agent_tree("t"), "--agent-native", "codex")
    assert res.exit_code == 2
    assert "needs --session-routing agent-native" in res.output


# How each routing mode names a request's own session (None: it names only the tree,
# so which session a request is of is not on the wire).
_OWN_SESSION = {
    "dynamo-full": "X-Dynamo-Session-ID",
    "agent-native-claude": "x-claude-code-agent-id",
    "header-session": "x-session-id",
    "agent-native-codex": None,
    "none": None,
}
_MODE_FLAGS = {
    "dynamo-full": ["--session-routing", "dynamo-full"],
    "agent-native-claude": [
        "--session-routing",
        "agent-native",
        "--agent-native",
        "claude",
    ],
    "header-session": ["--session-routing", "header", "--session-id-scope", "session"],
    "agent-native-codex": [
        "--session-routing",
        "agent-native",
        "--agent-native",
        "codex",
    ],
    "none": [],
}


@pytest.mark.parametrize("mode", list(_OWN_SESSION))
def test_session_token_follows_the_latest_value_and_is_never_written(
    tmp_path: Path, mode: str
) -> None:
    root = agent_tree("t")
    fake = FakeLLM(token_header="x-session-token")
    res = _run(
        tmp_path, fake, root,
        *_MODE_FLAGS[mode], "--session-token-header", "x-session-token",
    )  # fmt: skip
    assert res.exit_code == 0, res.output
    own = _OWN_SESSION[mode]
    if own is None:  # the token still echoes: each one a value issued before
        issued_before: set[str | None] = set()
        echoed = 0
        for sent, issued in zip(fake.headers, fake.tokens_issued, strict=True):
            token = sent.get("x-session-token")
            assert token is None or token in issued_before
            echoed += token is not None
            issued_before.add(issued)
        assert fake.headers[0].get("x-session-token") is None
    else:
        echoed = _check_echo_per_session(root, fake, own)
    assert echoed == 10 - 1  # every request but the very first
    run = tmp_path / "run"
    meta = json.loads((run / "run.json").read_text())
    assert meta["protocol"]["session_tokens_echoed"] == echoed
    assert meta["config"]["endpoint"]["session_token_header"] == "x-session-token"
    rows = pd.read_parquet(run / "requests")
    assert len(rows) == 10
    assert (rows.status == "ok").all()
    tokens = [t for t in fake.tokens_issued if t is not None]
    assert len(tokens) == 10
    # Nowhere in the run directory: the files' bytes, and the rows' decoded values
    # (the part files are compressed, so their bytes alone would not show a token).
    files = [f for f in run.rglob("*") if f.is_file()]
    assert files
    for f in files:
        data = f.read_bytes()
        for token in tokens:
            assert token.encode() not in data, f
    decoded = rows.astype(str).to_csv()
    for token in tokens:
        assert token not in decoded
        assert token not in res.output


def _check_echo_per_session(root: Session, fake: FakeLLM, own: str) -> int:
    """Each request carries the token its session's latest response returned (a
    subagent's first: what its parent held at the spawn); the number echoed."""
    tree = _sessions(root)
    latest: dict[str, str | None] = {}  # session → the token its last response carried
    spawn_token: dict[str, str | None] = {}
    echoed = 0
    for sent, issued in zip(fake.raw_headers, fake.tokens_issued, strict=True):
        headers = dict(sent)
        sid = headers[own].removesuffix("#0")
        parent, _ = tree[sid]
        if sid not in latest:  # its first request: what its parent held at the spawn
            want = latest.get(parent) if parent is not None else None
        else:
            want = latest[sid]
        assert headers.get("x-session-token") == want, sid
        echoed += want is not None
        latest[sid] = issued
        spawn_token.setdefault(sid, want)
    # Subagents a and b spawn after the root's first response; bg after its third.
    assert spawn_token["t/a"] == spawn_token["t/b"] == fake.tokens_issued[0]
    assert spawn_token["t/bg"] is not None
    return echoed


@pytest.mark.parametrize(
    "flag", ["--session-token-header", "--session-header"], ids=["token", "header"]
)
def test_header_name_with_spaces_is_a_one_line_usage_error(
    tmp_path: Path, flag: str
) -> None:
    fake = FakeLLM()
    res = _run(tmp_path, fake, agent_tree("t"), flag, "x session token")
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1
    assert flag in lines[0]
    assert "not an HTTP header name" in lines[0]
    assert fake.requests == 0
    assert not (tmp_path / "run").exists()


def test_session_id_scope_beside_a_header_set_is_a_usage_error(tmp_path: Path) -> None:
    fake = FakeLLM()
    res = _run(
        tmp_path, fake, agent_tree("t"),
        "--session-routing", "dynamo-full", "--session-id-scope", "session",
    )  # fmt: skip
    assert res.exit_code == 2
    assert "drop --session-id-scope" in res.output
    assert fake.requests == 0


@pytest.mark.parametrize(
    ("mode", "name"),
    [
        ("dynamo", "x-dynamo-session-id"),
        ("sglang", "x-smg-routing-key"),
        ("header", "x-session-id"),
    ],
)
def test_single_header_presets_carry_the_tree_identity(
    tmp_path: Path, mode: str, name: str
) -> None:
    fake = FakeLLM()
    res = _run(tmp_path, fake, agent_tree("t"), "--session-routing", mode)
    assert res.exit_code == 0, res.output
    assert fake.requests == 10
    for sent in fake.raw_headers:
        assert [(k, v) for k, v in sent if k.lower() in {*ROUTING, name}] == [
            (name, "t#0")
        ]


def test_session_tokens_echoed_add_up_over_workers(tmp_path: Path) -> None:
    fake = FakeLLM(token_header="x-session-token")
    trace = write_trace(
        trace_of(agent_tree("t"), agent_tree("u")), tmp_path / "t.jsonl"
    )
    with serve_in_thread(fake) as url:
        res = CliRunner().invoke(
            main,
            [
                "run", str(trace), "--endpoint", url, "--model", "fake-model",
                "--think-scale", "0", "--concurrency", "2", "--workers", "2",
                "--session-token-header", "x-session-token",
                "--out", str(tmp_path / "run"), "--quiet",
            ],
        )  # fmt: skip
    assert res.exit_code == 0, res.output
    assert fake.requests == 20
    echoed = sum("x-session-token" in h for h in fake.headers)
    assert echoed == 20 - 2  # each tree's first request has none to echo
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    assert meta["workers"] == 2
    assert meta["protocol"]["session_tokens_echoed"] == echoed
