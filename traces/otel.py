"""OpenTelemetry GenAI spans (an OTLP JSON export) → session trees: LLM call spans
are requests, ``invoke_agent`` spans are the agents that make them, traces sharing a
``gen_ai.conversation.id`` one session. See docs/traces.md#formats."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from traces.errors import Problem
from traces.model import MAX_TOKENS, Request, Session, Subagent
from traces.table import table_of

# gen_ai.operation.name values (OpenTelemetry GenAI semantic conventions).
CALL_OPERATIONS = frozenset({"chat", "text_completion", "generate_content"})
AGENT_OPERATIONS = frozenset({"invoke_agent", "invoke_workflow"})
TOOL_OPERATION = "execute_tool"
OTLP_BLOCK_SIZE = 64  # the importers' block size: ids by context growth


def looks_like_otlp(obj: object) -> bool:
    """True when ``obj`` (a parsed document or line) is an OTLP JSON trace export."""
    return isinstance(obj, dict) and "resourceSpans" in obj


def _value(v: object) -> object:
    """An OTLP AnyValue as Python (int64s arrive as strings in proto3 JSON)."""
    if not isinstance(v, dict) or len(v) != 1:
        return None
    ((kind, x),) = v.items()
    if kind == "intValue":
        try:
            return int(x)
        except (TypeError, ValueError):
            return None
    if kind == "arrayValue" and isinstance(x, dict):
        return [_value(e) for e in x.get("values", [])]
    return x


def _attributes(raw: object) -> dict[str, object]:
    out: dict[str, object] = {}
    if isinstance(raw, list):
        for kv in raw:
            if isinstance(kv, dict) and isinstance(kv.get("key"), str):
                out[kv["key"]] = _value(kv.get("value"))
    return out


@dataclass(slots=True, eq=False)
class _Span:
    line: int | None
    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start_ns: int
    end_ns: int
    attrs: dict[str, object]
    op: str | None
    children: list[_Span] = field(default_factory=list)
    parent: _Span | None = None


@dataclass(slots=True, eq=False)
class _Agent:
    """An agent (an ``invoke_agent`` span, or a trace's top) and what it does."""

    span: _Span | None
    calls: list[_Span] = field(default_factory=list)
    agents: list[_Agent] = field(default_factory=list)
    tools: list[_Span] = field(default_factory=list)  # its execute_tool spans

    @property
    def start_ns(self) -> int:
        if self.calls:
            return self.calls[0].start_ns
        if self.span is not None:
            return self.span.start_ns
        return min((a.start_ns for a in self.agents), default=0)

    @property
    def end_ns(self) -> int:
        ends = [c.end_ns for c in self.calls] + [a.end_ns for a in self.agents]
        if self.span is not None:
            ends.append(self.span.end_ns)
        return max(ends, default=self.start_ns)


class _Reader:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.problems: list[Problem] = []
        self.traces: dict[str, dict[str, _Span]] = {}

    def bad(
        self, line: int | None, trace_id: str | None, span: str | None, fld: str | None,
        reason: str,
    ) -> None:  # fmt: skip
        where = f"span {span}: " if span else ""
        self.problems.append(
            Problem(
                path=self.path, line=line, session_id=trace_id, field=fld,
                reason=where + reason,
            )
        )  # fmt: skip

    def add(self, line: int | None, doc: object) -> None:
        if not looks_like_otlp(doc):
            self.bad(
                line, None, None, None, "expected an OTLP JSON export (resourceSpans)"
            )
            return
        assert isinstance(doc, dict)
        for rs in _list(doc.get("resourceSpans")):
            scopes = _list(rs.get("scopeSpans")) + _list(
                rs.get("instrumentationLibrarySpans")
            )
            for ss in scopes:
                for raw in _list(ss.get("spans")):
                    self.span(line, raw)

    def span(self, line: int | None, raw: dict[str, Any]) -> None:
        tid, sid = raw.get("traceId"), raw.get("spanId")
        if not isinstance(tid, str) or not tid:
            self.bad(
                line, None, sid if isinstance(sid, str) else None, "traceId", "missing"
            )
            return
        if not isinstance(sid, str) or not sid:
            self.bad(line, tid, None, "spanId", f"a span of trace {tid} has none")
            return
        parent = raw.get("parentSpanId") or None
        if parent is not None and not isinstance(parent, str):
            self.bad(
                line,
                tid,
                sid,
                "parentSpanId",
                f"expected a hex string, got {parent!r:.40}",
            )
            return
        times = []
        for key in ("startTimeUnixNano", "endTimeUnixNano"):
            try:
                times.append(int(raw.get(key, "")))
            except (TypeError, ValueError):
                self.bad(
                    line,
                    tid,
                    sid,
                    key,
                    f"expected nanoseconds, got {raw.get(key)!r:.40}",
                )
                return
        if times[1] < times[0]:
            self.bad(line, tid, sid, "endTimeUnixNano", "ends before it starts")
            return
        attrs = _attributes(raw.get("attributes"))
        op = attrs.get("gen_ai.operation.name")
        raw_name = raw.get("name")
        name = raw_name if isinstance(raw_name, str) else ""
        if not isinstance(op, str):
            # Span names are "{gen_ai.operation.name} {model or agent}".
            head = name.split(" ", 1)[0]
            op = head if head in CALL_OPERATIONS | AGENT_OPERATIONS else None
        spans = self.traces.setdefault(tid, {})
        if sid in spans:
            self.bad(line, tid, sid, "spanId", "duplicate span id")
            return
        spans[sid] = _Span(line, tid, sid, parent, name, times[0], times[1], attrs, op)

    def link(self) -> None:
        """Each span under its parent: a parent missing from its trace, or a loop of
        parents, is a broken span tree."""
        for tid, spans in self.traces.items():
            for s in spans.values():
                if s.parent_id is None:
                    continue
                p = spans.get(s.parent_id)
                if p is None:
                    self.bad(
                        s.line,
                        tid,
                        s.span_id,
                        "parentSpanId",
                        f"parent span {s.parent_id} is not in the export "
                        "(a broken span tree)",
                    )
                    continue
                s.parent = p
                p.children.append(s)
            for s in spans.values():
                seen: set[str] = set()
                p = s
                while p.parent is not None and p.span_id not in seen:
                    seen.add(p.span_id)
                    p = p.parent
                if p.parent is not None:
                    self.bad(
                        s.line,
                        tid,
                        s.span_id,
                        "parentSpanId",
                        "its parents loop back to it (a broken span tree)",
                    )
                    break

    def agents(self, spans: dict[str, _Span]) -> _Agent:
        """The agent tree of one trace: each call under its nearest agent span."""
        top = _Agent(span=None)
        agent_of: dict[str, _Agent] = {}

        def owner(s: _Span) -> _Agent:
            p = s.parent
            while p is not None and p.op not in AGENT_OPERATIONS:
                p = p.parent
            return top if p is None else agent_of[p.span_id]

        ordered = sorted(spans.values(), key=lambda s: (_depth(s), s.start_ns))
        for s in ordered:
            if s.op in AGENT_OPERATIONS:
                a = agent_of[s.span_id] = _Agent(span=s)
                owner(s).agents.append(a)
        for s in ordered:
            if s.op in CALL_OPERATIONS:
                owner(s).calls.append(s)
            elif s.op == TOOL_OPERATION and not _runs_an_agent(s):
                # A tool that runs a subagent is not tool time: the replay waits
                # for the subagent itself.
                owner(s).tools.append(s)
        for a in (top, *agent_of.values()):
            a.calls.sort(key=lambda c: c.start_ns)
            a.agents.sort(key=lambda c: c.start_ns)
        # An agent that makes no call itself passes its subagents up.
        return _flatten(top)

    def request(
        self, c: _Span, start_ns: int, gap_ns: int, tool_ns: int | None
    ) -> Request | None:
        counts = {}
        for key in ("gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens"):
            v = c.attrs.get(key)
            if (
                not isinstance(v, int)
                or isinstance(v, bool)
                or not 0 <= v <= MAX_TOKENS
            ):
                self.bad(
                    c.line,
                    c.trace_id,
                    c.span_id,
                    key,
                    f"expected a token count, got {v!r:.40}",
                )
                return None
            counts[key] = v
        model = c.attrs.get("gen_ai.response.model") or c.attrs.get(
            "gen_ai.request.model"
        )
        extra: dict[str, Any] = {"span_id": c.span_id}
        cached = c.attrs.get("gen_ai.usage.cache_read.input_tokens")
        if isinstance(cached, int) and not isinstance(cached, bool):
            extra["cached_tokens"] = cached
        return Request(
            input_tokens=counts["gen_ai.usage.input_tokens"],
            output_tokens=counts["gen_ai.usage.output_tokens"],
            t_s=(c.start_ns - start_ns) / 1e9,
            think_time_s=max(gap_ns, 0) / 1e9,
            tool_wait_s=None if tool_ns is None else min(tool_ns, max(gap_ns, 0)) / 1e9,
            api_time_s=(c.end_ns - c.start_ns) / 1e9,
            model=model if isinstance(model, str) else None,
            extra=extra,
        )


def _list(v: object) -> list[dict[str, Any]]:
    return [x for x in v if isinstance(x, dict)] if isinstance(v, list) else []


def _depth(s: _Span) -> int:
    n = 0
    while s.parent is not None and n < 10_000:
        s, n = s.parent, n + 1
    return n


def _flatten(a: _Agent) -> _Agent:
    kids: list[_Agent] = []
    for k in a.agents:
        k = _flatten(k)
        if k.calls:
            kids.append(k)
        else:
            kids.extend(k.agents)
            a.tools.extend(k.tools)
    a.agents = sorted(kids, key=lambda k: k.start_ns)
    return a


def _runs_an_agent(s: _Span) -> bool:
    todo = list(s.children)
    while todo:
        c = todo.pop()
        if c.op in AGENT_OPERATIONS:
            return True
        todo.extend(c.children)
    return False


def _conversation(spans: dict[str, _Span]) -> str | None:
    for s in sorted(spans.values(), key=lambda s: (_depth(s), s.start_ns)):
        cid = s.attrs.get("gen_ai.conversation.id")
        if isinstance(cid, str) and cid:
            return cid
    return None


class _Builder:
    """Sessions from agent trees, hash ids by context growth (each call's prompt
    extends its agent's previous one), as the log importers number them."""

    def __init__(self, reader: _Reader, tools_known: bool) -> None:
        from traces.importers.prefix import GrowthIds

        self.reader = reader
        self.ids = GrowthIds(OTLP_BLOCK_SIZE)
        self.tools_known = tools_known  # the export has tool spans

    def session(
        self,
        sid: str,
        calls: list[_Span],
        agents: list[_Agent],
        tools: list[_Span],
        after_ns: int | None,
    ) -> Session | None:
        """The session of an agent's ``calls``; the gap before a call has the union of
        the agent's ``tools`` within it as its tool part, where the export has tool
        spans at all."""
        from traces.importers.assemble import SpanUnion
        from traces.importers.threads import Call

        if not calls:
            return None
        start = calls[0].start_ns
        requests: list[Request] = []
        prev_end = after_ns
        union = SpanUnion([(t.start_ns, t.end_ns) for t in tools])
        for c in calls:
            gap = 0 if prev_end is None else c.start_ns - prev_end
            tool = None
            if self.tools_known:
                tool = (
                    0
                    if prev_end is None
                    else round(union.covered(prev_end, c.start_ns))
                )
            r = self.reader.request(c, start, gap, tool)
            if r is None:
                return None
            requests.append(r)
            prev_end = c.end_ns
        threads = self.ids.thread(
            [
                Call(
                    input_tokens=r.input_tokens,
                    output_tokens=r.output_tokens,
                    start=None,
                    end=None,
                    cached_tokens=r.extra.get("cached_tokens"),
                )
                for r in requests
            ]
        )
        requests = [_with_ids(r, ids) for r, ids in zip(requests, threads, strict=True)]
        subagents = []
        for k, a in enumerate(agents):
            anchor = max(
                (i for i, c in enumerate(calls) if c.end_ns <= a.start_ns), default=-1
            )
            join = next(
                (i for i, c in enumerate(calls) if c.start_ns >= a.end_ns), None
            )
            if join is not None and join <= anchor:
                join = None
            span = a.span
            name = (
                None
                if span is None
                else span.attrs.get("gen_ai.agent.id")
                or span.attrs.get("gen_ai.agent.name")
            )
            agent_id = name if isinstance(name, str) and name else f"agent{k}"
            spawn_end = calls[anchor].end_ns if anchor >= 0 else start
            child = self.session(
                f"{sid}/{span.span_id if span else k}",
                a.calls,
                a.agents,
                a.tools,
                spawn_end,
            )
            if child is None:
                continue
            subagents.append(
                Subagent(
                    session=child,
                    anchor_index=anchor,
                    join_index=join,
                    agent_id=agent_id,
                    t_s=(a.start_ns - start) / 1e9,
                )
            )
        return Session(
            session_id=sid,
            requests=table_of(requests),
            subagents=tuple(subagents),
            block_size=OTLP_BLOCK_SIZE,
            hash_id_scope="local",
        )


def _with_ids(r: Request, ids: Any) -> Request:
    from dataclasses import replace

    return replace(r, hash_ids=ids)


def read_otlp(
    path: Path, docs: Iterable[tuple[int | None, object]]
) -> tuple[list[Session], list[Problem]]:
    """Session trees from OTLP JSON documents (line number, parsed value): one export,
    or one per line as the collector's file exporter writes them.

    Spans whose ``gen_ai.operation.name`` (or, without it, the first word of the span
    name) is chat, text_completion or generate_content are requests:
    ``gen_ai.usage.input_tokens`` and ``gen_ai.usage.output_tokens`` are required on
    them. Each request belongs to its nearest ``invoke_agent`` ancestor span; an
    agent under another agent is a subagent, spawned after the parent's last call
    that ended before it started and joined by the parent's first call that starts
    after it ends. Traces sharing a ``gen_ai.conversation.id`` are one session, in
    time order; the rest are a session each, named by trace id. Think gaps are the
    time between a call's end and the next call's start; where the export has
    ``execute_tool`` spans, a gap's tool part is the union of its agent's tool spans
    within it (a tool that runs a subagent left out: the replay waits for it).
    """
    reader = _Reader(path)
    for line, doc in docs:
        reader.add(line, doc)
    reader.link()
    if reader.problems:
        return [], reader.problems
    # Each trace's top agent; traces of one conversation in time order.
    groups: dict[str, list[_Agent]] = {}
    for tid, spans in reader.traces.items():
        top = reader.agents(spans)
        if not top.calls and len(top.agents) == 1:
            top = top.agents[0]
        if top.calls or top.agents:  # traces of other work hold no GenAI call
            groups.setdefault(_conversation(spans) or tid, []).append(top)
    tools_known = any(
        sp.op == TOOL_OPERATION
        for spans in reader.traces.values()
        for sp in spans.values()
    )
    builder = _Builder(reader, tools_known)
    roots: list[tuple[str, list[_Span], list[_Agent], list[_Span]]] = []
    for sid, tops in groups.items():
        tops.sort(key=lambda a: a.start_ns)
        calls = [c for a in tops for c in a.calls]
        agents = [k for a in tops for k in a.agents]
        tools = [t for a in tops for t in a.tools]
        if calls:
            roots.append((sid, calls, agents, tools))
        else:  # agents side by side with no caller: each a session of its own
            for a in agents:
                name = a.span.span_id if a.span is not None else str(len(roots))
                roots.append((f"{sid}/{name}", a.calls, a.agents, a.tools))
    sessions: list[Session] = []
    origin = min((calls[0].start_ns for _, calls, _, _ in roots), default=0)
    for sid, calls, agents, tools in roots:
        s = builder.session(sid, calls, agents, tools, None)
        if s is not None:
            sessions.append(_with_start(s, (calls[0].start_ns - origin) / 1e9))
    if not reader.problems and not sessions:
        reader.bad(
            None,
            None,
            None,
            None,
            "no LLM call spans (gen_ai.operation.name chat, text_completion or "
            "generate_content)",
        )
    return ([] if reader.problems else sessions), reader.problems


def _with_start(s: Session, start_s: float) -> Session:
    from dataclasses import replace

    return replace(s, start_s=start_s)
