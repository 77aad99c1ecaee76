"""The order in which a closed-loop replay at concurrency N sends a trace's requests: a
small discrete-event model of the engine's lanes. Deterministic and pure (no I/O, no
clock). See docs/capacity.md#the-knee-from-the-trace."""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from traces.gaps import GapRule
from traces.model import Session, Trace
from traces.table import request_column

DEFAULT_SERVICE_S = 1.0  # a request's duration when the trace records none at all


@dataclass(frozen=True, slots=True)
class SentRequest:
    """One request as the model sends it."""

    session: Session
    index: int  # request index in its session
    root_index: int  # its tree's index in ``Trace.sessions`` (the cache namespace)
    send_s: float  # model time it is sent
    end_s: float  # model time it ends (send_s + its duration)


@dataclass(slots=True, eq=False)
class _Play:
    """A session being played."""

    session: Session
    tree: _Tree
    parent: _Play | None
    join_in_parent: int | None
    durations_s: list[float]
    thinks_s: list[float]
    next_index: int = 0
    last_end_s: float = 0.0
    # request index → subagents joined there still playing
    pending_joins: dict[int, int] = field(default_factory=dict)
    waiting_at: int | None = None  # request index blocked on joins


@dataclass(slots=True, eq=False)
class _Tree:
    index: int
    live: int = 0  # sessions of the tree still playing


def _durations(session: Session, fallback_s: float) -> list[float]:
    api = request_column(session.requests, "api_time_s")
    ttft = request_column(session.requests, "ttft_s")
    out = np.where(np.isfinite(api), api, np.where(np.isfinite(ttft), ttft, fallback_s))
    durations: list[float] = np.maximum(out, 0.0).tolist()
    return durations


def _median_api_s(trace: Trace) -> float:
    parts = [request_column(s.requests, "api_time_s") for s, _ in trace.all_sessions()]
    api = np.concatenate(parts) if parts else np.zeros(0)
    api = api[np.isfinite(api)]
    return float(np.median(api)) if api.size else DEFAULT_SERVICE_S


def send_order(
    trace: Trace,
    *,
    concurrency: int,
    think_scale: float = 1.0,
    think_cap_s: float | None = None,
    max_inflight: int | None = None,
    tool_scale: float = 1.0,
) -> list[SentRequest]:
    """Every request of ``trace`` in the order a replay at ``concurrency`` lanes sends
    it, at most ``max_inflight`` in flight (see the module docstring for the timing
    model).

    A small discrete-event model of ``replayer run --concurrency N`` (the engine's
    lanes), built from the trace alone, so the cache model sees requests interleaved as
    a replay would send them, not in file order:

    - N lanes; a lane plays one session tree and takes the next tree (trace order) when
      its whole tree has drained, subagents included. All lanes start at time 0.
    - In a session, request 0 is sent when the session starts; request i > 0 is sent
      its gap after request i - 1 ends: the engine's rule, ``traces.gaps.GapRule``
      (the non-tool part of ``think_time_s`` times ``think_scale``, capped at
      ``think_cap_s``, plus its ``tool_wait_s`` times ``tool_scale``).
    - A subagent starts when its anchor request ends (at the session start for anchor
      -1); its first request waits its own scaled think time, as the engine does. The
      parent request at the join waits until every subagent joined there has ended. A
      background subagent (no join) runs beside the rest of its parent; the tree drains
      when the last of its sessions ends.
    - A request takes its recorded ``api_time_s``; when the trace lacks it, its
      ``ttft_s``, else the median recorded ``api_time_s`` of the trace (1 s if none).
      This is the approximation: a replayed server answers in its own time, so the order
      of requests from different lanes can differ; the order within a session tree (and
      its subagents' concurrency with the parent) is the engine's.
    - With ``max_inflight`` (``replayer run --max-inflight``) at most that many requests
      are in flight; a request that comes due while they are waits in one FIFO queue and
      is sent when one ends (the engine's admission semaphore). A slot freed by an end
      goes to the queue's head before the ended lane's next request comes due.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1 (got {concurrency})")
    if max_inflight is not None and max_inflight < 1:
        raise ValueError(f"max in-flight must be >= 1 (got {max_inflight})")
    slots = math.inf if max_inflight is None else max_inflight
    rule = GapRule(think_scale, think_cap_s, tool_scale)
    fallback_s = _median_api_s(trace)
    seq = itertools.count()
    # (time, seq, kind, play): kind 0 = send request play.next_index, 1 = it ends.
    events: list[tuple[float, int, int, _Play]] = []
    out: list[SentRequest] = []
    trees = iter(enumerate(trace.sessions))
    queued: deque[_Play] = deque()  # due, waiting for an in-flight slot
    inflight = 0

    def start_session(
        session: Session,
        tree: _Tree,
        at_s: float,
        parent: _Play | None,
        join: int | None,
    ) -> None:
        play = _Play(
            session,
            tree,
            parent,
            join,
            _durations(session, fallback_s),
            rule.gaps_s(session.requests).tolist(),
        )
        tree.live += 1
        for sub in session.subagents:
            if sub.join_index is not None:
                play.pending_joins[sub.join_index] = (
                    play.pending_joins.get(sub.join_index, 0) + 1
                )
        spawn(play, -1, at_s)
        if session.requests:
            heapq.heappush(events, (at_s, next(seq), 0, play))
        else:
            end_session(play, at_s)

    def spawn(play: _Play, anchor: int, at_s: float) -> None:
        for sub in play.session.subagents:
            if sub.anchor_index != anchor:
                continue
            reqs = sub.session.requests
            delay = float(rule.gaps_s(reqs[:1])[0]) if reqs else 0.0
            start_session(sub.session, play.tree, at_s + delay, play, sub.join_index)

    def end_session(play: _Play, at_s: float) -> None:
        parent, join = play.parent, play.join_in_parent
        if parent is not None and join is not None:
            parent.pending_joins[join] -= 1
            if parent.pending_joins[join] == 0 and parent.waiting_at == join:
                parent.waiting_at = None
                due_s = max(parent.last_end_s + parent.thinks_s[join], at_s)
                heapq.heappush(events, (due_s, next(seq), 0, parent))
        play.tree.live -= 1
        if play.tree.live == 0:
            start_next_tree(at_s)

    def start_next_tree(at_s: float) -> None:
        nxt = next(trees, None)
        if nxt is not None:
            start_session(nxt[1], _Tree(nxt[0]), at_s, None, None)

    def send(play: _Play, at_s: float) -> None:
        nonlocal inflight
        inflight += 1
        i = play.next_index
        end_s = at_s + play.durations_s[i]
        out.append(SentRequest(play.session, i, play.tree.index, at_s, end_s))
        heapq.heappush(events, (end_s, next(seq), 1, play))

    for _ in range(concurrency):
        start_next_tree(0.0)
    while events:
        at_s, _, kind, play = heapq.heappop(events)
        if kind == 0:
            if inflight < slots:
                send(play, at_s)
            else:
                queued.append(play)
            continue
        inflight -= 1
        if queued:
            send(queued.popleft(), at_s)
        play.last_end_s = at_s
        play.next_index = i = play.next_index + 1
        spawn(play, i - 1, at_s)
        if i >= len(play.session.requests):
            end_session(play, at_s)
            continue
        due_s = at_s + play.thinks_s[i]
        if play.pending_joins.get(i, 0) > 0:
            play.waiting_at = i  # sent when the last subagent joined here ends
            continue
        heapq.heappush(events, (due_s, next(seq), 0, play))
    return out
