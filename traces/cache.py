"""The LRU block-cache model: the prefix-cache hits a finite cache (a GPU tier, an
optional host tier) gets for requests in a given order. Pure; the ideal cache is in
``traces.stats``, the simulator's ``replayer.sim.cache``. See docs/capacity.md."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Iterable

import numpy as np
import numpy.typing as npt

CacheRequest = tuple[Hashable, npt.NDArray[np.int64], int]
"""(namespace key, block hash ids, input tokens) of one request."""


def lru_hits(
    requests_in_order: Iterable[CacheRequest],
    *,
    block_size: int,
    capacity_tokens: int,
    host_capacity_tokens: int | None = None,
) -> npt.NDArray[np.int64]:
    """Hit tokens of each request under an LRU block cache, in the given order.

    A request hits the leading run of its blocks that are cached in either tier
    (prefix caching cannot use a block after a miss), in tokens, capped at its input
    length. Then all its blocks become most recently used in the GPU tier (host hits
    are promoted back); the request's own blocks are touched last block first, so
    eviction trims a prefix from its tail, as vLLM's free queue does. Blocks evicted
    from the GPU tier go to the host tier (when it has capacity), whose own LRU
    overflow is dropped. A block is keyed by (namespace key, hash id): equal ids in
    different namespaces are different content. Capacities are in tokens and are
    rounded down to whole blocks.
    """
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1 (got {block_size})")
    if capacity_tokens < 0:
        raise ValueError(f"capacity_tokens must be >= 0 (got {capacity_tokens})")
    gpu_cap = capacity_tokens // block_size
    host_cap = (host_capacity_tokens or 0) // block_size
    gpu: OrderedDict[tuple[Hashable, int], None] = OrderedDict()
    host: OrderedDict[tuple[Hashable, int], None] = OrderedDict()
    out: list[int] = []
    for namespace, hash_ids, input_tokens in requests_in_order:
        keys = [(namespace, h) for h in hash_ids.tolist()]
        hit_blocks = 0
        for key in keys:
            if key in gpu or key in host:
                hit_blocks += 1
            else:
                break
        out.append(min(hit_blocks * block_size, int(input_tokens)))
        for key in reversed(keys):
            if key in gpu:
                gpu.move_to_end(key)
            else:
                host.pop(key, None)
                gpu[key] = None
        while len(gpu) > gpu_cap:
            key, _ = gpu.popitem(last=False)
            if host_cap:
                host[key] = None
                if len(host) > host_cap:
                    host.popitem(last=False)
    return np.asarray(out, dtype=np.int64)
