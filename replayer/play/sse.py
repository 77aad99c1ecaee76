"""Pure parsing of OpenAI-style server-sent events, no I/O: the byte framer
(:class:`EventFramer`) and the event parser (:func:`parse_event`).
See docs/metrics.md#latency."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson


@dataclass(frozen=True, slots=True)
class Event:
    """One parsed SSE event."""

    done: bool = False  # data: [DONE]
    has_content: bool = False  # carries generated text (content, reasoning or text)
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str | None = None  # an in-stream error object's message
    text: str | None = None  # the generated text, when asked for (live assistant)


DONE = Event(done=True)
EMPTY = Event()


def event_data(lines: list[bytes]) -> bytes | None:
    """The data payload of an event's raw lines (comments and other fields dropped)."""
    data: list[bytes] = []
    for line in lines:
        if line.startswith(b"data:"):
            value = line[5:]
            data.append(value[1:] if value.startswith(b" ") else value)
    return b"\n".join(data) if data else None


def parse_event(lines: list[bytes], *, text: bool = False) -> Event:
    """Parse one event given its lines (without line terminators); with ``text``,
    its generated text too (every chunk is then decoded).

    Handles what real servers send: comment lines (``: ping``), ``\\r\\n`` line ends, a
    role-only first chunk, several tokens per chunk, ``reasoning_content``/``reasoning``
    deltas, an empty-choices usage chunk, error events, and ``data: [DONE]``.
    """
    data = event_data(lines)
    if data is None:
        return EMPTY
    data = data.strip()
    if data == b"[DONE]":
        return DONE
    quick = None if text else _quick(data)
    if quick is not None:
        return quick
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return Event(error=f"malformed SSE data: {data[:200]!r}")
    if not isinstance(obj, dict):
        return EMPTY
    return parse_chunk(obj, text=text)


_CONTENT_KEYS = (
    b'"content":"',
    b'"reasoning_content":"',
    b'"reasoning":"',
    b'"text":"',
)
_FULL_PARSE = (b'"usage":{', b'"error"', b'"finish_reason":"', b'": ')
_CONTENT_EVENT = Event(has_content=True)


def _quick(data: bytes) -> Event | None:
    """Decide a plain token chunk without decoding it; None: decode it fully.

    Only compact JSON (vLLM, SGLang and the simulator send it) with no usage, error
    or finish reason takes this path. A bare `"content":"` can only be a key and the
    start of its value: inside a JSON string every quote is escaped.
    """
    if not (data.startswith(b"{") and data.endswith(b"}")):
        return None
    if b'"choices":[' not in data:  # no list of choices: parse_chunk says what is
        return None
    for marker in _FULL_PARSE:
        if marker in data:
            return None
    for key in _CONTENT_KEYS:
        i = data.find(key)
        if i >= 0 and data[i + len(key) : i + len(key) + 1] != b'"':
            return _CONTENT_EVENT
    return EMPTY


def parse_chunk(obj: dict[str, Any], *, text: bool = False) -> Event:
    """Interpret one decoded chunk (chat or completions); with ``text``, keep the
    content it carries (reasoning excluded: it is not part of the reply)."""
    err = obj.get("error")
    if err is not None:
        msg = err.get("message") if isinstance(err, dict) else str(err)
        return Event(error=str(msg)[:500])
    usage = obj.get("usage")
    choices = obj.get("choices")
    if choices is None:
        choices = []
    if not isinstance(choices, list) or not all(isinstance(c, dict) for c in choices):
        # A stream whose chunks are not OpenAI's cannot be read as ok: its tokens
        # (none found) would be measured as an empty reply.
        what = "a list of objects" if isinstance(choices, list) else "a list"
        return Event(
            error=f"malformed SSE chunk: 'choices' is not {what}: "
            f"{orjson.dumps(obj)[:200]!r}"
        )
    has_content = False
    finish = None
    parts: list[str] = []
    for choice in choices:
        delta = choice.get("delta")
        if isinstance(delta, dict):
            content = delta.get("content")
            if content or delta.get("reasoning_content") or delta.get("reasoning"):
                has_content = True
            if text and isinstance(content, str):
                parts.append(content)
        elif choice.get("text"):
            has_content = True
            if text:
                parts.append(str(choice["text"]))
        finish = choice.get("finish_reason") or finish
    return Event(
        has_content=has_content,
        usage=usage if isinstance(usage, dict) else None,
        finish_reason=finish,
        text="".join(parts) if parts else None,
    )


