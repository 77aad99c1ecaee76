"""Block hashes of completion prompts sent as token ids, computed only for what is new
since a recent prompt with the same start: a session's next turn re-sends its whole
history, and the virtual engine would otherwise parse and hash it again. See
docs/engine-model.md."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import orjson

from replayer.sim.cache import Ids, as_ids, block_hashes
from replayer.sim.protocol import ApiError
from traces.recent import RecentByKey

_OPEN = b'"prompt":['
_COMMA = ord(",")
# Prompts whose first bytes agree are compared in full: a tree's sessions share them.
_KEY_BYTES = 512
_PER_KEY = 4  # recent prompts kept per key (a root and its subagents interleave)
_NONE: Ids = np.zeros(0, np.int64)


@dataclass(slots=True)
class _Seen:
    ids: bytes  # the bytes between "prompt":[ and ]
    hashes: Ids  # chained hashes of its full blocks
    ends: Ids  # byte offset in ``ids`` of the comma after each full block


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
            _PER_KEY, max_bytes, lambda seen: len(seen.ids)
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
        ids = body[start:end]
        key = ids[:_KEY_BYTES]
        bs = self.block_size
        best: _Seen | None = None
        common = 0
        arr = np.frombuffer(ids, dtype=np.uint8)
        for seen in self._seen.get(key):
            if len(seen.ids) > common:
                n = _common_prefix(ids, seen.ids)
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
        try:
            tail = orjson.loads(b"[" + ids[tail_at:] + b"]")
        except orjson.JSONDecodeError:
            return None
        if set(map(type, tail)) != {int} or min(tail) < 0:
            raise ApiError(400, "token ids in 'prompt' must be integers >= 0")
        new = block_hashes(tail, bs, parent)
        hashes, ends = old, old_ends
        if new:
            hashes = np.concatenate((old, as_ids(new)))
            commas = np.flatnonzero(arr[tail_at:] == _COMMA)
            new_ends = commas[bs - 1 :: bs][: len(new)] + tail_at
            if len(new_ends) < len(new):  # the last block ends the prompt: no comma
                new_ends = np.append(new_ends, len(ids))
            ends = np.concatenate((old_ends, new_ends.astype(np.int64)))
        self.reused_blocks += reuse
        self.hashed_blocks += len(new)
        self._seen.add(key, _Seen(ids, hashes, ends))
        rest = body[:start] + b"0" + body[end:]
        return HashedPrompt(rest, reuse * bs + len(tail), hashes)


_CHUNK = 1 << 16


def _common_prefix(a: bytes, b: bytes) -> int:
    """Length of the common prefix of ``a`` and ``b``: memcmp over chunks
    (``startswith`` at an offset copies nothing), numpy inside the first that
    differs."""
    m = min(len(a), len(b))
    view = memoryview(b)
    if a.startswith(view[:m]):
        return m
    at = 0
    while a.startswith(view[at : at + _CHUNK], at):
        at += _CHUNK
    end = min(m, at + _CHUNK)
    diff = np.flatnonzero(
        np.frombuffer(a, np.uint8, end - at, at)
        != np.frombuffer(b, np.uint8, end - at, at)
    )
    return at + int(diff[0]) if len(diff) else end
