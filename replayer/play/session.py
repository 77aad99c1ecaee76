"""Playing one session tree: turns in order, think gaps, subagents spawned after their
anchor and joined before the parent's next request, and one record per request.
See docs/replaying.md."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt
import orjson

from replayer.config import TraceTimestamps, public_url
from replayer.play.client import NOT_STREAMED, Outcome
from replayer.records import RequestRecord, RequestStatus, tpot_ns

if TYPE_CHECKING:
    from replayer.clock import Clock
    from replayer.config import AgentNative, EndpointConfig, ReplayConfig
    from replayer.play.client import ChatClient, ServerWatch
    from replayer.play.phase import IdleSkip, StopControl
    from replayer.play.progress import RunCounters
    from replayer.play.recorder import ParquetRecorder
    from replayer.play.template import TemplateCost
    from traces.materialize import Materializer, Prompt, Reply
    from traces.model import Request, Session

_MAX_GAP_NS = 1 << 62  # a gap's most: past any run's end, and t0 + it fits int64


class PromptBuilder:
    """Builds request bodies. A large one (a 142K-token body takes tens of ms) is
    built on a thread of its own, since on the event loop it would delay the chunk
    stamps of every other stream; a small one is built inline, cheaper than the hop.

    A large prompt whose content the trace alone decides (no live replies) can be
    built ahead (:meth:`prefetch`): during its think gap, while the request it follows
    streams, or before the run starts, so that its send does not wait for it (nor,
    behind it on the one build thread, the sends of other lanes).
    """

    def __init__(
        self,
        materializer: Materializer,
        body: Callable[[bytes, int], bytes],
        *,
        inline_tokens: int = 4096,  # ~0.5 ms of building: below it, no thread hop
    ) -> None:
        self.materializer = materializer
        self._body = body
        self._inline_tokens = inline_tokens
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="replayer-prompts")
        # Prompts built or being built ahead, by (id(session), index, namespace,
        # replay); each is taken once, by its send.
        self._ahead: dict[tuple[int, int, str, int], asyncio.Future[Prompt]] = {}

    def prefetch(self, session: Session, i: int, namespace: str, replay: int) -> None:
        """Start building request ``i``'s prompt on the build thread, unless it is
        small (built inline at its send) or already under way. Only for prompts of
        the trace's content (not with live replies)."""
        key = (id(session), i, namespace, replay)
        if key in self._ahead or i >= len(session.requests):
            return
        sent, _ = self.materializer.sent_tokens(session, session.requests[i])
        if sent < self._inline_tokens:
            return
        job = functools.partial(
            self.materializer.prompt, session, i, namespace, replay=replay
        )
        fut = asyncio.get_running_loop().run_in_executor(self._executor, job)
        fut.add_done_callback(_retrieved)  # a prompt never sent raises nowhere
        self._ahead[key] = fut

    async def prebuild(self, prompts: Sequence[tuple[Session, int, str, int]]) -> None:
        """Build ``prompts`` (session, index, namespace, replay) ahead and wait for
        them: the first sends of a run, before its clock starts."""
        for p in prompts:
            self.prefetch(*p)
        keys = [(id(s), i, ns, r) for s, i, ns, r in prompts]
        waiting = [f for k in keys if (f := self._ahead.get(k)) is not None]
        if waiting:
            await asyncio.wait(waiting)

    async def build(
        self,
        session: Session,
        i: int,
        namespace: str,
        replay: int,
        max_tokens: int,
        *,
        sent_tokens: int | None = None,
        replies: Mapping[int, Reply] | None = None,
    ) -> tuple[Prompt, bytes]:
        """Request ``i`` of ``session``: its prompt and the whole POST body.
        ``sent_tokens``: its size when the caller has it (``Materializer.sent_tokens``),
        which decides where it is built. ``replies``: live assistant replies."""
        if replies is None:
            ahead = self._ahead.pop((id(session), i, namespace, replay), None)
            if ahead is not None:
                prompt = await ahead
                return prompt, self._body(prompt.fragment, max_tokens)
        if sent_tokens is None:
            sent_tokens, _ = self.materializer.sent_tokens(session, session.requests[i])

        def job() -> tuple[Prompt, bytes]:
            prompt = self.materializer.prompt(
                session, i, namespace, replay=replay, replies=replies
            )
            return prompt, self._body(prompt.fragment, max_tokens)

        if sent_tokens < self._inline_tokens:
            return job()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, job)

    def body(self, fragment: bytes, max_tokens: int) -> bytes:
        """The POST body of a built prompt's ``fragment`` asking ``max_tokens``."""
        return self._body(fragment, max_tokens)

    def close(self) -> None:
        for fut in self._ahead.values():
            fut.cancel()
        self._ahead.clear()
        self._executor.shutdown(wait=True, cancel_futures=True)


