"""The importers' intermediate form: threads of LLM calls (a session's main agent or one
subagent) before ids are hashed; ``assemble`` makes the trace. Raw values (ids, model
names, text) live here in memory only, never written. See docs/traces.md."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

# Weka input/output type names: the only block types an imported trace mentions.
TEXT = "text"
TOOL_RESULT = "tool_result"
IMAGE = "image"
THINKING = "thinking"
TOOL_USE = "tool_use"


@dataclass(slots=True)
class Call:
    """One LLM call: its usage as the agent's provider reported it, and its times.

    ``start`` is when the call was sent: the time of the last input (user message or
    tool result) logged before its output; ``end`` is the time of its last output
    record. Both are epoch seconds from the log, or None when the log has none.
    """

    input_tokens: int
    output_tokens: int
    start: float | None
    end: float | None
    cached_tokens: int | None = None  # the provider's cached part of input_tokens
    extra: dict[str, int] = field(default_factory=dict)  # more provider counts
    model: str | None = None  # raw: anonymized when assembled
    stop: str | None = None  # raw: allow-listed when assembled
    input_types: tuple[str, ...] = ()
    output_types: tuple[str, ...] = ()
    reset: bool = False  # a compaction (or reset) marker precedes this call
    prefix_hint: int | None = None  # TraceLab: tokens shared with the previous call
    # The latest input a person typed among this call's inputs (epoch seconds; None:
    # its inputs were tool results or the agent's own): the gap before it waited
    # for the user up to then.
    human_at: float | None = None
    # Tokenizer mode only: the text logged since the previous call's first output
    # (that call's output, then this call's inputs), in order.
    texts: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Spawn:
    """How a subagent thread was spawned, as far as the logs say."""

    parent: str  # the parent thread's key
    call_index: int | None = None  # the parent call that spawned it, when linked
    subagent_type: str | None = None  # raw
    status: str | None = None  # raw
    duration_ms: float | None = None
    total_tokens: int | None = None
    tool_use_count: int | None = None


@dataclass(slots=True)
class Thread:
    """A sequence of calls in one context (the main agent or one subagent)."""

    key: str  # raw id: hashed or numbered when assembled, never written
    calls: list[Call] = field(default_factory=list)
    files: set[Path] = field(default_factory=set)
    spawn: Spawn | None = None
    # (call, result) times of the thread's tool calls, epoch seconds: the gaps' tool
    # time is their union. Subagent-spawning tools are left out: a replay waits for
    # the subagent itself (its join).
    tool_spans: list[tuple[float, float]] = field(default_factory=list)

    def first_start(self) -> float | None:
        """When the thread's first call was sent (or ended, if that is all we know)."""
        for c in self.calls:
            t = c.start if c.start is not None else c.end
            if t is not None:
                return t
        return None
