"""The simulator's block prefix cache: a GPU tier with LRU eviction and a host tier.

Pure bookkeeping (no time, no I/O), modelled on vLLM's prefix caching: a block is
``block_size`` token ids keyed by a chained hash of (parent hash, block ids); a request
hits only a leading run of cached full blocks; blocks pinned by running requests are
never evicted. With a host tier (HiCache-style) evicted GPU blocks move to host memory,
and a host hit is promoted back to the GPU tier. Capacities are counted in blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (a partial tail is ignored).

    Python's tuple hash of ints is deterministic across processes; chaining the parent
    hash in makes a block's key depend on everything before it, as in vLLM.
    """
    hashes: list[int] = []
    parent = 0
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


@dataclass(slots=True)
class Allocation:
    """The blocks one running request holds; returned by :meth:`PrefixCache.allocate`.

    ``pinned`` are cached blocks whose reference this request holds; ``private_blocks``
    counts blocks that are only this request's (not yet computed or not shareable).
    """

    hashes: list[int]
    gpu_hit_blocks: int
    host_hit_blocks: int
    pinned: list[int] = field(default_factory=list)
    private_blocks: int = 0
    registered_blocks: int = 0  # leading blocks already in the cache or registered
    released: bool = False

    @property
    def hit_blocks(self) -> int:
        return self.gpu_hit_blocks + self.host_hit_blocks


class PrefixCache:
    """GPU-tier block cache with LRU eviction and an optional host tier.

    Invariant: ``private + len(refcount) <= gpu_capacity_blocks``; a cached block with
    refcount 0 sits in ``_evictable`` (least recently used first).
    """

    def __init__(self, *, gpu_capacity_blocks: int, host_capacity_blocks: int = 0):
        if gpu_capacity_blocks < 1:
            raise ValueError(
                f"gpu_capacity_blocks must be >= 1 (got {gpu_capacity_blocks})"
            )
        if host_capacity_blocks < 0:
            raise ValueError(
                f"host_capacity_blocks must be >= 0 (got {host_capacity_blocks})"
            )
        self.gpu_capacity_blocks = gpu_capacity_blocks
        self.host_capacity_blocks = host_capacity_blocks
        self._refcount: dict[int, int] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self._host: OrderedDict[int, None] = OrderedDict()
        self._private = 0

    @property
    def used_blocks(self) -> int:
        """GPU blocks holding data: private, pinned and evictable cached blocks."""
        return self._private + len(self._refcount)

    @property
    def active_blocks(self) -> int:
        """GPU blocks held by running requests (what vLLM's KV usage gauge counts)."""
        return self.used_blocks - len(self._evictable)

    @property
    def host_blocks(self) -> int:
        return len(self._host)

    def lookup(self, hashes: Sequence[int]) -> tuple[int, int]:
        """(GPU hits, host hits) in blocks of the leading cached run; read-only."""
        gpu = host = 0
        for h in hashes:
            if h in self._refcount:
                gpu += 1
            elif h in self._host:
                host += 1
            else:
                break
        return gpu, host

    def allocate(
        self, hashes: list[int], extra_blocks: int, *, max_hit_blocks: int | None = None
    ) -> Allocation | None:
        """Pin the leading hits and reserve room for the rest, or None if it can't fit.

        ``hashes`` are the request's full prompt blocks; ``extra_blocks`` are the other
        blocks it needs (partial prompt tail, output). At most ``max_hit_blocks``
        leading blocks count as hits (vLLM recomputes the last prompt token).
        """
        limit = len(hashes) if max_hit_blocks is None else max_hit_blocks
        gpu_hits: list[int] = []
        host_hits: list[int] = []
        for h in hashes[:limit]:
            if h in self._refcount:
                gpu_hits.append(h)
            elif h in self._host:
                host_hits.append(h)
            else:
                break
        hits = len(gpu_hits) + len(host_hits)
        needed = len(host_hits) + (len(hashes) - hits) + extra_blocks
        evictable_hits = sum(1 for h in gpu_hits if self._refcount[h] == 0)
        free = self.gpu_capacity_blocks - self.used_blocks
        if needed > free + len(self._evictable) - evictable_hits:
            return None
        for h in gpu_hits:
            self._pin(h)
        for h in host_hits:
            del self._host[h]  # before eviction below can push it out of the host tier
        self._make_room(needed)
        for h in host_hits:
            self._refcount[h] = 1
        self._private += needed - len(host_hits)
        return Allocation(
            hashes=hashes,
            gpu_hit_blocks=len(gpu_hits),
            host_hit_blocks=len(host_hits),
            pinned=gpu_hits + host_hits,
            private_blocks=needed - len(host_hits),
            registered_blocks=hits,
        )

    def register(self, alloc: Allocation, computed_blocks: int) -> None:
        """Make the request's first ``computed_blocks`` prompt blocks hittable."""
        for i in range(
            alloc.registered_blocks, min(computed_blocks, len(alloc.hashes))
        ):
            h = alloc.hashes[i]
            if h in self._refcount:
                # Another request computed it meanwhile: share theirs, free our copy.
                self._pin(h)
            else:
                self._host.pop(h, None)
                self._refcount[h] = 1
            self._private -= 1
            alloc.private_blocks -= 1
            alloc.pinned.append(h)
        alloc.registered_blocks = max(alloc.registered_blocks, computed_blocks)

    def release(self, alloc: Allocation) -> None:
        """Free the request's private blocks and unpin its cached ones (idempotent)."""
        if alloc.released:
            return
        alloc.released = True
        self._private -= alloc.private_blocks
        # Tail blocks become least recently used first, so eviction trims prefixes
        # from the end (a head evicted before its tail would strand the tail).
        for h in reversed(alloc.pinned):
            count = self._refcount[h] - 1
            self._refcount[h] = count
            if count == 0:
                self._evictable[h] = None

    def reset(self) -> int:
        """Drop every cached block no running request holds, in both tiers (vLLM's
        ``/reset_prefix_cache``, SGLang's ``/flush_cache``); returns how many."""
        dropped = len(self._evictable) + len(self._host)
        for h in self._evictable:
            del self._refcount[h]
        self._evictable.clear()
        self._host.clear()
        return dropped

    def _pin(self, h: int) -> None:
        if self._refcount[h] == 0:
            del self._evictable[h]
        self._refcount[h] += 1

    def _make_room(self, needed: int) -> None:
        while self.gpu_capacity_blocks - self.used_blocks < needed:
            h, _ = self._evictable.popitem(last=False)
            del self._refcount[h]
            if self.host_capacity_blocks:
                self._host[h] = None
                if len(self._host) > self.host_capacity_blocks:
                    self._host.popitem(last=False)
