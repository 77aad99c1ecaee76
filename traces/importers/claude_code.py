"""Claude Code session logs (``~/.claude/projects/<project>/*.jsonl``) → threads.
See docs/traces.md#bring-your-own-agent-traffic."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from traces.importers.logfile import ImportReport, count, parse_time, read_records
from traces.importers.threads import (
    IMAGE,
    TEXT,
    THINKING,
    TOOL_RESULT,
    TOOL_USE,
    Call,
    Spawn,
    Thread,
)

SYNTHETIC = "synthetic assistant message (no LLM call)"
NO_USAGE = "assistant message without usage"
NO_ID = "assistant record without a message id"
NO_TIME = "conversation record without a valid timestamp"
_SPAWN_TOOLS = frozenset({"Task", "Agent"})
_OUTPUT_TYPES = {
    "thinking": THINKING,
    "redacted_thinking": THINKING,
    "text": TEXT,
    "tool_use": TOOL_USE,
    "server_tool_use": TOOL_USE,
}
_INPUT_TYPES = {"text": TEXT, "tool_result": TOOL_RESULT, "image": IMAGE}


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


@dataclass(slots=True)
class _Usage:
    uncached: int
    write: int
    read: int
    output: int

    def score(self) -> tuple[int, int]:
        return self.output, self.uncached + self.write + self.read


def _usage(msg: Mapping[str, Any]) -> _Usage | None:
    u = msg.get("usage")
    if not isinstance(u, dict):
        return None
    uncached, output = count(u.get("input_tokens")), count(u.get("output_tokens"))
    write = count(u.get("cache_creation_input_tokens", 0))
    read = count(u.get("cache_read_input_tokens", 0))
    if uncached is None or output is None or write is None or read is None:
        return None
    return _Usage(uncached, write, read, output)


@dataclass(slots=True)
class _Pending:
    """A call being read: everything about it before it becomes a :class:`Call`."""

    start: float | None
    end: float
    input_types: tuple[str, ...]
    texts: list[str]
    reset: bool
    human_at: float | None = None
    usage: _Usage | None = None
    model: str | None = None
    stop: str | None = None
    outputs: set[str] = field(default_factory=set)


@dataclass(slots=True)
class _State:
    """One thread while its records are read."""

    thread: Thread
    session_id: str
    sidechain: bool
    agent_id: str | None = None
    pending: list[_Pending] = field(default_factory=list)
    by_message: dict[str, int] = field(default_factory=dict)
    last_input: float | None = None
    input_types: set[str] = field(default_factory=set)
    texts: list[str] = field(default_factory=list)
    reset: bool = False
    first_prompt: bytes | None = None
    human_at: float | None = None  # the latest typed input since the last call
    tool_use_at: dict[str, float] = field(default_factory=dict)  # id → call time


@dataclass(slots=True)
class _AgentResult:
    tool_use_id: str | None
    stats: Mapping[str, Any]


class _Reader:
    def __init__(self, report: ImportReport, want_text: bool) -> None:
        self.report = report
        self.want_text = want_text
        self.states: dict[str, _State] = {}
        self.tool_calls: dict[str, tuple[str, int]] = {}  # tool_use id → (thread, call)
        self.spawn_tools: dict[str, tuple[object, bytes | None]] = {}  # type, prompt
        self.agent_results: dict[tuple[str, str], _AgentResult] = {}

    def read(self, path: Path) -> None:
        records = list(read_records(path, self.report))
        roots = _sidechain_roots(records)
        for line, rec in records:
            self._record(path, line, rec, roots)

    def _state(
        self, path: Path, rec: Mapping[str, Any], roots: dict[str, str]
    ) -> _State:
        sid = rec.get("sessionId")
        sid = sid if isinstance(sid, str) and sid else f"file:{path}"
        side = rec.get("isSidechain") is True
        agent = rec.get("agentId")
        agent = agent if isinstance(agent, str) and agent else None
        if not side:
            key = sid
        elif agent is not None:
            key = f"{sid}\0agent\0{agent}"
        else:
            uuid = rec.get("uuid")
            root = roots.get(uuid, uuid) if isinstance(uuid, str) else None
            key = f"{sid}\0chain\0{root or path}"
        st = self.states.get(key)
        if st is None:
            st = self.states[key] = _State(
                thread=Thread(key=key),
                session_id=sid,
                sidechain=side,
                agent_id=agent if side else None,
            )
        st.thread.files.add(path)
        return st

    def _record(
        self, path: Path, line: int, rec: dict[str, Any], roots: dict[str, str]
    ) -> None:
        kind = rec.get("type")
        if kind == "system" and rec.get("subtype") == "compact_boundary":
            self._state(path, rec, roots).reset = True
            return
        if kind == "attachment" and self.want_text:
            att = rec.get("attachment")
            content = att.get("content") if isinstance(att, dict) else None
            if isinstance(content, str) and content:  # injected into the next prompt
                self._state(path, rec, roots).texts.append(content)
            return
        msg = rec.get("message")
        if kind not in ("user", "assistant") or not isinstance(msg, dict):
            return
        if kind == "assistant" and "<synthetic>" in (msg.get("model"), msg.get("id")):
            self.report.skip(path, line, SYNTHETIC)
            return
        if kind == "assistant" and not isinstance(msg.get("id"), str):
            self.report.skip(path, line, NO_ID)
            return
        ts = parse_time(rec.get("timestamp"))
        if ts is None:
            self.report.skip(path, line, NO_TIME)
            return
        st = self._state(path, rec, roots)
        if kind == "assistant":
            self._assistant(st, ts, msg)
        else:
            self._user(st, ts, rec, msg)

    def _assistant(self, st: _State, ts: float, msg: Mapping[str, Any]) -> None:
        mid = msg["id"]
        idx = st.by_message.get(mid)
        if idx is None:
            idx = st.by_message[mid] = len(st.pending)
            st.pending.append(
                _Pending(
                    start=st.last_input,
                    end=ts,
                    input_types=tuple(sorted(st.input_types)),
                    texts=st.texts,
                    reset=st.reset,
                    human_at=st.human_at,
                )
            )
            st.last_input, st.input_types, st.texts, st.reset = None, set(), [], False
            st.human_at = None
        call = st.pending[idx]
        call.end = max(call.end, ts)
        usage = _usage(msg)
        if usage is not None and (
            call.usage is None or usage.score() > call.usage.score()
        ):
            call.usage = usage
            call.stop = msg.get("stop_reason") or call.stop
        if isinstance(msg.get("model"), str):
            call.model = msg["model"]
        content = msg.get("content")
        for block in content if isinstance(content, list) else ():
            if not isinstance(block, dict):
                continue
            btype = block.get("type")
            if btype in _OUTPUT_TYPES:
                call.outputs.add(_OUTPUT_TYPES[btype])
            if btype == "tool_use" and isinstance(block.get("id"), str):
                self.tool_calls[block["id"]] = (st.thread.key, idx)
                inp = block.get("input")
                if block.get("name") not in _SPAWN_TOOLS:
                    st.tool_use_at[block["id"]] = ts
                elif isinstance(inp, dict):
                    prompt = inp.get("prompt")
                    self.spawn_tools[block["id"]] = (
                        inp.get("subagent_type"),
                        _digest(prompt) if isinstance(prompt, str) else None,
                    )
            if self.want_text:
                st.texts.extend(_block_texts(block))

    def _user(
        self, st: _State, ts: float, rec: Mapping[str, Any], msg: Mapping[str, Any]
    ) -> None:
        st.last_input = ts if st.last_input is None else max(st.last_input, ts)
        content = msg.get("content")
        if _typed(rec, content):
            st.human_at = ts if st.human_at is None else max(st.human_at, ts)
        if isinstance(content, str):
            st.input_types.add(TEXT)
            if st.sidechain and st.first_prompt is None and not st.pending:
                st.first_prompt = _digest(content)
            if self.want_text:
                st.texts.append(content)
        elif isinstance(content, list):
            for block in content:
                if not isinstance(block, dict):
                    continue
                btype = block.get("type")
                if btype in _INPUT_TYPES:
                    st.input_types.add(_INPUT_TYPES[btype])
                if btype == "tool_result":
                    called = st.tool_use_at.pop(str(block.get("tool_use_id")), None)
                    if called is not None:
                        st.thread.tool_spans.append((called, ts))
                if self.want_text:
                    st.texts.extend(_block_texts(block))
            if st.sidechain and st.first_prompt is None and not st.pending:
                texts = [b.get("text") for b in content if isinstance(b, dict)]
                joined = "".join(x for x in texts if isinstance(x, str))
                st.first_prompt = _digest(joined) if joined else None
        if rec.get("isCompactSummary") is True:
            st.reset = True
        result = rec.get("toolUseResult")
        agent = result.get("agentId") if isinstance(result, dict) else None
        if isinstance(result, dict) and isinstance(agent, str) and agent:
            blocks = content if isinstance(content, list) else []
            use_ids = [
                b.get("tool_use_id")
                for b in blocks
                if isinstance(b, dict) and b.get("type") == "tool_result"
            ]
            use_id = use_ids[0] if use_ids else None
            self.agent_results[(st.session_id, agent)] = _AgentResult(
                use_id if isinstance(use_id, str) else None, result
            )

    def threads(self) -> list[Thread]:
        out: list[Thread] = []
        used_prompts: set[str] = set()
        for st in self.states.values():
            for p in st.pending:
                if p.usage is None:
                    for f in sorted(st.thread.files)[:1]:
                        self.report.skip(f, None, NO_USAGE)
                    continue
                u = p.usage
                st.thread.calls.append(
                    Call(
                        input_tokens=u.uncached + u.write + u.read,
                        output_tokens=u.output,
                        start=p.start,
                        end=p.end,
                        cached_tokens=u.read,
                        extra={"provider_cache_write_tokens": u.write},
                        model=p.model,
                        stop=p.stop,
                        input_types=p.input_types,
                        output_types=tuple(sorted(p.outputs)),
                        reset=p.reset,
                        texts=p.texts,
                        human_at=p.human_at,
                    )
                )
            if st.sidechain:
                st.thread.spawn = self._spawn(st, used_prompts)
            out.append(st.thread)
        return out

    def _spawn(self, st: _State, used_prompts: set[str]) -> Spawn:
        spawn = Spawn(parent=st.session_id)
        use_id: str | None = None
        result = (
            self.agent_results.get((st.session_id, st.agent_id))
            if st.agent_id is not None
            else None
        )
        if result is not None:
            use_id = result.tool_use_id
            stats = result.stats
            spawn.status = stats.get("status")
            spawn.subagent_type = stats.get("agentType")
            dur = stats.get("totalDurationMs")
            if isinstance(dur, int | float) and not isinstance(dur, bool) and dur >= 0:
                spawn.duration_ms = float(dur)
            spawn.total_tokens = count(stats.get("totalTokens"))
            spawn.tool_use_count = count(stats.get("totalToolUseCount"))
        elif st.first_prompt is not None:
            use_id = next(
                (
                    tid
                    for tid, (_, prompt) in self.spawn_tools.items()
                    if prompt == st.first_prompt and tid not in used_prompts
                ),
                None,
            )
        if use_id is not None:
            used_prompts.add(use_id)
            tool = self.spawn_tools.get(use_id)
            if tool is not None and spawn.subagent_type is None:
                spawn.subagent_type = tool[0] if isinstance(tool[0], str) else None
            link = self.tool_calls.get(use_id)
            if link is not None and link[0] == st.session_id:
                spawn.call_index = link[1]
        return spawn


def _typed(rec: Mapping[str, Any], content: object) -> bool:
    """Whether a ``user`` record is input a person typed: a message with text and no
    tool result, not one Claude Code writes itself (``isMeta``, a compact summary)."""
    if rec.get("isMeta") is True or rec.get("isCompactSummary") is True:
        return False
    if isinstance(content, str):
        return True
    blocks = (
        [b for b in content if isinstance(b, dict)] if isinstance(content, list) else []
    )
    kinds = {b.get("type") for b in blocks}
    return "text" in kinds and "tool_result" not in kinds


def _sidechain_roots(records: list[tuple[int, dict[str, Any]]]) -> dict[str, str]:
    """uuid → the first uuid of its chain, for inline sidechain records."""
    parent: dict[str, str | None] = {}
    for _, rec in records:
        uuid = rec.get("uuid")
        if rec.get("isSidechain") is True and isinstance(uuid, str):
            p = rec.get("parentUuid")
            parent[uuid] = p if isinstance(p, str) else None
    roots: dict[str, str] = {}
    for uuid in parent:
        node, hops = uuid, 0
        while (p := parent.get(node)) is not None and p in parent and hops < 100_000:
            node, hops = p, hops + 1
        roots[uuid] = node
    return roots


def _block_texts(block: Mapping[str, Any]) -> list[str]:
    """The text a content block puts into the model's context (tokenizer mode)."""
    btype = block.get("type")
    if btype == "text" and isinstance(block.get("text"), str):
        return [block["text"]]
    if btype == "thinking" and isinstance(block.get("thinking"), str):
        return [block["thinking"]] if block["thinking"] else []
    if btype == "tool_use":
        name = block.get("name")
        args = orjson.dumps(block.get("input"), option=orjson.OPT_SORT_KEYS).decode()
        return [name, args] if isinstance(name, str) else [args]
    if btype == "tool_result":
        inner = block.get("content")
        if isinstance(inner, str):
            return [inner]
        if isinstance(inner, list):
            return [
                b["text"]
                for b in inner
                if isinstance(b, dict) and isinstance(b.get("text"), str)
            ]
    return []


