"""Each request's seeded fate in the simulator (output length, faults): one function,
so the HTTP simulator and the virtual-time engine decide alike. See
docs/engine-model.md."""

from __future__ import annotations

import random
from dataclasses import dataclass

from replayer.sim.config import SimConfig
from replayer.sim.wire import GenerateRequest, word_table


@dataclass(frozen=True, slots=True)
class Dice:
    """What the seeded RNG decided for one request."""

    output_tokens: int
    fail: bool
    disconnect_after: int | None  # content tokens sent before the connection drops
    stall_after: int | None  # content tokens sent before the stream pauses
    word_offset: int


def roll(rng: random.Random, cfg: SimConfig, req: GenerateRequest) -> Dice:
    """Draw one request's fate. Always the same values in the same order, so a seed
    fixes every request's fate whatever options the requests carry."""
    fail = rng.random() < cfg.fail_rate
    disconnect = rng.random() < cfg.disconnect_rate
    stall = rng.random() < cfg.stall_rate
    natural = 1 + int(rng.expovariate(1.0 / cfg.mean_output_tokens))
    u_disconnect, u_stall = rng.random(), rng.random()
    word_offset = rng.randrange(len(word_table()))
    if req.ignore_eos:
        n = req.max_tokens
    else:
        n = min(req.max_tokens, max(req.min_tokens, natural))
    return Dice(
        output_tokens=n,
        fail=fail,
        disconnect_after=1 + int(u_disconnect * max(1, n - 1)) if disconnect else None,
        stall_after=1 + int(u_stall * n) if stall else None,
        word_offset=word_offset,
    )