def usage_counts(
    usage: dict[str, Any] | None,
) -> tuple[int | None, int | None, int | None]:
    """(prompt_tokens, completion_tokens, cached_tokens) from a usage object.

    cached_tokens is None unless the server reports it (vLLM needs
    --enable-prompt-tokens-details): absence is not zero.
    """
    if not usage:
        return None, None, None
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return (
        _int_or_none(usage.get("prompt_tokens")),
        _int_or_none(usage.get("completion_tokens")),
        _int_or_none(cached),
    )


def usage_tiers(usage: dict[str, Any] | None) -> tuple[int | None, int | None]:
    """(GPU, host) hits of ``cached_tokens`` where the usage splits them: vLLM's
    ``prompt_tokens_details.local_cached_tokens`` / ``external_cached_tokens``
    (vllm#52199; a KV connector's, e.g. CPU offloading, are external) or SGLang's
    ``cached_tokens_details`` ``device`` / ``host`` (in the details or beside
    them). (None, None) when it does not."""
    if not usage:
        return None, None
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict):
        local = _int_or_none(details.get("local_cached_tokens"))
        external = _int_or_none(details.get("external_cached_tokens"))
        if local is not None or external is not None:
            return local or 0, external or 0
    split = details.get("cached_tokens_details") if isinstance(details, dict) else None
    if not isinstance(split, dict):
        split = usage.get("cached_tokens_details")
    if isinstance(split, dict):
        device = _int_or_none(split.get("device"))
        host = _int_or_none(split.get("host"))
        if device is not None or host is not None:
            # SGLang's third tier (storage) is off the GPU too: counted as host.
            storage = _int_or_none(split.get("storage")) or 0
            return device or 0, (host or 0) + storage
    return None, None


def _int_or_none(v: object) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


class EventFramer:
    """Splits a response body, fed in reads as they arrive, into parsed events.

    Each event is stamped with the arrival time of its first byte: events that came
    in one read share its stamp, and an event split over two reads keeps the first.

        framer = EventFramer()
        for stamp_ns, event in framer.feed(data, now_ns): ...
        tail = framer.finish()  # at EOF: an unterminated last event, or None
    """

    __slots__ = ("_buf", "_buf_stamp", "_lines", "_stamp", "_text")

    def __init__(self, *, text: bool = False) -> None:
        self._text = text  # decode every chunk's text (live assistant)
        self._buf = b""  # bytes after the last complete line
        self._buf_stamp = 0  # arrival of the first byte now in _buf
        self._lines: list[bytes] = []  # lines of the event being read
        self._stamp = 0  # arrival of that event's first byte

    def feed(self, data: bytes, now_ns: int) -> Iterator[tuple[int, Event]]:
        """The events that ``data`` (read at ``now_ns``) completes. Stopping early
        (at ``data: [DONE]``) is fine: the rest stays buffered."""
        buf = self._buf
        buf_stamp = self._buf_stamp if buf else now_ns
        buf += data
        lines = self._lines
        stamp = self._stamp
        pos = 0
        try:
            while True:
                nl = buf.find(b"\n", pos)
                if nl < 0:
                    return
                line = buf[pos:nl].rstrip(b"\r")
                line_stamp = buf_stamp
                pos = nl + 1
                buf_stamp = now_ns  # what is left arrived in this read
                if line:
                    if not lines:
                        stamp = line_stamp
                    lines.append(line)
                    continue
                if not lines:
                    continue
                event = parse_event(lines, text=self._text)
                lines = []
                yield stamp, event
        finally:
            self._buf = buf[pos:]
            self._buf_stamp = buf_stamp
            self._lines = lines
            self._stamp = stamp

    def finish(self) -> Event | None:
        """At EOF: the event the unterminated tail holds, or None when none is left."""
        tail = [
            *self._lines,
            *(ln.rstrip(b"\r") for ln in self._buf.split(b"\n") if ln),
        ]
        self._buf, self._lines = b"", []
        return parse_event(tail, text=self._text) if tail else None