def _retrieved(fut: asyncio.Future[Prompt]) -> None:
    if not fut.cancelled():
        fut.exception()


_FEW = 8  # requests: a session this short has its gaps worked out value by value


@dataclass(frozen=True, slots=True, kw_only=True)
class RunContext:
    """What every session of one process's run shares, fixed when the run starts:
    collaborators, constants, and the two mutable parts (counters and the stop
    control), each owned by the event loop."""

    config: ReplayConfig
    clock: Clock
    client: ChatClient
    recorder: ParquetRecorder
    prompts: PromptBuilder
    counters: RunCounters
    stop: StopControl
    run_id: str
    worker_id: int
    t0_ns: int  # the shared zero: run-relative times are offsets from it
    # Ideal hit of each request in trace tokens: session id → one per request index.
    ideal_tokens: dict[str, npt.NDArray[np.int64]]
    admission: asyncio.Semaphore | None  # --max-inflight
    idle: IdleSkip | None = None  # --idle-skip: whole-system idle is skipped
    watch: ServerWatch | None = None  # stops the run when the server goes away
    agent: AgentNative | None = None  # --session-routing agent-native: whose headers
    # --fit-context clamp of chat prompts: the server's template cost, as learned.
    template: TemplateCost | None = None

    def rel(self, abs_ns: int) -> int:
        return abs_ns - self.t0_ns

    def gaps_ns(self, requests: Sequence[Request]) -> list[int]:
        """The gap before each of ``requests`` (one session's), ns: the trace's think
        gaps under the run's gap rule (``traces.gaps``: tool time scaled apart)."""
        rule = self.config.gap_rule
        # A trace's time times --think-scale may pass what int64 ns hold: such a gap
        # outlasts any run, so it waits ~146 years rather than wrapping to 0.
        most_s = _MAX_GAP_NS / 1e9
        if len(requests) <= _FEW and isinstance(requests, tuple):
            # A short session of Request objects: the arithmetic per value costs
            # less than the arrays (one-request sessions: ~10x less).
            return [
                int(min(rule.gap_s(r.think_time_s, r.tool_wait_s), most_s) * 1e9)
                for r in requests
            ]
        gaps_s = np.minimum(rule.gaps_s(requests), most_s)
        gaps: list[int] = (gaps_s * 1e9).astype(np.int64).tolist()
        return gaps


def request_body(endpoint: EndpointConfig) -> Callable[[bytes, int], bytes]:
    """The body builder: ``{"model", <prompt>, "max_tokens", "stream" ...}``."""
    include_usage, vllm_extras = endpoint.include_usage, endpoint.vllm_extras
    head = b'{"model":' + orjson.dumps(endpoint.model) + b","

    def body(fragment: bytes, max_tokens: int) -> bytes:
        tail = b',"max_tokens":%d,"stream":true' % max_tokens
        if include_usage:
            tail += b',"stream_options":{"include_usage":true}'
        if vllm_extras:
            # Output lengths must match the trace: no early EOS.
            tail += b',"ignore_eos":true,"min_tokens":%d' % max_tokens
        return b"".join((head, fragment, tail, b"}"))  # one copy of the prompt

    return body


