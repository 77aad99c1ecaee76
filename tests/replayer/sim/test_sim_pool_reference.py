"""The block pool on arrays against a straightforward one, block by block (vLLM's
free queue as an ordered dict, the prefix cache as a dict): on random workloads under
eviction pressure the scheduler over either gives every request the same cached
tokens, the same blocks and the same steps."""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pytest

from replayer.sim.cache import BlockPool, Ids, _HashTable, as_ids, block_hashes
from replayer.sim.config import SimConfig
from replayer.sim.core import CoreRequest, Scheduler


class ReferencePool(BlockPool):
    """The pool one block at a time, as vLLM's ``BlockPool`` reads."""

    def __init__(self, num_blocks: int, host_blocks: int = 0) -> None:
        # Not BlockPool's state: only the attributes the scheduler reads.
        self.num_blocks = num_blocks
        self.host_capacity = host_blocks
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.num_free = num_blocks
        self.ref = [0] * num_blocks
        self.hash_of: list[int | None] = [None] * num_blocks
        self.cached: dict[int, int] = {}
        self.host: OrderedDict[int, None] = OrderedDict()
        self.evictions = 0
        self.version = 0

    def lookup_ids(self, hashes: Ids, limit: int) -> tuple[Ids, list[int]]:
        gpu: list[int] = []
        for h in hashes[:limit].tolist():
            block = self.cached.get(h)
            if block is None:
                break
            gpu.append(block)
        host: list[int] = []
        for h in hashes[len(gpu) : limit].tolist():
            if h not in self.host:
                break
            host.append(h)
        return as_ids(gpu), host

    def count_unheld(self, blocks: Ids) -> int:
        return sum(self.ref[b] == 0 for b in blocks.tolist())

    def touch(self, blocks: Sequence[int] | Ids) -> None:
        for b in as_ids(blocks).tolist():
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1
        self.num_free = len(self.free)

    def take_ids(self, n: int) -> Ids:
        out: list[int] = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            h = self.hash_of[b]
            if h is not None:
                del self.cached[h]
                self.evictions += 1
                self.version += 1
                if self.host_capacity:
                    self.host[h] = None
                    if len(self.host) > self.host_capacity:
                        self.host.popitem(last=False)
                self.hash_of[b] = None
            self.ref[b] = 1
            out.append(b)
        self.num_free = len(self.free)
        return as_ids(out)

    def cache_run(self, blocks: Ids, hashes: Ids, start: int = 0) -> None:
        for b, h in zip(blocks[start:].tolist(), hashes[start:].tolist(), strict=True):
            if h not in self.cached:
                self.cached[h] = b
                self.hash_of[b] = h
                self.host.pop(h, None)
                self.version += 1

    def load_from_host(
        self, hashes: Sequence[int], blocks: Sequence[int] | Ids
    ) -> None:
        for h, b in zip(hashes, as_ids(blocks).tolist(), strict=True):
            self.host.pop(h, None)
            self.cache_run(as_ids([b]), as_ids([h]))
        self.version += 1

    def release(self, blocks: Sequence[int] | Ids) -> None:
        for b in reversed(as_ids(blocks).tolist()):
            self.ref[b] -= 1
            if self.ref[b] == 0:
                self.free[b] = None
        self.num_free = len(self.free)

    def reset(self) -> int:
        dropped = len(self.host)
        self.version += 1
        for b in self.free:
            h = self.hash_of[b]
            if h is not None:
                del self.cached[h]
                self.hash_of[b] = None
                dropped += 1
        self.host.clear()
        return dropped


@dataclass(frozen=True)
class _Arrival:
    step: int  # scheduler steps before it arrives
    tokens: list[int]
    output: int
    abort_after: int | None  # steps after arriving, or None