def read_claude_code(
    files: list[Path], report: ImportReport, *, want_text: bool
) -> list[Thread]:
    """The threads of the Claude Code logs in ``files``.

    Calls. One call per distinct assistant ``message.id`` in a thread: Claude Code
    writes one record per content block (thinking, text, each tool use) and repeats the
    message's ``usage`` on each, so the records of one id are one call. Its usage is the
    most complete snapshot among them (largest ``output_tokens``, then largest input):
    input = ``input_tokens + cache_creation_input_tokens + cache_read_input_tokens``,
    output = ``output_tokens``; the provider's cached part is
    ``cache_read_input_tokens`` (recorded as ``provider_cached_tokens``;
    ``cache_creation_input_tokens`` as ``provider_cache_write_tokens``). ``<synthetic>``
    messages (API errors, interrupts) made no LLM call and are skipped, as are messages
    that carry no usage.

    Times. A call starts at its last input before its first record: the user message or
    tool results (``type: user`` records) logged since the previous call; it ends at its
    last record. Everything between is the think gap. Its tool time is the union of
    the thread's tool spans (a ``tool_use`` block's record to the ``tool_result``
    naming its id; ``Task``/``Agent`` spawns left out, the subagent is replayed);
    its human time runs up to the last message a person typed (text without a tool
    result, not ``isMeta``, not a compact summary).

    Threads and subagents. The main thread of a session is its ``isSidechain: false``
    records (by ``sessionId``). Subagents (the ``Task``/``Agent`` tool) are sidechains:
    ``isSidechain: true`` records, in ``agent-<id>.jsonl`` files (newer versions,
    grouped by ``agentId``) or inline in the session file (older versions, grouped by
    the root of their ``parentUuid`` chain). A subagent is linked to the parent call
    that spawned it by the parent's tool result naming its ``agentId``
    (``toolUseResult``), else by its first message being the spawning tool's ``prompt``;
    its type, status, duration, token and tool-use totals come from that tool result. A
    ``compact_boundary`` system record (or a compact-summary message) marks a
    compaction: the next call starts a new prefix.
    """
    reader = _Reader(report, want_text)
    for path in files:
        reader.read(path)
    return reader.threads()
