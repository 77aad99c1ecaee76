"""Each metric on a hand-computed 5-row table (expected values worked out by hand)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable

import numpy as np
import pandas as pd
import pytest

from analysis import metrics as m
from analysis.errors import AnalysisError, SloError
from analysis.load import records_frame
from replayer.records import RequestRecord, records_to_table
from traces.stats import percentiles as trace_percentiles

MS = 1_000_000


@pytest.fixture
def five(timed: Callable[..., RequestRecord]) -> pd.DataFrame:
    """A, B, C: ok and measured; D: ok but warm-up; E: an HTTP error.

    A: sent 1000 ms (scheduled 990), TTFT 100, E2E 1100, 11 tokens  → TPOT 100
    B: sent 1500 ms (on time),       TTFT 300, E2E 2300, 41 tokens  → TPOT 50
    C: sent 2000 ms (scheduled 1970), TTFT 200, E2E 1000, 5 tokens  → TPOT 200
    """
    cols = (
        "start_ms",
        "ttft_ms",
        "e2e_ms",
        "out",
        "scheduled_ns",
        "prompt_tokens",
        "server_prompt_tokens",
        "cached_tokens",
        "ideal_cached_tokens",
        "warmup",
        "status",
    )
    table = [
        (1000, 100, 1100, 11, 990 * MS, 1000, 1010, 500, 600, False, "ok"),  # A
        (1500, 300, 2300, 41, 1500 * MS, 2000, None, None, 1000, False, "ok"),  # B
        (2000, 200, 1000, 5, 1970 * MS, 3000, None, 1500, 2000, False, "ok"),  # C
        (0, 1000, 5000, 2, 0, 4000, None, 1000, 0, True, "ok"),  # D
        (2500, 0, 2500, 1, 2400 * MS, 1000, None, None, 0, False, "http_error"),  # E
    ]
    rows = [
        timed(request_index=i, **dict(zip(cols, values, strict=True)))
        for i, values in enumerate(table)
    ]  # fmt: skip
    return records_frame(records_to_table(rows))  # fmt: skip


def test_percentile_linear_interpolation() -> None:
    # [1, 2, 3, 4]: p90 at index 2.7 → 3 + 0.7 * 1.
    assert m.percentile([4, 1, 3, 2], 90) == pytest.approx(3.7)
    assert np.isnan(m.percentile([], 50))
    assert m.percentiles([np.nan, 10.0], [0, 100]) == [10.0, 10.0]


def test_percentile_rows_is_the_one_definition_along_an_axis() -> None:
    x = np.random.default_rng(0).normal(size=(7, 13))
    for q in (2.5, 50, 90, 97.5):
        assert m.percentile_rows(x, q).tolist() == pytest.approx(
            [trace_percentiles(row, [q])[0] for row in x], rel=0, abs=1e-12
        )


def test_counts_by_status_and_warmup(five: pd.DataFrame) -> None:
    c = m.counts(five)
    assert c.requests == 5
    assert c.ok == 4
    assert c.errors["http_error"] == 1
    assert c.errors["timeout"] == 0
    assert c.warmup == 1
    assert c.measured_ok == 3


def test_ttft_ms_excludes_warmup_and_errors(five: pd.DataFrame) -> None:
    d = m.describe(m.ttft_ms(five))
    # [100, 200, 300]: p90 at index 1.8 → 200 + 0.8 * 100.
    assert d.as_dict() == pytest.approx(
        {"mean": 200.0, "p50": 200.0, "p90": 280.0, "p99": 298.0, "count": 3}
    )


def test_e2e_ms(five: pd.DataFrame) -> None:
    d = m.describe(m.e2e_ms(five))
    # E2E sorted: 1000, 1100, 2300 ms.
    assert d.mean == pytest.approx(4400 / 3)
    assert d.p50 == pytest.approx(1100.0)
    assert d.p90 == pytest.approx(1100 + 0.8 * 1200)
    assert d.p99 == pytest.approx(1100 + 0.98 * 1200)


def test_tpot_ms_is_decode_time_over_tokens_after_first(five: pd.DataFrame) -> None:
    assert sorted(m.tpot_ms(five).tolist()) == pytest.approx([50.0, 100.0, 200.0])


def test_tpot_ms_reads_the_engines_tpot_column(
    rec: Callable[..., RequestRecord],
) -> None:
    # The column, not a formula of its own: a row whose tpot_ns says 7 ms is 7 ms.
    row = rec(ttft_ns=5 * MS, e2e_ns=105 * MS, output_tokens=11, tpot_ns=7 * MS)
    assert m.tpot_ms(records_frame(records_to_table([row]))).tolist() == [7.0]


def test_goodput_tpot_agrees_with_tpot_ms(
    rec: Callable[..., RequestRecord],
) -> None:
    # tpot_ns deliberately unlike (E2E - TTFT) / (out - 1) = 10 ms: goodput must
    # judge the same per-row TPOT that tpot_ms reports.
    rows = [
        rec(request_index=i, ttft_ns=5 * MS, e2e_ns=105 * MS, end_ns=105 * MS,
            output_tokens=11, tpot_ns=t * MS)
        for i, t in enumerate((20, 40))
    ]  # fmt: skip
    df = records_frame(records_to_table(rows))
    assert sorted(m.tpot_ms(df).tolist()) == [20.0, 40.0]
    assert m.goodput(df, m.Slo(tpot_ms=30.0)).requests == 1
    assert m.goodput(df, m.Slo(tpot_ms=15.0)).requests == 0
    assert m.goodput(df, m.Slo(tpot_ms=40.0)).requests == 2


def test_tpot_ms_skips_single_token_rows(rec: Callable[..., RequestRecord]) -> None:
    df = records_frame(
        records_to_table(
            [rec(ttft_ns=5 * MS, e2e_ns=5 * MS, output_tokens=1, end_ns=5 * MS)]
        )
    )
    assert m.tpot_ms(df).size == 0


def test_itl_ms_pools_gaps_within_requests(five: pd.DataFrame) -> None:
    gaps = m.itl_ms(five)
    # A: 10 gaps of 100 ms, B: 40 of 50 ms, C: 4 of 200 ms; no gap across rows.
    assert gaps.size == 54
    assert gaps.mean() == pytest.approx((1000 + 2000 + 800) / 54)
    assert m.percentile(gaps, 50) == pytest.approx(50.0)
    assert m.percentile(gaps, 90) == pytest.approx(100.0)
    assert gaps.max() == pytest.approx(200.0)


def test_interactivity_p90_is_the_slow_end(five: pd.DataFrame) -> None:
    it = m.interactivity_tok_s(five)
    # TPOT [50, 100, 200]: P50 100 ms → 10 tok/s; P90 180 ms → 5.56 tok/s.
    assert it["p50"] == pytest.approx(10.0)
    assert it["p90"] == pytest.approx(1000 / 180)
    assert it["p90"] < it["p50"]


def test_e2e_norm_interactivity(five: pd.DataFrame) -> None:
    # E2E/OSL: A 1.1/11 = 0.1, B 2.3/41 = 0.0561, C 1.0/5 = 0.2 → P90 = 0.18 s.
    assert sorted(m.e2e_per_token_s(five).tolist()) == pytest.approx(
        [2.3 / 41, 0.1, 0.2]
    )
    assert m.e2e_norm_interactivity_tok_s(five) == pytest.approx(1 / 0.18)


def test_throughput_over_measured_window(five: pd.DataFrame) -> None:
    t = m.throughput_tok_s(five, gpus=2)
    # Window: A's start 1.0 s → B's end 3.8 s = 2.8 s (D warm-up, E error excluded).
    assert t.window_s == pytest.approx(2.8)
    assert t.input == pytest.approx(6000 / 2.8)
    assert t.output == pytest.approx(57 / 2.8)
    assert t.total == pytest.approx(6057 / 2.8)
    assert t.requests == pytest.approx(3 / 2.8)
    assert t.per_gpu is not None
    assert t.per_gpu.output == pytest.approx(57 / 2.8 / 2)
    assert m.throughput_tok_s(five).per_gpu is None


def test_goodput_counts_errors_as_failing(five: pd.DataFrame) -> None:
    g = m.goodput(five, m.parse_slo("ttft=250ms,tpot=150ms"))
    # A meets both; B's TTFT 300 and C's TPOT 200 fail; E failed; D is warm-up.
    assert g.requests == 1
    assert g.attempted == 4
    assert g.fraction == pytest.approx(0.25)
    assert g.requests_s == pytest.approx(1 / 2.8)
    assert g.output_tok_s == pytest.approx(11 / 2.8)
    assert g.slo == {"ttft_ms": 250.0, "tpot_ms": 150.0}


def test_parse_slo_units_and_errors() -> None:
    assert m.parse_slo("ttft=2s, tpot=50ms,e2e=30") == m.Slo(
        ttft_ms=2000.0, tpot_ms=50.0, e2e_ms=30000.0
    )
    with pytest.raises(SloError, match="bad SLO"):
        m.parse_slo("itl=3ms")
    with pytest.raises(SloError, match="duration"):
        m.parse_slo("ttft=fast")


@pytest.mark.parametrize("text", ["itl=3ms", "ttft=fast", "ttft", " , "])
def test_parse_slo_errors_are_analysis_errors(text: str) -> None:
    with pytest.raises(AnalysisError) as info:
        m.parse_slo(text)
    assert isinstance(info.value, SloError)
    assert not isinstance(info.value, ValueError)  # the CLI catches AnalysisError


def test_dispatch_lag_ms(five: pd.DataFrame) -> None:
    lag = m.dispatch_lag_ms(five)
    # A 10, B 0, C 30, E 100 (D is warm-up) → sorted [0, 10, 30, 100].
    assert sorted(lag.tolist()) == pytest.approx([0.0, 10.0, 30.0, 100.0])
    assert m.percentile(lag, 50) == pytest.approx(20.0)
    assert m.percentile(lag, 99) == pytest.approx(30 + 0.97 * 70)


def test_server_hit_rate_uses_reporting_rows_only(five: pd.DataFrame) -> None:
    # A: 500 of 1010 (server's count), C: 1500 of 3000 (sent); B reports nothing.
    assert m.server_hit_rate(five) == pytest.approx(2000 / 4010)


def test_server_hit_rate_unavailable_is_nan_not_zero(
    rec: Callable[..., RequestRecord],
) -> None:
    df = records_frame(records_to_table([rec(), rec(request_index=1)]))
    assert np.isnan(m.server_hit_rate(df))


def test_ideal_hit_rate(five: pd.DataFrame) -> None:
    assert m.ideal_hit_rate(five) == pytest.approx(3600 / 6000)


def test_lru_hit_rate_over_simulated_measured_ok_rows(five: pd.DataFrame) -> None:
    # Rows A..E; B not simulated (NaN); D warm-up and E errored are excluded.
    lru = np.array([400.0, np.nan, 1500.0, 4000.0, 1000.0])
    assert m.lru_hit_rate(five, lru) == pytest.approx(1900 / 4000)
    assert np.isnan(m.lru_hit_rate(five, np.full(5, np.nan)))


def test_hit_rate_unavailable_is_nan_not_zero() -> None:
    assert m.hit_rate([10.0, np.nan], [100.0, 900.0]) == pytest.approx(0.1)
    assert np.isnan(m.hit_rate([np.nan], [100.0]))
    assert np.isnan(m.hit_rate([], []))


def test_prometheus_hit_rate_from_counter_deltas() -> None:
    a, b = json.dumps({"engine": "0"}), json.dumps({"engine": "1"})
    rows = [
        # scrape_ns, metric, labels, value: two label sets, summed.
        (0, m.PROM_HITS, a, 0.0),
        (0, m.PROM_QUERIES, a, 0.0),
        (0, m.PROM_HITS, b, 10.0),
        (0, m.PROM_QUERIES, b, 10.0),
        (1000, m.PROM_HITS, a, 100.0),
        (1000, m.PROM_QUERIES, a, 400.0),
        (1000, m.PROM_HITS, b, 10.0),
        (1000, m.PROM_QUERIES, b, 10.0),
        (2000, m.PROM_HITS, a, 300.0),
        (2000, m.PROM_QUERIES, a, 1000.0),
        (2000, m.PROM_HITS, b, 110.0),
        (2000, m.PROM_QUERIES, b, 210.0),
    ]
    sm = pd.DataFrame(rows, columns=["scrape_ns", "metric", "labels", "value"])
    # Whole run: (300 + 100) / (1000 + 200).
    assert m.prometheus_hit_rate(sm) == pytest.approx(400 / 1200)
    # After warm-up (baseline = scrape at 1000): (200 + 100) / (600 + 200).
    assert m.prometheus_hit_rate(sm, since_ns=1000) == pytest.approx(300 / 800)
    assert np.isnan(m.prometheus_hit_rate(sm.iloc[0:0]))


def test_itl_coalesced_chunks_are_counted_and_spread(
    rec: Callable[..., RequestRecord],
) -> None:
    # Request 1: chunks at 10, 10, 10 (one read), 40, 70, 70 ms; request 2: 5, 25 ms.
    rows = [
        rec(request_index=0, chunk_times_ns=[10 * MS, 10 * MS, 10 * MS, 40 * MS,
                                             70 * MS, 70 * MS]),
        rec(request_index=1, chunk_times_ns=[5 * MS, 25 * MS]),
    ]  # fmt: skip
    df = records_frame(records_to_table(rows))
    raw = m.itl_ms(df)
    assert sorted(raw.tolist()) == [0, 0, 0, 20, 30, 30]  # half the gaps are 0 ns
    assert m.itl_coalesced_share(df) == 0.5
    spread = m.itl_spread_ms(df)
    # The 40 ms read waited 30 ms for 1 chunk; the 70 ms read 30 ms for 2 chunks;
    # the chunks that came with each first token contribute nothing.
    assert sorted(spread.tolist()) == [15, 15, 20, 30]
    assert spread.sum() == pytest.approx(raw[raw > 0].sum())
    assert m.percentile(spread, 50) == pytest.approx(17.5)
    assert m.percentile(raw, 50) == pytest.approx(10.0)


def _itl_by_row(rows: list[tuple[list[int] | None, bool]]) -> tuple[list[float], ...]:
    """The pooled gaps and the spread ITL, ms, read straight from the definitions,
    one kept row at a time."""
    gaps: list[float] = []
    spread: list[float] = []
    for chunks, kept in rows:
        if not kept or not chunks:
            continue
        gaps += [(b - a) / MS for a, b in itertools.pairwise(chunks)]
        reads: list[list[int]] = []  # chunk stamps grouped by read
        for t in chunks:
            if reads and reads[-1][0] == t:
                reads[-1].append(t)
            else:
                reads.append([t])
        for prev, read in itertools.pairwise(reads):
            spread += [(read[0] - prev[0]) / MS / len(read)] * len(read)
    return gaps, spread


@pytest.mark.parametrize("seed", range(20))
def test_itl_and_spread_match_their_definitions_row_by_row(
    rec: Callable[..., RequestRecord], seed: int
) -> None:
    """Random rows: null, empty, single-chunk, coalesced at the head, in the middle
    and throughout; failed and warm-up rows left out."""
    rng = np.random.default_rng(seed)
    rows: list[tuple[list[int] | None, bool]] = []
    records = []
    for i in range(int(rng.integers(1, 40))):
        n = int(rng.integers(0, 7))
        steps = rng.choice([0, 0, 1, 3, 7], size=n) * MS
        chunks = None if rng.random() < 0.1 else np.cumsum(steps).tolist()
        status = "ok" if rng.random() < 0.8 else "timeout"
        warm = bool(rng.random() < 0.15)
        rows.append((chunks, status == "ok" and not warm))
        records.append(
            rec(request_index=i, chunk_times_ns=chunks, status=status, warmup=warm)
        )
    df = records_frame(records_to_table(records))
    want_gaps, want_spread = _itl_by_row(rows)
    gaps, spread = m.itl_and_spread_ms(df)
    assert gaps.tolist() == want_gaps
    assert spread.tolist() == want_spread
    assert m.itl_ms(df).tolist() == want_gaps
    assert m.itl_spread_ms(df).tolist() == want_spread


def test_measured_ok_recomputes_when_the_view_column_is_not_plain_bool(
    rec: Callable[..., RequestRecord],
) -> None:
    """numeric_view's ``measured_ok`` column is read only while it is plain bool: after
    a concat with rows that lack it (NaN there), the population comes from status and
    warm-up again."""
    raw = records_frame(
        records_to_table([rec(request_index=0), rec(request_index=1, status="timeout")])
    )
    view = m.numeric_view(raw)
    assert m.measured_ok(view).tolist() == [True, False]
    mixed = pd.concat([view, raw.assign(warmup=[True, False])], ignore_index=True)
    assert m.measured_ok(mixed).tolist() == [True, False, False, False]


@pytest.mark.parametrize("dtype", ["int64", "uint32", "float64"])
def test_measured_window_of_plain_columns_is_the_float_reduction(dtype: str) -> None:
    """A compact frame's plain time columns: the window from their kept extremes
    found in place is the one from their float64 copies (epoch instants round in
    the cast: the cast of the least is the least of the casts)."""
    rng = np.random.default_rng(3)
    n = 1_000
    base = 1_765_000_000_000_000_000 if dtype != "uint32" else 1_000_000
    start = (base + rng.integers(0, 10**9, n)).astype(dtype)
    end = (start + rng.integers(1, 10**9, n)).astype(dtype)
    keep = rng.random(n) < 0.5
    keep[[start.argmin(), end.argmax()]] = False  # the extremes: not in it
    df = pd.DataFrame(
        {"start_ns": start, "end_ns": end, m.MEASURED_OK: keep}, copy=False
    )
    lo = np.fmin.reduce(start[keep].astype(np.float64))
    hi = np.fmax.reduce(end[keep].astype(np.float64))
    assert m.measured_window_s(df) == float(hi - lo) / 1e9


@pytest.mark.parametrize("size", [0, 1, 2, 1_000])
def test_runs_of_sorted_values_are_unique_with_counts(size: int) -> None:
    values = np.sort(np.random.default_rng(size).integers(0, max(size // 4, 1), size))
    got, counts = m._runs(values)
    want, want_counts = np.unique(values, return_counts=True)
    assert got.tolist() == want.tolist()
    assert counts.tolist() == want_counts.tolist()
