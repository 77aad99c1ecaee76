"""Session-tree roll-ups from request rows: wall time, critical-path TTFT and the
time a parent agent waited on its subagents.

Pure: rows in, one row per session tree out. Needs no trace: subagent joins are
recognised from the rows' timing (see :func:`session_trees`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analysis.metrics import column, is_warmup

_NS_PER_MS = 1e6
TREE_COLUMNS = (
    "root_session_id",
    "requests",
    "sessions",
    "subagent_requests",
    "wall_ms",
    "critical_path_ttft_ms",
    "join_wait_ms",
    "warmup",
)


def _sessions(df: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(sent rows with integer session codes, one row per session)."""
    cats = pd.Index(df["session_id"].astype("object").unique()).dropna()
    start = column(df, "start_ns")
    end = column(df, "end_ns")
    sent = ~np.isnan(start)
    rows = pd.DataFrame(
        {
            "sid": cats.get_indexer(df["session_id"].astype("object"))[sent],
            "start": start[sent],
            # A cancelled row may have no end: it held the session until it was sent.
            "end": np.where(np.isnan(end), start, end)[sent],
            "ttft": np.nan_to_num(column(df, "ttft_ns")[sent]),
            "request_index": column(df, "request_index")[sent],
        }
    )
    parent = cats.get_indexer(df["parent_session_id"].astype("object"))
    root = cats.get_indexer(df["root_session_id"].astype("object"))
    meta = pd.DataFrame(
        {
            "sid": cats.get_indexer(df["session_id"].astype("object")),
            "parent": parent,
            "root": root,
            "depth": column(df, "agent_depth"),
        }
    ).drop_duplicates("sid")
    per = rows.groupby("sid").agg(
        first_start=("start", "min"), last_end=("end", "max"), ttft=("ttft", "sum")
    )
    per = meta.set_index("sid").join(per, how="left")
    per["ttft"] = per["ttft"].fillna(0.0)
    per["depth"] = per["depth"].fillna(0)
    return rows, per


def _joins(rows: pd.DataFrame, per: pd.DataFrame) -> pd.DataFrame:
    """Subagent sessions that ran entirely between two parent requests.

    Subagent S of parent P is joined at P's request j when j is P's first request
    sent at or after S's last end and P's previous request ended at or before S's
    first start. A subagent overlapping a parent request runs in the background.
    """
    subs = per[(per["parent"] >= 0) & per["last_end"].notna()].reset_index()
    if subs.empty:
        return pd.DataFrame(
            columns=["sid", "parent", "last_end", "join_start", "prev_end"]
        )
    prows = rows[rows["sid"].isin(subs["parent"])].sort_values(["sid", "start"])
    prows = prows.assign(prev_end=prows.groupby("sid")["end"].shift(1))
    found = pd.merge_asof(
        subs.sort_values("last_end"),
        prows.rename(columns={"sid": "parent", "start": "join_start"})[
            ["parent", "join_start", "prev_end"]
        ].sort_values("join_start"),
        left_on="last_end",
        right_on="join_start",
        by="parent",
        direction="forward",
    )
    joined = found["prev_end"].notna() & (found["prev_end"] <= found["first_start"])
    return found.loc[joined, ["sid", "parent", "last_end", "join_start", "prev_end"]]


def session_trees(df: pd.DataFrame) -> pd.DataFrame:
    """One row per session tree (``root_session_id``), durations in ms.

    Population: every row for ``requests``; rows that were sent (start_ns not null)
    for the times; a row without end_ns ends at its start.

    - ``wall_ms``: last end - first start over the tree's rows.
    - ``join_wait_ms``: time the root agent was blocked on subagents: for each join
      (see ``_joins``), from the end of the root's request before the join until the
      last joined subagent ended (at most until the join request was sent), summed.
      The rest of that gap is think time and dispatch.
    - ``critical_path_ttft_ms``: cp(root), with cp(S) = Σ TTFT of S's own requests +
      Σ over S's joins of cp(the joined subagent that ended last): the prefill waits
      the user sat through on the path that set the tree's wall time (a background
      subagent, and a joined one that finished early, are off that path).
    - ``warmup``: whether any of its rows was sent in the warm-up window.
    """
    if df.empty:
        return pd.DataFrame(columns=list(TREE_COLUMNS))
    rows, per = _sessions(df)
    joins = _joins(rows, per)
    # Join wait: per (parent, join request) the latest subagent end, clipped.
    wait = pd.Series(0.0, index=per.index)
    cp = per["ttft"].astype(float).copy()
    if not joins.empty:
        g = joins.groupby(["parent", "join_start"]).agg(
            last_end=("last_end", "max"), prev_end=("prev_end", "first")
        )
        blocked = (
            np.minimum(g["last_end"], g.index.get_level_values(1)) - g["prev_end"]
        ).clip(lower=0)
        wait = wait.add(blocked.groupby(level="parent").sum(), fill_value=0.0)
        # Critical path, bottom-up: a child's cp is final before its parent's.
        joins = joins.assign(depth=per.loc[joins["sid"], "depth"].to_numpy())
        for depth in sorted(joins["depth"].unique(), reverse=True):
            level = joins[joins["depth"] == depth]
            last = level.loc[
                level.groupby(["parent", "join_start"])["last_end"].idxmax()
            ]
            add = cp.loc[last["sid"]].groupby(last["parent"].to_numpy()).sum()
            cp = cp.add(add, fill_value=0.0)
    sid_rows = pd.Index(df["session_id"].astype("object").unique()).dropna()
    roots = per[per.index == per["root"]]
    tree_key = df["root_session_id"].astype("object")
    counts = df.groupby(tree_key, sort=False, observed=True).agg(
        requests=("request_index", "size"),
        sessions=("session_id", "nunique"),
    )
    sub_reqs = (
        pd.Series(column(df, "agent_depth") > 0).groupby(tree_key.to_numpy()).sum()
    )
    warm = pd.Series(is_warmup(df)).groupby(tree_key.to_numpy()).any()
    root_ids = sid_rows[roots.index.to_numpy()]
    trees = pd.DataFrame(
        {
            "root_session_id": root_ids,
            "wall_ms": (roots["last_end"] - roots["first_start"]).to_numpy(),
            "critical_path_ttft_ms": cp.loc[roots.index].to_numpy() / _NS_PER_MS,
            "join_wait_ms": wait.loc[roots.index].to_numpy() / _NS_PER_MS,
        }
    )
    # Wall time spans the whole tree, not only the root session's own rows.
    span = per.groupby("root").agg(
        first=("first_start", "min"), last=("last_end", "max")
    )
    trees["wall_ms"] = (span["last"] - span["first"]).reindex(
        roots.index
    ).to_numpy() / _NS_PER_MS
    trees = trees.set_index("root_session_id")
    trees = trees.join(counts).join(sub_reqs.rename("subagent_requests"))
    trees = trees.join(warm.rename("warmup"))
    return trees.reset_index()[list(TREE_COLUMNS)]
