"""Playing one session tree: turns in order, think gaps, subagents spawned after their
anchor and joined before the parent's next request, and one record per request.

A failed request ends its session: the rest of it (and subagents it would have spawned)
are recorded as ``skipped``, because continuing would replay broken history.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from replayer.records import RequestRecord

if TYPE_CHECKING:
    from replayer.client import Client, Outcome
    from replayer.clock import Clock
    from replayer.config import ReplayConfig
    from replayer.recorder import ParquetRecorder
    from traces.materialize import Materializer
    from traces.model import Session


@dataclass(slots=True)
class RunState:
    """Mutable state shared by all sessions of one run (one event loop, no locks)."""

    config: ReplayConfig
    clock: Clock
    client: Client
    recorder: ParquetRecorder
    materializer: Materializer
    run_id: str
    t0_ns: int
    ideal_tokens: dict[tuple[str, int], int]  # trace-block tokens, per request
    body_head: bytes  # b'{"model":"m",'
    stop_at_ns: int | None = None  # absolute; no new requests after it
    stopping: bool = False
    inflight: int = 0
    lanes: int = 0
    done: int = 0
    failed: int = 0
    skipped: int = 0
    output_tokens: int = 0
    input_tokens: int = 0
    ttfts_ns: list[int] = field(default_factory=list)
    admission: asyncio.Semaphore | None = None
    inflight_tasks: set[asyncio.Task[object]] = field(default_factory=set)

    def rel(self, abs_ns: int) -> int:
        return abs_ns - self.t0_ns

    def past_stop(self, abs_ns: int) -> bool:
        return self.stopping or (
            self.stop_at_ns is not None and abs_ns >= self.stop_at_ns
        )


def think_ns(state: RunState, think_time_s: float) -> int:
    """A trace think gap, scaled and capped, in ns."""
    gap = think_time_s * state.config.think_scale
    cap = state.config.think_cap_s
    if cap is not None:
        gap = min(gap, cap)
    return int(gap * 1e9)


@dataclass(frozen=True, slots=True)
class _Place:
    """Where a session sits in its tree, and where its blocks' content comes from."""

    session: Session
    root: Session
    parent_id: str | None
    depth: int
    replay: int

    @property
    def namespace(self) -> str:
        return self.root.hash_namespace()

    def child(self, sub: Session) -> _Place:
        return _Place(
            sub, self.root, self.session.session_id, self.depth + 1, self.replay
        )


def _body(state: RunState, fragment: bytes, max_tokens: int) -> bytes:
    ep = state.config.endpoint
    tail = b',"max_tokens":%d,"stream":true' % max_tokens
    if ep.include_usage:
        tail += b',"stream_options":{"include_usage":true}'
    if ep.vllm_extras:
        # Output lengths must match the trace: no early EOS.
        tail += b',"ignore_eos":true,"min_tokens":%d' % max_tokens
    return state.body_head + fragment + tail + b"}"


async def play_tree(
    state: RunState, root: Session, *, replay: int, start_abs_ns: int
) -> None:
    """Play a whole session tree; returns when it and all its subagents have drained."""
    state.lanes += 1
    try:
        async with asyncio.TaskGroup() as tg:
            await _play_session(
                state, _Place(root, root, None, 0, replay), start_abs_ns, tg
            )
    finally:
        state.lanes -= 1


async def _play_session(
    state: RunState, place: _Place, start_abs_ns: int, tg: asyncio.TaskGroup
) -> None:
    clock = state.clock
    cfg = state.config
    session = place.session
    spawned: dict[int, list[asyncio.Task[None]]] = {}

    def spawn(anchor: int, at_abs_ns: int) -> None:
        for k, sub in enumerate(session.subagents):
            if sub.anchor_index != anchor:
                continue
            first = sub.session.requests[0] if sub.session.requests else None
            delay = think_ns(state, first.think_time_s) if first else 0
            task = tg.create_task(
                _play_session(state, place.child(sub.session), at_abs_ns + delay, tg),
                name=f"subagent-{sub.session.session_id}-{k}",
            )
            if sub.join_index is not None:
                spawned.setdefault(sub.join_index, []).append(task)

    spawn(-1, start_abs_ns)
    prev_end_abs = start_abs_ns
    origin_abs = start_abs_ns  # timestamps mode: the session's trace start
    for i, req in enumerate(session.requests):
        if cfg.mode == "timestamps":
            due = max(prev_end_abs, origin_abs + int(req.t_s / cfg.speedup * 1e9))
        elif i == 0:
            due = start_abs_ns
        else:
            due = prev_end_abs + think_ns(state, req.think_time_s)
        joins = spawned.pop(i, [])
        if joins:
            await asyncio.wait(joins)
            for t in joins:
                if not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
            due = max(due, clock.now_ns())
        if state.past_stop(due):
            return
        await clock.sleep_until(due)
        if state.past_stop(clock.now_ns()):
            return
        record = await _request(state, place, i, due)
        prev_end_abs = state.t0_ns + (record.end_ns or state.rel(clock.now_ns()))
        if record.status != "ok":
            _skip_rest(state, place, i + 1)
            return
        spawn(i, prev_end_abs)


