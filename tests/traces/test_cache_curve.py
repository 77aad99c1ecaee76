"""Hit rate against KV budget (``traces.cache_curve``) and the replay order it assumes
(``traces.sendorder``): values worked by hand, equality with ``lru_hits``, and the
curve's invariants on random and real traces."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.builders import session, subagent, trace_of
from traces.cache import lru_hits
from traces.cache_curve import (
    cache_curve,
    inflight_tokens,
    model_of_requests,
    trace_model,
)
from traces.errors import TraceError
from traces.io import read_trace
from traces.model import Request, Trace
from traces.sendorder import send_order
from traces.stats import ideal_hit_totals

WEKA = Path(__file__).resolve().parents[2] / ".." / "shared" / "data" / "weka"
BS = 10  # tokens per block in the handmade traces


def _req(ids: list[int], tokens: int, api_s: float, think_s: float = 0.0) -> Request:
    return Request(
        input_tokens=tokens,
        output_tokens=1,
        hash_ids=np.asarray(ids, dtype=np.int64),
        api_time_s=api_s,
        think_time_s=think_s,
    )


def _two_sessions() -> Trace:
    """Session A: [1,2] 20 tok, [1,2,3] 30 tok, [1,2,3,4] 35 tok, 1 s each.
    Session B: [1,2,3] 30 tok, [1,2,3,4,5] 50 tok, 1.5 s each. Separate namespaces.
    At concurrency 2 with no think time the sends are A0@0, B0@0, A1@1, B1@1.5, A2@2."""
    a = session(
        "A",
        [_req([1, 2], 20, 1.0), _req([1, 2, 3], 30, 1.0), _req([1, 2, 3, 4], 35, 1.0)],
        block_size=BS,
    )
    b = session(
        "B", [_req([1, 2, 3], 30, 1.5), _req([1, 2, 3, 4, 5], 50, 1.5)], block_size=BS
    )
    return trace_of(a, b)


def _order(trace: Trace, **kw: float) -> list[tuple[str, int, float]]:
    lanes = int(kw.pop("concurrency", 1))
    cap = kw.pop("max_inflight", None)
    return [
        (s.session.session_id, s.index, s.send_s)
        for s in send_order(
            trace,
            concurrency=lanes,
            max_inflight=None if cap is None else int(cap),
            **kw,
        )
    ]


def test_send_order_interleaves_lanes_by_recorded_durations() -> None:
    order = _order(_two_sessions(), concurrency=2, think_scale=0.0)
    assert order == [
        ("A", 0, 0.0),
        ("B", 0, 0.0),
        ("A", 1, 1.0),
        ("B", 1, 1.5),
        ("A", 2, 2.0),
    ]
    # One lane: the second tree starts when the first has drained (3 s).
    assert [(s, i) for s, i, _ in _order(_two_sessions(), think_scale=0.0)] == [
        ("A", 0),
        ("A", 1),
        ("A", 2),
        ("B", 0),
        ("B", 1),
    ]
    assert _order(_two_sessions(), think_scale=0.0)[3][2] == 3.0


def _tree() -> Trace:
    """P0 (1 s) spawns a (a0 2 s, a1 1 s) and b (b0 0.5 s), both joined at P1; P1
    (1 s); P2 after a 10 s think; bg spawned after P1, never joined (b0 4 s).
    Then tree Q."""
    a = session("P/a", [_req([1], 4, 2.0), _req([1, 2], 8, 1.0)], block_size=BS)
    b = session("P/b", [_req([1], 4, 0.5)], block_size=BS)
    bg = session("P/bg", [_req([1], 4, 4.0)], block_size=BS)
    p = session(
        "P",
        [_req([1], 4, 1.0), _req([1], 4, 1.0), _req([1], 4, 1.0, think_s=10.0)],
        subagents=(
            subagent(a, anchor=0, join=1),
            subagent(b, anchor=0, join=1),
            subagent(bg, anchor=1, join=None),
        ),
        block_size=BS,
    )
    q = session("Q", [_req([1], 4, 1.0)], block_size=BS)
    return trace_of(p, q)


def test_send_order_subagents_run_beside_their_parent_and_join() -> None:
    assert _order(_tree(), think_scale=0.5) == [
        ("P", 0, 0.0),
        ("P/a", 0, 1.0),  # spawned when P0 ends, both subagents at once
        ("P/b", 0, 1.0),
        ("P/a", 1, 3.0),
        ("P", 1, 4.0),  # waits for a (ends at 4), not only b (1.5)
        ("P/bg", 0, 5.0),  # background: beside P2
        ("P", 2, 10.0),  # 5 + 10 s think x 0.5
        ("Q", 0, 11.0),  # the lane frees when P2 (ends 11) and bg (ends 9) are done
    ]


def test_send_order_max_inflight_queues_due_requests_fifo() -> None:
    # One slot: B0 waits for A0 (ends 1); A1, due at 1, waits behind B0 (ends 2.5)...
    order = _order(_two_sessions(), concurrency=2, think_scale=0.0, max_inflight=1)
    assert order == [
        ("A", 0, 0.0),
        ("B", 0, 1.0),
        ("A", 1, 2.5),
        ("B", 1, 3.5),
        ("A", 2, 5.0),
    ]
    sent = send_order(_two_sessions(), concurrency=2, think_scale=0.0, max_inflight=1)
    assert [s.end_s for s in sent] == [1.0, 2.5, 3.5, 5.0, 6.0]
    # A cap no lower than the lanes changes nothing.
    assert _order(
        _two_sessions(), concurrency=2, think_scale=0.0, max_inflight=2
    ) == _order(_two_sessions(), concurrency=2, think_scale=0.0)


def test_send_order_bad_arguments() -> None:
    with pytest.raises(ValueError, match="concurrency"):
        send_order(_tree(), concurrency=0)
    with pytest.raises(ValueError, match="think scale"):
        send_order(_tree(), concurrency=1, think_scale=-1.0)
    with pytest.raises(ValueError, match="in-flight"):
        send_order(_tree(), concurrency=1, max_inflight=0)


def test_inflight_tokens_by_hand() -> None:
    # Held = input + output (1): A0 21, B0 31, A1 31, B1 51, A2 36. At concurrency 2
    # (sends A0@0 B0@0 A1@1 B1@1.5 A2@2; ends 1, 1.5, 2, 3, 3) the requests in flight
    # at each send hold 21, 52, 62, 82, 87: p90 = 82 + 0.6 x 5 = 85.
    order = send_order(_two_sessions(), concurrency=2, think_scale=0.0)
    assert inflight_tokens(order, block_size=BS, block_tokens=BS) == 85
    # Twice the tokens per block: prompts double, outputs do not (41 .. 172: 168).
    assert inflight_tokens(order, block_size=BS, block_tokens=2 * BS) == 168
    # One in flight: each alone, 21, 31, 31, 51, 36: p90 = 36 + 0.6 x 15 = 45.
    one = send_order(_two_sessions(), concurrency=2, think_scale=0.0, max_inflight=1)
    assert inflight_tokens(one, block_size=BS, block_tokens=BS) == 45
    curve = cache_curve(
        _two_sessions(), concurrency=2, think_scale=0.0, budgets_tokens=[80, 90]
    )
    assert curve.inflight_tokens == 85
    assert [curve.below_inflight(p.budget_tokens) for p in curve.points] == [
        True,
        False,
    ]


# LRU by hand, order A0, B0, A1, B1, A2 (recency lists, most recent first):
#  A0 [a1 a2]: cold.                    -> a1 a2
#  B0 [b1 b2 b3]: cold.                 -> b1 b2 b3 a1 a2
#  A1 [a1 a2 a3]: ranks 4, 5, unseen.   hits 10 at C=4, 20 at C>=5
#  B1 [b1..b5]: ranks 4, 5, 6, unseen.  hits 10 at C=4, 20 at 5, 30 at C>=6
#  A2 [a1..a4]: ranks 6, 7, 8, unseen.  hits 10 at C=6, 20 at 7, 30 at C>=8
# Σ input 165; ideal 0 + 0 + 20 + 30 + 30 = 80.
_LRU_BY_HAND = {0: 0, 3: 0, 4: 20, 5: 40, 6: 60, 7: 70, 8: 80, 100: 80}
# Belady (keep the blocks used soonest; drop the deepest of the latest first):
#  C=2: after B0 keeps a1 a2 (next: A1); A1 hits 20, keeps a1 a2 (next: A2) over
#       a3; B1 hits nothing; A2 hits 20.                                 -> 40
#  C=3: after B0 a1 a2 b1; A1 20; keeps b1 a1 a2; B1 10; A2 20.         -> 50
#  C=4: after B0 a1 a2 b1 b2; A1 20; b1 b2 a1 a2; B1 20; A2 20.         -> 60
#  C=5: all of B0 kept; A1 20; a3 dropped; B1 30; A2 20.                -> 70
#  C=6: everything reused is kept.                                      -> 80
_BELADY_BY_HAND = {0: 0, 2: 40, 3: 50, 4: 60, 5: 70, 6: 80, 100: 80}


def test_cache_model_matches_values_worked_by_hand() -> None:
    model = trace_model(_two_sessions(), concurrency=2, think_scale=0.0)
    assert model.input_tokens == 165
    assert {c: model.lru_hit_tokens(c) for c in _LRU_BY_HAND} == _LRU_BY_HAND
    assert {c: model.belady_hit_tokens(c) for c in _BELADY_BY_HAND} == _BELADY_BY_HAND
    assert model.lru_unbounded_tokens() == 80
    assert ideal_hit_totals(_two_sessions()) == (80, 165)


def test_ids_repeated_inside_a_request_hit_per_position_by_hand() -> None:
    """A request that repeats an id looks the same block up twice: both positions
    hit when the block is cached (as ``lru_hits`` counts them), and Belady holds the
    block once. Block size 1; (namespace, ids, input tokens)."""

    def curve(reqs: list[tuple[int, list[int], int]]) -> list[tuple[int, int]]:
        model = model_of_requests(
            [(ns, np.asarray(ids, dtype=np.int64), t) for ns, ids, t in reqs],
            block_size=1,
        )
        return [(model.lru_hit_tokens(c), model.belady_hit_tokens(c)) for c in range(4)]

    # [1] then [1, 1]: one cached block serves both positions.
    assert curve([(0, [1], 1), (0, [1, 1], 2)]) == [(0, 0), (2, 2), (2, 2), (2, 2)]
    # [1, 2] then [1, 2, 1, 2]: 1 block keeps the head (1 hit); 2 hold both (4 hits).
    assert curve([(0, [1, 2], 2), (0, [1, 2, 1, 2], 4)]) == [
        (0, 0),
        (1, 1),
        (4, 4),
        (4, 4),
    ]
    # [1, 1] alone, then [3, 1]: the repeat inside the first request misses (not
    # cached before it), and [3, 1] misses at its head.
    assert curve([(0, [1, 1], 2), (0, [3, 1], 2)]) == [(0, 0)] * 4


def test_cache_curve_knee_and_server_side_by_hand() -> None:
    curve = cache_curve(
        _two_sessions(),
        concurrency=2,
        think_scale=0.0,
        budgets_tokens=[40, 59, 80],  # 59 tokens round down to 5 blocks
        server_kv_tokens=70,
    )
    assert curve.ceiling_hit_rate == pytest.approx(80 / 165)
    assert [p.lru_hit_rate * 165 for p in curve.points] == pytest.approx([20, 40, 80])
    assert [p.belady_hit_rate * 165 for p in curve.points] == pytest.approx(
        [60, 70, 80]
    )
    # Ceiling - 5 points = 71.75 tokens: 7 blocks hit 70, 8 blocks hit 80.
    assert curve.knee_tokens == 80
    assert curve.server is not None
    assert curve.server.lru_hit_rate * 165 == pytest.approx(70)
    assert curve.server_above_knee is False
    # Budgets in server tokens: 16 tokens per trace block, so the knee is 8 x 16.
    assert cache_curve(
        _two_sessions(), concurrency=2, think_scale=0.0, block_tokens=16
    ).knee_tokens == (8 * 16)


def test_cache_curve_rejects_mixed_block_sizes() -> None:
    a = session("A", [_req([1], 10, 1.0)], block_size=10)
    b = session("B", [_req([1], 16, 1.0)], block_size=16)
    with pytest.raises(TraceError, match="one block size"):
        trace_model(trace_of(a, b), concurrency=1)


@st.composite
def _request_orders(draw: st.DrawFn) -> tuple[int, list[tuple[int, np.ndarray, int]]]:
    """Requests of a few namespaces in some order: chains that grow, restart from a
    shorter head, or (rarely) arbitrary ids; inputs cut the last block or run past
    the hashed blocks."""
    bs = draw(st.sampled_from([1, 4, 10]))
    chains: dict[int, list[int]] = {}
    out = []
    for _ in range(draw(st.integers(1, 40))):
        ns = draw(st.integers(0, 3))
        chain = chains.get(ns, [])
        if chain and draw(st.integers(0, 5)) == 0:
            chain = chain[: draw(st.integers(0, len(chain)))]
        top = max(chain, default=ns * 1000)
        chain = chain + list(range(top + 1, top + 1 + draw(st.integers(0, 5))))
        if draw(st.integers(0, 9)) == 0:
            ids = draw(st.lists(st.integers(0, 8), max_size=5))
        else:
            chains[ns] = ids = chain
        tokens = max(0, len(ids) * bs - draw(st.integers(0, bs - 1)))
        tokens += draw(st.sampled_from([0, 0, 7]))
        out.append((ns, np.asarray(ids, dtype=np.int64), tokens))
    return bs, out


@st.composite
def _repeating_orders(draw: st.DrawFn) -> tuple[int, list[tuple[int, np.ndarray, int]]]:
    """Requests of arbitrary ids from a small set, so that ids repeat inside a
    request and across requests in every pattern."""
    bs = draw(st.sampled_from([1, 4]))
    out = []
    for _ in range(draw(st.integers(1, 12))):
        ids = draw(st.lists(st.integers(0, 5), max_size=6))
        tokens = max(0, len(ids) * bs - draw(st.integers(0, bs - 1)))
        tokens += draw(st.sampled_from([0, 0, 7]))
        out.append((draw(st.integers(0, 1)), np.asarray(ids, dtype=np.int64), tokens))
    return bs, out


@settings(max_examples=300, deadline=None)
@given(st.one_of(_request_orders(), _repeating_orders()))
def test_lru_curve_equals_lru_hits_at_every_budget(
    case: tuple[int, list[tuple[int, np.ndarray, int]]],
) -> None:
    bs, reqs = case
    model = model_of_requests(reqs, block_size=bs)
    lru = []
    for c in range(0, 45):
        want = int(lru_hits(reqs, block_size=bs, capacity_tokens=c * bs).sum())
        assert model.lru_hit_tokens(c) == want, c
        lru.append(want)
        assert model.belady_hit_tokens(c) >= want, c
    assert lru == sorted(lru)


def _weka() -> Trace:
    if not WEKA.is_dir():
        pytest.skip("shared Weka sample not present")
    return read_trace(WEKA)


def test_cache_curve_on_real_sessions_is_monotone_and_reaches_the_ideal() -> None:
    trace = _weka()
    curve = cache_curve(trace, concurrency=8)
    hit, total = ideal_hit_totals(trace)
    assert curve.ceiling_hit_rate == hit / total
    assert curve.lru_unbounded_hit_rate == hit / total
    lru = [p.lru_hit_rate for p in curve.points]
    belady = [p.belady_hit_rate for p in curve.points]
    assert len(lru) == 20
    assert lru == sorted(lru)
    assert belady == sorted(belady)
    assert all(b >= a for a, b in zip(lru, belady, strict=True))
    assert lru[-1] == curve.ceiling_hit_rate  # the last default budget is saturated
    assert curve.knee_tokens is not None
    knee = curve.knee_tokens // curve.block_tokens
    model = trace_model(trace, concurrency=8)
    limit = hit - 0.05 * total
    assert model.lru_hit_tokens(knee) >= limit > model.lru_hit_tokens(knee - 1)


def test_more_lanes_share_the_same_budget_and_hit_less() -> None:
    """At a budget of about one session's context, 8 lanes interleaved hit less than
    one lane playing the trees one after the other: the model sees the order."""
    trace = _weka()
    with_subs = [s for s in trace.sessions if s.subagents]
    sub_trace = Trace(sessions=tuple(with_subs), source_format="weka")
    one = trace_model(sub_trace, concurrency=1)
    eight = trace_model(sub_trace, concurrency=8)
    budget = 2000  # blocks: ~128K tokens, about one session's context
    assert one.lru_hit_tokens(budget) > eight.lru_hit_tokens(budget)
