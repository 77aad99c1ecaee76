"""The server-metrics files of a run directory: Prometheus samples scraped during
the run, raw while it goes on, parsed at its end. See docs/run-directory.md."""

from __future__ import annotations

import json

import pyarrow as pa

SERVER_METRICS_SCHEMA = pa.schema(
    [
        ("scrape_ns", pa.int64()),  # run-relative perf-counter ns
        ("metric", pa.string()),  # sample name, e.g. vllm:prefix_cache_hits_total
        ("labels", pa.string()),  # JSON object
        ("value", pa.float64()),
    ]
)

# While a run goes on, scrapes land raw in ``server_metrics/raw-<worker>-<seq>.parquet``
# every flush interval (a kill -9 loses at most the last interval); the run's end
# parses them into ``server_metrics.parquet`` and removes the folder.
SERVER_METRICS_RAW_DIR = "server_metrics"
SERVER_METRICS_RAW_SCHEMA = pa.schema(
    [
        ("scrape_ns", pa.int64()),  # run-relative perf-counter ns
        ("body", pa.string()),  # the /metrics response, Prometheus text format
    ]
)


def parse_metrics(text: str) -> list[tuple[str, str, float]]:
    """(sample name, labels JSON, value) for every sample in a Prometheus text body.

    Raises:
        ValueError: not Prometheus text.
    """
    from prometheus_client.parser import text_string_to_metric_families

    out: list[tuple[str, str, float]] = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = json.dumps(dict(sorted(sample.labels.items())))
            out.append((sample.name, labels, float(sample.value)))
    return out


def server_metrics_table(raw: pa.Table) -> tuple[pa.Table, int]:
    """Raw scrapes (SERVER_METRICS_RAW_SCHEMA) → samples (SERVER_METRICS_SCHEMA), and
    how many bodies could not be parsed."""
    stamps: list[int] = []
    names: list[str] = []
    labels: list[str] = []
    values: list[float] = []
    bad = 0
    for now, body in zip(
        raw.column("scrape_ns").to_pylist(), raw.column("body").to_pylist(), strict=True
    ):
        try:
            samples = parse_metrics(body or "")
        except ValueError:
            bad += 1
            continue
        stamps.extend([now] * len(samples))
        for name, label, value in samples:
            names.append(name)
            labels.append(label)
            values.append(value)
    columns = (stamps, names, labels, values)
    arrays = [
        pa.array(c, type=f.type)
        for c, f in zip(columns, SERVER_METRICS_SCHEMA, strict=True)
    ]
    return pa.Table.from_arrays(arrays, schema=SERVER_METRICS_SCHEMA), bad
