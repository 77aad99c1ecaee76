"""Prompt materialization: trace requests → request body bytes, equal hash ids giving
byte-identical blocks. See docs/replaying.md#prompts-and-the-servers-cache."""

from __future__ import annotations

import hashlib
import itertools
import re
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt
import orjson

from traces.errors import TraceError
from traces.model import Request, Session, Trace
from traces.recent import RecentByKey
from traces.table import RequestRows, request_column
from traces.textrule import CHAT_TOKENS_PER_MESSAGE, word_for_token

Api = Literal["chat", "completions"]
_WORD = re.compile(r"^ [a-z]{2,12}$")
_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


# Recent prompts remembered per namespace (a root session and its subagents).
_JOINS_PER_NAMESPACE = 4


@dataclass(frozen=True, slots=True, kw_only=True)
class PromptConfig:
    """How prompts are built.

    PromptConfig(api="completions", salt="run-42", block_tokens=16)
    """

    api: Api = "completions"
    salt: str = ""  # cache-bust salt; "" = the same content in every run
    token_min: int = 1000  # token ids come from [token_min, token_max): every common
    token_max: int = 30000  # vocabulary has them, and none are special tokens
    block_tokens: int | None = None  # tokens per materialized block; None = trace's
    max_input_tokens: int | None = None  # prompts are cut (from the end) to this
    cache_bytes: int = 512 << 20  # bound on the block cache (fragments and entries)
    # A local tokenizer.json: chat text is then made of words that are single tokens
    # in that vocabulary, so message content is exact in the model's own tokens.
    tokenizer: str | None = None
    # Each replay of a session (a recycled tree) gets content of its own, so that
    # two replays never share cache while the turns of one replay do.
    replay_markers: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.token_min < self.token_max:
            raise ValueError(
                f"token id range must satisfy 0 <= min < max "
                f"(got {self.token_min}..{self.token_max})"
            )
        if self.block_tokens is not None and self.block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1 (got {self.block_tokens})")
        if self.max_input_tokens is not None and self.max_input_tokens < 1:
            raise ValueError(
                f"max_input_tokens must be >= 1 (got {self.max_input_tokens})"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class Prompt:
    """A materialized prompt: the JSON fragment for the body and its accounting."""

    fragment: bytes  # `"prompt":[...]` or `"messages":[...]`
    prompt_tokens: int  # tokens sent (by the shared text rule in chat mode)
    dropped_tokens: int  # cut by max_input_tokens
    blocks: int  # hashed blocks sent (full or partial)
    block_tokens: int  # tokens per materialized block
    # Live assistant turns: tokens sent minus those the recorded replies would have
    # taken (0 when the history is the trace's).
    drift_tokens: int = 0
    messages: int = 0  # chat: the messages sent (a server's template adds to each)


def _splitmix64(x: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _dumps_ids(ids: npt.NDArray[np.int64]) -> bytes:
    """``orjson.dumps(ids.tolist())``, from the array without the list."""
    return orjson.dumps(
        np.ascontiguousarray(ids, dtype=np.int64), option=orjson.OPT_SERIALIZE_NUMPY
    )


def _key(*parts: str | int) -> int:
    """A 64-bit seed of ``parts`` (blake2b of their text, unit-separator joined)."""
    (key,) = _keys(parts[:-1], [parts[-1]])
    return key


def _keys(head: tuple[str | int, ...], last: Sequence[str | int]) -> list[int]:
    """``[_key(*head, x) for x in last]``, hashing ``head`` once."""
    prefix = "".join(f"{part}\x1f" for part in head)
    base = hashlib.blake2b(prefix.encode(), digest_size=8)
    out = []
    for x in last:
        h = base.copy()
        h.update(str(x).encode())
        out.append(int.from_bytes(h.digest(), "little"))
    return out


# A live assistant reply: its text and its length in the model's tokens.
Reply = tuple[str, int]

# What one cache entry costs beyond its fragment's bytes: the key tuple with its two
# ints (the namespace string is shared) and the ordered dict's node, measured with
# tracemalloc at ~200 bytes on CPython 3.11.
_ENTRY_BYTES = 200


class Materializer:
    """Builds prompt fragments for trace requests; one per run (it caches blocks).

    A block is ``block_tokens`` token ids derived deterministically from (salt,
    namespace, hash id), so equal hash ids give byte-identical content and the server's
    prefix cache sees exactly the sharing the trace describes; the salt keeps separate
    runs (and separate replays of one session) apart unless asked otherwise. Each
    block's JSON fragment is encoded once and cached; a body is a join of cached bytes.
    """

    def __init__(self, config: PromptConfig) -> None:
        self.config = config
        self._words: list[str] | None = None
        self._word_table: npt.NDArray[np.object_] | None = None
        if config.tokenizer is not None and config.api == "chat":
            self._words = tokenizer_words(config.tokenizer)
        # Rule words are joined by spaces; tokenizer words carry their leading space.
        self._sep = b"" if self._words else b" "
        # Each chat message costs one role token under the shared rule; with a real
        # tokenizer the template's cost is the server's to count (server_prompt_tokens).
        self._role_tokens = 0 if self._words else CHAT_TOKENS_PER_MESSAGE
        # The block cache may be used from two threads (the replayer builds small
        # prompts on its event loop and large ones on a thread): the lock guards the
        # cache and its counters only, never the generation of missing blocks.
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()
        self._cache_bytes = 0
        # Recent prompts' joined full blocks, per (namespace, block tokens).
        self._joins: RecentByKey[tuple[str, int], tuple[list[int], bytes]] = (
            RecentByKey(
                _JOINS_PER_NAMESPACE, config.cache_bytes // 4, lambda e: len(e[1])
            )
        )
        self.hits = 0
        self.misses = 0

    # -- token ids ---------------------------------------------------------------

    def _token_rows(self, seeds: list[int], n: int) -> npt.NDArray[np.int64]:
        """Token ids for each 64-bit seed: row k is block k's first ``n`` tokens."""
        span = np.uint64(self.config.token_max - self.config.token_min)
        base: npt.NDArray[np.uint64] = np.array(seeds, dtype=np.uint64)
        grid: npt.NDArray[np.uint64] = np.add.outer(base, np.arange(n, dtype=np.uint64))
        rows: npt.NDArray[np.int64] = (_splitmix64(grid) % span).astype(np.int64)
        rows += self.config.token_min
        return rows

    def _tokens(self, seed: int, n: int) -> npt.NDArray[np.int64]:
        row: npt.NDArray[np.int64] = self._token_rows([seed], n)[0]
        return row

    def block_token_ids(
        self, namespace: str, hash_id: int, n: int
    ) -> npt.NDArray[np.int64]:
        """The token ids of block ``hash_id`` (its first ``n``: a partial block is the
        head of the full one)."""
        return self._tokens(_key(self.config.salt, namespace, hash_id), n)

    def _fragments(self, namespace: str, hash_ids: list[int], n: int) -> list[bytes]:
        """Fragments of many full blocks; the missing ones generated in one batch."""
        cache = self._cache
        out: list[bytes | None] = []
        missing: list[int] = []
        with self._lock:
            for k, h in enumerate(hash_ids):
                key = (namespace, h, n)
                frag = cache.get(key)
                if frag is None:
                    missing.append(k)
                else:
                    cache.move_to_end(key)
                out.append(frag)
            self.hits += len(hash_ids) - len(missing)
            self.misses += len(missing)
        if missing:
            salt = self.config.salt
            seeds = _keys((salt, namespace), [hash_ids[k] for k in missing])
            tokens = self._token_rows(seeds, n)
            made = self._encode_rows(tokens)
            with self._lock:
                for k, frag in zip(missing, made, strict=True):
                    out[k] = frag
                    self._store((namespace, hash_ids[k], n), frag)
        return out  # type: ignore[return-value]

    def _store(self, key: tuple[str, int, int], frag: bytes) -> None:
        """Callers hold the lock. An entry costs its fragment plus its key and
        dict node (_ENTRY_BYTES): the bound is on memory, not on payload."""
        old = self._cache.pop(key, None)
        if old is not None:  # the other thread made it meanwhile
            self._cache_bytes -= len(old) + _ENTRY_BYTES
        self._cache[key] = frag
        self._cache_bytes += len(frag) + _ENTRY_BYTES
        while self._cache_bytes > self.config.cache_bytes and self._cache:
            _, old = self._cache.popitem(last=False)
            self._cache_bytes -= len(old) + _ENTRY_BYTES

    def _joined(
        self, namespace: str, hash_ids: list[int], n: int, *, keep: bool = True
    ) -> bytes:
        """The comma-joined fragments of ``hash_ids``' full blocks. A session's next
        turn re-sends its history: the longest prefix already joined for a recent
        prompt of the namespace is reused, and only the blocks past it are looked
        up. Bounded by a quarter of ``cache_bytes`` (least recent out). ``keep``:
        whether this join is kept for later prompts to extend."""
        if not hash_ids:
            return b""
        key = (namespace, n)
        best: tuple[list[int], bytes] | None = None
        with self._lock:
            for seen in self._joins.get(key):
                k = len(seen[0])
                longer = best is None or k > len(best[0])
                if k <= len(hash_ids) and longer and hash_ids[:k] == seen[0]:
                    best = seen
            if best is not None:
                self.hits += len(best[0])  # reused blocks count as cache hits
        if best is not None and len(best[0]) == len(hash_ids):
            joined = best[1]
        elif best is not None:
            rest = self._fragments(namespace, hash_ids[len(best[0]) :], n)
            joined = b"".join((best[1], b",", b",".join(rest)))  # one copy
        else:
            joined = b",".join(self._fragments(namespace, hash_ids, n))
        if keep:
            with self._lock:
                self._joins.add(key, (hash_ids, joined))
        return joined

    def _fragment(self, namespace: str, hash_id: int, n: int) -> bytes:
        key = (namespace, hash_id, n)
        with self._lock:
            cached = self._cache.get(key)
            if cached is not None:
                self._cache.move_to_end(key)
                self.hits += 1
                return cached
            self.misses += 1
        frag = self._encode(self.block_token_ids(namespace, hash_id, n))
        with self._lock:
            self._store(key, frag)
        return frag

    def _encode_rows(self, rows: npt.NDArray[np.int64]) -> list[bytes]:
        """``_encode`` of each row; completions' in one JSON dump, cut apart."""
        if self.config.api != "completions" or not len(rows):
            return [self._encode(row) for row in rows]
        # "[[1,2],[3,4]]": ints hold no bracket, so "],[" is exactly between rows.
        # orjson writes the array itself (the same bytes as its list, 5x faster).
        return _dumps_ids(rows)[2:-2].split(b"],[")

    def _encode(self, ids: npt.NDArray[np.int64]) -> bytes:
        if self.config.api == "completions":
            return _dumps_ids(ids)[1:-1]
        table = self._table()
        words = table[ids - self.config.token_min] if ids.size else ()
        return (self._sep.decode() if self._words else " ").join(words).encode()

    def _table(self) -> npt.NDArray[np.object_]:
        """Text of every token id in [token_min, token_max), built once."""
        if self._word_table is None:
            lo, hi = self.config.token_min, self.config.token_max
            if self._words is not None:
                w = self._words
                table = [w[t % len(w)] for t in range(lo, hi)]
            else:
                table = [word_for_token(t) for t in range(lo, hi)]
            self._word_table = np.array(table, dtype=object)
        return self._word_table

    # -- prompts -----------------------------------------------------------------

    def block_tokens_for(self, session: Session) -> int:
        """Tokens per materialized block for ``session``."""
        return self.config.block_tokens or session.block_size

    def sent_tokens(self, session: Session, request: Request) -> tuple[int, int]:
        """(tokens that will be sent, tokens cut by max_input_tokens) for a request."""
        bt = self.block_tokens_for(session)
        n_full, tail = self._shape(session, request, bt)
        total = n_full * bt + tail
        cap = self.config.max_input_tokens
        if cap is not None and total > cap:
            return cap, total - cap
        return total, 0

    def _shape(self, session: Session, request: Request, bt: int) -> tuple[int, int]:
        """(full blocks, tokens after them) of the prompt, in materialized tokens."""
        bs = session.block_size
        n_ids = request.hash_ids.size
        hashed = min(n_ids * bs, request.input_tokens)
        n_full = hashed // bs
        partial = hashed - n_full * bs  # a hashed partial last block (Mooncake)
        unhashed = request.input_tokens - hashed
        scale = bt / bs
        return n_full, round((partial + unhashed) * scale)

    def replay_namespace(self, namespace: str, replay: int) -> str:
        """The namespace blocks of replay ``replay`` are derived from: the per-replay
        cache-bust marker (replay 0 keeps the plain namespace)."""
        if replay == 0 or not self.config.replay_markers:
            return namespace
        return f"{namespace}#{replay}"

    def prompt(
        self,
        session: Session,
        request_index: int,
        namespace: str,
        *,
        replay: int = 0,
        replies: Mapping[int, Reply] | None = None,
    ) -> Prompt:
        """Materialize request ``request_index`` of ``session``.

        ``namespace`` is the hash-id namespace (the root session id for local scope,
        "global" otherwise); ``replay`` separates repeated replays of one session.
        ``replies`` (chat only): the model's own replies to earlier requests, by
        request index, sent in place of the recorded ones (live assistant).
        """
        request = session.requests[request_index]
        bt = self.block_tokens_for(session)
        bs = session.block_size
        ns = self.replay_namespace(namespace, replay)
        ids = request.hash_ids.tolist()
        n_full, tail = self._shape(session, request, bt)
        hashed_partial = len(ids) > n_full  # the last hashed block is partial
        total = n_full * bt + tail
        cap = self.config.max_input_tokens
        keep = total if cap is None else min(total, cap)
        dropped = total - keep
        if self.config.api == "chat":
            return self._chat(
                session, request_index, ns, ids, bt, keep, dropped, replies or {}
            )
        whole = min(n_full, keep // bt)
        # A session's last prompt, with no subagent to extend it, extends nothing
        # later: its join is not kept (one-request sessions would fill the store).
        later = request_index < len(session.requests) - 1 or bool(session.subagents)
        head = self._joined(ns, ids[:whole], bt, keep=later)
        frags = [head] if head else []
        left = keep - whole * bt
        if left > 0 and whole < n_full:  # cut inside a block: its head
            take = min(bt, left)
            frags.append(self._fragment(ns, ids[whole], take))
            left -= take
        blocks = whole + len(frags) - (1 if head else 0)
        if left > 0 and hashed_partial:
            partial = min(left, round((request.input_tokens - n_full * bs) * bt / bs))
            if partial > 0:
                frags.append(self._fragment(ns, ids[n_full], partial))
                left -= partial
                blocks += 1
        if left > 0:
            # The unhashed tail is unique to this request (this turn's new content).
            seed = _key(self.config.salt, ns, session.session_id, request_index, "tail")
            frags.append(self._encode(self._tokens(seed, left)))
        return Prompt(
            # One copy of the prompt (a lone fragment joins without one).
            fragment=b"".join((b'"prompt":[', b",".join(frags), b"]")),
            prompt_tokens=keep,
            dropped_tokens=dropped,
            blocks=blocks,
            block_tokens=bt,
        )

    def _chat(
        self,
        session: Session,
        request_index: int,
        ns: str,
        ids: list[int],
        bt: int,
        keep: int,
        dropped: int,
        replies: Mapping[int, Reply],
    ) -> Prompt:
        # Messages cut at block boundaries: the system prompt, then per earlier turn
        # whose prompt is a prefix of this one, its user content and the assistant's
        # reply. Equal leading blocks → equal leading messages, byte for byte.
        n_full = min(len(ids), keep // bt)
        cuts, turns = self._chat_cuts(session, request_index, n_full)
        cuts.append(n_full)
        # Each message costs its role token; it is taken from the message's first
        # block (always the same block at the same place, so content stays identical
        # turn to turn) and, for a message without blocks, from the unique tail.
        role_cost = self._role_tokens
        head = role_cost if bt > role_cost else 0

        def blocks(lo: int, hi: int) -> list[bytes]:
            frags = self._fragments(ns, ids[lo:hi], bt)
            if frags and head:
                frags[0] = self._fragment(ns, ids[lo], bt - head)
            return frags

        messages: list[tuple[str, list[bytes]]] = [("system", blocks(0, cuts[0]))]
        from_blocks = head if messages[0][1] else 0
        recorded_msgs = 1  # the messages the recorded history has
        drift = 0
        for i, (lo, hi) in enumerate(itertools.pairwise(cuts)):
            live = replies.get(turns[i // 2]) if i % 2 and i // 2 < len(turns) else None
            if live is not None:
                text, live_tokens = live
                # In place of the recorded reply's blocks (or of no message at all).
                recorded = (hi - lo) * bt - head + role_cost if hi > lo else 0
                drift += live_tokens + role_cost - recorded
                if hi > lo:  # accounted as recorded, then corrected by the drift
                    from_blocks += head
                    recorded_msgs += 1
                messages.append(("assistant", [orjson.dumps(text)[1:-1]]))
            elif hi > lo:
                role = "assistant" if i % 2 else "user"
                messages.append((role, blocks(lo, hi)))
                from_blocks += head
                recorded_msgs += 1
        if messages[-1][0] != "user":
            messages.append(("user", []))
            recorded_msgs += 1
        # The unique tail is what the recorded prompt has beyond its blocks and
        # message costs: live replies do not change it.
        overhead = recorded_msgs * role_cost - from_blocks
        tail = max(0, keep - n_full * bt - overhead)
        if tail:
            seed = _key(self.config.salt, ns, session.session_id, request_index, "tail")
            messages[-1][1].append(self._encode(self._tokens(seed, tail)))
        sent = n_full * bt - from_blocks + tail + recorded_msgs * role_cost + drift
        body = b",".join(
            b'{"role":"' + r.encode() + b'","content":"' + self._sep.join(parts) + b'"}'
            for r, parts in messages
        )
        return Prompt(
            fragment=b'"messages":[' + body + b"]",
            prompt_tokens=sent,
            dropped_tokens=dropped,
            blocks=n_full,
            block_tokens=bt,
            drift_tokens=drift,
            messages=len(messages),
        )

    def _chat_cuts(
        self, session: Session, request_index: int, n_full: int
    ) -> tuple[list[int], list[int]]:
        """Block indices where messages start: system end, then (prompt end, reply end)
        per earlier turn that is a prefix of this one; and those turns' indices.
        Pairs keep role parity stable from turn to turn; clamping keeps them
        non-decreasing."""
        bs = session.block_size
        sys_blocks = ((session.system_tokens or 0) + (session.tool_tokens or 0)) // bs
        cuts = [min(n_full, sys_blocks)]
        cur = session.requests[request_index].hash_ids
        n, out, last = _earlier_prompts(session.requests, request_index)
        # Chained ids: equal last block ⇒ the earlier prompt is a prefix of this.
        prefix = (n > 0) & (n <= min(cur.size, n_full))
        prefix[prefix] = last[prefix] == cur[n[prefix] - 1]
        turns = [int(t) for t in np.flatnonzero(prefix)]
        n = n[prefix]
        reply = np.minimum(n + out[prefix] // bs, n_full)
        # Running max: each cut is clamped to the one before it.
        seq = np.concatenate(([cuts[0]], np.column_stack((n, reply)).reshape(-1)))
        cuts = [int(c) for c in np.maximum.accumulate(seq).tolist()]
        return cuts, turns


# Memory a prompt takes while it is built, measured with tracemalloc on CPython 3.11
# (a 2M-token prompt of 512K-token blocks): the block being generated costs ~86 bytes
# a token (its id grid, the ids as Python ints), the finished fragments, their join
# and the request body ~24 bytes a token of the whole prompt.
BLOCK_BYTES_PER_TOKEN = 90
PROMPT_BYTES_PER_TOKEN = 24


@dataclass(frozen=True, slots=True)
class LargestPrompt:
    """The largest prompt a replay of a trace sends under a PromptConfig."""

    tokens: int
    session_id: str
    request_index: int
    block_tokens: int  # tokens per materialized block there

    @property
    def peak_bytes(self) -> int:
        """Memory it takes at most while it is built."""
        return (
            self.tokens * PROMPT_BYTES_PER_TOKEN
            + min(self.tokens, self.block_tokens) * BLOCK_BYTES_PER_TOKEN
        )


def largest_prompt(trace: Trace, config: PromptConfig) -> LargestPrompt | None:
    """The largest prompt (in tokens as sent: the trace's blocks scaled to
    ``block_tokens``, cut at ``max_input_tokens``); None for a trace without
    requests. From the columns: no prompt is built."""
    best: LargestPrompt | None = None
    cap = config.max_input_tokens
    for session, _ in trace.all_sessions():
        inputs = request_column(session.requests, "input_tokens")
        if not inputs.size:
            continue
        i = int(np.argmax(inputs))
        bt = config.block_tokens or session.block_size
        tokens = int(inputs[i]) * bt // session.block_size
        if cap is not None:
            tokens = min(tokens, cap)
        if best is None or tokens > best.tokens:
            best = LargestPrompt(tokens, session.session_id, i, bt)
    return best


def _earlier_prompts(
    requests: Sequence[Request], index: int
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(blocks, output tokens, last block id or 0) of the requests before ``index``,
    from the columns when the session has them (no request objects built)."""
    if isinstance(requests, RequestRows):
        t, a = requests.table, requests.start
        n = t.n_blocks[a : a + index]
        offs = t.ids_offset[a : a + index]
        last = np.where(n > 0, t.blocks[np.maximum(offs + n - 1, 0)], 0)
        return n, t.output_tokens[a : a + index], last
    prev = requests[:index]
    n = np.array([r.hash_ids.size for r in prev], dtype=np.int64)
    out = np.array([r.output_tokens for r in prev], dtype=np.int64)
    last = np.array(
        [int(r.hash_ids[-1]) if r.hash_ids.size else 0 for r in prev], dtype=np.int64
    )
    return n, out, last


def load_tokenizer(path: str | Path) -> Any:
    """The ``tokenizers.Tokenizer`` of a local tokenizer.json (the optional
    ``tokenizers`` package); TraceError when the package or the file is not usable."""
    try:
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise TraceError(
            "--tokenizer needs the 'tokenizers' package (pip install tokenizers)"
        ) from exc
    try:
        return Tokenizer.from_file(str(path))
    except Exception as exc:  # the Rust side raises its own exception type
        raise TraceError(f"{path}: not a readable tokenizer.json: {exc}") from exc


def tokenizer_words(path: str) -> list[str]:
    """Words (with their leading space) that are exactly one token each in the
    tokenizer at ``path``, in vocabulary order; concatenated, they re-tokenize into
    the same tokens."""
    tok = load_tokenizer(path)
    ids = list(range(tok.get_vocab_size()))
    decoded = tok.decode_batch([[i] for i in ids])
    candidates = [(i, d) for i, d in zip(ids, decoded, strict=True) if _WORD.match(d)]
    encoded = tok.encode_batch([d for _, d in candidates], add_special_tokens=False)
    words = [
        d for (i, d), enc in zip(candidates, encoded, strict=True) if enc.ids == [i]
    ]
    if len(words) < 256:
        raise TraceError(f"{path}: too few single-token words ({len(words)})")
    return words
