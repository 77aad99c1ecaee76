"""Block hash ids for imported calls: which ``block_size``-token blocks two calls share,
by one of three rules (``hash_rule`` in each root session).
See docs/traces.md#bring-your-own-agent-traffic."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from traces.errors import TraceError
from traces.importers.threads import Call
from traces.materialize import load_tokenizer
from traces.model import HashIds

RESET_FRACTION = 0.8  # the same threshold traces.fit uses to spot compactions
CONTEXT_GROWTH = "context-growth"
TRACELAB_SPLIT = "tracelab-prefix-split"


def shared_tokens(call: Call, prev: Call | None) -> int:
    """Tokens ``call`` shares with ``prev`` under the context-growth rule.

    Every call of a thread extends its predecessor's context; a compaction or a reset
    starts a new prefix. Three rules, and the trace says which one made its ids
    (``hash_rule`` in each root session):

    ``context-growth`` (no tokenizer; ids local to each session tree)
        A thread's first call is all new blocks. Call k shares its first ``min(in[k-1],
        in[k])`` tokens with call k-1 (the whole previous prompt, or all of this one if
        the context shrank a little). After a compaction marker, or when the context
        shrinks below ``RESET_FRACTION`` of the previous one, the call starts a new
        prefix and keeps only the head the provider still served from its cache:
        ``min(cached[k], in[k-1], in[k])`` tokens. Shared tokens become the previous
        call's first ``shared // block_size`` ids; the remaining full blocks get new ids
        (partial tail blocks are not hashed, as in Weka).
    """
    if prev is None:
        return 0
    if call.prefix_hint is not None:
        return min(call.prefix_hint, prev.input_tokens, call.input_tokens)
    if call.reset or call.input_tokens < RESET_FRACTION * prev.input_tokens:
        return min(call.cached_tokens or 0, prev.input_tokens, call.input_tokens)
    return min(prev.input_tokens, call.input_tokens)


class GrowthIds:
    """Context-growth (and TraceLab split) ids, numbered from 1 per session tree.

    ``tracelab-prefix-split`` (TraceLab rows)
        The same, with the split the row gives: round k shares ``prefix_tokens`` (at
        most the previous round's input) with round k-1; ``newly_append_tokens`` are new
        blocks. A session's first round is all new blocks.
    """

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.next_id = 1

    def thread(self, calls: Sequence[Call]) -> list[HashIds]:
        """The ids of each call of one thread."""
        out: list[HashIds] = []
        prev: Call | None = None
        prev_ids: HashIds = np.zeros(0, dtype=np.int64)
        for call in calls:
            n_full = call.input_tokens // self.block_size
            keep = min(shared_tokens(call, prev) // self.block_size, prev_ids.size)
            fresh = np.arange(
                self.next_id, self.next_id + n_full - keep, dtype=np.int64
            )
            self.next_id += n_full - keep
            ids = np.concatenate((prev_ids[:keep], fresh))
            out.append(ids)
            prev, prev_ids = call, ids
        return out


def tokenizer_digest(path: Path) -> str:
    """Short content digest of a tokenizer file (its path is never recorded)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:12]
    except OSError as exc:
        raise TraceError(f"{path}: cannot read: {exc.strerror or exc}") from exc


class _Chain:
    """One thread's context since its last reset, as chained block hashes."""

    __slots__ = ("filler", "ids", "length", "owner", "pending", "prev")

    def __init__(self, owner: TokenIds, filler: int) -> None:
        self.owner = owner
        # Negative, so never a token id; unique to this chain, so that no block after
        # hidden content is ever taken as shared with another thread.
        self.filler = np.int64(filler)
        self.ids: list[int] = []
        self.prev = b""  # every chain starts alike: equal leading text, equal ids
        self.pending = np.zeros(0, dtype=np.int64)
        self.length = 0

    def add(self, tokens: HashIds) -> None:
        bs = self.owner.block_size
        buf = np.concatenate((self.pending, tokens)) if self.pending.size else tokens
        n_full = buf.size // bs
        for b in range(n_full):
            self._block(buf[b * bs : (b + 1) * bs])
        self.pending = buf[n_full * bs :].copy()
        self.length += tokens.size

    def _block(self, block: HashIds) -> None:
        digest = hashlib.blake2b(
            self.prev + block.tobytes(), key=self.owner.key, digest_size=16
        ).digest()
        self.prev = digest
        self.ids.append(self.owner.id_of(digest))


class TokenIds:
    """Content-derived ids from a local tokenizer.json, shared across the trace.

    ``token-ids:<tokenizer digest>`` (``--tokenizer FILE``; ids shared across the trace)
        A thread's context is the text its log shows (system and developer instructions,
        user messages, assistant text and tool calls, tool results), tokenized in log
        order, with the tokens the log does not show (hidden system prompts and tool
        definitions, thinking, images, formatting) as filler right after the visible
        text of the stretch they belong to, so that call k's prompt is exactly ``in[k]``
        tokens and extends call k-1's. Block ids are chained keyed hashes of block
        contents (BLAKE2b over the previous block's hash and this block's token ids,
        keyed with the import's secret), numbered in order of first appearance: two
        sessions whose logs start with the same text (a Codex system prompt, a repeated
        first message) share those blocks. Filler is unique to its thread, so blocks
        after it are never shared across threads; a compaction (or a shrink below
        ``RESET_FRACTION``) starts a new chain.
    """

    def __init__(self, tokenizer: Path, key: bytes, block_size: int) -> None:
        self._tok = load_tokenizer(tokenizer)
        self.rule = f"token-ids:{tokenizer_digest(tokenizer)}"
        self.key = key
        self.block_size = block_size
        self._ids: dict[bytes, int] = {}
        self._fillers = 0

    def id_of(self, digest: bytes) -> int:
        """The sequential id of a block hash (1, 2, ... in order of first use)."""
        got = self._ids.get(digest)
        if got is None:
            got = self._ids[digest] = len(self._ids) + 1
        return got

    def _new_chain(self) -> _Chain:
        self._fillers += 1
        return _Chain(self, -self._fillers)

    def _encode(self, texts: list[str]) -> list[HashIds]:
        if not texts:
            return []
        encs = self._tok.encode_batch(texts, add_special_tokens=False)
        return [np.asarray(e.ids, dtype=np.int64) for e in encs]

    def thread(self, calls: Sequence[Call]) -> list[HashIds]:
        """The ids of each call of one thread."""
        out: list[HashIds] = []
        chain = self._new_chain()
        prev: Call | None = None
        for call in calls:
            if prev is not None and (
                call.reset or call.input_tokens < RESET_FRACTION * prev.input_tokens
            ):
                chain = self._new_chain()
            for tokens in self._encode(call.texts):
                chain.add(tokens)
            if chain.length < call.input_tokens:
                gap = call.input_tokens - chain.length
                chain.add(np.full(gap, chain.filler, dtype=np.int64))
            n_full = call.input_tokens // self.block_size
            out.append(np.asarray(chain.ids[:n_full], dtype=np.int64))
            prev = call
        return out
