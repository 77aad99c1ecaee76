"""Threads of calls → an anonymized :class:`~traces.model.Trace`: relative times, gaps,
and subagent spawn and join points. See docs/traces.md#bring-your-own-agent-traffic."""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from traces.importers.anonymize import Anonymizer
from traces.importers.logfile import ImportReport
from traces.importers.prefix import GrowthIds, TokenIds
from traces.importers.threads import Call, Thread
from traces.model import HashIds, Request, Session, Subagent, Trace

_MAX_DEPTH = 8  # as the Weka reader allows


def _ms(x: float) -> float:
    return round(x, 3)


def _times(calls: Sequence[Call]) -> list[tuple[float | None, float | None]]:
    """(start, end) per call, made monotone: a start never precedes the last end."""
    out: list[tuple[float | None, float | None]] = []
    prev_end: float | None = None
    for c in calls:
        start, end = c.start, c.end
        if start is None:
            start = prev_end if prev_end is not None else end
        if start is not None and prev_end is not None:
            start = max(start, prev_end)
        if end is not None and start is not None:
            end = max(end, start)
        out.append((start, end))
        if end is not None:
            prev_end = end
        elif start is not None:
            prev_end = start
    return out


class SpanUnion:
    """The union of a thread's tool spans, and how much of an interval it covers."""

    def __init__(self, spans: Sequence[tuple[float, float]]) -> None:
        self.lo: list[float] = []
        self.hi: list[float] = []
        for a, b in sorted(s for s in spans if s[1] > s[0]):
            if self.hi and a <= self.hi[-1]:
                self.hi[-1] = max(self.hi[-1], b)
            else:
                self.lo.append(a)
                self.hi.append(b)
        self.before = [0.0]  # covered length of the spans before each one
        for a, b in zip(self.lo, self.hi, strict=True):
            self.before.append(self.before[-1] + b - a)

    def _upto(self, x: float) -> float:
        k = bisect.bisect_right(self.lo, x) - 1
        if k < 0:
            return 0.0
        return self.before[k] + min(x, self.hi[k]) - self.lo[k]

    def covered(self, a: float, b: float) -> float:
        """The length of [a, b] the union covers."""
        return self._upto(b) - self._upto(a) if b > a else 0.0


def _gap_parts(
    union: SpanUnion,
    prev_end: float,
    start: float,
    human_at: float | None,
    think: float,
) -> tuple[float, float]:
    """(tool, human) seconds of the gap [prev_end, start] (``think`` long, rounded):
    tool time is the union of the tool spans within it; human time runs from the
    gap's start to the person's input, less tool time."""
    tool = min(_ms(union.covered(prev_end, start)), think)
    human = 0.0
    if human_at is not None and human_at > prev_end:
        upto = min(human_at, start)
        human = (upto - prev_end) - union.covered(prev_end, upto)
    return tool, min(_ms(max(human, 0.0)), _ms(think - tool))


