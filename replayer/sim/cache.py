"""The simulated engine's KV block pool: vLLM v1's free queue and prefix cache, plus a
HiCache-style host tier. Pure bookkeeping, no time, on arrays of block ids (a request's
blocks are looked up, taken, cached and freed as runs). See docs/engine-model.md."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

Ids = npt.NDArray[np.int64]  # block ids, or chained block hashes

_NONE: Ids = np.zeros(0, np.int64)
_EMPTY, _GONE = -1, -2  # a hash table slot never used; one whose key was deleted
_FEW = 16  # probes left to a batch: finished one by one, cheaper than array calls
_GOLDEN_INT = 0x9E3779B97F4A7C15  # Fibonacci hashing spreads any int keys
_GOLDEN = np.uint64(_GOLDEN_INT)
_M64 = (1 << 64) - 1


def block_hashes(
    token_ids: Sequence[int], block_size: int, parent: int = 0
) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (a partial tail is ignored),
    following the block whose hash is ``parent`` (0: from the prompt's start).

    Python's tuple hash of ints is deterministic across processes; chaining the parent
    hash in makes a block's key depend on everything before it, as in vLLM. A hash is
    a signed 64-bit int (never -1), so a prompt's hashes fit an int64 array.
    """
    hashes: list[int] = []
    # zip of one iterator block_size times: the full blocks as tuples, in C (a
    # partial tail is dropped).
    for block in zip(*[iter(token_ids)] * block_size, strict=False):
        parent = hash((parent, block))
        hashes.append(parent)
    return hashes


def as_ids(values: Sequence[int] | Ids) -> Ids:
    """``values`` as an int64 array (no copy when it is one)."""
    return np.asarray(values, dtype=np.int64)


class _HashTable:
    """The prefix cache's index: int64 keys (block hashes) to values (block ids
    ``0 .. max_keys - 1``), by open addressing with linear probing, most operations
    on a whole array of keys at once. At most half the slots are used (live keys and
    tombstones, which a rebuild clears), a quarter live: a probe reads one or two
    slots."""

    def __init__(self, max_keys: int) -> None:
        bits = max(4, (4 * max_keys - 1).bit_length())
        self._bits = bits
        self._shift = np.uint64(64 - bits)
        self._mask = (1 << bits) - 1
        self.keys = np.zeros(1 << bits, np.int64)
        self.vals = np.full(1 << bits, _EMPTY, np.int32)
        self.slot_of = np.zeros(max_keys, np.intp)  # a live value's slot
        self._used = 0  # slots not _EMPTY (live keys and tombstones)
        self._limit = (1 << bits) // 2

    def _home(self, keys: Ids) -> npt.NDArray[np.intp]:
        return ((keys.view(np.uint64) * _GOLDEN) >> self._shift).astype(np.intp)

    def find(self, keys: Ids) -> npt.NDArray[np.intp]:
        """Each key's slot, or -1 where it is absent."""
        out = np.full(len(keys), -1, np.intp)
        if not len(keys):
            return out
        tvals, tkeys, mask = self.vals, self.keys, self._mask
        at = self._home(keys)
        todo = np.arange(len(keys))
        while len(todo) > _FEW:
            v = tvals.take(at)
            hit = (v >= 0) & (tkeys.take(at) == keys)
            out[todo[hit]] = at[hit]
            # A miss ends at a never-used slot.
            go = (v != _EMPTY) & ~hit
            todo, keys, at = todo[go], keys[go], (at[go] + 1) & mask
        for i, key, slot in zip(todo.tolist(), keys.tolist(), at.tolist(), strict=True):
            while (val := int(tvals[slot])) != _EMPTY:
                if val >= 0 and int(tkeys[slot]) == key:
                    out[i] = slot
                    break
                slot = (slot + 1) & mask
        return out

    def find_one(self, key: int) -> int:
        """One key's value, or -1 (the same probe as :meth:`find`, in Python)."""
        at = ((key & _M64) * _GOLDEN_INT & _M64) >> (64 - self._bits)
        vals, keys, mask = self.vals, self.keys, self._mask
        while True:
            v = int(vals[at])
            if v == _EMPTY:
                return -1
            if v >= 0 and int(keys[at]) == key:
                return v
            at = (at + 1) & mask

    def add(self, keys: Ids, vals: Ids) -> npt.NDArray[np.bool_]:
        """Add distinct keys with distinct values, but for keys already present
        (they keep theirs); which were added. A key goes to the first never-used
        slot of its probe (tombstones are reclaimed by rebuilding), so the probe that
        places it also finds it if present."""
        if self._used + len(keys) > self._limit:
            self._rebuild()
        added = np.zeros(len(keys), bool)
        tvals, tkeys, mask = self.vals, self.keys, self._mask
        at = self._home(keys)
        todo = np.arange(len(keys))
        while len(todo) > _FEW:
            v = tvals.take(at)
            present = (v >= 0) & (tkeys.take(at) == keys)
            empty = np.flatnonzero(v == _EMPTY)
            # Keys reaching one empty slot all write it; the one read back took it,
            # the rest go on.
            slots, claim = at[empty], keys[empty]
            tkeys[slots] = claim
            won = empty[tkeys.take(slots) == claim]
            slots, won_vals = at[won], vals[won]
            tvals[slots] = won_vals
            self.slot_of[won_vals] = slots
            self._used += len(won)
            added[todo[won]] = True
            present[won] = True  # done
            left = ~present
            todo, keys, vals = todo[left], keys[left], vals[left]
            at = (at[left] + 1) & mask
        for i, key, val, slot in zip(
            todo.tolist(), keys.tolist(), vals.tolist(), at.tolist(), strict=True
        ):
            while (v1 := int(tvals[slot])) != _EMPTY:
                if v1 >= 0 and int(tkeys[slot]) == key:
                    break
                slot = (slot + 1) & mask
            else:
                tkeys[slot], tvals[slot] = key, val
                self.slot_of[val] = slot
                self._used += 1
                added[i] = True
        return added

    def remove(self, vals: Ids) -> None:
        """Remove the keys of live values (their slots become tombstones)."""
        self.vals[self.slot_of[vals]] = _GONE

    def _rebuild(self) -> None:
        live = self.vals >= 0
        keys, vals = self.keys[live], self.vals[live].astype(np.int64)
        self.vals.fill(_EMPTY)
        self._used = 0
        self.add(keys, vals)