@dataclass(slots=True)
class _Seen:
    """What a session's responses told (event-loop owned): the latest
    --session-token-header value (never recorded), and for a chat server's template
    cost, its last (messages, server prompt tokens - ours)."""

    token: str | None = None
    template: tuple[int, int] | None = None


@dataclass(frozen=True, slots=True)
class _Place:
    """Where a session sits in its tree, and where its blocks' content comes from."""

    session: Session
    root: Session
    parent_id: str | None
    depth: int
    replay: int
    seen: _Seen = field(default_factory=_Seen)

    @property
    def namespace(self) -> str:
        return self.root.hash_namespace()

    def child(self, sub: Session) -> _Place:
        """``sub``'s place; it starts with the token its parent holds at the spawn
        (it shares the parent's prefix: the same replica serves it best)."""
        return _Place(
            sub,
            self.root,
            self.session.session_id,
            self.depth + 1,
            self.replay,
            _Seen(self.seen.token),
        )


async def play_tree(
    ctx: RunContext,
    root: Session,
    *,
    replay: int,
    start_abs_ns: int,
    start_at: float | None = None,
) -> None:
    """Play a whole session tree; returns when it and all its subagents have drained.
    ``start_at``: start this fraction of the way into the root session (a lane's
    first tree, mid-session start), after priming its prefix.

    By default a failed request ends its session: the rest of it (and subagents it would
    have spawned) are recorded as ``skipped``. ``on_error`` chooses otherwise:
    ``continue`` (the history comes from the trace, so later turns are still
    well-formed) or ``abort-run``. A lane's first tree may start mid-session
    (``start_ratio``): its prefix is primed by one ``max_tokens=1`` request, flagged and
    excluded from every figure.
    """
    ctx.counters.lanes += 1
    try:
        async with asyncio.TaskGroup() as tg:
            await _play_session(
                ctx,
                _Place(root, root, None, 0, replay),
                start_abs_ns,
                tg,
                start_at=start_at,
            )
    finally:
        ctx.counters.lanes -= 1


def start_index(session: Session, start_at: float) -> int:
    """The first request played when ``session`` starts ``start_at`` (a fraction) of
    the way into its recorded duration: the first at or after that instant, at least
    1 (one request to prime with) and at most the last (one request to measure).
    0 when the session has fewer than two requests."""
    n = len(session.requests)
    if n < 2:
        return 0
    times = [r.t_s for r in session.requests]
    at = times[0] + start_at * (times[-1] - times[0])
    k = next((i for i, t in enumerate(times) if t >= at), n - 1)
    return min(max(k, 1), n - 1)


async def _play_session(
    ctx: RunContext,
    place: _Place,
    start_abs_ns: int,
    tg: asyncio.TaskGroup,
    *,
    start_at: float | None = None,
) -> None:
    idle = ctx.idle
    try:
        await _play_turns(ctx, place, start_abs_ns, tg, start_at)
    finally:
        if idle is not None:
            idle.idle()  # the spawner counted this stream busy


