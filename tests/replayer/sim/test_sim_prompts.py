"""PromptHashes: its incremental hashes equal a full parse's, whatever came before."""

from __future__ import annotations

import random

import orjson
import pytest

from replayer.sim.cache import block_hashes
from replayer.sim.prompts import PromptHashes
from replayer.sim.wire import ApiError


def _body(ids: list[int]) -> bytes:
    return b'{"model":"m","prompt":' + orjson.dumps(ids) + b',"max_tokens":3}'


def test_incremental_hashes_equal_full_hashing_over_growing_sessions() -> None:
    rng = random.Random(7)
    hashes = PromptHashes(block_size=16, max_bytes=1 << 20)
    system = [rng.randrange(0, 99_999) for _ in range(700)]
    histories = [list(system) for _ in range(5)]
    reused = 0
    for _ in range(120):
        k = rng.randrange(5)
        h = histories[k]
        if rng.random() < 0.1:  # an edit inside the history: a shorter common prefix
            h[rng.randrange(len(system), len(h) + 1) - 1] += 1
        # Numbers of other widths at the joint: "12" then "123" must not match.
        h.extend(
            rng.randrange(0, 10 ** rng.randrange(1, 6))
            for _ in range(rng.randrange(1, 90))
        )
        split = hashes.split(_body(h))
        assert split is not None
        assert split.tokens == len(h)
        assert split.hashes == block_hashes(h, 16)
        assert orjson.loads(split.rest)["prompt"] == [0]
        assert orjson.loads(split.rest)["max_tokens"] == 3
        reused = hashes.reused_blocks
    assert reused > hashes.hashed_blocks  # the point: most blocks were not re-hashed


def test_block_aligned_prompts_and_bounded_memory() -> None:
    hashes = PromptHashes(block_size=4, max_bytes=200)
    ids = list(range(100, 132))  # 8 full blocks, no partial tail
    for n in (8, 16, 32, 32, 31):
        split = hashes.split(_body(ids[:n]))
        assert split is not None
        assert split.hashes == block_hashes(ids[:n], 4)
    assert hashes._seen.held_bytes <= 200


@pytest.mark.parametrize(
    "body",
    [
        b'{"model":"m","prompt":"some text"}',
        b'{"model":"m","prompt":[[1,2,3]]}',
        b'{"model":"m","messages":[{"role":"user","content":"hi"}]}',
        b'{"model":"m","prompt":[]}',
    ],
)
def test_other_prompts_are_left_to_the_full_parse(body: bytes) -> None:
    assert PromptHashes(16).split(body) is None


@pytest.mark.parametrize("ids", [b"1,2,-3", b"1,2.5,3", b'1,"x"'])
def test_bad_ids_are_refused_as_the_simulator_refuses_them(ids: bytes) -> None:
    with pytest.raises(ApiError) as info:
        PromptHashes(16).split(b'{"model":"m","prompt":[' + ids + b"]}")
    assert info.value.status == 400
