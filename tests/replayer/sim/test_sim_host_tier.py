"""The simulator's host tier in both dialects: the usage split and the per-tier
metric families (vLLM's, SGLang's), and its load cost in bytes over bandwidth."""

from __future__ import annotations

import pytest

from replayer.errors import ConfigError
from replayer.play.sse import usage_tiers
from replayer.sim import SimConfig
from replayer.sim.cache import block_hashes
from replayer.sim.core import CoreRequest, Scheduler

_TIER = {
    "block_size": 4,
    "kv_capacity_tokens": 64,
    "max_model_len": 60,
    "host_capacity_tokens": 64,
}


async def _evict_then_hit(sim) -> tuple[dict, dict[str, float]]:
    a = list(range(1000, 1042))
    await sim.completion(a)
    await sim.completion(list(range(2000, 2042)))
    again = await sim.completion(a)
    assert again.cached_tokens == 40  # 5 blocks from the GPU tier + 5 from host
    return again.usage, await sim.metrics_by_labels()


async def test_vllm_dialect_splits_usage_and_counts_by_source(start_sim) -> None:
    knobs = {"host_bytes_per_token": 1000.0, "host_bandwidth_gbs": 1.0}
    async with start_sim(**_TIER, **knobs) as sim:
        usage, m = await _evict_then_hit(sim)
    details = usage["prompt_tokens_details"]
    assert details["local_cached_tokens"] == 20
    assert details["external_cached_tokens"] == 20
    assert usage_tiers(usage) == (20, 20)
    source = "vllm:prompt_tokens_by_source_total[source={}]"
    assert m[source.format("external_kv_transfer")] == 20
    assert m[source.format("local_cache_hit")] == 20
    assert m[source.format("local_compute")] == 3 * 42 - 40
    # Every prompt token comes from one of the three sources.
    assert sum(m[source.format(s)] for s in ("local_compute", "local_cache_hit",
               "external_kv_transfer")) == m["vllm:prompt_tokens_total"]  # fmt: skip
    assert m["vllm:kv_offload_total_bytes_total[transfer_type=CPU_to_GPU]"] == 20_000
    assert 0 < m["vllm:kv_offload_cpu_cache_usage_perc"] <= 1
    assert not any(k.startswith("sglang:") for k in m)


async def test_sglang_dialect_splits_usage_and_counts_by_cache_source(
    start_sim,
) -> None:
    async with start_sim(**_TIER, host_dialect="sglang") as sim:
        usage, m = await _evict_then_hit(sim)
    assert usage["prompt_tokens_details"]["cached_tokens_details"] == {
        "device": 20,
        "host": 20,
    }
    assert usage_tiers(usage) == (20, 20)
    assert m["sglang:cached_tokens_total[cache_source=device]"] == 20
    assert m["sglang:cached_tokens_total[cache_source=host]"] == 20
    assert m["sglang:prompt_tokens_total"] == 3 * 42
    assert m["sglang:hicache_host_total_tokens"] == 64
    assert 0 < m["sglang:hicache_host_used_tokens"] <= 64
    assert not any(k.startswith("vllm:prompt_tokens_by_source") for k in m)


async def test_no_host_tier_keeps_the_usage_and_metrics_as_they_were(start_sim) -> None:
    async with start_sim(block_size=4) as sim:
        prompt = list(range(1000, 1042))
        await sim.completion(prompt)
        warm = await sim.completion(prompt)
        m = await sim.metrics_by_labels()
    assert warm.usage["prompt_tokens_details"] == {"cached_tokens": 40}
    assert usage_tiers(warm.usage) == (None, None)
    assert not any("by_source" in k or k.startswith("sglang:") for k in m)


def test_host_load_costs_bytes_over_bandwidth_beside_the_per_token_term() -> None:
    cfg = SimConfig.fast(
        host_hit_us_per_token=2.0, host_bytes_per_token=131072, host_bandwidth_gbs=16
    )
    assert cfg.host_load_us_per_token == pytest.approx(2.0 + 131072 / 16e3)
    core = Scheduler(cfg)
    assert core.step_duration_us(0, 0, host_hit=100) == pytest.approx(
        100 * cfg.host_load_us_per_token
    )


def test_core_counts_host_hits_at_first_admission() -> None:
    cfg = SimConfig.fast(**_TIER)
    core = Scheduler(cfg)
    a = list(range(1000, 1042))

    def run(ids: list[int]) -> CoreRequest:
        req = CoreRequest(len(ids), 1, block_hashes(ids, 4))
        core.add(req)
        while core.step() is not None:
            pass
        return req

    run(a)
    run(list(range(2000, 2042)))
    again = run(a)
    assert (again.cached_tokens, again.host_hit_tokens) == (40, 20)
    assert core.stats.host_hits_tokens == 20


@pytest.mark.parametrize(
    ("knobs", "says"),
    [
        ({"host_dialect": "trtllm"}, "host_dialect must be one of vllm, sglang"),
        ({"host_bytes_per_token": 1000.0}, "host_bytes_per_token needs"),
        ({"host_bandwidth_gbs": -1.0}, "host_bandwidth_gbs must be >= 0"),
    ],
)
def test_bad_host_settings_are_refused(knobs: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        SimConfig.fast(**knobs)


@pytest.mark.parametrize(
    ("usage", "split"),
    [
        # vLLM (vllm#52199): a KV connector's hits (CPU offloading) are external.
        (
            {
                "prompt_tokens_details": {
                    "cached_tokens": 48,
                    "local_cached_tokens": 32,
                    "external_cached_tokens": 16,
                }
            },
            (32, 16),
        ),
        # SGLang's meta_info shape, with its storage tier counted off the GPU.
        ({"cached_tokens_details": {"device": 2, "host": 3, "storage": 1}}, (2, 4)),
        ({"prompt_tokens_details": {"cached_tokens": 8}}, (None, None)),
        ({"cached_tokens_details": None}, (None, None)),
        (None, (None, None)),
    ],
)
def test_usage_tiers_reads_both_servers(usage, split) -> None:
    assert usage_tiers(usage) == split