async def _play_turns(
    ctx: RunContext,
    place: _Place,
    start_abs_ns: int,
    tg: asyncio.TaskGroup,
    start_at: float | None,
) -> None:
    clock = ctx.clock
    stop = ctx.stop
    idle = ctx.idle
    timestamps = ctx.config.schedule
    speedup = timestamps.speedup if isinstance(timestamps, TraceTimestamps) else None
    session = place.session
    spawned: dict[int, list[asyncio.Task[None]]] = {}
    # --live-assistant: this replay's own replies, by request index.
    replies: dict[int, Reply] | None = {} if ctx.config.live_assistant else None

    gaps = ctx.gaps_ns(session.requests)

    def gap_ns(i: int, after_abs: int) -> int:
        # The cache-pressure warm-up plays with zero think gaps.
        return gaps[i] if stop.measuring(after_abs) else 0

    def spawn(anchor: int, at_abs_ns: int) -> None:
        for k, sub in enumerate(session.subagents):
            if sub.anchor_index != anchor:
                continue
            # Its first request waits its own gap (none in the cache warm-up).
            delay = 0
            if sub.session.requests and stop.measuring(at_abs_ns):
                delay = ctx.gaps_ns(sub.session.requests[:1])[0]
            if idle is not None:
                idle.busy()
            task = tg.create_task(
                _play_session(ctx, place.child(sub.session), at_abs_ns + delay, tg),
                name=f"subagent-{sub.session.session_id}-{k}",
            )
            if sub.join_index is not None:
                spawned.setdefault(sub.join_index, []).append(task)

    first = 0
    prev_end_abs = start_abs_ns
    if start_at is not None:
        first = start_index(session, start_at)
        primed_ok = True
        if first > 0:
            primer = await _request(ctx, place, first - 1, start_abs_ns, primer=True)
            prev_end_abs = ctx.t0_ns + (primer.end_ns or ctx.rel(clock.now_ns()))
            primed_ok = primer.status == "ok"
        stop.primed(clock.now_ns())
        if not primed_ok and not _go_on(ctx, place, first - 1):
            return
        spawn(first - 1, prev_end_abs)
    else:
        spawn(-1, start_abs_ns)
    origin_abs = start_abs_ns  # timestamps mode: the session's trace start
    for i in range(first, len(session.requests)):
        req = session.requests[i]
        if speedup is not None:
            due = max(prev_end_abs, origin_abs + int(req.t_s / speedup * 1e9))
        elif i == 0:
            due = start_abs_ns
        else:
            due = prev_end_abs + gap_ns(i, prev_end_abs)
        if replies is None:  # built during the gap and the joins, not at the send
            ctx.prompts.prefetch(session, i, place.namespace, place.replay)
        joins = spawned.pop(i, [])
        if joins:
            if idle is not None:
                idle.idle()
            try:
                await asyncio.wait(joins)
            finally:
                if idle is not None:
                    idle.busy()
            for t in joins:
                if not t.cancelled() and t.exception() is not None:
                    raise t.exception()  # type: ignore[misc]
            due = max(due, clock.now_ns())
        # An agent still thinking when the window closes keeps its lane taken until
        # then, rather than letting it churn through first turns.
        if idle is not None:
            # Idle skipping may bring the gap's end forward, into the window.
            if not await idle.sleep_until(due, cap_ns=stop.deadline_ns):
                return
        elif stop.past(due):
            if not stop.stopping and stop.deadline_ns is not None:
                await clock.sleep_until(stop.deadline_ns)
            return
        else:
            await clock.sleep_until(due)
        if stop.past(clock.now_ns()):
            return
        record = await _request(ctx, place, i, due, replies=replies)
        prev_end_abs = ctx.t0_ns + (record.end_ns or ctx.rel(clock.now_ns()))
        if record.status != "ok" and not _go_on(ctx, place, i):
            return
        spawn(i, prev_end_abs)


def _go_on(ctx: RunContext, place: _Place, failed: int) -> bool:
    """After request ``failed`` of ``place`` failed: whether its session goes on
    (``--on-error continue``); otherwise the rest of it is recorded as skipped, and
    with ``abort-run`` the whole run stops."""
    policy = ctx.config.on_error
    if policy == "continue":
        return True
    if policy == "abort-run":
        ctx.stop.abort(
            f"request {failed} of session {place.session.session_id} failed "
            "(--on-error abort-run)"
        )
    _skip_rest(ctx, place, failed + 1)
    return False


def _skip_rest(ctx: RunContext, place: _Place, first: int) -> None:
    now_rel = ctx.rel(ctx.clock.now_ns())
    for i in range(first, len(place.session.requests)):
        ctx.recorder.put(_base_record(ctx, place, i, now_rel, "skipped"))
        ctx.counters.count("skipped")
    for sub in place.session.subagents:
        # Subagents anchored at the failed request (first - 1) never spawn either.
        if sub.anchor_index >= first - 1:
            _skip_rest(ctx, place.child(sub.session), 0)


