"""The virtual engine: its shortcut over pure decode steps gives the same token times,
cache and counters as stepping one by one; the live and virtual rules of when a step
starts (first arrival, next step planned at a step's end)."""

from __future__ import annotations

import random

import pytest

from replayer.sim.cache import block_hashes
from replayer.sim.config import SimConfig
from replayer.sim.core import CoreRequest
from replayer.sim.virtual import VirtualEngine, VirtualRequest


class _Counting(VirtualEngine):
    runs = 0

    def _decode_run(self, start: int, limit_ns: int | None) -> bool:
        ran = super()._decode_run(start, limit_ns)
        self.runs += ran
        return ran


class _OneByOne(VirtualEngine):
    def _decode_run(self, start: int, limit_ns: int | None) -> bool:
        return False


def _drive(engine: VirtualEngine, seed: int) -> list[list[int]]:
    """Arrivals over time, some sharing prefixes, limits like a loop's timers."""
    rng = random.Random(seed)
    prefixes = [
        [rng.randrange(1000, 9000) for _ in range(rng.randrange(64, 400))]
        for _ in range(3)
    ]
    requests: list[VirtualRequest] = []
    now = 0
    for _ in range(40):
        ids = rng.choice(prefixes) + [
            rng.randrange(1000, 9000) for _ in range(rng.randrange(1, 200))
        ]
        core = CoreRequest(len(ids), rng.randrange(1, 120), block_hashes(ids, 16))
        req = VirtualRequest(core, now)
        core.handle = req
        requests.append(req)
        engine.submit(req, now)
        now += rng.randrange(0, 60_000_000)  # up to 60 ms to the next arrival
        while engine.advance(now) is not None:
            pass
    while engine.advance(None) is not None:
        pass
    assert all(r.core.finished for r in requests)
    return [r.token_times_ns for r in requests]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("kv", [2_048, 16_384])
def test_decode_shortcut_equals_stepping(seed: int, kv: int) -> None:
    config = SimConfig(
        kv_capacity_tokens=kv, max_model_len=kv - 16, max_num_batched_tokens=512
    )
    fast, slow = _Counting(config), _OneByOne(config)
    assert _drive(fast, seed) == _drive(slow, seed)
    assert fast.steps == slow.steps
    assert fast.busy_ns == slow.busy_ns
    assert fast.core.stats == slow.core.stats
    assert fast.core.pool.evictions == slow.core.pool.evictions
    # The shortcut ran and, with the small KV, so did preemption.
    assert fast.runs > 0
    if kv == 2_048:
        assert slow.core.stats.preemptions > 0
