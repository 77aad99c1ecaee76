"""The columnar request table: chain compaction, row views that behave like the tuples
of requests they replace, and bulk paths (store, stats, prompts) that agree with the
per-request ones."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.builders import request, session, subagent, trace_of
from traces import read_trace, write_trace
from traces.generate import PRESETS, generate_trace
from traces.materialize import Api, Materializer, PromptConfig
from traces.model import Request, Scope, Session, Trace
from traces.stats import ideal_cached_tokens, trace_stats
from traces.table import (
    RequestRows,
    RequestTable,
    request_column,
    request_extras,
    session_rows,
    table_of,
)


def _full(ids: list[int], **fields: object) -> Request:
    """A request with every field set (None where optional fields allow it)."""
    base = request(ids, block_size=4, out=7, think=0.5, t=1.25)
    return replace(
        base,
        api_time_s=2.5,
        kind="s",
        model="m",
        stop="end_turn",
        input_types=("text", "image"),
        output_types=(),
        extra={"x": [1, 2]},
        **fields,  # type: ignore[arg-type]
    )


def _on_rows(sid: str, rows: RequestRows, **fields: Any) -> Session:
    """A session holding ``rows`` (the builder would turn them into a tuple)."""
    return replace(session(sid, [], **fields), requests=rows)


def test_table_chains_store_each_growing_prompt_once() -> None:
    reqs = [
        request([1, 2]),
        request([1, 2, 3, 4]),  # extends: adds 3, 4
        request([1, 2, 3]),  # a prefix: adds nothing
        request([9, 8]),  # does not extend: a new chain
        request([9, 8, 7]),
        request([]),
    ]
    table = RequestTable.from_requests(reqs)
    assert table.blocks.tolist() == [1, 2, 3, 4, 9, 8, 7]
    assert table.ids_offset.tolist() == [0, 0, 0, 4, 4, 4]
    assert [table.hash_ids(i).tolist() for i in range(6)] == [
        r.hash_ids.tolist() for r in reqs
    ]
    # A chain break (session boundary) starts a new chain even for an extension.
    broken = RequestTable.from_requests(reqs[:2], chain_breaks=[1])
    assert broken.blocks.tolist() == [1, 2, 1, 2, 3, 4]


def test_table_from_requests_matches_the_checked_constructor() -> None:
    """from_requests builds its columns without __post_init__: they are what the
    checking constructor makes of the same values (dtypes, read-only, labels)."""
    reqs = [
        _full([1, 2], tool_wait_s=0.25),
        replace(_full([1, 2, 3]), kind="n", model=None, extra={}),
        replace(_full([7]), input_types=()),
    ]
    fast = RequestTable.from_requests(reqs)
    checked = RequestTable(
        **{
            f: getattr(fast, f)
            for f in RequestTable.__dataclass_fields__
            if f not in ("extra_rows", "_built")
        }
    )
    for name in RequestTable.__dataclass_fields__:
        a, b = getattr(fast, name), getattr(checked, name)
        if isinstance(a, np.ndarray):
            nan_ok = a.dtype.kind == "f"
            assert a.dtype == b.dtype, name
            assert np.array_equal(a, b, equal_nan=nan_ok), name
            assert not a.flags.writeable, name
    assert fast.extra_rows.tolist() == [0, 2]
    assert list(fast.rows()) == reqs
    one = RequestTable.from_requests([replace(_full([4]), extra={})] * 3)
    assert one.kind.values == ("s",)
    assert one.kind.codes.tolist() == [0, 0, 0]
    assert one.extra_rows.tolist() == []


def test_a_parsed_one_request_session_holds_a_tuple(tmp_path: Path) -> None:
    """A session of one request shares no prompt: it is read as a tuple, not a table
    of its own; longer ones are rows."""
    trace = trace_of(
        session("a", [_full([1, 2])]), session("b", [_full([1]), _full([1, 2])])
    )
    back = read_trace(write_trace(trace, tmp_path / "t.jsonl"))
    assert back.sessions == trace.sessions
    assert isinstance(back.sessions[0].requests, tuple)
    assert isinstance(back.sessions[1].requests, RequestRows)


def test_table_rows_behave_like_the_tuple_they_replace() -> None:
    reqs = (
        _full([1, 2]),
        _full([1, 2, 3], ttft_s=0.25),
        replace(_full([5]), model=None, stop=None, extra={}),
    )
    rows = table_of(reqs)
    assert isinstance(rows, RequestRows)
    assert len(rows) == 3
    assert rows == reqs  # both directions, element by element
    assert reqs == tuple(rows)
    assert list(rows) == list(reqs)
    assert rows[-1] == reqs[-1]
    assert rows[1:] == reqs[1:]
    assert isinstance(rows[1:], RequestRows)
    assert rows[::2] == reqs[::2]
    assert rows.index(reqs[1]) == 1
    assert rows != reqs[:2]
    with pytest.raises(IndexError):
        rows[3]
    with pytest.raises(TypeError):
        hash(rows)
    for r in rows:
        assert r.hash_ids.dtype == np.int64
        assert not r.hash_ids.flags.writeable
    assert not rows.table.input_tokens.flags.writeable
    # Sessions compare equal whichever form their requests take.
    assert session("s", reqs) == _on_rows("s", rows)
    assert _on_rows("s", rows) == session("s", reqs)


def test_table_request_column_agrees_with_the_requests() -> None:
    reqs = (_full([1, 2]), _full([1, 2, 3], ttft_s=0.25))
    rows = table_of(reqs)
    for name, want in (
        ("input_tokens", [8, 12]),
        ("output_tokens", [7, 7]),
        ("t_s", [1.25, 1.25]),
        ("ttft_s", [np.nan, 0.25]),
        ("n_blocks", [2, 3]),
    ):
        for seq in (reqs, rows):
            np.testing.assert_array_equal(request_column(seq, name), want)
    with pytest.raises(ValueError, match="not a numeric request column"):
        request_column(rows, "model")


def test_table_request_extras_visit_only_requests_that_carry_any() -> None:
    reqs = (
        _full([1]),
        replace(_full([2]), extra={}),
        replace(_full([3]), extra={"y": 1}),
    )
    rows = table_of(reqs)
    want = [(0, {"x": [1, 2]}), (2, {"y": 1})]
    assert list(request_extras(reqs)) == want
    assert list(request_extras(rows)) == want
    assert list(request_extras(rows[1:])) == [(1, {"y": 1})]
    assert rows.table.extra_rows.tolist() == [0, 2]


def test_table_session_rows_convert_tuples_in_one_table() -> None:
    a = session("a", [request([1, 2]), request([1, 2, 3])])
    b = session("b", [request([1, 2, 3, 4])])
    rows = table_of([request([7])])
    got = session_rows([a, _on_rows("c", rows), b])
    assert got[1] == (rows.table, 0, 1)
    table, start, stop = got[2]
    assert (start, stop) == (2, 3)
    assert got[0][0] is table
    # Chains never span sessions: b's prompt is stored whole.
    assert table.blocks.tolist() == [1, 2, 3, 1, 2, 3, 4]


def test_table_generated_trace_holds_unique_blocks_only() -> None:
    trace = generate_trace(PRESETS["agentx"], sessions=12, seed=2)
    tables = {id(t): t for t, _, _ in session_rows(s for s, _ in trace.all_sessions())}
    assert len(tables) == 1  # one table (and block buffer) for the whole trace
    table = next(iter(tables.values()))
    prompts = int(table.n_blocks.sum())
    assert table.blocks.size * 20 < prompts


def test_table_store_keeps_chains_and_reads_rows(tmp_path: Path) -> None:
    trace = generate_trace(PRESETS["agentx"], sessions=6, seed=1)
    out = write_trace(trace, tmp_path / "t.parquet")
    back = read_trace(out)
    assert back.sessions == trace.sessions
    rows = back.sessions[0].requests
    assert isinstance(rows, RequestRows)
    stored = pq.read_table(out, columns=["block_run_lengths", "n_blocks"])
    buffer_blocks = sum(sum(x) for x in stored.column(0).to_pylist())
    assert buffer_blocks * 20 < sum(stored.column(1).to_pylist())
    assert trace_stats(back) == replace(trace_stats(trace), source_format="parquet")


def test_table_store_mixes_tables_and_tuples(tmp_path: Path) -> None:
    shared = table_of([_full([1, 2, 3]), _full([1, 2, 3, 4, 5]), _full([8])])
    child = _on_rows("p/c", shared.table.rows(2, 3))
    parent = _on_rows(
        "p",
        shared.table.rows(0, 2),
        subagents=(subagent(child, anchor=0, join=1),),
        scope="global",
    )
    loose = session("q", [_full([4, 5]), _full([1, 2])], scope="global")
    trace = trace_of(parent, loose)
    back = read_trace(write_trace(trace, tmp_path / "t.parquet"))
    assert back.sessions == trace.sessions
    assert ideal_cached_tokens(back) == ideal_cached_tokens(trace)


def _v1_store(trace: Trace, out: Path) -> None:
    """A store in format 1 (every row's whole prompt as runs), as it was written."""
    import orjson
    import pyarrow as pa

    from traces.store import _flatten, _session_meta

    flat = _flatten(trace)
    rows: list[tuple[int, Request]] = [
        (k, r) for k, (s, _, _) in enumerate(flat) for r in s.requests
    ]

    def runs(ids: list[int]) -> tuple[list[int], list[int]]:
        starts: list[int] = []
        lengths: list[int] = []
        for x in ids:
            if starts and x == starts[-1] + lengths[-1]:
                lengths[-1] += 1
            else:
                starts.append(x)
                lengths.append(1)
        return starts, lengths

    table = pa.table(
        {
            "session": pa.array([k for k, _ in rows], pa.int32()),
            "input_tokens": [r.input_tokens for _, r in rows],
            "output_tokens": [r.output_tokens for _, r in rows],
            "t_s": [r.t_s for _, r in rows],
            "think_time_s": [r.think_time_s for _, r in rows],
            "api_time_s": pa.array([r.api_time_s for _, r in rows], pa.float64()),
            "ttft_s": pa.array([r.ttft_s for _, r in rows], pa.float64()),
            "kind": [r.kind for _, r in rows],
            "model": [r.model for _, r in rows],
            "stop": [r.stop for _, r in rows],
            "input_types": ["\x1f".join(r.input_types) or None for _, r in rows],
            "output_types": ["\x1f".join(r.output_types) or None for _, r in rows],
            "extra": [
                orjson.dumps(dict(r.extra)).decode() if r.extra else None
                for _, r in rows
            ],
            "n_blocks": [r.hash_ids.size for _, r in rows],
            "id_runs": [runs(r.hash_ids.tolist())[0] for _, r in rows],
            "id_run_lengths": [runs(r.hash_ids.tolist())[1] for _, r in rows],
        }
    )
    meta = {
        "format": "replayer-trace-store/1",
        "source_format": trace.source_format,
        "sessions": [_session_meta(*f) for f in flat],
    }
    pq.write_table(
        table.replace_schema_metadata({b"replayer.trace": orjson.dumps(meta)}), out
    )


def test_table_store_reads_format_1(tmp_path: Path) -> None:
    trace = generate_trace(PRESETS["demo"], sessions=3, seed=0)
    extra = session("x", [_full([1, 2]), replace(_full([1, 2, 3]), model=None)])
    trace = trace_of(*trace.sessions, extra)
    _v1_store(trace, tmp_path / "v1.parquet")
    back = read_trace(tmp_path / "v1.parquet")
    assert back.sessions == trace.sessions
    assert isinstance(back.sessions[0].requests, RequestRows)


# Prompts that grow, fork and shrink the way agent sessions do, over ids that are
# consecutive runs (as real traces number blocks) with some shared across sessions.
@st.composite
def _growing_sessions(draw: st.DrawFn, sid: str, depth: int) -> Session:
    prompt: list[int] = []
    reqs: list[Request] = []
    next_id = draw(st.integers(0, 30))
    for _ in range(draw(st.integers(0, 6))):
        move = draw(st.sampled_from(["extend", "extend", "fork", "shrink", "new"]))
        if move == "fork" and prompt:
            prompt = prompt[: draw(st.integers(0, len(prompt)))]
        elif move == "shrink" and prompt:
            prompt = prompt[: draw(st.integers(0, len(prompt)))]
            reqs.append(request(prompt, block_size=4, extra_tokens=1))
            continue
        elif move == "new":
            prompt = []
        grow = draw(st.integers(0, 5))
        if draw(st.booleans()):  # reuse a low id range (shared with other sessions)
            next_id = draw(st.integers(0, 10))
        prompt = prompt + list(range(next_id, next_id + grow))
        next_id += grow
        reqs.append(request(prompt, block_size=4, extra_tokens=1))
    subs = []
    if depth == 0 and reqs:
        for k in range(draw(st.integers(0, 2))):
            anchor = draw(st.integers(-1, len(reqs) - 1))
            child = draw(_growing_sessions(f"{sid}/a{k}", depth + 1))
            join = anchor + 1 if anchor + 1 < len(reqs) else None
            subs.append(subagent(child, anchor=anchor, join=join))
    scope: Scope = draw(st.sampled_from(["local", "global"]))
    return session(sid, reqs, subagents=subs, scope=scope)


def _reference_hits(trace: Trace) -> dict[tuple[str, int], int]:
    """Set-based ideal hits walked request by request (no chains, no intervals)."""
    out: dict[tuple[str, int], int] = {}
    shared: set[int] = set()
    for root in trace.sessions:
        seen = shared if root.hash_id_scope == "global" else set()
        for s, i, r in root.ordered_requests():
            ids = r.hash_ids.tolist()
            n = next((k for k, h in enumerate(ids) if h not in seen), len(ids))
            out[(s.session_id, i)] = min(n * s.block_size, r.input_tokens)
            seen.update(ids)
    return out


def _as_rows(s: Session) -> Session:
    subs = tuple(replace(sub, session=_as_rows(sub.session)) for sub in s.subagents)
    return replace(s, requests=table_of(s.requests), subagents=subs)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(data=st.data())
def test_table_ideal_hits_on_chains_match_reference(
    tmp_path: Path, data: st.DataObject
) -> None:
    n = data.draw(st.integers(1, 4))
    trace = trace_of(*(data.draw(_growing_sessions(f"s{k}", 0)) for k in range(n)))
    # A trace of no requests at all is refused when read back (not a trace).
    assume(any(s.requests for s, _ in trace.all_sessions()))
    want = _reference_hits(trace)
    assert ideal_cached_tokens(trace) == want
    rows_backed = trace_of(*(_as_rows(s) for s in trace.sessions))
    assert rows_backed.sessions == trace.sessions
    assert ideal_cached_tokens(rows_backed) == want
    back = read_trace(write_trace(rows_backed, tmp_path / "t.parquet"))
    assert back.sessions == trace.sessions
    assert ideal_cached_tokens(back) == want


@pytest.mark.parametrize("api", ["chat", "completions"])
def test_table_prompts_are_the_same_from_rows_and_tuples(api: Api) -> None:
    trace = generate_trace(PRESETS["demo"], sessions=2, seed=3)
    m_rows = Materializer(PromptConfig(api=api, block_tokens=4))
    m_tuple = Materializer(PromptConfig(api=api, block_tokens=4))
    for s, _ in trace.all_sessions():
        as_tuple = replace(s, requests=tuple(s.requests))
        for i in range(len(s.requests)):
            a = m_rows.prompt(s, i, "ns")
            b = m_tuple.prompt(as_tuple, i, "ns")
            assert a == b
