"""The simulated engine's KV block pool: vLLM v1's free queue and prefix cache, plus a
HiCache-style host tier. Pure bookkeeping, no time. See docs/engine-model.md."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from functools import partial
from itertools import islice, takewhile
from operator import is_not
from typing import cast


def block_hashes(
    token_ids: Sequence[int], block_size: int, parent: int = 0
) -> list[int]:
    """Chained hashes of the full blocks of ``token_ids`` (a partial tail is ignored),
    following the block whose hash is ``parent`` (0: from the prompt's start).

    Python's tuple hash of ints is deterministic across processes; chaining the parent
    hash in makes a block's key depend on everything before it, as in vLLM.
    """
    hashes: list[int] = []
    for start in range(0, len(token_ids) - block_size + 1, block_size):
        parent = hash((parent, tuple(token_ids[start : start + block_size])))
        hashes.append(parent)
    return hashes


class Block:
    """One physical KV block: its content hash once full and cached, and how many
    requests hold it."""

    __slots__ = ("hash", "ref")

    def __init__(self) -> None:
        self.hash: int | None = None
        self.ref = 0


_is_block = partial(is_not, None)


class BlockPool:
    """``num_blocks`` GPU blocks, as vLLM's ``BlockPool`` keeps them.

    A block no request holds sits in the free queue, least recently freed first,
    whether or not it still caches a prefix; allocation takes from the head, so the
    oldest cached prefix is evicted first (to the host tier when there is one). A
    request's blocks are freed tail first, so its prefix outlives its suffix.
    """

    def __init__(self, num_blocks: int, host_blocks: int = 0) -> None:
        if num_blocks < 1:
            raise ValueError(f"num_blocks must be >= 1 (got {num_blocks})")
        if host_blocks < 0:
            raise ValueError(f"host_blocks must be >= 0 (got {host_blocks})")
        self.num_blocks = num_blocks
        self.host_capacity = host_blocks
        self.free: OrderedDict[Block, None] = OrderedDict(
            (Block(), None) for _ in range(num_blocks)
        )
        self.cached: dict[int, Block] = {}
        self.host: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0
        # Bumped whenever what a lookup can find changes (a prefix cached or evicted,
        # either tier): a waiting request's lookup is reused until then.
        self.version = 0

    @property
    def num_free(self) -> int:
        return len(self.free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by requests (vLLM's ``kv_cache_usage_perc``)."""
        return 1.0 - len(self.free) / self.num_blocks

    def lookup(
        self, hashes: Sequence[int], limit: int
    ) -> tuple[list[Block], list[int]]:
        """The leading cached run of ``hashes[:limit]``: GPU blocks, then the host-tier
        hashes that continue it."""
        # The scan runs in C: map and takewhile stop at the first miss.
        get: Callable[[int], Block | None] = self.cached.get
        gpu = cast(
            list[Block], list(takewhile(_is_block, map(get, islice(hashes, limit))))
        )
        host: list[int] = []
        if self.host and len(gpu) < limit:
            in_host = self.host
            for h in islice(hashes, len(gpu), limit):
                if h not in in_host:
                    break
                host.append(h)
        return gpu, host

    def touch(self, blocks: Sequence[Block]) -> None:
        """Take a reference on cached blocks (out of the free queue if unheld)."""
        free = self.free
        for block in blocks:
            if block.ref == 0:
                del free[block]
            block.ref += 1

    def take(self, n: int) -> list[Block]:
        """``n`` blocks from the head of the free queue, evicting what they cached."""
        free, cached = self.free, self.cached
        out: list[Block] = []
        for _ in range(n):
            block, _ = free.popitem(last=False)
            if block.hash is not None:
                del cached[block.hash]
                self.evictions += 1
                self.version += 1
                if self.host_capacity:
                    self.host[block.hash] = None
                    if len(self.host) > self.host_capacity:
                        self.host.popitem(last=False)
                block.hash = None
            block.ref = 1
            out.append(block)
        return out

    def load_from_host(self, hashes: Sequence[int], blocks: Sequence[Block]) -> None:
        """Promote host-tier blocks into freshly taken GPU blocks."""
        for h, block in zip(hashes, blocks, strict=True):
            self.host.pop(h, None)
            self.cache(block, h)
        self.version += 1

    def cache(self, block: Block, h: int) -> None:
        """Make a computed full block hittable (a duplicate of a cached one stays
        private, as its twin already serves hits)."""
        if h not in self.cached:
            self.cached[h] = block
            block.hash = h
            self.host.pop(h, None)
            self.version += 1

    def release(self, blocks: Sequence[Block]) -> None:
        """Drop one reference on each of ``blocks``, freeing them tail first."""
        free = self.free
        for block in reversed(blocks):
            block.ref -= 1
            if block.ref == 0:
                free[block] = None

    def reset(self) -> int:
        """Forget every cached prefix no request holds, both tiers (vLLM's
        ``/reset_prefix_cache``, SGLang's ``/flush_cache``); how many were dropped."""
        dropped = len(self.host)
        self.version += 1
        for block in self.free:
            if block.hash is not None:
                del self.cached[block.hash]
                block.hash = None
                dropped += 1
        self.host.clear()
        return dropped
