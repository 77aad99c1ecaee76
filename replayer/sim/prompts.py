"""Block hashes of prompts computed only past what a recent prompt of the same session
already hashed (the next turn re-sends the whole history). See docs/engine-model.md."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from itertools import accumulate, chain
from typing import Any

import numpy as np
import orjson

from replayer.sim.cache import Ids, as_ids, block_hashes
from replayer.sim.wire import ApiError
from traces.recent import RecentByKey
from traces.textrule import chat_to_token_ids

_OPEN = b'"prompt":['
_COMMA = ord(",")
_ID_BYTES = b"0123456789,"
# Prompts whose first bytes agree are compared in full: a tree's sessions share them.
_KEY_BYTES = 512
_PER_KEY = 4  # recent prompts kept per key (a root and its subagents interleave)
_MARKED = 3  # a chat prompt is found by its last few messages
_NONE: Ids = np.zeros(0, np.int64)


@dataclass(slots=True)
class _Seen:
    body: bytes  # the request body (kept whole: cutting its ids out is a copy)
    start: int  # its ids are body[start:end], between "prompt":[ and ]
    end: int
    hashes: Ids  # chained hashes of its full blocks
    ends: Ids  # offset in the ids of the comma after each full block

    def ids(self) -> memoryview:
        return memoryview(self.body)[self.start : self.end]


@dataclass(frozen=True, slots=True)
class HashedPrompt:
    """A body whose token-id prompt is cut out: the rest is small JSON to validate."""

    rest: bytes  # the body with the prompt's ids replaced by a single 0
    tokens: int
    hash_ids: Ids  # the prompt's chained block hashes

    @property
    def hashes(self) -> list[int]:
        hashes: list[int] = self.hash_ids.tolist()
        return hashes


class PromptHashes:
    """Splits a completions body with a token-id prompt into its small rest and the
    prompt's length and chained block hashes, reusing the hashes of the longest
    common prefix with a recent prompt. The hashes equal ``block_hashes`` of the
    parsed ids. Holds at most ``max_bytes`` of recent prompts (least recent out)."""

    def __init__(self, block_size: int, max_bytes: int = 64 << 20) -> None:
        self.block_size = block_size
        self.max_bytes = max_bytes
        self._seen: RecentByKey[bytes, _Seen] = RecentByKey(
            _PER_KEY, max_bytes, lambda seen: len(seen.body)
        )
        self.reused_blocks = 0
        self.hashed_blocks = 0

    def split(self, body: bytes) -> HashedPrompt | None:
        """None when the prompt is not a flat list of token ids (a string, a nested
        list, a chat body): the caller parses the whole body then.

        Raises:
            ApiError: ids that are not integers >= 0, or an empty prompt.
        """
        at = body.find(_OPEN)
        if at < 0:
            return None
        start = at + len(_OPEN)
        end = body.find(b"]", start)
        if end < 0 or start == end or not body[start : start + 1].isdigit():
            return None
        size = end - start
        key = body[start : min(end, start + _KEY_BYTES)]
        bs = self.block_size
        best: _Seen | None = None
        common = 0
        arr = np.frombuffer(body, np.uint8, size, start)
        for seen in self._seen.get(key):
            if seen.end - seen.start > common:
                n = _common_prefix(body, start, end, seen.ids())
                if n > common:
                    best, common = seen, n
        # Blocks whose closing comma lies in the common prefix are the same tokens.
        reuse = 0 if best is None else int(np.searchsorted(best.ends, common))
        if best is not None and reuse:
            old, old_ends = best.hashes[:reuse], best.ends[:reuse]
            tail_at = int(old_ends[-1]) + 1
            parent = int(old[-1])
        else:
            old, old_ends, tail_at, parent = _NONE, _NONE, 0, 0
        raw = body[start + tail_at : end]
        try:
            tail = orjson.loads(b"[" + raw + b"]")
        except orjson.JSONDecodeError:
            return None
        # Digits and commas only (checked in C): every id is an int >= 0.
        plain = bool(raw) and not raw.translate(None, _ID_BYTES)
        if not plain and (set(map(type, tail)) != {int} or min(tail) < 0):
            raise ApiError(400, "token ids in 'prompt' must be integers >= 0")
        new = block_hashes(tail, bs, parent)
        hashes, ends = old, old_ends
        if new:
            hashes = np.concatenate((old, as_ids(new)))
            commas = np.flatnonzero(arr[tail_at:] == _COMMA)
            new_ends = commas[bs - 1 :: bs][: len(new)] + tail_at
            if len(new_ends) < len(new):  # the last block ends the prompt: no comma
                new_ends = np.append(new_ends, size)
            ends = np.concatenate((old_ends, new_ends.astype(np.int64)))
        self.reused_blocks += reuse
        self.hashed_blocks += len(new)
        self._seen.add(key, _Seen(body, start, end, hashes, ends))
        rest = body[:start] + b"0" + body[end:]
        return HashedPrompt(rest, reuse * bs + len(tail), hashes)


@dataclass(slots=True)
class _SeenChat:
    marks: list[int]  # per message, a hash of its role and content
    ends: list[int]  # tokens through each message
    hashes: Ids


class ChatHashes:
    """Token count and chained block hashes of a chat prompt, tokenizing (by the
    shared text rule) and hashing only past the whole blocks of the longest recent
    prompt it shares whole messages with (a session's previous turn). Equal to
    ``block_hashes(chat_to_token_ids(messages))``; messages are told apart by a
    64-bit hash of role and content, as blocks are by their chained hashes. Holds
    at most ``max_bytes`` of recent prompts' marks and hashes (least recent out)."""

    def __init__(self, block_size: int, max_bytes: int = 64 << 20) -> None:
        self.block_size = block_size
        # Keyed by (n, the n-th message's mark) for its last few n: a prompt that
        # shares an entry's first n messages has that same mark at that same place
        # (the next turn re-sends all but, often, the last: its unhashed tail).
        self._seen: RecentByKey[tuple[int, int], _SeenChat] = RecentByKey(
            1, max_bytes, lambda seen: 16 * len(seen.marks) + seen.hashes.nbytes
        )
        self.reused_blocks = 0
        self.hashed_blocks = 0

    def hash(self, messages: list[dict[str, Any]]) -> tuple[int, Ids]:
        """(tokens, block hashes) of checked ``messages`` (:func:`chat_messages`)."""
        marks = list(map(_mark, messages))
        best: _SeenChat | None = None
        common = 0  # whole messages in common
        for n in range(len(marks), 0, -1):
            for seen in self._seen.get((n, marks[n - 1])):
                if seen.marks[:n] == marks[:n]:
                    best, common = seen, n
                    break
            if best is not None:
                break
        bs = self.block_size
        reuse = 0
        if best is not None:
            reuse = min(best.ends[common - 1] // bs, len(best.hashes))
        at = reuse * bs
        # From the message holding token ``at`` on (those before it are common).
        first = 0 if best is None else bisect.bisect_right(best.ends, at)
        done = best.ends[first - 1] if best is not None and first else 0
        ids = [chat_to_token_ids([m]) for m in messages[first:]]
        ends = [] if best is None else best.ends[:first]
        ends += accumulate(map(len, ids), initial=done)
        del ends[first]  # the initial value
        tail = list(chain.from_iterable(ids))[at - done :]
        old = _NONE if best is None else best.hashes[:reuse]
        new = block_hashes(tail, bs, int(old[-1]) if reuse else 0)
        hashes = np.concatenate((old, as_ids(new))) if new else old
        self.reused_blocks += reuse
        self.hashed_blocks += len(new)
        seen = _SeenChat(marks, ends, hashes)
        for n in range(len(marks), max(0, len(marks) - _MARKED), -1):
            self._seen.add((n, marks[n - 1]), seen)
        return ends[-1], hashes


def _mark(message: dict[str, Any]) -> int:
    content = message.get("content")
    if isinstance(content, str):
        return hash((message.get("role"), content))
    return hash(orjson.dumps(message, option=orjson.OPT_SORT_KEYS))


_CHUNK = 1 << 16


def _common_prefix(a: bytes, start: int, end: int, b: memoryview) -> int:
    """Length of the common prefix of ``a[start:end]`` and ``b``: memcmp over chunks
    (``startswith`` at an offset copies nothing), numpy inside the first that
    differs."""
    m = min(end - start, len(b))
    if a.startswith(b[:m], start):
        return m
    at = 0
    while a.startswith(b[at : at + _CHUNK], start + at, end):
        at += _CHUNK
    stop = min(m, at + _CHUNK)
    diff = np.flatnonzero(
        np.frombuffer(a, np.uint8, stop - at, start + at)
        != np.frombuffer(b, np.uint8, stop - at, at)
    )
    return at + int(diff[0]) if len(diff) else stop
