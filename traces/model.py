"""The in-memory trace model: sessions of requests, subagent sessions with their spawn
and join points, hash ids as numpy arrays. Owns no I/O (``traces.io``).
See docs/traces.md."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

HashIds = npt.NDArray[np.int64]
# The most tokens one request may claim (~1.1e12): a million times the longest
# context served today, and sums over millions of requests stay within int64.
MAX_TOKENS = 1 << 40
# The longest time (a gap, a duration, an offset in a session) a trace may hold, in
# seconds (~3 years): past it a value is a typo or an overflow, and in nanoseconds it
# would not fit the int64 columns a replay writes.
MAX_SECONDS = 1e8
Scope = Literal["local", "global"]
_EMPTY_IDS: HashIds = np.zeros(0, dtype=np.int64)
_EMPTY_IDS.setflags(write=False)


def _frozen_ids(ids: HashIds) -> HashIds:
    if ids.dtype != np.int64 or ids.ndim != 1:
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)
    if ids.flags.writeable:
        ids = ids.view()
        ids.setflags(write=False)
    return ids


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class Request:
    """One LLM call as the trace recorded it."""

    input_tokens: int
    output_tokens: int
    # Block hash ids of the prompt, block_size tokens each; equal ids = equal content
    # (and, as ids are chained, an equal prefix up to that block).
    hash_ids: HashIds = field(default_factory=lambda: _EMPTY_IDS)
    t_s: float = 0.0  # issue time, seconds from the start of its session
    think_time_s: float = 0.0  # gap the agent spent before this request (trace field)
    api_time_s: float | None = None  # recorded duration of the call
    ttft_s: float | None = None  # recorded time to first token (streaming calls only)
    kind: str = "n"  # Weka request type: "n" normal, "s" streaming
    model: str | None = None
    stop: str | None = None
    input_types: tuple[str, ...] = ()
    output_types: tuple[str, ...] = ()
    # Unknown fields, kept verbatim.
    extra: Mapping[str, Any] = field(default_factory=dict)
    # The think gap's parts, where the source knows them (None: not known; the gap
    # is then one part). tool_wait_s: the union of the tool spans within the gap;
    # human_wait_s: the wait for the user's input; the rest (other_wait_s) is
    # model-side and local time. tool + human <= think_time_s.
    tool_wait_s: float | None = None
    human_wait_s: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "hash_ids", _frozen_ids(self.hash_ids))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Request):
            return NotImplemented
        return (
            self.input_tokens == other.input_tokens
            and self.output_tokens == other.output_tokens
            and np.array_equal(self.hash_ids, other.hash_ids)
            and self.t_s == other.t_s
            and self.think_time_s == other.think_time_s
            and self.api_time_s == other.api_time_s
            and self.ttft_s == other.ttft_s
            and self.kind == other.kind
            and self.model == other.model
            and self.stop == other.stop
            and self.input_types == other.input_types
            and self.output_types == other.output_types
            and dict(self.extra) == dict(other.extra)
            and self.tool_wait_s == other.tool_wait_s
            and self.human_wait_s == other.human_wait_s
        )

    @property
    def other_wait_s(self) -> float | None:
        """The think gap less its tool and human parts (None: neither is known)."""
        if self.tool_wait_s is None and self.human_wait_s is None:
            return None
        return max(
            0.0,
            self.think_time_s - (self.tool_wait_s or 0.0) - (self.human_wait_s or 0.0),
        )

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True, kw_only=True)
class Subagent:
    """A subagent session spawned from a parent session.

    Weka semantics: the subagent entry sits between two parent requests; it spawns once
    the parent request before it (the anchor) has finished, and the parent request after
    it (the join) waits for it. With no parent request after it, it runs in the
    background (``join_index is None``) and the session tree ends when it does.
    """

    session: Session
    anchor_index: int  # parent request after which it spawns; -1 = at session start
    join_index: int | None  # parent request that waits for it; None = background
    agent_id: str
    t_s: float = 0.0  # spawn time, seconds from the parent's session start
    subagent_type: str | None = None
    duration_ms: float | None = None
    total_tokens: int | None = None
    tool_use_count: int | None = None
    status: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Session:
    """A sequence of requests (turns) plus the subagents it spawns.

    Owns no I/O (see ``traces.io``). Hash ids are never expanded into tokens here: a
    710-session corpus is ~94M blocks. A session's ``requests`` is any sequence of
    :class:`Request`; sessions read or generated in bulk hold
    ``traces.table.RequestRows`` (columns, with each prompt a view into a block buffer
    that stores a session's growing prompt once), and a ``Request`` is then built only
    when one is indexed.
    """

    session_id: str
    # A tuple of requests, or RequestRows (traces.table) for bulk-built sessions;
    # equal sessions compare equal whichever they hold.
    requests: Sequence[Request]
    subagents: tuple[Subagent, ...] = ()
    block_size: int = 64  # tokens per hash block
    # "global": hash ids shared across all sessions of a trace.
    hash_id_scope: Scope = "local"
    start_s: float | None = None  # arrival in the trace's timeline (None: no timeline)
    models: tuple[str, ...] = ()
    tool_tokens: int | None = None  # tokens of tool definitions in the prompt prefix
    system_tokens: int | None = None  # tokens of the system prompt
    extra: Mapping[str, Any] = field(default_factory=dict)

    def hash_namespace(self) -> str:
        """Namespace of the hash ids of this session tree (ask the root): the root's
        id for local scope, "global" when ids are shared across the trace. Subagents
        follow their root, whatever scope they carry themselves."""
        return "global" if self.hash_id_scope == "global" else self.session_id

    def subagents_at(self, anchor_index: int) -> tuple[Subagent, ...]:
        """Subagents that spawn right after request ``anchor_index``."""
        return tuple(s for s in self.subagents if s.anchor_index == anchor_index)

    def walk(self, depth: int = 0) -> Iterator[tuple[Session, int]]:
        """This session and all nested subagent sessions, with their depth."""
        yield self, depth
        for sub in self.subagents:
            yield from sub.session.walk(depth + 1)

    def ordered_requests(self) -> Iterator[tuple[Session, int, Request]]:
        """Requests of the whole tree in the trace's own order.

        A subagent's requests come after its anchor and before its join; subagents of
        one anchor in the order they are listed.
        """
        for sub in self.subagents_at(-1):
            yield from sub.session.ordered_requests()
        for i, req in enumerate(self.requests):
            yield self, i, req
            for sub in self.subagents_at(i):
                yield from sub.session.ordered_requests()

    def request_count(self) -> int:
        """Requests in the tree, subagents included."""
        return sum(len(s.requests) for s, _ in self.walk())


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """A workload: root sessions (each the root of a session tree)."""

    sessions: tuple[Session, ...]
    source_format: str = "native"  # "weka" | "mooncake" | "native" | "parquet"

    def __len__(self) -> int:
        return len(self.sessions)

    def request_count(self) -> int:
        """All requests, subagents included."""
        return sum(s.request_count() for s in self.sessions)

    def all_sessions(self) -> Iterator[tuple[Session, int]]:
        """Every session of every tree with its depth (0 = root)."""
        for s in self.sessions:
            yield from s.walk()