def _base_record(
    ctx: RunContext,
    place: _Place,
    i: int,
    scheduled_rel: int,
    status: RequestStatus,
    *,
    primer: bool = False,
) -> RequestRecord:
    session = place.session
    req = session.requests[i]
    materializer = ctx.prompts.materializer
    sent, dropped = materializer.sent_tokens(session, req)
    # Primers and the cache-pressure warm-up only fill the cache: one output token.
    warming = primer or not ctx.stop.measuring(ctx.t0_ns + scheduled_rel)
    config = ctx.config
    max_tokens = (
        1 if warming and config.phased else config.output_tokens(req.output_tokens)
    )
    dropped_output = 0
    limit = config.max_model_len
    if (
        config.fit_context == "clamp"
        and limit is not None
        and sent + max_tokens > limit
    ):
        room = max(1, limit - sent)  # a prompt past it alone still fails: its error
        dropped_output = max(0, max_tokens - room)
        max_tokens -= dropped_output
    hits = ctx.ideal_tokens.get(session.session_id)
    trace_ideal = int(hits[i]) if hits is not None and i < hits.size else 0
    bt = materializer.block_tokens_for(session)
    return RequestRecord(
        run_id=ctx.run_id,
        worker_id=ctx.worker_id,
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
        dropped_output_tokens=dropped_output,
        # Trace blocks → materialized blocks, capped at what is sent.
        ideal_cached_tokens=min(trace_ideal // session.block_size * bt, sent),
        status=status,
        warmup=warming or scheduled_rel < int(ctx.config.warmup_s * 1e9),
        primer=primer,
        replay_index=place.replay,
    )


async def _request(
    ctx: RunContext,
    place: _Place,
    i: int,
    due_abs: int,
    *,
    primer: bool = False,
    replies: dict[int, Reply] | None = None,
) -> RequestRecord:
    session = place.session
    woke_ns = ctx.clock.now_ns()
    rec = _base_record(ctx, place, i, ctx.rel(due_abs), "ok", primer=primer)
    prompt, body = await ctx.prompts.build(
        session,
        i,
        place.namespace,
        place.replay,
        rec.requested_output_tokens,
        sent_tokens=rec.prompt_tokens,  # _base_record's sent_tokens
        replies=None if replies is None else dict(replies),
    )
    built_ns = ctx.clock.now_ns()
    if not ctx.config.live_assistant:
        # The subagents this request spawns when it ends: built while it streams.
        for sub in session.subagents:
            if sub.anchor_index == i:
                ctx.prompts.prefetch(sub.session, 0, place.namespace, place.replay)
    if replies is not None:
        rec.live_drift_tokens = prompt.drift_tokens
    rec.prompt_tokens = prompt.prompt_tokens
    messages = prompt.messages
    template = ctx.template
    if template is not None and messages:
        # The chat template's tokens are the server's to add: room is left for them
        # as its reports so far say (the count before the build had none).
        body = _fit_template(ctx, rec, template.reserve(messages), prompt, body)
    rec.dropped_input_tokens = prompt.dropped_tokens
    rec.ideal_cached_tokens = min(rec.ideal_cached_tokens, prompt.prompt_tokens)
    # The body holds the prompt: its fragment (as large) need not live while the
    # request does (64 lanes of 222K-token prompts: ~60 MB).
    del prompt
    counters = ctx.counters
    admission = ctx.admission
    if admission is not None:
        await admission.acquire()
    rec.inflight_at_send = counters.inflight + 1
    rec.lanes_at_send = counters.lanes
    counters.inflight += 1
    outcome = Outcome(woke_ns=woke_ns, built_ns=built_ns)
    # A reply is carried only from a full-length request (not a 1-token warm-up).
    live = replies is not None and (
        rec.requested_output_tokens + rec.dropped_output_tokens
        == ctx.config.output_tokens(session.requests[i].output_tokens)
    )
    if live:
        outcome.text = []
    headers = routing_headers(ctx, place, i)
    token_header = ctx.config.endpoint.session_token_header
    if token_header is not None and place.seen.token is not None:
        headers = {**(headers or {}), token_header: place.seen.token}
        counters.session_tokens_echoed += 1
    watch = ctx.watch
    if watch is not None:
        watch.sent(outcome)
    try:
        if headers is None:
            await ctx.client.send(body, outcome)
        else:
            await ctx.client.send(body, outcome, headers=headers)
    except asyncio.CancelledError:
        # Keep what was measured: the real send time, the first token, the chunks.
        if outcome.start_ns == 0:  # cancelled before the client stamped a send
            outcome.start_ns = ctx.clock.now_ns()
        outcome.end_ns = ctx.clock.now_ns()
        outcome.fail("cancelled", "CancelledError", "cancelled before the end")
        _fill(ctx, rec, outcome)
        ctx.recorder.put(rec)
        raise
    finally:
        counters.inflight -= 1
        if admission is not None:
            admission.release()
        if watch is not None:
            gone = watch.ended(outcome, ctx.clock.now_ns())
            if gone is not None:
                url = public_url(ctx.config.endpoint.base_url)
                ctx.stop.fail(f"the server at {url} stopped answering: {gone}")
    if outcome.session_token is not None:
        place.seen.token = outcome.session_token
    if template is not None and messages and outcome.server_prompt_tokens is not None:
        excess = outcome.server_prompt_tokens - rec.prompt_tokens
        template.observe(messages, excess, place.seen.template)
        place.seen.template = (messages, excess)
    _fill(ctx, rec, outcome)
    ctx.recorder.put(rec)
    if live and rec.status == "ok" and outcome.text is not None and replies is not None:
        replies[i] = ("".join(outcome.text), rec.output_tokens or 0)
    return rec


def _fit_template(
    ctx: RunContext, rec: RequestRecord, reserve: int, prompt: Prompt, body: bytes
) -> bytes:
    """``body``, or one asking for fewer output tokens when prompt + ``reserve`` (the
    template) + output passes the server's context; ``rec`` counts the cut."""
    limit = ctx.config.max_model_len
    assert limit is not None  # ctx.template is set only with one
    over = prompt.prompt_tokens + reserve + rec.requested_output_tokens - limit
    cut = min(over, rec.requested_output_tokens - 1)  # at least 1 token: as the clamp
    if cut <= 0:
        return body
    rec.requested_output_tokens -= cut
    rec.dropped_output_tokens += cut
    return ctx.prompts.body(prompt.fragment, rec.requested_output_tokens)


def routing_headers(ctx: RunContext, place: _Place, i: int) -> dict[str, str] | None:
    """The session-routing headers of request ``i`` of ``place`` (None: none).

    ``--session-header`` (and its presets): the identity of :func:`_identity`.
    ``dynamo-full``: ``X-Dynamo-Session-ID`` the (sub)session's own identity,
    ``X-Dynamo-Parent-Session-ID`` its parent's (subagents only),
    ``X-Dynamo-Session-Final: true`` on the session's last request.
    ``agent-native`` Claude Code: ``x-claude-code-session-id`` the tree's,
    ``x-claude-code-agent-id`` the (sub)session's own and
    ``x-claude-code-parent-agent-id`` its parent's (subagents only); Codex:
    ``session-id`` the tree's. An identity is ``<session id>#<replay>``."""
    config = ctx.config
    headers: dict[str, str] = {}
    if config.session_header is not None:
        headers[config.session_header] = _identity(ctx, place)
    mode = config.session_routing
    if mode is None:
        return headers or None
    own = f"{place.session.session_id}#{place.replay}"
    tree = f"{place.root.session_id}#{place.replay}"
    parent = None if place.parent_id is None else f"{place.parent_id}#{place.replay}"
    if mode == "dynamo-full":
        headers["X-Dynamo-Session-ID"] = own
        if parent is not None:
            headers["X-Dynamo-Parent-Session-ID"] = parent
        if i == len(place.session.requests) - 1:
            headers["X-Dynamo-Session-Final"] = "true"
    elif ctx.agent == "codex":
        headers["session-id"] = tree
    else:
        headers["x-claude-code-session-id"] = tree
        headers["x-claude-code-agent-id"] = own
        if parent is not None:
            headers["x-claude-code-parent-agent-id"] = parent
    return headers


def _identity(ctx: RunContext, place: _Place) -> str:
    """The session identity a KV-aware router keys on: the tree's (a subagent's is
    its root's) unless ``session_id_scope`` says "session"; a recycled replay is a
    conversation of its own, with content of its own."""
    owner = place.root if ctx.config.session_id_scope == "tree" else place.session
    return f"{owner.session_id}#{place.replay}"


def _fill(ctx: RunContext, rec: RequestRecord, out: Outcome) -> None:
    rel = ctx.rel
    rec.start_ns = rel(out.start_ns)
    rec.end_ns = rel(out.end_ns)
    rec.e2e_ns = out.end_ns - out.start_ns
    rec.status = out.status
    rec.http_status = out.http_status
    rec.error_type = out.error_type
    rec.error_message = out.error_message
    rec.retries = out.retries
    rec.pool_wait_ns = out.pool_wait_ns
    rec.slot_wait_ns = out.slot_wait_ns
    rec.connect_ns = out.connect_ns
    rec.server_prompt_tokens = out.server_prompt_tokens
    rec.cached_tokens = out.cached_tokens
    rec.cached_gpu_tokens = out.cached_gpu_tokens
    rec.cached_host_tokens = out.cached_host_tokens
    rec.chunk_times_ns = out.chunk_times_ns
    received = out.status in ("ok", "cancelled")  # chunks count as tokens then
    rec.output_tokens = (
        out.completion_tokens
        if out.completion_tokens is not None
        else (len(out.chunk_times_ns) if received else None)
    )
    if out.first_token_ns is not None:
        rec.first_token_ns = rel(out.first_token_ns)
        rec.ttft_ns = out.first_token_ns - out.start_ns
    if (
        rec.status == "ok"
        and rec.ttft_ns is not None
        and rec.output_tokens is not None
        and rec.output_tokens >= 2
    ):
        rec.tpot_ns = tpot_ns(rec.e2e_ns, rec.ttft_ns, rec.output_tokens)
    counters = ctx.counters
    counters.count(rec.status)
    if not rec.warmup:  # the self-check judges the measured window
        counters.pool_waits_ns.append(out.pool_wait_ns)
        if out.slot_wait_ns is not None and out.connect_ns is not None:
            counters.slot_waits_ns.append(out.slot_wait_ns)
            counters.connects_ns.append(out.connect_ns)
        counters.dispatch_lags_ns.append(max(0, rec.start_ns - rec.scheduled_ns))
        if out.woke_ns:  # its parts (same order): wake-up, prompt build, the rest
            due = ctx.t0_ns + rec.scheduled_ns
            counters.wake_lags_ns.append(max(0, out.woke_ns - due))
            counters.build_waits_ns.append(out.built_ns - out.woke_ns)
    if rec.status == "ok":
        if out.error_type == NOT_STREAMED:
            counters.not_streamed += 1
        if (rec.output_tokens or 0) < rec.requested_output_tokens:
            counters.short_output += 1
        counters.output_tokens += rec.output_tokens or 0
        # The status line's P90 is the summary's: the measured window only.
        if rec.ttft_ns is not None and not rec.warmup:
            counters.recent_ttfts_ns.append(rec.ttft_ns)
