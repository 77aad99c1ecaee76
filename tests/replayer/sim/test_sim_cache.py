"""Unit tests of replayer.sim.cache: the pure block prefix cache."""

from __future__ import annotations

import pytest

from replayer.sim.cache import PrefixCache, block_hashes

BS = 4


def _hashes(ids: range | list[int]) -> list[int]:
    return block_hashes(list(ids), BS)


def _run(cache: PrefixCache, hashes: list[int], extra_blocks: int = 1) -> None:
    """One request from admission to completion: allocate, compute, release."""
    alloc = cache.allocate(hashes, extra_blocks)
    assert alloc is not None
    cache.register(alloc, len(hashes))
    cache.release(alloc)


def test_block_hashes_full_blocks_only_and_chained() -> None:
    a = _hashes(range(10))
    assert len(a) == 2
    assert _hashes(range(8)) == a
    # Same block content after a different prefix hashes differently.
    b = block_hashes([9, 9, 9, 9, 4, 5, 6, 7], BS)
    assert b[0] != a[0]
    assert b[1] != a[1]


def test_cache_cold_then_warm_hits_registered_blocks() -> None:
    cache = PrefixCache(gpu_capacity_blocks=100)
    hashes = _hashes(range(40))
    alloc = cache.allocate(hashes, extra_blocks=1)
    assert alloc is not None
    assert alloc.hit_blocks == 0
    assert cache.lookup(hashes) == (0, 0)  # not computed yet, so not hittable
    cache.register(alloc, 10)
    assert cache.lookup(hashes) == (10, 0)
    cache.release(alloc)
    assert cache.active_blocks == 0
    assert cache.used_blocks == 10
    again = cache.allocate(hashes, extra_blocks=1)
    assert again is not None
    assert again.gpu_hit_blocks == 10


def test_cache_partial_prefix_hits_only_shared_full_blocks() -> None:
    cache = PrefixCache(gpu_capacity_blocks=100)
    _run(cache, _hashes(range(40)))
    second = _hashes([*range(22), *range(500, 518)])  # shares 22 tokens = 5 blocks
    assert cache.lookup(second) == (5, 0)


def test_cache_max_hit_blocks_caps_the_hit() -> None:
    cache = PrefixCache(gpu_capacity_blocks=100)
    hashes = _hashes(range(16))
    _run(cache, hashes, 0)
    again = cache.allocate(hashes, 0, max_hit_blocks=3)
    assert again is not None
    assert again.gpu_hit_blocks == 3


def test_cache_evicts_lru_tail_first_and_never_pinned_blocks() -> None:
    cache = PrefixCache(gpu_capacity_blocks=16)
    a = _hashes(range(40))
    alloc_a = cache.allocate(a, 1)
    assert alloc_a is not None
    cache.register(alloc_a, 10)
    b = _hashes(range(1000, 1040))
    # A still runs and pins 11 blocks: B's 11 do not fit.
    assert cache.allocate(b, 1) is None
    cache.release(alloc_a)
    alloc_b = cache.allocate(b, 1)
    assert alloc_b is not None
    assert cache.used_blocks <= 16
    # Five of A's blocks had to go, the tail ones: the head still hits.
    assert cache.lookup(a) == (5, 0)


def test_cache_host_tier_takes_evicted_blocks_and_promotes_hits() -> None:
    cache = PrefixCache(gpu_capacity_blocks=16, host_capacity_blocks=16)
    a = _hashes(range(40))
    _run(cache, a)
    _run(cache, _hashes(range(1000, 1040)))
    assert cache.host_blocks == 5
    assert cache.lookup(a) == (5, 5)
    again = cache.allocate(a, 1)
    assert again is not None
    assert (again.gpu_hit_blocks, again.host_hit_blocks) == (5, 5)
    assert cache.used_blocks <= 16
    cache.release(again)
    assert cache.lookup(a) == (10, 0)  # promoted back to the GPU tier


def test_cache_host_tier_is_bounded() -> None:
    cache = PrefixCache(gpu_capacity_blocks=11, host_capacity_blocks=3)
    for base in (0, 1000, 2000):
        _run(cache, _hashes(range(base, base + 40)))
    assert cache.host_blocks == 3
    assert cache.used_blocks <= 11


def test_cache_concurrent_duplicate_shares_on_register() -> None:
    cache = PrefixCache(gpu_capacity_blocks=100)
    hashes = _hashes(range(20))
    first = cache.allocate(hashes, 0)
    second = cache.allocate(hashes, 0)
    assert first is not None
    assert second is not None
    assert cache.used_blocks == 10
    cache.register(first, 5)
    cache.register(second, 5)
    assert cache.used_blocks == 5  # the second copy was freed, the blocks shared
    cache.release(first)
    assert cache.active_blocks == 5
    cache.release(second)
    cache.release(second)  # idempotent
    assert cache.active_blocks == 0
    assert cache.used_blocks == 5


def test_cache_rejects_bad_capacity() -> None:
    with pytest.raises(ValueError, match="gpu_capacity_blocks"):
        PrefixCache(gpu_capacity_blocks=0)


def test_cache_reset_drops_unpinned_blocks_in_both_tiers() -> None:
    cache = PrefixCache(gpu_capacity_blocks=4, host_capacity_blocks=8)
    _run(cache, _hashes(range(12)), extra_blocks=0)  # 3 blocks
    _run(cache, _hashes(range(100, 112)), extra_blocks=0)  # evicts 2 to the host
    held = cache.allocate(_hashes(range(100, 112)), extra_blocks=0)  # pins 3 blocks
    assert held is not None
    assert cache.host_blocks > 0
    dropped = cache.reset()
    assert cache.host_blocks == 0
    assert cache.lookup(_hashes(range(12))) == (0, 0)
    # The running request keeps its blocks.
    assert cache.lookup(_hashes(range(100, 112))) == (3, 0)
    assert dropped >= 2
    cache.release(held)
