"""TraceLab's released round format (one LLM call per JSONL row) → threads.
See docs/traces.md#bring-your-own-agent-traffic."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traces.errors import Problem, TraceFormatError
from traces.importers.logfile import ImportReport, count, parse_time, read_records
from traces.importers.threads import TEXT, THINKING, TOOL_RESULT, TOOL_USE, Call, Thread

_INPUT_EVENTS = {"user_message": TEXT, "tool_result": TOOL_RESULT}
_OUTPUT_EVENTS = {
    "reasoning": THINKING,
    "text": TEXT,
    "tool_call": TOOL_USE,
    "usage_report": None,
}


@dataclass(slots=True)
class _Tools:
    """One session's tool calls: when each was made and when its result came."""

    called: dict[str, float] = field(default_factory=dict)
    answered: dict[str, float] = field(default_factory=dict)

    def add(self, row: Mapping[str, Any]) -> None:
        """The ``tools[]`` of a row (``emitted_at``, ``result_at``) and its
        ``tool_call`` / ``tool_result`` events, by ``tool_call_id``."""
        tools = row.get("tools")
        for tool in tools if isinstance(tools, list) else ():
            if isinstance(tool, dict) and isinstance(tool.get("tool_call_id"), str):
                self._at(self.called, tool["tool_call_id"], tool.get("emitted_at"))
                self._at(self.answered, tool["tool_call_id"], tool.get("result_at"))
        events = row.get("timing_events")
        for ev in events if isinstance(events, list) else ():
            if isinstance(ev, dict) and isinstance(ev.get("tool_call_id"), str):
                kind = ev.get("event_type")
                if kind in ("tool_call", "tool_result"):
                    into = self.called if kind == "tool_call" else self.answered
                    self._at(into, ev["tool_call_id"], ev.get("timestamp"))

    @staticmethod
    def _at(into: dict[str, float], key: str, value: object) -> None:
        ts = parse_time(value)
        if ts is not None:
            into.setdefault(key, ts)

    def spans(self) -> list[tuple[float, float]]:
        return [
            (t, self.answered[k]) for k, t in self.called.items() if k in self.answered
        ]


def _times(
    events: object,
) -> tuple[float | None, float | None, tuple[str, ...], tuple[str, ...], float | None]:
    start: float | None = None
    end: float | None = None
    first_out: float | None = None
    human: float | None = None
    ins: set[str] = set()
    outs: set[str] = set()
    for ev in events if isinstance(events, list) else ():
        if not isinstance(ev, dict):
            continue
        kind, ts = ev.get("event_type"), parse_time(ev.get("timestamp"))
        if kind in _INPUT_EVENTS:
            ins.add(_INPUT_EVENTS[kind])
            if ts is not None:
                start = ts if start is None else max(start, ts)
                if kind == "user_message":
                    human = ts if human is None else max(human, ts)
        elif kind in _OUTPUT_EVENTS:
            out_type = _OUTPUT_EVENTS[kind]
            if out_type is not None:
                outs.add(out_type)
            if ts is not None:
                end = ts if end is None else max(end, ts)
                first_out = ts if first_out is None else min(first_out, ts)
    if start is None:
        start = first_out
    return start, end, tuple(sorted(ins)), tuple(sorted(outs)), human


