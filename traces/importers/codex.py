"""Codex CLI rollout logs (``~/.codex/sessions/YYYY/MM/DD/rollout-*.jsonl``) → threads.
See docs/traces.md#bring-your-own-agent-traffic."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from traces.importers.logfile import ImportReport, count, parse_time, read_records
from traces.importers.threads import (
    TEXT,
    THINKING,
    TOOL_RESULT,
    TOOL_USE,
    Call,
    Spawn,
    Thread,
)

NO_INFO = "token_count without usage (info is null)"
REPEATED = "repeated token_count (totals unchanged)"
BAD_USAGE = "token_count with invalid token counts"
UNFINISHED = "model output without a token_count yet (round still running)"
NO_TIME = "record without a valid timestamp"
_OUTPUTS = {
    "reasoning": THINKING,
    "function_call": TOOL_USE,
    "custom_tool_call": TOOL_USE,
    "local_shell_call": TOOL_USE,
    "web_search_call": TOOL_USE,
}
_TOOL_OUTPUTS = frozenset({"function_call_output", "custom_tool_call_output"})
_USAGE_KEYS = ("input_tokens", "cached_input_tokens", "output_tokens")


def _usage(obj: object) -> dict[str, int] | None:
    if not isinstance(obj, dict):
        return None
    out: dict[str, int] = {}
    for k in (*_USAGE_KEYS, "reasoning_output_tokens"):
        v = count(obj.get(k, 0))
        if v is None:
            return None
        out[k] = v
    return out


@dataclass(slots=True)
class _Rollout:
    """One rollout file while it is read."""

    thread: Thread
    path: Path
    parent: str | None = None
    role: object = None
    model: str | None = None
    prev_total: dict[str, int] | None = None
    prev_end: float | None = None
    # The call being formed: inputs before its first output, then outputs.
    last_input: float | None = None
    input_types: set[str] = field(default_factory=set)
    human_at: float | None = None  # the latest user message among them
    first_output: float | None = None
    outputs: set[str] = field(default_factory=set)
    call_texts: list[str] | None = None
    # Inputs and text seen after the current call's first output: the next call's.
    next_input: float | None = None
    next_types: set[str] = field(default_factory=set)
    next_human: float | None = None
    tool_call_at: dict[str, float] = field(default_factory=dict)  # call_id → time
    texts: list[str] = field(default_factory=list)
    reset: bool = False
    unfinished_line: int | None = None
    spawn_names: dict[str, int] = field(default_factory=dict)  # call_id → call index
    spawn_outputs: list[tuple[int, str]] = field(default_factory=list)


class _Reader:
    def __init__(self, report: ImportReport, want_text: bool) -> None:
        self.report = report
        self.want_text = want_text
        self.rollouts: list[_Rollout] = []

    def read(self, path: Path) -> None:
        ro: _Rollout | None = None
        for line, rec in read_records(path, self.report):
            if ro is None:
                ro = _Rollout(thread=Thread(key=f"file:{path}"), path=path)
                ro.thread.files.add(path)
                self.rollouts.append(ro)
            self._record(ro, line, rec)
        if ro is not None and ro.unfinished_line is not None:
            self.report.skip(path, ro.unfinished_line, UNFINISHED)

    def _record(self, ro: _Rollout, line: int, rec: Mapping[str, Any]) -> None:
        kind = rec.get("type")
        payload = rec.get("payload")
        if not isinstance(payload, dict):
            return
        if kind == "session_meta":
            self._meta(ro, payload)
            return
        if kind == "turn_context":
            if isinstance(payload.get("model"), str):
                ro.model = payload["model"]
            return
        if kind == "compacted":
            ro.reset = True
            if self.want_text and isinstance(payload.get("message"), str):
                ro.texts.append(payload["message"])
            return
        if kind not in ("response_item", "event_msg"):
            return
        ptype = payload.get("type")
        if kind == "event_msg" and ptype == "context_compacted":
            ro.reset = True
            return
        relevant = kind == "response_item" or ptype in ("token_count", "user_message")
        if not relevant:
            return
        ts = parse_time(rec.get("timestamp"))
        if ts is None:
            self.report.skip(ro.path, line, NO_TIME)
            return
        if kind == "event_msg":
            if ptype == "user_message":
                self._input(ro, ts, TEXT)
            else:
                self._token_count(ro, line, ts, payload)
            return
        self._item(ro, line, ts, payload)

    def _meta(self, ro: _Rollout, payload: Mapping[str, Any]) -> None:
        if ro.thread.calls or ro.thread.key.startswith("\0"):
            return  # a resumed rollout repeats its meta: the first one names it
        tid = payload.get("id")
        if isinstance(tid, str) and tid:
            ro.thread.key = "\0" + tid
        source = payload.get("source")
        sub = source.get("subagent") if isinstance(source, dict) else None
        spawn = sub.get("thread_spawn") if isinstance(sub, dict) else None
        if isinstance(spawn, dict) and isinstance(spawn.get("parent_thread_id"), str):
            ro.parent = "\0" + spawn["parent_thread_id"]
            ro.role = spawn.get("agent_role")
        if self.want_text:
            base = payload.get("base_instructions")
            text = base.get("text") if isinstance(base, dict) else base
            if isinstance(text, str) and text:
                ro.texts.append(text)

    def _input(self, ro: _Rollout, ts: float, kind: str) -> None:
        typed = kind == TEXT  # a user message; the rest are tool outputs
        if ro.first_output is None:
            ro.last_input = _later(ro.last_input, ts)
            ro.input_types.add(kind)
            if typed:
                ro.human_at = _later(ro.human_at, ts)
        else:
            ro.next_input = _later(ro.next_input, ts)
            ro.next_types.add(kind)
            if typed:
                ro.next_human = _later(ro.next_human, ts)

    def _output(self, ro: _Rollout, line: int, ts: float, kind: str) -> None:
        if ro.first_output is None:
            ro.first_output = ts
            ro.call_texts, ro.texts = ro.texts, []
            ro.unfinished_line = line
        ro.outputs.add(kind)

    def _item(
        self, ro: _Rollout, line: int, ts: float, payload: Mapping[str, Any]
    ) -> None:
        ptype = payload.get("type")
        if ptype == "message":
            role = payload.get("role")
            if role == "assistant":
                self._output(ro, line, ts, TEXT)
            elif role == "user":
                self._input(ro, ts, TEXT)
            if self.want_text:
                ro.texts.extend(_message_texts(payload.get("content")))
        elif ptype in _OUTPUTS:
            self._output(ro, line, ts, _OUTPUTS[ptype])
            call_id = payload.get("call_id")
            name = payload.get("name")
            if isinstance(call_id, str) and isinstance(name, str) and "spawn" in name:
                ro.spawn_names[call_id] = len(ro.thread.calls)
            elif isinstance(call_id, str):
                ro.tool_call_at[call_id] = ts
            if self.want_text:
                ro.texts.extend(_call_texts(payload))
        elif ptype in _TOOL_OUTPUTS:
            self._input(ro, ts, TOOL_RESULT)
            out = payload.get("output")
            text = out if isinstance(out, str) else orjson.dumps(out).decode()
            call_id = payload.get("call_id")
            called = (
                ro.tool_call_at.pop(call_id, None) if isinstance(call_id, str) else None
            )
            if called is not None:
                ro.thread.tool_spans.append((called, ts))
            if isinstance(call_id, str) and call_id in ro.spawn_names:
                ro.spawn_outputs.append((ro.spawn_names[call_id], text))
            if self.want_text:
                ro.texts.append(text)

    def _token_count(
        self, ro: _Rollout, line: int, ts: float, payload: Mapping[str, Any]
    ) -> None:
        info = payload.get("info")
        if not isinstance(info, dict):
            self.report.skip(ro.path, line, NO_INFO)
            return
        total = _usage(info.get("total_token_usage"))
        last = _usage(info.get("last_token_usage"))
        if total is not None and total == ro.prev_total:
            self.report.skip(ro.path, line, REPEATED)
            return
        if last is None and total is not None and ro.prev_total is not None:
            last = {k: total[k] - ro.prev_total.get(k, 0) for k in total}
            last = last if min(last.values()) >= 0 else None
        elif last is None and total is not None:
            last = total
        if last is None:
            self.report.skip(ro.path, line, BAD_USAGE)
            return
        ro.prev_total = total
        if ro.last_input is not None:
            start: float | None = ro.last_input
        elif ro.prev_end is not None:
            start = ro.prev_end
        else:
            start = ro.first_output if ro.first_output is not None else ts
        texts = ro.call_texts if ro.call_texts is not None else ro.texts
        if ro.call_texts is None:
            ro.texts = []
        ro.thread.calls.append(
            Call(
                input_tokens=last["input_tokens"],
                output_tokens=last["output_tokens"],
                start=start,
                end=ts,
                cached_tokens=last["cached_input_tokens"],
                extra={"reasoning_output_tokens": last["reasoning_output_tokens"]},
                model=ro.model,
                input_types=tuple(sorted(ro.input_types)),
                output_types=tuple(sorted(ro.outputs)),
                reset=ro.reset,
                texts=texts,
                human_at=ro.human_at,
            )
        )
        ro.prev_end = ts
        ro.last_input, ro.input_types = ro.next_input, ro.next_types
        ro.next_input, ro.next_types = None, set()
        ro.human_at, ro.next_human = ro.next_human, None
        ro.first_output, ro.outputs, ro.call_texts = None, set(), None
        ro.reset, ro.unfinished_line = False, None

    def threads(self) -> list[Thread]:
        by_key = {ro.thread.key: ro for ro in self.rollouts}
        for ro in self.rollouts:
            if ro.parent is None:
                continue
            role = ro.role if isinstance(ro.role, str) else None
            spawn = Spawn(parent=ro.parent, subagent_type=role)
            parent = by_key.get(ro.parent)
            child_id = ro.thread.key.lstrip("\0")
            if parent is not None and child_id:
                spawn.call_index = next(
                    (idx for idx, text in parent.spawn_outputs if child_id in text),
                    None,
                )
            ro.thread.spawn = spawn
        return [ro.thread for ro in self.rollouts]


def _later(t: float | None, ts: float) -> float:
    return ts if t is None else max(t, ts)


def _message_texts(content: object) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    return [
        b["text"]
        for b in content
        if isinstance(b, dict) and isinstance(b.get("text"), str)
    ]


def _call_texts(payload: Mapping[str, Any]) -> list[str]:
    out = [payload["name"]] if isinstance(payload.get("name"), str) else []
    for key in ("arguments", "input"):
        v = payload.get(key)
        if isinstance(v, str):
            out.append(v)
        elif v is not None:
            out.append(orjson.dumps(v, option=orjson.OPT_SORT_KEYS).decode())
    return out


def read_codex(
    files: list[Path], report: ImportReport, *, want_text: bool
) -> list[Thread]:
    """The threads of the Codex rollouts in ``files``.

    Calls. One call per ``token_count`` event whose cumulative ``total_token_usage``
    changed: Codex logs one after every model round (a repeat with unchanged totals, or
    one without ``info``, is not a new call and is skipped). The call's numbers are its
    ``last_token_usage`` (or the difference of the totals when that is missing): input =
    ``input_tokens`` (which includes the cached part), output = ``output_tokens`` (which
    includes reasoning); the provider's cached part is ``cached_input_tokens``
    (``provider_cached_tokens``), ``reasoning_output_tokens`` is kept as such. Model
    output after the last ``token_count`` of a file (a round still running) is skipped.

    Times. A call starts at its last input logged before its first output: the user
    message (``response_item`` message with role ``user``, or ``event_msg``
    ``user_message``) or tool outputs (``function_call_output``,
    ``custom_tool_call_output``) since the previous call; it ends at its
    ``token_count``. The think gap's tool time is the union of the tool spans (a
    tool call to the output with its ``call_id``; ``spawn`` tools left out, the
    subagent is replayed); its human time runs up to the last user message.

    Threads and subagents. One rollout file is one thread (``session_meta.payload.id``).
    A rollout whose ``session_meta.payload.source`` is ``{"subagent": {"thread_spawn":
    {"parent_thread_id": ...}}}`` is a subagent of that thread (when it is imported
    too), spawned by the parent call whose ``spawn_agent`` tool output names it. A
    ``compacted`` record or a ``context_compacted`` event marks a compaction: the next
    call starts a new prefix.
    """
    reader = _Reader(report, want_text)
    for path in files:
        reader.read(path)
    return reader.threads()
