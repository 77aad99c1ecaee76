"""Figures by turn within the session and by subagent depth."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from analysis import depth as depth_module
from analysis import metrics as m
from analysis.depth import by_depth, by_turn, by_turn_and_depth, turn_bucket
from analysis.load import load_run, records_frame
from replayer.records import RequestRecord, records_to_table

MS = 1_000_000


def test_depth_turn_buckets_are_powers_of_two() -> None:
    idx = np.array([0, 1, 2, 3, 4, 7, 8, 15, 16, 300], dtype=np.float64)
    assert turn_bucket(idx).tolist() == [0, 1, 2, 2, 3, 3, 4, 4, 5, 9]


def test_depth_tables_by_turn_and_depth(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    rows = []
    # Two root sessions of 4 turns: turn i has ttft 10*(i+1) ms, prompt 1000, the
    # ideal hit 250*i and the server's 200*i; one subagent turn at depth 1.
    for s in ("a", "b"):
        for i in range(4):
            rows.append(
                rec(session_id=s, request_index=i, ttft_ns=10 * (i + 1) * MS,
                    e2e_ns=100 * MS, prompt_tokens=1000, server_prompt_tokens=1000,
                    ideal_cached_tokens=250 * i, cached_tokens=200 * i)
            )  # fmt: skip
    rows.append(
        rec(session_id="a/sub", root_session_id="a", agent_depth=1, request_index=0,
            ttft_ns=7 * MS, e2e_ns=50 * MS, prompt_tokens=400, cached_tokens=None,
            ideal_cached_tokens=0)
    )  # fmt: skip
    run = load_run(make_run_dir(tmp_path / "r", rows))
    df = m.numeric_view(run.requests)
    turns = {r.group: r for r in by_turn(df)}
    assert list(turns) == ["0", "1", "2-3"]
    assert turns["0"].requests == 3  # both roots' first turn and the subagent's
    assert turns["1"].ttft_ms_p50 == pytest.approx(20.0)
    assert turns["2-3"].requests == 4
    assert turns["2-3"].ttft_ms_p90 == pytest.approx(
        np.percentile([30, 30, 40, 40], 90)
    )
    assert turns["2-3"].hit_rate_ideal == pytest.approx((500 + 750) * 2 / 4000)
    assert turns["2-3"].hit_rate_server == pytest.approx((400 + 600) * 2 / 4000)
    # Turn 0: the subagent reports no cached_tokens: the server rate is over the
    # roots' first turns only (0), never a 0 made up for the subagent.
    assert turns["0"].hit_rate_server == 0.0
    depths = {r.group: r for r in by_depth(df)}
    assert depths["0"].requests == 8
    assert depths["1"].requests == 1
    assert np.isnan(depths["1"].hit_rate_server)  # unavailable, not 0
    assert depths["0"].hit_rate_lru is None
    lru = np.full(len(df), 100.0)
    assert by_depth(df, lru)[0].hit_rate_lru == pytest.approx(0.1)


def test_depth_tables_in_analyze_json_and_text(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
) -> None:
    rows = [rec(request_index=i, ttft_ns=(i + 1) * MS) for i in range(5)]
    path = make_run_dir(tmp_path / "r", rows)
    cmd = [sys.executable, "-m", "replayer", "analyze", str(path)]
    got = json.loads(
        subprocess.run(
            [*cmd, "--json"], capture_output=True, text=True, check=True
        ).stdout
    )
    assert [r["group"] for r in got["by_turn"]] == ["0", "1", "2-3", "4-7"]
    assert [r["group"] for r in got["by_depth"]] == ["0"]
    text = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    assert "turn" in text
    assert "subagent depth" in text


@pytest.mark.parametrize("depths", [[0, -1, 2, -1], [0, 1, 2**31 - 1, 1]])
def test_depth_table_takes_any_agent_depth(
    rec: Callable[..., RequestRecord], depths: list[int]
) -> None:
    """A negative or huge agent_depth (a foreign writer's) is a group of its own, in
    order, as np.unique gave them (was: ValueError from np.bincount on a negative
    depth, and arrays and a label dict as long as the largest depth)."""
    rows = [
        rec(session_id=f"s{i}", agent_depth=d, request_index=0, ttft_ns=(i + 1) * MS,
            e2e_ns=10 * MS, prompt_tokens=100, ideal_cached_tokens=10 * i)
        for i, d in enumerate(depths)
    ]  # fmt: skip
    df = m.numeric_view(records_frame(records_to_table(rows)))
    table = {r.group: r for r in by_depth(df)}
    assert list(table) == [str(d) for d in sorted(set(depths))]
    for d in set(depths):
        mine = [i for i, x in enumerate(depths) if x == d]
        assert table[str(d)].requests == len(mine)
        assert table[str(d)].hit_rate_ideal == sum(10 * i for i in mine) / (
            100 * len(mine)
        )
        assert table[str(d)].ttft_ms_p50 == np.percentile([i + 1 for i in mine], 50)


def test_depth_tables_from_cells_equal_each_table_alone(
    tmp_path: Path,
    rec: Callable[..., RequestRecord],
    make_run_dir: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The (turn, depth) cell pass and the per-table pass give the same floats,
    # with unknown cached and server prompt tokens and unmeasured latencies.
    rng = np.random.default_rng(7)
    rows = []
    for j in range(300):
        depth = int(rng.integers(0, 3))
        server = None if j % 5 == 0 else int(rng.integers(1, 10**5))
        rows.append(
            rec(session_id=f"s{j % 9}/{depth}", root_session_id=f"s{j % 9}",
                agent_depth=depth, request_index=int(rng.integers(0, 40)),
                ttft_ns=None if j % 17 == 0 else int(rng.integers(1, 10**9)),
                e2e_ns=int(rng.integers(1, 10**10)),
                prompt_tokens=int(rng.integers(1, 10**5)),
                server_prompt_tokens=server,
                ideal_cached_tokens=int(rng.integers(0, 10**4)),
                cached_tokens=None if j % 7 == 0 else int(rng.integers(0, 10**4)))
        )  # fmt: skip
    df = m.numeric_view(load_run(make_run_dir(tmp_path / "r", rows)).requests)
    lru = rng.integers(0, 10**4, len(df)).astype(np.float64)
    lru[::11] = np.nan
    cells = by_turn_and_depth(df, lru)
    monkeypatch.setattr(depth_module._Cells, "MOST", 0)
    alone = by_turn_and_depth(df, lru)
    assert len(cells[0]) > 3
    assert len(cells[1]) == 3
    assert repr(cells) == repr(alone)