class _Builder:
    def __init__(
        self,
        threads: list[Thread],
        *,
        source: str,
        anon: Anonymizer,
        block_size: int,
        token_ids: TokenIds | None,
        hash_rule: str,
        report: ImportReport,
    ) -> None:
        self.source = source
        self.anon = anon
        self.block_size = block_size
        self.token_ids = token_ids
        self.hash_rule = hash_rule
        self.report = report
        self.by_key = {t.key: t for t in threads if t.calls}
        self.children: dict[str, list[Thread]] = {}
        self.roots: list[Thread] = []
        for t in self.by_key.values():
            parent = self._parent(t)
            if parent is None:
                self.roots.append(t)
            else:
                self.children.setdefault(parent.key, []).append(t)
        self.times = {k: _times(t.calls) for k, t in self.by_key.items()}

    def _parent(self, t: Thread) -> Thread | None:
        if t.spawn is None:
            return None
        parent = self.by_key.get(t.spawn.parent)
        seen = {t.key}
        p = parent
        while p is not None:  # a cycle or a chain too deep: import it as a root
            if p.key in seen or len(seen) > _MAX_DEPTH:
                return None
            seen.add(p.key)
            p = self.by_key.get(p.spawn.parent) if p.spawn is not None else None
        return parent

    def _start(self, t: Thread) -> float | None:
        for start, end in self.times[t.key]:
            if start is not None:
                return start
            if end is not None:
                return end
        return None

    def build(self) -> Trace:
        def order(t: Thread) -> tuple[bool, float, str]:
            s = self._start(t)
            return (s is None, s if s is not None else 0.0, self._root_id(t))

        self.roots.sort(key=order)
        starts = [s for s in map(self._start, self.roots) if s is not None]
        t0 = min(starts) if starts else None
        owner = self._file_owners()
        sessions = []
        for root in self.roots:
            first = self._start(root)
            skipped: Counter[str] = Counter()
            for path, counts in self.report.skipped_by_file.items():
                if owner.get(path) == root.key:
                    skipped.update(counts)
            extra: dict[str, Any] = {
                "imported_from": self.source,
                "hash_rule": self.hash_rule,
            }
            if skipped:
                extra["skipped_records"] = dict(sorted(skipped.items()))
            session = self._session(
                root,
                self._root_id(root),
                GrowthIds(self.block_size) if self.token_ids is None else None,
                root=True,
                start_s=None if t0 is None or first is None else _ms(first - t0),
                extra=extra,
            )
            sessions.append(session)
        self.report.sessions = len(sessions)
        return Trace(sessions=tuple(sessions), source_format=self.source)

    def _root_id(self, t: Thread) -> str:
        return f"{self.source}-{self.anon.pseudonym('session', t.key)}"

    def _file_owners(self) -> dict[Path, str]:
        """Each file's skips go to the first root (in trace order) it fed."""
        owner: dict[Path, str] = {}

        def walk(t: Thread, root_key: str) -> None:
            for f in sorted(t.files):
                owner.setdefault(f, root_key)
            for c in self.children.get(t.key, []):
                walk(c, root_key)

        for r in self.roots:
            walk(r, r.key)
        return owner

    def _ids(self, t: Thread, growth: GrowthIds | None) -> list[HashIds]:
        if growth is not None:
            return growth.thread(t.calls)
        assert self.token_ids is not None
        return self.token_ids.thread(t.calls)

    def _session(
        self,
        t: Thread,
        sid: str,
        growth: GrowthIds | None,
        *,
        root: bool,
        start_s: float | None = None,
        extra: dict[str, Any] | None = None,
    ) -> Session:
        times = self.times[t.key]
        origin = self._start(t) or 0.0
        ids = self._ids(t, growth)
        requests: list[Request] = []
        prev_end: float | None = None
        union = SpanUnion(t.tool_spans)
        for k, (call, (start, end)) in enumerate(zip(t.calls, times, strict=True)):
            think = tool = human = 0.0
            if k and start is not None and prev_end is not None:
                think = _ms(max(0.0, start - prev_end))
                # A subagent's inputs come from its parent agent, not a person.
                human_at = call.human_at if root else None
                tool, human = _gap_parts(union, prev_end, start, human_at, think)
            requests.append(
                Request(
                    input_tokens=call.input_tokens,
                    output_tokens=call.output_tokens,
                    hash_ids=ids[k],
                    t_s=_ms(start - origin) if start is not None else 0.0,
                    think_time_s=think,
                    api_time_s=(
                        _ms(end - start)
                        if start is not None and end is not None
                        else None
                    ),
                    kind="n",
                    model=self.anon.model(call.model),
                    stop=self.anon.stop(call.stop),
                    input_types=call.input_types,
                    output_types=call.output_types,
                    extra=_request_extra(call),
                    tool_wait_s=tool,
                    human_wait_s=human,
                )
            )
            if end is not None:
                prev_end = end
        self.report.calls += len(requests)
        models = tuple(dict.fromkeys(r.model for r in requests if r.model is not None))
        subagents = self._subagents(t, sid, requests, origin, growth)
        return Session(
            session_id=sid,
            requests=tuple(requests),
            subagents=tuple(subagents),
            block_size=self.block_size,
            hash_id_scope="global" if root and self.token_ids is not None else "local",
            start_s=start_s,
            models=models,
            extra=extra or {},
        )

    def _anchor(self, parent: Thread, child: Thread) -> int:
        idx = child.spawn.call_index if child.spawn is not None else None
        if idx is not None and 0 <= idx < len(parent.calls):
            return idx
        child_start = self._start(child)
        if child_start is None:
            return -1
        anchor = -1
        for k, (start, _) in enumerate(self.times[parent.key]):
            if start is not None and start <= child_start:
                anchor = k
        return anchor

    def _subagents(
        self,
        t: Thread,
        sid: str,
        requests: list[Request],
        origin: float,
        growth: GrowthIds | None,
    ) -> list[Subagent]:
        placed = []
        for child in self.children.get(t.key, []):
            anchor = self._anchor(t, child)
            join = anchor + 1 if anchor + 1 < len(requests) else None
            lo = requests[anchor].t_s if anchor >= 0 else 0.0
            hi = requests[join].t_s if join is not None else math.inf
            cs = self._start(child)
            spawn_t = min(max(_ms(cs - origin), lo), hi) if cs is not None else lo
            placed.append((anchor, spawn_t, self._root_id(child), child, join))
        placed.sort(key=lambda p: (p[0], p[1], p[2]))
        out: list[Subagent] = []
        for n, (anchor, spawn_t, _, child, join) in enumerate(placed, start=1):
            agent_id = f"agent_{n:03d}"
            session = self._session(child, f"{sid}/{agent_id}", growth, root=False)
            self.report.subagent_sessions += 1
            sp = child.spawn
            assert sp is not None
            duration = sp.duration_ms
            if duration is None:
                times = [
                    x for pair in self.times[child.key] for x in pair if x is not None
                ]
                duration = round((max(times) - min(times)) * 1000) if times else None
            out.append(
                Subagent(
                    session=session,
                    anchor_index=anchor,
                    join_index=join,
                    agent_id=agent_id,
                    t_s=spawn_t,
                    subagent_type=self.anon.subagent_type(sp.subagent_type),
                    duration_ms=duration,
                    total_tokens=sp.total_tokens,
                    tool_use_count=sp.tool_use_count,
                    status=self.anon.status(sp.status),
                )
            )
        return out