def _workload(seed: int, bs: int) -> list[_Arrival]:
    """Sessions whose turns grow their history, some forking subagents that share
    the system prefix; prompts from one to several times the KV's share."""
    rng = random.Random(seed)
    systems = [[rng.randrange(50_000) for _ in range(rng.randrange(bs, 12 * bs))]]
    systems.append(systems[0][: rng.randrange(1, len(systems[0]))])
    arrivals: list[_Arrival] = []
    at = 0
    for _ in range(14):
        history = list(rng.choice(systems))
        for _ in range(rng.randrange(1, 6)):
            history += [rng.randrange(50_000) for _ in range(rng.randrange(1, 9 * bs))]
            fork = rng.random() < 0.3
            tokens = history[: rng.randrange(1, len(history) + 1)] if fork else history
            abort = rng.randrange(1, 40) if rng.random() < 0.1 else None
            arrivals.append(_Arrival(at, list(tokens), rng.randrange(1, 30), abort))
            at += rng.randrange(0, 6)
    return arrivals


def _run(
    config: SimConfig, arrivals: list[_Arrival], reference: bool, decode_runs: bool
) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]], tuple[int, int]]:
    core = Scheduler(config)
    if reference:
        core.pool = ReferencePool(core.pool.num_blocks, core.pool.host_capacity)
    bs = config.block_size
    reqs: list[CoreRequest] = []
    aborts: dict[int, list[CoreRequest]] = {}
    steps: list[tuple[object, ...]] = []
    pending = list(arrivals)
    n = 0
    while pending or not core.idle:
        while pending and pending[0].step <= n:
            a = pending.pop(0)
            req = CoreRequest(len(a.tokens), a.output, block_hashes(a.tokens, bs))
            reqs.append(req)
            core.add(req)
            if a.abort_after is not None:
                aborts.setdefault(n + a.abort_after, []).append(req)
        for req in aborts.pop(n, []):
            core.abort(req)
        k = core.decode_run() if decode_runs else 0
        if k > 1 and core.decode_steps(k - 1):
            steps.append(("decode", k - 1))
        result = core.step()
        if result is not None:
            emitted = [reqs.index(r) for r in result.emitted]
            steps.append(
                (result.duration_us, emitted, [r.held().tolist() for r in core.running])
            )
        n += 1
        assert n < 100_000, "the workload does not drain"
    per_request = [
        (r.cached_tokens, r.host_hit_tokens, r.preemptions, r.generated, r.state)
        for r in reqs
    ]
    return per_request, steps, (core.pool.evictions, core.pool.num_free)


@pytest.mark.parametrize("seed", range(12))
def test_array_pool_equals_block_by_block_reference(seed: int) -> None:
    rng = random.Random(1000 + seed)
    bs = rng.choice([2, 4, 16])
    blocks = rng.randrange(24, 120)
    config = SimConfig.fast(
        block_size=bs,
        kv_capacity_tokens=blocks * bs,
        max_model_len=(blocks - 1) * bs,
        max_num_batched_tokens=rng.choice([bs, 7 * bs, 4096]),
        max_num_seqs=rng.choice([2, 8, 256]),
        host_capacity_tokens=rng.choice([0, 0, 40 * bs]),
        policy=rng.choice(["vllm", "vllm", "reserve"]),
        prefill_us_per_token=1.0,
        decode_base_ms=1.0,
    )
    # As the front end refuses what the server would (prompt + output past
    # max_model_len): the rest fits an empty pool.
    arrivals = [
        a
        for a in _workload(seed, bs)
        if len(a.tokens) + a.output <= config.max_model_len
    ]
    decode_runs = seed % 2 == 0
    fast = _run(config, arrivals, reference=False, decode_runs=decode_runs)
    slow = _run(config, arrivals, reference=True, decode_runs=decode_runs)
    assert fast[0] == slow[0]  # cached tokens, host hits, preemptions, per request
    assert fast[1] == slow[1]  # every step: time, tokens, blocks held
    assert fast[2] == slow[2]
    # The workload hit the cache and ran out of room.
    assert any(cached > 0 for cached, *_ in fast[0])
    assert fast[2][0] > 0


