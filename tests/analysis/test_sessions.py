"""Session-tree roll-ups on a hand-built tree (times in ms)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from analysis import sessions
from analysis.load import records_frame
from analysis.sessions import _per_session, session_trees
from replayer.records import RequestRecord, records_to_table

MS = 1_000_000


@pytest.fixture
def tree(rec: Callable[..., RequestRecord]) -> pd.DataFrame:
    def r(
        sid: str, idx: int, start: int, end: int, ttft: int, **kw: object
    ) -> RequestRecord:
        depth = sid.count("/")
        parent = sid.rsplit("/", 1)[0] if depth else None
        root = sid.split("/", 1)[0]
        return rec(
            session_id=sid, root_session_id=root, parent_session_id=parent,
            agent_depth=depth, request_index=idx, start_ns=start * MS,
            end_ns=end * MS, ttft_ns=ttft * MS, **kw,
        )  # fmt: skip

    rows = [
        r("R", 0, 0, 1000, 100),
        r("R", 1, 5000, 6000, 200),  # waits for A and B (joined here)
        r("R", 2, 6500, 7000, 50),
        r("R/A", 0, 1100, 2000, 300),
        r("R/A", 1, 2100, 4000, 400),  # waits for A1
        r("R/A/A1", 0, 2010, 2090, 5),
        r("R/B", 0, 1200, 3000, 1000),  # ends before A: off the critical path
        r("R/C", 0, 5500, 8000, 10),  # overlaps R's requests: background
        r("T", 0, 100, 300, 20, warmup=True),
    ]
    return records_frame(records_to_table(rows))


def test_session_trees_hand_computed(tree: pd.DataFrame) -> None:
    t = session_trees(tree).set_index("root_session_id")
    assert sorted(t.index) == ["R", "T"]
    r = t.loc["R"]
    assert r["requests"] == 8
    assert r["sessions"] == 5
    assert r["subagent_requests"] == 5
    assert r["wall_ms"] == pytest.approx(8000.0)  # 0 → C's end at 8000
    # R blocked from its request 0's end (1000) until A ended (4000).
    assert r["join_wait_ms"] == pytest.approx(3000.0)
    # R's own 100 + 200 + 50, + A's 300 + 400, + A1's 5 (A's join); not B, not C.
    assert r["critical_path_ttft_ms"] == pytest.approx(1055.0)
    assert not r["warmup"]
    s = t.loc["T"]
    assert s["wall_ms"] == pytest.approx(200.0)
    assert s["critical_path_ttft_ms"] == pytest.approx(20.0)
    assert s["join_wait_ms"] == pytest.approx(0.0)
    assert s["warmup"]


def test_session_trees_empty(tree: pd.DataFrame) -> None:
    assert session_trees(tree.iloc[0:0]).empty


_TTFT_TOP = {"int64": 2**52, "int32": 2**31 - 1, "uint32": 2**31 - 1, "float64": 2**40}


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint32", "float64"])
def test_per_session_matches_a_group_by(dtype: str) -> None:
    """The per-session first start, last end and Σ TTFT: a group-by's values, as
    floats, for each column type a frame may hold (integer sums in 64 bits)."""
    rng = np.random.default_rng(7)
    n, size = 5_000, 300
    sid = rng.integers(0, size, n).astype(np.int32)
    sid[sid == 17] = 18  # a code with no rows: not in the result
    top = 2**31 - 1 if dtype.endswith("32") else 2**60
    rows = pd.DataFrame(
        {
            "sid": sid,
            "start": rng.integers(0, top, n).astype(dtype),
            "end": rng.integers(0, top, n).astype(dtype),
            # Sums past 32 bits: a 32-bit accumulator would wrap; int64 ones past
            # 2**53: a float64 accumulator would round.
            "ttft": rng.integers(0, _TTFT_TOP[dtype], n).astype(dtype),
        }
    )
    want = (
        rows.groupby("sid")
        .agg(
            first_start=("start", "min"), last_end=("end", "max"), ttft=("ttft", "sum")
        )
        .astype(np.float64)
    )
    got = _per_session(rows, size=size)
    pd.testing.assert_frame_equal(got, want, check_exact=True, check_index_type=False)
    assert got.index.dtype == sid.dtype


@pytest.mark.parametrize("block", [2, 3, 1 << 20])
def test_a_session_is_what_its_first_row_says(
    rec: Callable[..., RequestRecord], monkeypatch: pytest.MonkeyPatch, block: int
) -> None:
    """A session's parent, root and depth are its first row's (here its later rows
    disagree, as a foreign writer's may), whatever the block the first rows are
    found a block at a time by."""
    monkeypatch.setattr(sessions, "_BLOCK", block)

    def r(
        sid: str, idx: int, start: int, root: str, parent: str | None
    ) -> RequestRecord:
        return rec(
            session_id=sid, root_session_id=root, parent_session_id=parent,
            agent_depth=0 if parent is None else 1, request_index=idx,
            start_ns=start * MS, end_ns=(start + 10) * MS, ttft_ns=MS,
        )  # fmt: skip

    rows = [
        r("R", 0, 0, "R", None),
        r("X", 0, 20, "R", "R"),  # X's first row: a subagent of R
        r("X", 1, 40, "X", None),  # its later rows: a root of its own
        r("X", 2, 60, "X", None),
        r("R", 1, 80, "R", None),
    ]
    t = session_trees(records_frame(records_to_table(rows))).set_index(
        "root_session_id"
    )
    assert list(t.index) == ["R"]
    assert t.loc["R", "sessions"] == 2


def test_a_frame_cut_from_a_larger_one_keeps_its_trees(tree: pd.DataFrame) -> None:
    """Rows taken from a larger frame keep its id categories, some now of no row:
    those are no sessions (they were, at the first row's place, and made the
    session table's index repeat)."""
    cut = tree.iloc[-1:].reset_index(drop=True)  # T's row only, every id kept
    assert "R" in cut["session_id"].cat.categories
    alone = tree.iloc[-1:].copy()
    for name in ("session_id", "root_session_id", "parent_session_id"):
        alone[name] = alone[name].astype(str).replace("nan", None).astype("category")
    got = session_trees(cut).set_index("root_session_id")
    want = session_trees(alone.reset_index(drop=True)).set_index("root_session_id")
    pd.testing.assert_frame_equal(got, want)
    assert list(got.index) == ["T"]