class BlockPool:
    """``num_blocks`` GPU blocks (ids ``0 .. num_blocks - 1``), as vLLM's ``BlockPool``
    keeps them.

    A block no request holds sits in the free queue, least recently freed first,
    whether or not it still caches a prefix; allocation takes from the head, so the
    oldest cached prefix is evicted first (to the host tier when there is one). A
    request's blocks are freed tail first, so its prefix outlives its suffix.

    The free queue is a log of block ids in the order they were freed, read from a
    head: an entry is live while its block's ``_pos`` still points at it (a block
    taken back out by a hit, or freed again later, leaves a dead entry behind). So
    freeing, taking and touching a run of blocks are array operations, and so is a
    lookup: the blocks a request caches are also logged as a chain, and a later
    prompt's leading run is read off the chain its first hit is on (checked block
    by block against its hashes, in one array comparison), with a probe of the
    index only where the chain ends or departs from the prompt.
    """

    def __init__(self, num_blocks: int, host_blocks: int = 0) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1 (got {num_blocks})")
        if host_blocks < 0:
            raise ValueError(f"host_blocks must be >= 0 (got {host_blocks})")
        self.num_blocks = num_blocks
        self.host_capacity = host_blocks
        self.num_free = num_blocks
        self._ref = np.zeros(num_blocks, np.int32)  # requests holding each block
        # Each block's index in _log while it is free, -1 while held.
        self._pos = np.arange(num_blocks, dtype=np.int64)
        self._log = np.zeros(2 * num_blocks + 64, np.int64)
        self._log[:num_blocks] = self._pos
        self._head, self._tail = 0, num_blocks
        self._hash = np.zeros(num_blocks, np.int64)  # valid where _hashed
        self._hashed = np.zeros(num_blocks, bool)
        self._index = _HashTable(num_blocks)  # cached hash -> block id
        # Chains of block ids as requests hold them, newest last: a lookup follows
        # a chain from one probe and checks it against the hashes, rather than
        # probing the index for every block. ``_where``: a block's latest place.
        self._chains = np.zeros(3 * num_blocks + 1024, np.int64)
        self._chains_len = 0
        self._where = np.full(num_blocks, -1, np.int64)
        self.host: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0
        # Changes whenever what a lookup can find changes (a prefix cached or
        # evicted, either tier): a waiting request's lookup is reused until then.
        self.version = 0

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - self.num_free / self.num_blocks

    # -- runs of blocks (the scheduler's interface) ---------------------------------

    def lookup_ids(self, hashes: Ids, limit: int) -> tuple[Ids, list[int]]:
        """The leading cached run of ``hashes[:limit]``: GPU block ids, then the
        host-tier hashes that continue it."""
        limit = min(limit, len(hashes))
        find_one, chains, where = self._index.find_one, self._chains, self._where
        runs: list[Ids] = []
        k = 0
        while k < limit:
            block = find_one(int(hashes[k]))
            if block < 0:
                break
            # Where the chain holding this block goes on as the prompt does.
            at = int(where[block])
            run = chains[at : min(self._chains_len, at + limit - k)]
            same = (self._hash[run] == hashes[k : k + len(run)]) & self._hashed[run]
            n = int(same.argmin()) or len(run)  # same[0]: the block found
            runs.append(run[:n])
            k += n
        gpu = runs[0] if len(runs) == 1 else np.concatenate(runs or [_NONE])
        host: list[int] = []
        if self.host and k < limit:
            in_host = self.host
            for h in hashes[k:limit].tolist():
                if h not in in_host:
                    break
                host.append(h)
        return gpu, host

    def count_unheld(self, blocks: Ids) -> int:
        """How many of ``blocks`` no request holds (they sit in the free queue)."""
        return int(np.count_nonzero(self._ref[blocks] == 0))

    def touch(self, blocks: Sequence[int] | Ids) -> None:
        """Take a reference on cached blocks (out of the free queue if unheld)."""
        ids = as_ids(blocks)
        unheld = ids[self._ref[ids] == 0]
        self._pos[unheld] = -1  # their log entries die
        self.num_free -= len(unheld)
        self._ref[ids] += 1

    def take_ids(self, n: int) -> Ids:
        """``n`` blocks from the head of the free queue, evicting what they cached.

        Raises:
            KeyError: fewer than ``n`` blocks are free.
        """
        if n > self.num_free:
            raise KeyError(f"{n} blocks wanted, {self.num_free} free")
        if n <= 0:
            return _NONE
        log, pos = self._log, self._pos
        head, tail = self._head, self._tail
        parts: list[Ids] = []
        need = n
        while need:
            end = min(tail, head + max(2 * need, 256))
            chunk = log[head:end]
            live = np.flatnonzero(pos[chunk] == np.arange(head, end))
            if len(live) >= need:
                live = live[:need]
                head += int(live[-1]) + 1
                need = 0
            else:
                need -= len(live)
                head = end
            parts.append(chunk[live])
        self._head = head
        ids = parts[0] if len(parts) == 1 else np.concatenate(parts)
        pos[ids] = -1
        self._ref[ids] = 1
        self.num_free -= n
        evicted = ids[self._hashed[ids]]
        if len(evicted):
            self._evict(evicted)
        return ids

    def cache_run(self, blocks: Ids, hashes: Ids, start: int = 0) -> None:
        """Make computed full blocks ``blocks[start:]`` hittable under their hashes
        (chained, so distinct); a duplicate of a cached hash stays private, as its
        twin already serves hits. ``blocks[:start]``: the request's blocks before
        them, which the chain of block ids logged for lookups starts with."""
        new_blocks, new_hashes = blocks[start:], hashes[start:]
        if not len(new_blocks):
            return
        self._log_chain(blocks, start)
        new = self._index.add(new_hashes, new_blocks)
        if not new.all():
            new_blocks, new_hashes = new_blocks[new], new_hashes[new]
            if not len(new_blocks):
                return
        self._hash[new_blocks] = new_hashes
        self._hashed[new_blocks] = True
        self.version += 1
        if self.host:
            pop = self.host.pop
            for h in new_hashes.tolist():
                pop(h, None)

    def load_from_host(
        self, hashes: Sequence[int], blocks: Sequence[int] | Ids
    ) -> None:
        """Promote host-tier blocks into freshly taken GPU blocks."""
        ids, keys = as_ids(blocks), as_ids(hashes)
        if len(ids) != len(keys):
            raise ValueError(f"{len(keys)} hashes for {len(ids)} blocks")
        for h in hashes:
            self.host.pop(h, None)
        self.cache_run(ids, keys)
        self.version += 1

    def release(self, blocks: Sequence[int] | Ids) -> None:
        """Drop one reference on each of ``blocks`` (distinct ids, a request's),
        freeing them tail first."""
        ids = as_ids(blocks)[::-1]
        if not len(ids):
            return
        ref = self._ref
        ref[ids] -= 1
        freed = ids[ref[ids] == 0]
        k = len(freed)
        if self._tail + k > len(self._log):
            self._compact(k)
        tail = self._tail
        self._log[tail : tail + k] = freed
        self._pos[freed] = np.arange(tail, tail + k)
        self._tail = tail + k
        self.num_free += k

    def reset(self) -> int:
        """Forget every cached prefix no request holds, both tiers (vLLM's
        ``/reset_prefix_cache``, SGLang's ``/flush_cache``); how many were dropped."""
        dropped = len(self.host)
        self.version += 1
        gone = np.flatnonzero((self._ref == 0) & self._hashed)
        self._index.remove(gone)
        self._hashed[gone] = False
        self.host.clear()
        return dropped + len(gone)

    # -- one block at a time (the same operations, for callers holding lists) -------

    def lookup(self, hashes: Sequence[int], limit: int) -> tuple[list[int], list[int]]:
        """:meth:`lookup_ids` with the GPU block ids as a list."""
        gpu, host = self.lookup_ids(as_ids(hashes), limit)
        ids: list[int] = gpu.tolist()
        return ids, host

    def take(self, n: int) -> list[int]:
        """:meth:`take_ids` as a list."""
        ids: list[int] = self.take_ids(n).tolist()
        return ids

    def cache(self, block: int, h: int) -> None:
        """:meth:`cache_run` of one block."""
        self.cache_run(as_ids([block]), as_ids([h]))

    # -- internals -------------------------------------------------------------------

    def _evict(self, blocks: Ids) -> None:
        hashes = self._hash[blocks]
        self._index.remove(blocks)
        self._hashed[blocks] = False
        self.evictions += len(blocks)
        self.version += 1
        if self.host_capacity:
            host = self.host
            for h in hashes.tolist():
                host[h] = None
            while len(host) > self.host_capacity:
                host.popitem(last=False)

    def _log_chain(self, blocks: Ids, start: int) -> None:
        """Log ``blocks``' chain: only ``blocks[start:]`` when the log already ends
        with ``blocks[:start]`` (the request's previous chunk), else all of it."""
        n = self._chains_len
        chains = self._chains
        if not (start and n and chains[n - 1] == blocks[start - 1]):
            start = 0
        run = blocks[start:]
        if n + len(run) > len(chains):
            # Keep each block's latest place only, in order.
            live = np.flatnonzero(self._where[chains[:n]] == np.arange(n))
            kept = chains[live]
            n = len(kept)
            if n + len(run) > len(chains):
                self._chains = chains = np.zeros(2 * (n + len(run)), np.int64)
            chains[:n] = kept
            self._where[kept] = np.arange(n)
        chains[n : n + len(run)] = run
        self._where[run] = np.arange(n, n + len(run))
        self._chains_len = n + len(run)

    def _compact(self, extra: int) -> None:
        """Drop the log's dead entries to make room for ``extra`` more."""
        head, tail = self._head, self._tail
        chunk = self._log[head:tail]
        live = chunk[self._pos[chunk] == np.arange(head, tail)]
        size = max(len(self._log), 2 * (len(live) + extra))
        if size > len(self._log):
            self._log = np.zeros(size, np.int64)
        self._log[: len(live)] = live
        self._pos[live] = np.arange(len(live))
        self._head, self._tail = 0, len(live)