def test_array_pool_lookups_equal_reference_under_random_operations() -> None:
    """Pool operations in any order (lookups memoized or not), as a request's
    life makes them: touch the hits, take the rest, cache, release."""
    rng = random.Random(7)
    for host_blocks in (0, 12):
        pools = [BlockPool(40, host_blocks), ReferencePool(40, host_blocks)]
        prefixes = [
            [rng.randrange(9) for _ in range(rng.randrange(4, 60))] for _ in range(6)
        ]
        held: list[list[Ids]] = [[], []]
        for _ in range(600):
            if held[0] and (rng.random() < 0.45 or pools[0].num_free < 12):
                i = rng.randrange(len(held[0]))
                for pool, blocks in zip(pools, held, strict=True):
                    pool.release(blocks.pop(i))
                continue
            tokens = rng.choice(prefixes) + [
                rng.randrange(9) for _ in range(rng.randrange(0, 30))
            ]
            hashes = as_ids(block_hashes(tokens, 2))
            limit = rng.randrange(len(hashes) + 2)
            found = [pool.lookup_ids(hashes, limit) for pool in pools]
            assert found[0][0].tolist() == found[1][0].tolist()
            assert found[0][1] == found[1][1]
            gpu, host = found[0]
            want = min(len(hashes), 12)
            host = host[: max(0, want - len(gpu))]
            need = want - len(gpu)
            if need < 0 or need > pools[0].num_free - pools[0].count_unheld(gpu):
                continue
            for pool, blocks in zip(pools, held, strict=True):
                pool.touch(gpu)
                fresh = pool.take_ids(need)
                pool.load_from_host(host, fresh[: len(host)])
                chain = np.concatenate((gpu, fresh))
                pool.cache_run(chain, hashes[: len(chain)], len(gpu) + len(host))
                blocks.append(chain)
            assert [p.num_free for p in pools] == [pools[1].num_free] * 2
            assert pools[0].evictions == pools[1].evictions
            assert list(pools[0].host) == list(pools[1].host)
            if rng.random() < 0.02:
                assert pools[0].reset() == pools[1].reset()


@pytest.mark.parametrize("seed", range(4))
def test_index_finds_what_a_dict_holds_through_inserts_and_removals(seed: int) -> None:
    """The prefix cache's index (batches past and under its one-by-one threshold,
    tombstones, rebuilds) against a dict."""
    rng = random.Random(seed)
    size = 3000
    index = _HashTable(size)
    truth: dict[int, int] = {}
    free = list(range(size))
    for _ in range(400):
        if truth and rng.random() < 0.4:
            gone = rng.sample(sorted(truth), min(len(truth), rng.randrange(1, 300)))
            index.remove(as_ids([truth[k] for k in gone]))
            for k in gone:
                free.append(truth.pop(k))
        else:
            n = min(len(free), rng.randrange(1, 300))
            keys = {rng.randrange(-(2**63), 2**63) for _ in range(n)} - truth.keys()
            vals = [free.pop() for _ in keys]
            # Some keys again: they keep their values.
            again = rng.sample(sorted(truth), min(len(truth), rng.randrange(0, 40)))
            added = index.add(
                as_ids([*keys, *again]), as_ids([*vals, *range(len(again))])
            )
            assert added.tolist() == [True] * len(keys) + [False] * len(again)
            truth.update(zip(keys, vals, strict=True))
        probe = rng.sample(sorted(truth), min(len(truth), 100))
        probe += [rng.randrange(-(2**63), 2**63) for _ in range(rng.randrange(1, 40))]
        slots = index.find(as_ids(probe))
        got = [int(index.vals[s]) if s >= 0 else -1 for s in slots.tolist()]
        assert got == [truth.get(k, -1) for k in probe]
        assert [index.find_one(k) for k in probe[:20]] == got[:20]