def _request_extra(call: Call) -> dict[str, int]:
    extra: dict[str, int] = {}
    if call.cached_tokens is not None:
        extra["provider_cached_tokens"] = call.cached_tokens
    extra.update(call.extra)
    return extra


def assemble(
    threads: list[Thread],
    *,
    source: str,
    anon: Anonymizer,
    block_size: int,
    token_ids: TokenIds | None,
    hash_rule: str,
    report: ImportReport,
) -> Trace:
    """The trace of ``threads``: roots by first call, subagents under their parents.

    Times. A call's ``t`` is its start minus its thread's first start; its
    ``think_time`` is its start minus the previous call's end (the user's or the tools'
    time); its ``api_time`` is its end minus its start. The think gap's parts:
    ``tool_wait`` is the length of the gap the thread's tool spans (tool call to tool
    result, overlapping ones counted once) cover; ``human_wait`` runs from the gap's
    start to the last input a person typed before the call (root sessions only), less
    tool time; the rest is other time (the agent's own work between calls), so the
    parts always add up to ``think_time``. Starts never precede the
    previous call's end. A root session's ``start_t`` is its first start minus the
    import's first start, so absolute times of day are never written. Times are rounded
    to the millisecond, the logs' own resolution.

    Subagents (Weka semantics). A subagent thread spawns after the parent call that
    spawned it: the call the log links it to (a tool call whose result names it), else
    the last parent call that started before the subagent's first call. The parent call
    after that one waits for it (the join); with no parent call after it, it runs in the
    background. Its spawn time is clamped between those two calls, as the Weka format
    requires. Subagents are numbered ``agent_001``, ``agent_002``, ... per parent in
    spawn order and their session ids are ``<parent id>/<agent id>``.
    """
    report.hash_rule = hash_rule
    return _Builder(
        threads,
        source=source,
        anon=anon,
        block_size=block_size,
        token_ids=token_ids,
        hash_rule=hash_rule,
        report=report,
    ).build()
