"""The compact load (``load_run(compact=True)`` with only ``summary.COLUMNS``, ITL read
again from the part files a batch at a time), which ``analyze`` uses, gives every
figure the full load gives, to the last digit."""

from __future__ import annotations

import dataclasses
import gc
import json
import random
import shutil
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

import analysis.load
import analysis.summary
from analysis import metrics as m
from analysis.errors import AnalysisError
from analysis.load import compact_column, load_run, part_batches, records_frame
from analysis.summary import COLUMNS, ITL_COLUMNS, summarize
from analysis.text import format_summaries
from replayer.cli import main
from replayer.records import RECORD_SCHEMA, RequestRecord, records_to_table
from replayer.records.parts import compact_parts, part_name, write_part
from tests.analysis.conftest import run_meta
from tests.builders import timed_record

GOLDEN = Path(__file__).parents[1] / "data" / "golden" / "inputs"


def _figures(path: Path) -> tuple[str, str]:
    """(summary JSON, table text) of the full load and of the compact one."""
    full = summarize(load_run(path))
    compact = summarize(load_run(path, columns=COLUMNS, compact=True))
    for s in (full, compact):
        assert s.itl_ms.count >= 0
    one = json.dumps(full.as_dict(), sort_keys=True, default=str)
    two = json.dumps(compact.as_dict(), sort_keys=True, default=str)
    assert one == two
    assert format_summaries([full]) == format_summaries([compact])
    return one, format_summaries([compact])


@pytest.mark.parametrize(
    "run_dir",
    sorted(p.parent.relative_to(GOLDEN) for p in GOLDEN.rglob("run.json")),
    ids=str,
)
def test_golden_runs_give_the_same_figures(run_dir: Path) -> None:
    _figures(GOLDEN / run_dir)


def _records(rng: random.Random, n: int, first_session: int) -> list[RequestRecord]:
    """Rows with nulls, errors, warm-up, subagents and coalesced chunks."""
    out = []
    for i in range(n):
        sid = first_session + i // 7
        root = sid - sid % 2
        status = rng.choice(["ok"] * 8 + ["timeout", "http_error"])
        out_tokens = rng.randint(1, 9)
        rec = timed_record(
            start_ms=i * 10 + rng.random(),
            ttft_ms=rng.uniform(5, 900),
            e2e_ms=rng.uniform(900, 5000),
            out=out_tokens,
            session_id=f"s{sid}",
            root_session_id=f"s{root}",
            parent_session_id=f"s{root}" if sid != root else None,
            agent_depth=int(sid != root),
            request_index=i % 7,
            scheduled_ns=int((i * 10 - rng.random()) * 1e6),
            status=status,
            http_status=400 if status == "http_error" else None,
            error_message="prompt is too long" if status == "http_error" else None,
            prompt_tokens=rng.randint(100, 50_000),
            server_prompt_tokens=rng.choice([None, rng.randint(100, 50_000)]),
            cached_tokens=rng.choice([None, rng.randint(0, 40_000)]),
            ideal_cached_tokens=rng.randint(0, 40_000),
            pool_wait_ns=rng.choice([None, rng.randint(0, 3 * 10**9)]),
            live_drift_tokens=rng.choice([None, rng.randint(-50, 50)]),
            warmup=rng.choice([True, False, False, False, None]),
        )
        chunks = list(rec.chunk_times_ns or [])
        for k in range(1, len(chunks)):  # some chunks in the previous one's read
            if rng.random() < 0.3:
                chunks[k] = chunks[k - 1]
        out.append(dataclasses.replace(rec, chunk_times_ns=chunks))
    return out


