"""Per-tier hits: the families vLLM and SGLang expose (parsed from their own
exposition text), the rows' split, per session tree and over time, and old runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from analysis.load import load_run
from analysis.summary import summarize
from analysis.tiers import counter_tiers, usage_gauges
from replayer.cli import main
from replayer.records.server_metrics import parse_metrics

# vLLM's PrometheusStatLogger (vllm/v1/metrics/loggers.py): the counter
# vllm:prompt_tokens_by_source, labels model_name, engine, source in
# PromptTokenStats.ALL_SOURCES; prometheus_client adds _total and a _created
# sample. The CPU offloading connector's (vllm/distributed/kv_transfer
# offloading metrics): kv_offload_total_bytes by transfer_type, the CPU usage gauge.
VLLM = """\
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{{engine="0",model_name="m"}} {usage}
# HELP vllm:prompt_tokens_by_source_total Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_total counter
vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="local_compute"}} {compute}
vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="local_cache_hit"}} {local}
vllm:prompt_tokens_by_source_total{{engine="0",model_name="m",source="external_kv_transfer"}} {external}
# HELP vllm:prompt_tokens_by_source_created Number of prompt tokens by source.
# TYPE vllm:prompt_tokens_by_source_created gauge
vllm:prompt_tokens_by_source_created{{engine="0",model_name="m",source="local_compute"}} 1.7e+09
# HELP vllm:kv_offload_total_bytes_total Number of bytes offloaded by KV connector
# TYPE vllm:kv_offload_total_bytes_total counter
vllm:kv_offload_total_bytes_total{{engine="0",model_name="m",transfer_type="CPU_to_GPU"}} {loaded}
vllm:kv_offload_total_bytes_total{{engine="0",model_name="m",transfer_type="GPU_to_CPU"}} 2.0e+09
# HELP vllm:kv_offload_cpu_cache_usage_perc CPU KV cache usage.
# TYPE vllm:kv_offload_cpu_cache_usage_perc gauge
vllm:kv_offload_cpu_cache_usage_perc{{engine="0",model_name="m"}} {host_usage}
"""  # noqa: E501

# SGLang's scheduler metrics: sglang:cached_tokens_total by cache_source
# (device, host, storage) beside sglang:prompt_tokens_total; HiCache's host pool
# as used and total tokens (tp_rank 0 only), the device pool as token_usage.
SGLANG = """\
# HELP sglang:prompt_tokens_total Number of prefill tokens processed.
# TYPE sglang:prompt_tokens_total counter
sglang:prompt_tokens_total{{model_name="m",engine_type="unified"}} {prompt}
# HELP sglang:cached_tokens_total Number of cached prompt tokens.
# TYPE sglang:cached_tokens_total counter
sglang:cached_tokens_total{{model_name="m",engine_type="unified",cache_source="device"}} {device}
sglang:cached_tokens_total{{model_name="m",engine_type="unified",cache_source="host"}} {host}
sglang:cached_tokens_total{{model_name="m",engine_type="unified",cache_source="storage"}} {storage}
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{{model_name="m",engine_type="unified",tp_rank="0"}} {usage}
# HELP sglang:hicache_host_used_tokens Host KV cache used tokens.
# TYPE sglang:hicache_host_used_tokens gauge
sglang:hicache_host_used_tokens{{model_name="m",tp_rank="0"}} {used}
# HELP sglang:hicache_host_total_tokens Host KV cache total tokens.
# TYPE sglang:hicache_host_total_tokens gauge
sglang:hicache_host_total_tokens{{model_name="m",tp_rank="0"}} 4000000.0
"""  # noqa: E501


def _scrapes(*bodies: tuple[int, str]) -> pd.DataFrame:
    rows = [
        (t, name, labels, value)
        for t, body in bodies
        for name, labels, value in parse_metrics(body)
    ]
    return pd.DataFrame(rows, columns=["scrape_ns", "metric", "labels", "value"])


def test_vllm_prompt_tokens_by_source_give_each_tier() -> None:
    sm = _scrapes(
        (0, VLLM.format(compute=100, local=0, external=0, usage=0.1, host_usage=0,
                        loaded=0)),
        (10**9, VLLM.format(compute=400, local=400, external=200, usage=0.9,
                            host_usage=0.5, loaded=2.6e7)),
    )  # fmt: skip
    assert counter_tiers(sm) == pytest.approx(
        {"gpu": 400 / 900, "host": 200 / 900, "overall": 600 / 900,
         "host_load_bytes": 2.6e7}  # CPU_to_GPU only, not the stores
    )  # fmt: skip
    gpu, host = usage_gauges(sm)
    assert gpu.tolist() == [0.1, 0.9]
    assert host.tolist() == [0.0, 0.5]


def test_sglang_cache_source_gives_each_tier_storage_counted_off_the_gpu() -> None:
    sm = _scrapes(
        (0, SGLANG.format(prompt=0, device=0, host=0, storage=0, usage=0.2, used=0)),
        (
            10**9,
            SGLANG.format(
                prompt=1000,
                device=500,
                host=200,
                storage=100,
                usage=0.8,
                used=2_000_000,
            ),
        ),
    )
    assert counter_tiers(sm) == pytest.approx({"gpu": 0.5, "host": 0.3, "overall": 0.8})
    gpu, host = usage_gauges(sm)
    assert gpu.tolist() == [0.2, 0.8]
    assert host.tolist() == [0.0, 0.5]


def test_no_per_tier_family_gives_nothing() -> None:
    sm = _scrapes((0, "# TYPE vllm:prefix_cache_hits_total counter\n"
                      'vllm:prefix_cache_hits_total{model_name="m"} 5\n'))  # fmt: skip
    assert counter_tiers(sm) == {}


def _tier_records(rec, split: bool) -> list:
    rows = []
    for tree, (gpu, host) in {"a": (600, 200), "b": (100, 500)}.items():
        for i in range(3):
            rows.append(
                rec(
                    session_id=tree,
                    root_session_id=tree,
                    request_index=i,
                    start_ns=i * 10**9,
                    end_ns=i * 10**9 + 10**8,
                    first_token_ns=i * 10**9 + 10**7,
                    ttft_ns=10**7,
                    e2e_ns=10**8,
                    output_tokens=10,
                    server_prompt_tokens=1000,
                    cached_tokens=gpu + host,
                    cached_gpu_tokens=gpu if split else None,
                    cached_host_tokens=host if split else None,
                    ideal_cached_tokens=900,
                )
            )
    return rows


def test_rows_give_tiers_per_run_per_tree_and_over_time(
    tmp_path: Path, rec, make_run_dir
) -> None:
    run = make_run_dir(tmp_path / "r", _tier_records(rec, split=True))
    s = summarize(load_run(run))
    t = s.cache_tiers
    assert t is not None
    assert t.source == "rows"
    assert (t.gpu, t.host, t.overall) == pytest.approx((0.35, 0.35, 0.7))
    assert t.ideal == pytest.approx(0.9)
    assert t.overall == pytest.approx(s.cache_hit_rate.server)
    trees = t.by_tree.set_index("root_session_id")
    assert trees.loc["a", ["gpu", "host", "overall"]].tolist() == [0.6, 0.2, 0.8]
    assert trees.loc["b", ["gpu", "host", "overall"]].tolist() == [0.1, 0.5, 0.6]
    assert t.over_time["requests"].sum() == 6
    doc = s.as_dict()["cache_tiers"]
    assert {"source", "gpu", "host", "overall", "ideal", "by_tree", "over_time"} <= set(
        doc
    )
    assert json.dumps(doc, default=str)  # plain JSON


def test_counters_stand_in_where_the_rows_have_no_split(
    tmp_path: Path, rec, make_run_dir
) -> None:
    sm = [
        (0, "vllm:prompt_tokens_by_source_total", {"source": "local_compute"}, 0.0),
        (0, "vllm:prompt_tokens_by_source_total", {"source": "local_cache_hit"}, 0.0),
        (0, "vllm:prompt_tokens_by_source_total", {"source": "external_kv_transfer"},
         0.0),
        (9, "vllm:prompt_tokens_by_source_total", {"source": "local_compute"}, 300.0),
        (9, "vllm:prompt_tokens_by_source_total", {"source": "local_cache_hit"},
         500.0),
        (9, "vllm:prompt_tokens_by_source_total", {"source": "external_kv_transfer"},
         200.0),
    ]  # fmt: skip
    run = make_run_dir(
        tmp_path / "r", _tier_records(rec, split=False), server_metrics=sm
    )
    t = summarize(load_run(run)).cache_tiers
    assert t is not None
    assert t.source == "counters"
    assert (t.gpu, t.host) == pytest.approx((0.5, 0.2))
    assert t.by_tree is None


def test_old_runs_without_the_columns_analyze_as_before(
    tmp_path: Path, rec, make_run_dir
) -> None:
    run = make_run_dir(tmp_path / "r", _tier_records(rec, split=False))
    for part in (run / "requests").glob("*.parquet"):
        table = pq.read_table(part)
        old = table.drop_columns(["cached_gpu_tokens", "cached_host_tokens"])
        pq.write_table(old.replace_schema_metadata(table.schema.metadata), part)
    s = summarize(load_run(run))
    assert s.cache_tiers is None
    result = CliRunner().invoke(main, ["analyze", str(run), "--json"])
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert "cache_tiers" not in doc
    assert math.isclose(doc["cache_hit_rate"]["server"], 0.7)


def test_report_shows_the_tiers_of_runs_that_split_them(
    tmp_path: Path, rec, make_run_dir
) -> None:
    split = make_run_dir(tmp_path / "split", _tier_records(rec, split=True))
    plain = make_run_dir(tmp_path / "plain", _tier_records(rec, split=False))
    out = tmp_path / "report.html"
    args = ["report", str(split), str(plain), "-o", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    page = out.read_text()
    assert "KV cache per tier: GPU and host" in page
    assert "Hits per tier over time" not in page  # a figure: a PNG, not text
    assert page.count("per session tree") == 1  # the run with the split only


def test_analyze_text_gives_the_tiers_per_run_over_time_and_per_tree(
    tmp_path: Path, rec, make_run_dir
) -> None:
    run = make_run_dir(tmp_path / "r", _tier_records(rec, split=True))
    result = CliRunner().invoke(main, ["analyze", str(run)])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "cache hit: host tier" in text
    assert "hits per tier over time (rows)" in text
    assert "hits per tier by session tree (2 of 2" in text