def _row(
    path: Path, line: int, row: Mapping[str, Any], problems: list[Problem]
) -> tuple[str, int, Call] | None:
    def bad(fld: str, reason: str) -> None:
        problems.append(Problem(path=path, line=line, field=fld, reason=reason))

    n = len(problems)
    sid = row.get("session_id")
    if not isinstance(sid, str | int) or isinstance(sid, bool) or sid == "":
        bad("session_id", "missing or not a string")
    rnd = row.get("round_index")
    if rnd is not None and count(rnd) is None:
        bad("round_index", f"expected a non-negative integer, got {rnd!r:.40}")
    vals: dict[str, int | None] = {}
    for key in ("prefix_tokens", "newly_append_tokens", "input_tokens_total"):
        v = row.get(key)
        vals[key] = count(v)
        if v is not None and vals[key] is None:
            bad(key, f"expected a non-negative integer, got {v!r:.40}")
    prefix, append, total = (
        vals["prefix_tokens"],
        vals["newly_append_tokens"],
        vals["input_tokens_total"],
    )
    if total is None and prefix is not None and append is not None:
        total = prefix + append
    if total is None and "input_tokens_total" not in row:
        bad(
            "input_tokens_total", "missing (and no prefix_tokens + newly_append_tokens)"
        )
    elif prefix is not None and append is not None and total != prefix + append:
        bad(
            "input_tokens_total",
            f"{total} != prefix_tokens + newly_append_tokens ({prefix} + {append})",
        )
    out = count(row.get("output_tokens"))
    if out is None:
        bad(
            "output_tokens",
            f"expected a non-negative integer, got {row.get('output_tokens')!r:.40}",
        )
    reasoning = row.get("reasoning_output_tokens")
    if reasoning is not None and count(reasoning) is None:
        bad(
            "reasoning_output_tokens",
            f"expected a non-negative integer or null, got {reasoning!r:.40}",
        )
    if len(problems) > n or total is None or out is None:
        return None
    start, end, ins, outs, human = _times(row.get("timing_events"))
    extra = {"reasoning_output_tokens": reasoning} if isinstance(reasoning, int) else {}
    call = Call(
        input_tokens=total,
        output_tokens=out,
        start=start,
        end=end,
        cached_tokens=prefix,
        extra=extra,
        model=row.get("model") if isinstance(row.get("model"), str) else None,
        input_types=ins,
        output_types=outs,
        prefix_hint=prefix,
        human_at=human,
    )
    return str(sid), rnd if isinstance(rnd, int) else line, call


def read_tracelab(
    files: list[Path], report: ImportReport, *, want_text: bool = False
) -> list[Thread]:
    """The threads (one per ``session_id``) of the TraceLab round files.

    Calls. Each row is one call: input = ``input_tokens_total`` (= ``prefix_tokens +
    newly_append_tokens``), output = ``output_tokens``; ``prefix_tokens`` (the
    provider's cached part) is ``provider_cached_tokens`` and
    ``reasoning_output_tokens`` is kept. Rows are grouped by ``session_id`` and ordered
    by ``round_index``. The split maps onto block ids (``tracelab-prefix-split``): round
    k shares its ``prefix_tokens`` with round k-1, its ``newly_append_tokens`` are new
    blocks.

    Times come from ``timing_events``: a call starts at its last ``user_message`` or
    ``tool_result`` event and ends at its last output event (``reasoning``, ``text``,
    ``tool_call``, ``usage_report``). The think gap's tool time is the union of the
    session's tool spans (``tools[]``: ``emitted_at`` to ``result_at``, else the
    ``tool_call`` and ``tool_result`` events of one ``tool_call_id``); its human
    time runs up to the call's last ``user_message`` event. The released rows carry
    no subagent links, so every session is a root. A row that breaks the schema is
    an error naming its file, line and field; a partial last line (a file still
    being written) is skipped.
    """
    problems: list[Problem] = []
    rows: dict[str, list[tuple[int, int, Call]]] = {}
    threads: dict[str, Thread] = {}
    tools: dict[str, _Tools] = {}
    for path in files:
        for line, row in read_records(path, report):
            got = _row(path, line, row, problems)
            if got is None:
                continue
            sid, order, call = got
            mine = rows.setdefault(sid, [])
            mine.append((order, len(mine), call))  # file order breaks ties
            threads.setdefault(sid, Thread(key=sid)).files.add(path)
            tools.setdefault(sid, _Tools()).add(row)
    if problems:
        raise TraceFormatError(problems)
    for sid, items in rows.items():
        items.sort(key=lambda x: (x[0], x[1]))
        threads[sid].calls = [c for _, _, c in items]
        threads[sid].tool_spans = tools[sid].spans()
    return list(threads.values())
