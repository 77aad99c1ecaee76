"""Trace statistics and ideal cache hits, checked against a reference computed here
from the raw JSON with plain ``json`` and a set-based walk (never the tool's output)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.builders import request, session, subagent, trace_of
from traces import ideal_cached_tokens, read_trace, trace_stats
from traces.model import Scope, Trace


def _percentile(values: list[int], q: float) -> float:
    """Linear interpolation between closest ranks (the documented method)."""
    xs = sorted(values)
    rank = q / 100 * (len(xs) - 1)
    lo = math.floor(rank)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (rank - lo)


def _summary(values: list[int]) -> dict[str, float]:
    return {
        "mean": sum(values) / len(values),
        "p50": _percentile(values, 50),
        "p90": _percentile(values, 90),
        "p99": _percentile(values, 99),
        "max": max(values),
    }


def _leading_hit(ids: list[int], seen: set[int]) -> int:
    n = 0
    for h in ids:
        if h not in seen:
            break
        n += 1
    return n


def _reference_weka(files: list[Path]) -> dict[str, Any]:
    """Stats of Weka files: requests walked in file order (a subagent's requests sit
    between its anchor and its join), one hash namespace per file (local scope)."""
    ins: list[int] = []
    outs: list[int] = []
    hits = 0
    with_subagents = subagent_sessions = 0

    def walk(entries: list[dict[str, Any]], seen: set[int], block: int) -> int:
        nonlocal hits, subagent_sessions
        subs = 0
        for e in entries:
            if e["type"] == "subagent":
                subs += 1
                subagent_sessions += 1
                walk(e["requests"], seen, block)
                continue
            ins.append(e["in"])
            outs.append(e["out"])
            hits += min(_leading_hit(e["hash_ids"], seen) * block, e["in"])
            seen.update(e["hash_ids"])
        return subs

    for f in files:
        raw = json.loads(f.read_text())
        if walk(raw["requests"], set(), raw["block_size"]):
            with_subagents += 1
    return {
        "sessions": len(files),
        "requests": len(ins),
        "sessions_with_subagents": with_subagents,
        "subagent_sessions": subagent_sessions,
        "input_tokens": _summary(ins),
        "output_tokens": _summary(outs),
        "ideal_cache_hit_rate": hits / sum(ins),
    }


def _reference_mooncake(path: Path) -> dict[str, Any]:
    """One global namespace in line order; 512-token blocks, partial tail hashed."""
    ins: list[int] = []
    outs: list[int] = []
    hits = 0
    seen: set[int] = set()
    for line in path.read_text().splitlines():
        obj = json.loads(line)
        ins.append(obj["input_length"])
        outs.append(obj["output_length"])
        hits += min(_leading_hit(obj["hash_ids"], seen) * 512, obj["input_length"])
        seen.update(obj["hash_ids"])
    return {
        "sessions": len(ins),
        "requests": len(ins),
        "sessions_with_subagents": 0,
        "subagent_sessions": 0,
        "input_tokens": _summary(ins),
        "output_tokens": _summary(outs),
        "ideal_cache_hit_rate": hits / sum(ins),
    }


def _assert_stats_match(got: dict[str, Any], want: dict[str, Any]) -> None:
    for key, value in want.items():
        assert got[key] == pytest.approx(value, rel=1e-12), key


def test_stats_real_weka_match_reference(weka_dir: Path) -> None:
    want = _reference_weka(sorted(weka_dir.glob("*.json")))
    assert want["sessions"] == 30
    assert want["sessions_with_subagents"] == 9  # documented in data/README.md
    _assert_stats_match(trace_stats(read_trace(weka_dir)).as_dict(), want)


def test_stats_real_mooncake_match_reference(mooncake_file: Path) -> None:
    want = _reference_mooncake(mooncake_file)
    _assert_stats_match(trace_stats(read_trace(mooncake_file)).as_dict(), want)


def test_stats_ideal_hit_counts_only_the_leading_run() -> None:
    reqs = [request([1, 2, 3]), request([1, 9, 3]), request([1, 9, 3, 4])]
    hits = ideal_cached_tokens(trace_of(session("s", reqs, block_size=4)))
    # Block 3 of request 1 was seen, but after a miss: a prefix cache cannot use it.
    assert hits == {("s", 0): 0, ("s", 1): 4, ("s", 2): 12}


def test_stats_ideal_hit_is_capped_at_input_tokens() -> None:
    # Mooncake-style: the partial tail block is hashed too (10 tokens, 3 blocks of 4).
    reqs = [request([1, 2, 3], input_tokens=10), request([1, 2, 3], input_tokens=10)]
    s = session("s", reqs, block_size=4)
    assert ideal_cached_tokens(trace_of(s))[("s", 1)] == 10


def test_stats_ideal_hit_scope_local_vs_global() -> None:
    def two(scope: Scope) -> Trace:
        return trace_of(
            *(
                session(sid, [request([7, 8])], block_size=4, scope=scope)
                for sid in ("a", "b")
            )
        )

    assert ideal_cached_tokens(two("local"))[("b", 0)] == 0
    assert ideal_cached_tokens(two("global"))[("b", 0)] == 8


def test_stats_ideal_hit_follows_subagent_spawn_and_join_order() -> None:
    sub = session("p/x", [request([1, 5])], block_size=4)
    parent = session(
        "p",
        [request([1, 2]), request([1, 5, 6]), request([]), request([1, 2])],
        subagents=[subagent(sub, anchor=0, join=1, agent_id="x")],
        block_size=4,
    )
    hits = ideal_cached_tokens(trace_of(parent))
    assert hits[("p/x", 0)] == 4  # sees its parent's first request (spawned after it)
    assert hits[("p", 1)] == 8  # the join sees the subagent's block 5
    assert hits[("p", 2)] == 0  # empty hash ids: nothing to hit
    assert hits[("p", 3)] == 8


def _reference_hits(trace: Trace) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    global_seen: set[int] = set()
    for root in trace.sessions:
        seen = global_seen if root.hash_id_scope == "global" else set()
        for sess, i, r in root.ordered_requests():
            ids = r.hash_ids.tolist()
            blocks = _leading_hit(ids, seen)
            out[(sess.session_id, i)] = min(blocks * sess.block_size, r.input_tokens)
            seen.update(ids)
    return out


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_stats_ideal_hits_match_set_based_reference(
    trace_strategy: st.SearchStrategy[Trace], data: st.DataObject
) -> None:
    trace = data.draw(trace_strategy)
    assert ideal_cached_tokens(trace) == _reference_hits(trace)
    stats = trace_stats(trace)
    assert stats.requests == sum(
        1 for r in trace.sessions for _ in r.ordered_requests()
    )
    assert stats.subagent_sessions == sum(1 for _, d in trace.all_sessions() if d > 0)
