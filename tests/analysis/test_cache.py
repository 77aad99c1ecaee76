"""Cache truth: LRU estimate over a run's start order, per-tree rates, miss impact."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from analysis.cache import lru_cached_tokens, miss_impact, request_cache, tree_cache
from analysis.load import records_frame
from analysis.sweep import pareto_front
from replayer.records import RequestRecord, records_to_table
from tests.builders import request, session, subagent, trace_of
from traces.model import Trace

MS = 1_000_000


@pytest.fixture
def trace() -> Trace:
    """Tree A: A0 [1,2], A1 [1,2,3], subagent A/x [1,7]; tree B: B0 [1,2]."""
    sub = session("A/x", [request([1, 7], input_tokens=20)], block_size=10)
    a = session(
        "A",
        [request([1, 2], input_tokens=20), request([1, 2, 3], input_tokens=30)],
        subagents=[subagent(sub, anchor=0, join=1, agent_id="x")],
        block_size=10,
    )
    b = session("B", [request([1, 2], input_tokens=20)], block_size=10)
    return trace_of(a, b)


def test_lru_follows_the_runs_start_order(
    trace: Trace, rec: Callable[..., RequestRecord]
) -> None:
    rows = [
        # Row order is not start order: A1 started last.
        rec(session_id="A", root_session_id="A", request_index=1, start_ns=30,
            prompt_tokens=30),
        rec(session_id="A", root_session_id="A", request_index=0, start_ns=10,
            prompt_tokens=20),
        rec(session_id="A/x", root_session_id="A", parent_session_id="A",
            agent_depth=1, request_index=0, start_ns=20, prompt_tokens=20),
        rec(session_id="B", root_session_id="B", request_index=0, start_ns=15,
            prompt_tokens=20),
        rec(session_id="Z", root_session_id="Z", request_index=0, start_ns=16),
    ]  # fmt: skip
    df = records_frame(records_to_table(rows))
    big = lru_cached_tokens(df, trace, block_size=10, capacity_tokens=1000)
    # A0 cold; B separate namespace cold; A/x hits block 1; A1 hits 1,2; Z unknown.
    assert big[:4].tolist() == [20.0, 0.0, 10.0, 0.0]
    assert np.isnan(big[4])
    # Two blocks of GPU cache: B0's blocks evict A0's, so A/x starts cold; its
    # blocks (1, 7) evict B0's, so A1 finds block 1 (put back by A/x) but not 2.
    small = lru_cached_tokens(df, trace, block_size=10, capacity_tokens=20)
    assert small[:4].tolist() == [10.0, 0.0, 0.0, 0.0]


def test_request_cache_tree_rates_and_miss_impact(
    rec: Callable[..., RequestRecord],
) -> None:
    def r(
        sid: str, i: int, ttft_ms: int, cached: int | None, ideal: int
    ) -> RequestRecord:
        return rec(session_id=sid, root_session_id=sid, request_index=i,
                   ttft_ns=ttft_ms * MS, prompt_tokens=1000, cached_tokens=cached,
                   ideal_cached_tokens=ideal)  # fmt: skip

    rows = [
        r("A", 0, 100, 0, 0),  # cold: no miss
        r("A", 1, 120, 800, 800),  # full ideal hit
        r("A", 2, 900, 100, 900),  # missed 800
        r("B", 0, 1000, 0, 500),  # missed 500
        r("B", 1, 110, None, 900),  # not reported
    ]
    df = records_frame(records_to_table(rows))
    per = request_cache(df)
    assert per["missed_tokens"].tolist()[:4] == [0.0, 0.0, 800.0, 500.0]
    assert np.isnan(per["missed_tokens"].iloc[4])
    trees = tree_cache(per).set_index("root_session_id")
    assert trees.loc["A", "server"] == pytest.approx(900 / 3000)
    assert trees.loc["A", "ideal"] == pytest.approx(1700 / 3000)
    assert trees.loc["B", "server"] == pytest.approx(0 / 1000)  # only B0 reports
    assert trees.loc["B", "ideal"] == pytest.approx(1400 / 2000)
    assert np.isnan(trees["lru"]["B"])
    impact = miss_impact(per, tolerance_tokens=64)
    assert impact.requests_reporting == 4
    assert impact.requests_with_miss == 2
    assert impact.missed_tokens == pytest.approx(1300.0)
    # Full hit TTFTs [100, 120]: P90 118; with miss [900, 1000]: P90 990.
    assert impact.ttft_p90_ms_full_hit == pytest.approx(118.0)
    assert impact.ttft_p90_ms_with_miss == pytest.approx(990.0)
    # P90 of [100, 120, 900, 1000] = 970: the one slower row (1000) missed.
    assert impact.slow_with_miss_fraction == pytest.approx(1.0)


def test_miss_impact_unavailable_when_nothing_reported(
    rec: Callable[..., RequestRecord],
) -> None:
    per = request_cache(records_frame(records_to_table([rec()])))
    impact = miss_impact(per, tolerance_tokens=64)
    assert impact.requests_with_miss is None
    assert np.isnan(impact.ttft_p90_ms_with_miss)


def test_pareto_front_hand_made() -> None:
    x = np.array([1.0, 2.0, 3.0, 2.0, np.nan])
    y = np.array([9.0, 5.0, 1.0, 4.0, 10.0])
    # (2, 4) is dominated by (2, 5); NaN is never on the front.
    assert pareto_front(x, y).tolist() == [True, True, True, False, False]


def test_tree_cache_empty() -> None:
    assert tree_cache(request_cache(records_frame(_empty()))).empty


def _empty() -> pa.Table:
    from replayer.records import RECORD_SCHEMA

    return RECORD_SCHEMA.empty_table()


def test_miss_counts_only_shortfalls_beyond_one_server_block(
    tmp_path: Path,
) -> None:
    # Replayed with 4-token blocks against a server caching 16-token blocks: the
    # server rounds down to its blocks, so 10 tokens short is no miss, 20 is.
    from analysis.load import load_run
    from analysis.summary import summarize
    from tests.analysis.conftest import write_run_dir
    from tests.builders import make_record

    rows = [
        make_record(request_index=i, ttft_ns=1_000_000, e2e_ns=2_000_000,
                    ideal_cached_tokens=800, cached_tokens=800 - short,
                    output_tokens=10, end_ns=2_000_000)
        for i, short in enumerate((0, 10, 20))
    ]  # fmt: skip
    info = (0, "vllm:cache_config_info", {"block_size": "16"}, 1.0)
    run_dir = write_run_dir(tmp_path / "run", rows, server_metrics=[info])
    run = load_run(run_dir)
    misses = summarize(run).cache_misses
    assert misses.tolerance_tokens == 16
    assert misses.requests_with_miss == 1
    assert misses.missed_tokens == 20
    told = summarize(run, server_block_tokens=4).cache_misses
    assert told.tolerance_tokens == 4
    assert told.requests_with_miss == 2
