"""Unit tests of replayer.sim.cache: vLLM's block pool (free queue, prefix cache) and
the host tier."""

from __future__ import annotations

import pytest

from replayer.sim.cache import BlockPool, block_hashes

BS = 4


def _hashes(ids: range | list[int]) -> list[int]:
    return block_hashes(list(ids), BS)


def _compute(pool: BlockPool, hashes: list[int]) -> list:
    """One request's blocks, computed and cached (still held)."""
    blocks = pool.take(len(hashes))
    for block, h in zip(blocks, hashes, strict=True):
        pool.cache(block, h)
    return blocks


def test_block_hashes_full_blocks_only_and_chained() -> None:
    a = _hashes(range(10))
    assert len(a) == 2
    assert _hashes(range(8)) == a
    # Same block content after a different prefix hashes differently.
    b = block_hashes([9, 9, 9, 9, 4, 5, 6, 7], BS)
    assert b[0] != a[0]
    assert b[1] != a[1]


def test_pool_cached_blocks_hit_after_release_and_touch_takes_them_back() -> None:
    pool = BlockPool(100)
    hashes = _hashes(range(40))
    blocks = _compute(pool, hashes)
    assert pool.num_free == 90
    pool.release(blocks)
    assert pool.num_free == 100  # free, yet still cached
    gpu, host = pool.lookup(hashes, 10)
    assert (len(gpu), host) == (10, [])
    assert len(pool.lookup(hashes, 3)[0]) == 3  # the limit caps the hit
    pool.touch(gpu)
    assert pool.num_free == 90
    assert pool.usage == pytest.approx(0.1)


def test_pool_partial_prefix_hits_only_shared_full_blocks() -> None:
    pool = BlockPool(100)
    pool.release(_compute(pool, _hashes(range(40))))
    second = _hashes([*range(22), *range(500, 518)])  # shares 22 tokens = 5 blocks
    assert len(pool.lookup(second, 10)[0]) == 5


def test_pool_takes_never_used_blocks_first_then_evicts_least_recently_freed() -> None:
    pool = BlockPool(16)
    a = _hashes(range(40))
    pool.release(_compute(pool, a))  # 10 cached, free, freed tail first
    fresh = pool.take(6)  # the 6 never-used blocks come first
    assert len(pool.lookup(a, 10)[0]) == 10
    more = pool.take(5)  # now A's blocks go, tail ones first: the head still hits
    assert len(pool.lookup(a, 10)[0]) == 5
    assert pool.evictions == 5
    pool.release(fresh + more)


def test_pool_never_hands_out_a_held_block() -> None:
    pool = BlockPool(8)
    held = _compute(pool, _hashes(range(20)))  # 5 held
    assert pool.num_free == 3
    other = pool.take(3)
    assert not set(map(id, other)) & set(map(id, held))
    with pytest.raises(KeyError):
        pool.take(1)


def test_pool_host_tier_takes_evicted_blocks_and_promotes_hits() -> None:
    pool = BlockPool(10, host_blocks=16)
    a = _hashes(range(40))
    pool.release(_compute(pool, a))
    pool.release(_compute(pool, _hashes(range(1000, 1040))))  # evicts all of A
    gpu, host = pool.lookup(a, 10)
    assert (len(gpu), len(host)) == (0, 10)
    blocks = pool.take(10)  # evicts B to the host
    pool.load_from_host(host, blocks)
    assert len(pool.lookup(a, 10)[0]) == 10  # back in the GPU tier
    assert a[0] not in pool.host


def test_pool_host_tier_is_bounded() -> None:
    pool = BlockPool(10, host_blocks=3)
    for base in (0, 1000, 2000):
        pool.release(_compute(pool, _hashes(range(base, base + 40))))
    assert len(pool.host) == 3


def test_pool_rejects_bad_capacity() -> None:
    with pytest.raises(ValueError, match="num_blocks"):
        BlockPool(0)


def test_pool_reset_drops_free_cached_blocks_in_both_tiers_not_held_ones() -> None:
    pool = BlockPool(4, host_blocks=8)
    pool.release(_compute(pool, _hashes(range(12))))  # 3 blocks
    held = _compute(pool, _hashes(range(100, 112)))  # evicts 2 of them to the host
    assert pool.host
    dropped = pool.reset()
    assert dropped == 3
    assert not pool.host
    assert pool.lookup(_hashes(range(12)), 3) == ([], [])
    assert len(pool.lookup(_hashes(range(100, 112)), 3)[0]) == 3
    pool.release(held)