def _skip_rest(state: RunState, place: _Place, first: int) -> None:
    now_rel = state.rel(state.clock.now_ns())
    for i in range(first, len(place.session.requests)):
        state.recorder.put(_base_record(state, place, i, now_rel, "skipped"))
        state.skipped += 1
    for sub in place.session.subagents:
        # Subagents anchored at the failed request (first - 1) never spawn either.
        if sub.anchor_index >= first - 1:
            _skip_rest(state, place.child(sub.session), 0)


def _base_record(
    state: RunState, place: _Place, i: int, scheduled_rel: int, status: str
) -> RequestRecord:
    session = place.session
    req = session.requests[i]
    sent, dropped = state.materializer.sent_tokens(session, req)
    max_tokens = max(1, req.output_tokens)
    return RequestRecord(
        run_id=state.run_id,
        worker_id=state.config.worker_id,
        session_id=session.session_id,
        root_session_id=place.root.session_id,
        parent_session_id=place.parent_id,
        agent_depth=place.depth,
        request_index=i,
        scheduled_ns=scheduled_rel,
        trace_input_tokens=req.input_tokens,
        prompt_tokens=sent,
        dropped_input_tokens=dropped,
        trace_output_tokens=req.output_tokens,
        requested_output_tokens=max_tokens,
        ideal_cached_tokens=_ideal(state, session, i, sent),
        status=status,  # type: ignore[arg-type]
        warmup=scheduled_rel < int(state.config.warmup_s * 1e9),
    )


def _ideal(state: RunState, session: Session, i: int, sent: int) -> int:
    trace_tokens = state.ideal_tokens.get((session.session_id, i), 0)
    bt = state.materializer.block_tokens_for(session)
    return min(trace_tokens // session.block_size * bt, sent)


async def _request(
    state: RunState, place: _Place, i: int, due_abs: int
) -> RequestRecord:
    session = place.session
    rec = _base_record(state, place, i, state.rel(due_abs), "ok")
    prompt = state.materializer.prompt(session, i, place.namespace, replay=place.replay)
    rec.prompt_tokens = prompt.prompt_tokens
    rec.dropped_input_tokens = prompt.dropped_tokens
    rec.ideal_cached_tokens = min(rec.ideal_cached_tokens, prompt.prompt_tokens)
    body = _body(state, prompt.fragment, rec.requested_output_tokens)
    admission = state.admission
    if admission is not None:
        await admission.acquire()
    rec.inflight_at_send = state.inflight + 1
    rec.lanes_at_send = state.lanes
    state.inflight += 1
    outcome: Outcome | None = None
    try:
        outcome = await state.client.send(body)
    except asyncio.CancelledError:
        now_rel = state.rel(state.clock.now_ns())
        rec.status = "cancelled"
        rec.error_type = "CancelledError"
        rec.error_message = "cancelled before the response completed"
        rec.start_ns = rec.start_ns if rec.start_ns is not None else now_rel
        rec.end_ns = now_rel
        state.recorder.put(rec)
        raise
    finally:
        state.inflight -= 1
        if admission is not None:
            admission.release()
    _fill(state, rec, outcome)
    state.recorder.put(rec)
    return rec


def _fill(state: RunState, rec: RequestRecord, out: Outcome) -> None:
    rel = state.rel
    rec.start_ns = rel(out.start_ns)
    rec.end_ns = rel(out.end_ns)
    rec.e2e_ns = out.end_ns - out.start_ns
    rec.status = out.status  # type: ignore[assignment]
    rec.http_status = out.http_status
    rec.error_type = out.error_type
    rec.error_message = out.error_message
    rec.retries = out.retries
    rec.server_prompt_tokens = out.server_prompt_tokens
    rec.cached_tokens = out.cached_tokens
    rec.chunk_times_ns = out.chunk_times_ns
    n_chunks = len(out.chunk_times_ns)
    rec.output_tokens = (
        out.completion_tokens
        if out.completion_tokens is not None
        else (n_chunks if out.status == "ok" else None)
    )
    if out.first_token_ns is not None:
        rec.first_token_ns = rel(out.first_token_ns)
        rec.ttft_ns = out.first_token_ns - out.start_ns
    if n_chunks >= 2:
        gaps = np.diff(np.asarray(out.chunk_times_ns, dtype=np.int64))
        rec.itl_mean_ns = int(gaps.mean())
        rec.itl_max_ns = int(gaps.max())
    if (
        rec.status == "ok"
        and rec.ttft_ns is not None
        and rec.output_tokens is not None
        and rec.output_tokens >= 2
    ):
        rec.tpot_ns = (rec.e2e_ns - rec.ttft_ns) // (rec.output_tokens - 1)
    if rec.status == "ok":
        state.done += 1
        state.output_tokens += rec.output_tokens or 0
        state.input_tokens += rec.prompt_tokens
        if rec.ttft_ns is not None:
            state.ttfts_ns.append(rec.ttft_ns)
    else:
        state.failed += 1