@pytest.fixture(scope="module")
def messy_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three part files of different sessions (own dictionaries), one written by
    an older writer without two columns, the first without any 0 ns gap (the
    spread ITL's buffer starts at the second), and an unreadable part."""
    rng = random.Random(7)
    path = tmp_path_factory.mktemp("messy")
    (path / "requests").mkdir()
    meta = run_meta()
    tables = [records_to_table(_records(rng, 400, k * 1000)) for k in range(3)]
    tables[1] = tables[1].drop_columns(["live_drift_tokens", "connect_ns"])
    no_zero = [
        sorted(set(c)) if c else c for c in tables[0]["chunk_times_ns"].to_pylist()
    ]
    tables[0] = tables[0].set_column(
        tables[0].schema.get_field_index("chunk_times_ns"),
        "chunk_times_ns",
        pa.array(no_zero, pa.list_(pa.int64())),
    )
    for k, table in enumerate(tables):
        table = table.replace_schema_metadata({"replayer.run": json.dumps(meta)})
        pq.write_table(table, path / "requests" / f"part-000-{k:05d}.parquet")
    (path / "requests" / "part-001-00000.parquet").write_bytes(b"not parquet")
    (path / "run.json").write_text(json.dumps(meta))
    return path


def test_a_messy_run_gives_the_same_figures(messy_run: Path) -> None:
    summary, _ = _figures(messy_run)
    s = json.loads(summary)
    assert s["requests"] == 1200
    assert 0 < s["itl_coalesced_share"] < 1  # the spread ITL's general path
    assert s["itl_ms"]["p90"] != s["itl_spread_ms"]["p90"]
    run = load_run(messy_run, columns=COLUMNS, compact=True)
    assert len(run.parts) == 3
    assert any("part-001-00000.parquet: unreadable" in p for p in run.problems)


def test_itl_read_in_small_batches_is_the_same(messy_run: Path) -> None:
    full = m.numeric_view(load_run(messy_run).requests)
    itl, spread = m.itl_and_spread_ms(full)
    run = load_run(messy_run, columns=COLUMNS, compact=True)
    batches = part_batches(run, (*ITL_COLUMNS, "status", "warmup"), rows=37)
    pieces = [m.itl_and_spread_ms(records_frame(b)) for b in batches]
    assert np.array_equal(np.concatenate([a for a, _ in pieces]), itl)
    assert np.array_equal(np.concatenate([b for _, b in pieces]), spread)


def test_itl_in_many_batches_around_a_skipped_part(
    tmp_path: Path, messy_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The streamed ITL takes each batch's population from the frame's rows in
    # order: batches of 37 rows (many a part, parts joined in one), with the
    # unreadable part between readable ones, give the full load's figures.
    path = tmp_path / "run"
    shutil.copytree(messy_run, path)
    parts = path / "requests"
    (parts / "part-000-00002.parquet").rename(parts / "part-002-00000.parquet")
    (parts / "part-001-00000.parquet").rename(parts / "part-000-00002.parquet")
    monkeypatch.setattr(
        analysis.summary,
        "part_batches",
        lambda run, columns: part_batches(run, columns, rows=37),
    )
    summary, _ = _figures(path)
    assert json.loads(summary)["itl_ms"]["count"] > 1000
    run = load_run(path, columns=COLUMNS, compact=True)
    assert [p.name for p in run.parts] == [
        "part-000-00000.parquet",
        "part-000-00001.parquet",
        "part-002-00000.parquet",
    ]


def test_parts_changed_since_the_load_are_an_error(
    tmp_path: Path, messy_run: Path
) -> None:
    # The ITL reads the chunk column again and takes the frame's rows as its
    # population: part files that no longer hold those rows are an error.
    path = tmp_path / "run"
    shutil.copytree(messy_run, path)
    run = load_run(path, columns=COLUMNS, compact=True)
    last = path / "requests" / "part-000-00002.parquet"
    pq.write_table(pq.read_table(last).slice(0, 100), last)
    with pytest.raises(AnalysisError, match="no longer hold the rows it loaded"):
        summarize(run)


def test_parts_read_a_column_at_a_time_give_the_same_figures(
    messy_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Parts past ``_BIG_PART`` rows are read a column at a time (the others
    whole): the same frame either way."""
    whole = load_run(messy_run, columns=COLUMNS, compact=True).requests
    monkeypatch.setattr(analysis.load, "_BIG_PART", 100)
    by_column = load_run(messy_run, columns=COLUMNS, compact=True).requests
    pd.testing.assert_frame_equal(by_column, whole)
    _figures(messy_run)


def test_wrong_or_missing_statistics_fall_back_to_the_values(
    messy_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The integer columns' dtypes are planned from the parts' Parquet statistics:
    a part written without them, or statistics the values contradict, give the
    dtypes :func:`compact_column` picks from the values, and the same figures."""
    want = load_run(messy_run, columns=COLUMNS, compact=True).requests
    plain = tmp_path / "plain"
    (plain / "requests").mkdir(parents=True)
    (plain / "run.json").write_bytes((messy_run / "run.json").read_bytes())
    for k, part in enumerate(sorted((messy_run / "requests").glob("part-000-*"))):
        table = pq.read_table(part)
        stats = k != 1  # the middle part without statistics
        pq.write_table(table, plain / "requests" / part.name, write_statistics=stats)
    got = load_run(plain, columns=COLUMNS, compact=True).requests
    assert dict(got.dtypes) == dict(want.dtypes)

    real = analysis.load._int_plan

    def too_narrow(opened: Any, name: str) -> Any:
        plan = real(opened, name)
        if plan is None or plan[0] is None:
            return plan
        # Statistics that say 0-100: the values past them would not fit.
        return (np.int8 if np.dtype(plan[0]).kind == "i" else np.float32), 0, 100

    monkeypatch.setattr(analysis.load, "_int_plan", too_narrow)
    lied = load_run(messy_run, columns=COLUMNS, compact=True).requests
    for frame in (got, lied):
        for name in m.NUMERIC_COLUMNS:
            if name in COLUMNS:
                assert np.array_equal(
                    m.column(frame, name), m.column(want, name), equal_nan=True
                ), name
    assert dict(lied.dtypes) == dict(want.dtypes)


def test_many_small_parts_with_their_own_ids(tmp_path: Path) -> None:
    """A run as the recorder writes it: many small parts, each with a dictionary
    of its own sessions. The ids come back as one categorical, the ITL batches
    join small parts, and every figure is the full load's."""
    rng = random.Random(5)
    path = tmp_path / "small"
    (path / "requests").mkdir(parents=True)
    meta = run_meta()
    for k in range(40):
        table = records_to_table(_records(rng, 35, k * 10))
        table = table.replace_schema_metadata({"replayer.run": json.dumps(meta)})
        pq.write_table(table, path / "requests" / f"part-000-{k:05d}.parquet")
    (path / "run.json").write_text(json.dumps(meta))
    run = load_run(path, columns=COLUMNS, compact=True)
    sessions = run.requests["session_id"]
    assert sessions.cat.categories.is_unique
    assert list(sessions.astype(str)) == list(load_run(path).requests["session_id"])
    sizes = [len(b) for b in part_batches(run, ITL_COLUMNS, rows=100)]
    assert sum(sizes) == 40 * 35
    assert max(sizes) == 70  # two parts a batch
    _figures(path)


def test_compact_columns_hold_the_same_values() -> None:
    big = 2**24 + 1
    cases = {
        "small": (pa.array([0, 5, 127], pa.int64()), np.int8),
        "neg": (pa.array([-40_000, 3], pa.int64()), np.int32),
        "wide": (pa.array([2**40, 1], pa.int64()), np.int64),
        "null_small": (pa.array([None, 2**24, -3], pa.int64()), np.float32),
        "null_big": (pa.array([None, big], pa.int64()), np.float64),
        "all_null": (pa.nulls(3, pa.int64()), np.float32),
    }
    for name, (arr, dtype) in cases.items():
        col = pa.chunked_array([arr, arr])
        got = np.asarray(compact_column(col))
        assert got.dtype == dtype, name
        want = col.to_numpy().astype(np.float64)
        assert np.array_equal(got.astype(np.float64), want, equal_nan=True), name


def test_compact_strings_of_nulls_only_are_an_empty_categorical() -> None:
    col = pa.chunked_array([pa.nulls(3, pa.string()), pa.nulls(2, pa.string())])
    got = compact_column(col)
    want = pd.Categorical(np.full(5, np.nan))  # what pandas makes of five NaNs
    assert got.dtype == want.dtype
    assert got.codes.dtype == np.int8
    assert got.codes.tolist() == [-1] * 5
    pd.testing.assert_series_equal(pd.Series(got), pd.Series(want))


def test_compact_frame_is_smaller_with_the_same_columns(messy_run: Path) -> None:
    full = load_run(messy_run).requests
    compact = load_run(messy_run, columns=COLUMNS, compact=True).requests
    assert list(compact.columns) == list(COLUMNS)
    assert set(COLUMNS) <= set(RECORD_SCHEMA.names)
    assert compact.memory_usage().sum() < full[list(COLUMNS)].memory_usage().sum()
    for name in COLUMNS:
        if name in m.NUMERIC_COLUMNS:
            assert np.array_equal(
                m.column(compact, name), m.column(full, name), equal_nan=True
            )


@pytest.fixture(scope="module")
def large_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """80K rows built as Arrow columns (past traces.quantile.MIN_SIZE, so the fast
    percentiles run), two parts, 4 chunks a row, some coalesced, 3% timeouts."""
    rng = np.random.default_rng(11)
    n, ms = 80_000, 1_000_000
    sess = np.arange(n) // 40
    start = sess * 1000 * ms + (np.arange(n) % 40) * 5000 * ms + rng.integers(0, ms, n)
    ttft = rng.integers(20, 3000, n) * ms + rng.integers(0, 999, n)
    out = rng.integers(1, 900, n)
    e2e = ttft + (out - 1) * rng.integers(5, 60, n) * ms
    ok = rng.random(n) >= 0.03
    chunks = ttft[:, None] + np.arange(4) * (e2e - ttft)[:, None] // 3
    chunks[:, 2] = np.where(rng.random(n) < 0.2, chunks[:, 1], chunks[:, 2])
    names = np.array([f"s{i}" for i in range(sess.max() + 1)])
    cols = {
        "session_id": pa.array(names[sess]),
        "root_session_id": pa.array(names[sess - sess % 2]),
        "parent_session_id": pa.array(
            np.where(sess % 2 == 1, names[sess - 1], None), pa.string()
        ),
        "agent_depth": pa.array((sess % 2).astype(np.int32)),
        "request_index": pa.array((np.arange(n) % 40).astype(np.int32)),
        **{
            name: pa.array(values)
            for name, values in (
                ("scheduled_ns", start - rng.integers(0, 5 * ms, n)),
                ("start_ns", start),
                ("first_token_ns", start + ttft),
                ("end_ns", start + e2e),
                ("ttft_ns", ttft),
                ("e2e_ns", e2e),
            )
        },
        "tpot_ns": pa.array(
            (e2e - ttft) // np.maximum(out - 1, 1), mask=~ok | (out < 2)
        ),
        "chunk_times_ns": pa.array(list(start[:, None] + chunks), pa.list_(pa.int64())),
        "prompt_tokens": pa.array(rng.integers(1000, 200_000, n)),
        "output_tokens": pa.array(out),
        "cached_tokens": pa.array(rng.integers(0, 1000, n)),
        "ideal_cached_tokens": pa.array(rng.integers(0, 1000, n)),
        "status": pa.array(np.where(ok, "ok", "timeout")),
        "warmup": pa.array(np.arange(n) < n // 20),
    }
    table = pa.table(
        [cols.get(f.name, pa.nulls(n, f.type)) for f in RECORD_SCHEMA],
        schema=RECORD_SCHEMA,
    )
    path = tmp_path_factory.mktemp("large")
    (path / "requests").mkdir()
    for k in range(2):
        part = table.slice(k * n // 2, n // 2)
        pq.write_table(part, path / "requests" / f"part-000-{k:05d}.parquet")
    (path / "run.json").write_text(json.dumps(run_meta()))
    return path


def test_a_large_run_gives_the_naive_figures(large_run: Path) -> None:
    """Past the size where the fast percentiles take over: both loads agree on every
    figure, and the headline latencies are what pandas and np.percentile give."""
    summary, _ = _figures(large_run)
    s = json.loads(summary)
    df = pq.read_table(large_run / "requests").to_pandas()
    ok = df[(df["status"] == "ok") & ~df["warmup"]]
    gaps = ok["chunk_times_ns"].explode().astype("float64").groupby(level=0).diff()
    naive = {
        "ttft_ms": ok["ttft_ns"] / 1e6,
        "e2e_ms": ok["e2e_ns"] / 1e6,
        "tpot_ms": ok["tpot_ns"].dropna() / 1e6,
        "itl_ms": gaps.dropna() / 1e6,
    }
    for name, values in naive.items():
        x = values.to_numpy(dtype=np.float64)
        assert x.size >= 65_536, name
        p50, p90, p99 = np.percentile(x, [50, 90, 99], method="linear")
        want = {"p50": p50, "p90": p90, "p99": p99, "count": x.size}
        assert {k: s[name][k] for k in want} == want, name
        assert s[name]["mean"] == pytest.approx(x.mean(), rel=1e-12)


def test_a_sweep_is_summarized_one_run_at_a_time(
    tmp_path: Path, make_sweep_dir: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`analyze SWEEP` holds one run's rows at a time, however many levels: when a
    level loads, the frames of the levels before it are gone."""
    rng = random.Random(3)
    levels = {f"c{c}": _records(rng, 60, 0) for c in (1, 2, 4, 8)}
    sweep = make_sweep_dir(tmp_path / "sweep", levels)
    alive: list[weakref.ref[Any]] = []
    held_at_load: list[int] = []
    real = analysis.load.load_run

    def load_and_count(path: Any, **kwargs: Any) -> Any:
        gc.collect()
        held_at_load.append(sum(r() is not None for r in alive))
        run = real(path, **kwargs)
        alive.append(weakref.ref(run.requests))
        return run

    monkeypatch.setattr(analysis.load, "load_run", load_and_count)
    result = CliRunner().invoke(main, ["analyze", str(sweep), "--json"])
    assert result.exit_code == 0, result.output
    assert len(json.loads(result.output)["runs"]) == 4
    assert held_at_load == [0, 0, 0, 0]


def test_a_compacted_run_gives_the_same_figures(tmp_path: Path) -> None:
    # What ``run`` leaves: its small parts joined at the end (row groups and
    # parts of other sizes, one dictionary a row group). Every figure the same.
    rng = random.Random(11)
    meta = run_meta()
    folder = tmp_path / "requests"
    folder.mkdir()
    for k in range(9):
        table = records_to_table(_records(rng, 150, k * 1000))
        write_part(
            table.replace_schema_metadata({"replayer.run": json.dumps(meta)}),
            folder / part_name(0, k),
        )
    (tmp_path / "run.json").write_text(json.dumps(meta))
    before, text = _figures(tmp_path)
    joined = compact_parts(
        folder, 0, 9, json.dumps(meta).encode(), part_rows=750, group_rows=256
    )
    assert joined == 9
    assert len(load_run(tmp_path, columns=COLUMNS, compact=True).parts) == 2
    assert _figures(tmp_path) == (before, text)
