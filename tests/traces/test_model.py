"""The trace model: read-only int64 hash ids, value equality, tree order."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.builders import request, session, subagent, trace_of
from traces import read_trace
from traces.model import Request, Subagent

_BLOCK = 64  # the model's default block size


def _req(ids: list[int]) -> Request:
    return request(ids, block_size=_BLOCK)


def test_model_hash_ids_are_read_only_int64() -> None:
    source = np.array([1, 2, 3], dtype=np.int32)
    r = _req([1, 2, 3])
    r2 = Request(input_tokens=192, output_tokens=1, hash_ids=source)
    for got in (r.hash_ids, r2.hash_ids):
        assert got.dtype == np.int64
        with pytest.raises(ValueError, match="read-only"):
            got[0] = 9
    writable = np.array([4, 5], dtype=np.int64)
    r3 = Request(input_tokens=128, output_tokens=1, hash_ids=writable)
    writable[0] = 7  # the caller's array stays writable; ours is a read-only view
    assert not r3.hash_ids.flags.writeable


def test_model_request_equality_compares_ids_by_value() -> None:
    assert _req([1, 2]) == _req([1, 2])
    assert _req([1, 2]) != _req([1, 3])
    with pytest.raises(TypeError):
        hash(_req([1]))


def test_model_ordered_requests_places_subagents_between_anchor_and_join() -> None:
    def sub(sid: str, anchor: int, join: int | None) -> Subagent:
        s = session(sid, [_req([9])], block_size=_BLOCK)
        return subagent(s, anchor=anchor, join=join, agent_id=sid)

    parent = session(
        "p",
        [_req([1]), _req([2])],
        subagents=(
            sub("first", -1, 0),
            sub("a", 0, 1),
            sub("b", 0, 1),
            sub("bg", 1, None),
        ),
        block_size=_BLOCK,
    )
    order = [(s.session_id, i) for s, i, _ in parent.ordered_requests()]
    assert order == [("first", 0), ("p", 0), ("a", 0), ("b", 0), ("p", 1), ("bg", 0)]
    assert parent.request_count() == 6
    assert [d for _, d in parent.walk()] == [0, 1, 1, 1, 1]
    assert [s.agent_id for s in parent.subagents_at(0)] == ["a", "b"]
    trace = trace_of(parent)
    assert (len(trace), trace.request_count()) == (1, 6)


def test_model_real_parallel_subagent_groups_share_anchor(weka_dir: Path) -> None:
    trace = read_trace(weka_dir)
    groups = [
        len(s.subagents_at(a))
        for s in trace.sessions
        for a in {sub.anchor_index for sub in s.subagents}
    ]
    assert max(groups) > 1  # some sessions spawn several subagents at once
    for s in trace.sessions:
        for sub in s.subagents:
            assert sub.join_index in (sub.anchor_index + 1, None)
            assert sub.session.session_id == f"{s.session_id}/{sub.agent_id}"
