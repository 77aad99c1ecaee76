"""The LRU block-cache model on hand-made request sequences."""

from __future__ import annotations

import numpy as np
import pytest

from traces.cache import lru_hits


def _reqs(*items: tuple[str, list[int], int]) -> list[tuple[str, np.ndarray, int]]:
    return [(ns, np.asarray(ids, dtype=np.int64), n) for ns, ids, n in items]


def test_lru_hits_unbounded_is_leading_run_of_seen_blocks() -> None:
    reqs = _reqs(("a", [1, 2], 20), ("a", [1, 2, 3], 25), ("a", [1, 9, 3], 30))
    hits = lru_hits(reqs, block_size=10, capacity_tokens=10_000)
    # 0: cold; 1: blocks 1,2 seen → 20; 2: block 1 seen, 9 is a miss → stop at 10.
    assert hits.tolist() == [0, 20, 10]


def test_lru_hits_capped_at_input_tokens() -> None:
    reqs = _reqs(("a", [1, 2], 15), ("a", [1, 2], 15))
    assert lru_hits(reqs, block_size=10, capacity_tokens=100).tolist() == [0, 15]


def test_lru_hits_namespaces_do_not_share() -> None:
    reqs = _reqs(("a", [1, 2], 20), ("b", [1, 2], 20), ("a", [1, 2], 20))
    assert lru_hits(reqs, block_size=10, capacity_tokens=100).tolist() == [0, 0, 20]


def test_lru_hits_evicts_least_recently_used_tail_first() -> None:
    # Capacity 3 blocks. After req 0 ([1,2,3]) and req 1 ([7]) the cache holds
    # 1,2,3,7 → evict the LRU block: req 0's tail (3), so 1,2 survive.
    reqs = _reqs(
        ("a", [1, 2, 3], 30),
        ("a", [7], 10),
        ("a", [1, 2, 3], 30),
    )
    assert lru_hits(reqs, block_size=10, capacity_tokens=30).tolist() == [0, 0, 20]


def test_lru_hits_capacity_rounds_down_to_blocks() -> None:
    reqs = _reqs(("a", [1, 2], 20), ("a", [1, 2], 20))
    # 19 tokens = 1 block: req 0 leaves block 1 (its head), tail 2 evicted.
    assert lru_hits(reqs, block_size=10, capacity_tokens=19).tolist() == [0, 10]


def test_lru_hits_host_tier_catches_gpu_evictions() -> None:
    reqs = _reqs(("a", [1, 2], 20), ("a", [5, 6], 20), ("a", [1, 2], 20))
    gpu_only = lru_hits(reqs, block_size=10, capacity_tokens=20)
    assert gpu_only.tolist() == [0, 0, 0]
    tiered = lru_hits(reqs, block_size=10, capacity_tokens=20, host_capacity_tokens=20)
    assert tiered.tolist() == [0, 0, 20]
    # A host tier too small for both evicted blocks keeps only the newest one (1),
    # evicted after 2; a leading run needs block 1 first, so 10 tokens hit.
    small = lru_hits(reqs, block_size=10, capacity_tokens=20, host_capacity_tokens=10)
    assert small.tolist() == [0, 0, 10]


def test_lru_hits_empty_and_bad_arguments() -> None:
    assert lru_hits([], block_size=4, capacity_tokens=8).dtype == np.int64
    with pytest.raises(ValueError, match="block_size"):
        lru_hits([], block_size=0, capacity_tokens=8)
