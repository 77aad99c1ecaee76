"""The simulator's counters and histograms under vLLM's names and units, rendered by
hand as Prometheus text 0.0.4, so a scraper written for vLLM reads it unchanged. See
docs/metrics.md."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

from replayer.sim.config import SimConfig
from replayer.sim.core import CoreStats

# vLLM's bucket boundaries, seconds.
TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
    2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
E2E_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
    60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip
TPOT_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
    5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip

# vLLM's tokens-per-engine-step buckets (vllm:iteration_tokens_total).
ITERATION_TOKEN_BUCKETS = (
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0,
    8192.0, 16384.0,
)  # fmt: skip


@dataclass(slots=True)
class Histogram:
    """Cumulative-on-render histogram; ``counts[i]`` = observations in bucket i only."""

    buckets: tuple[float, ...]
    counts: list[int] = field(init=False)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)  # last one: +Inf

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.count += 1


@dataclass(slots=True)
class EngineStats(CoreStats):
    """Everything /metrics exposes: the core's counters (tokens or requests, as vLLM
    counts), its gauges and the latency histograms."""

    num_gpu_blocks: int = 0
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    host_used_tokens: int = 0  # blocks in the host tier, in tokens
    ttft_s: Histogram = field(default_factory=lambda: Histogram(TTFT_BUCKETS_S))
    e2e_s: Histogram = field(default_factory=lambda: Histogram(E2E_BUCKETS_S))
    tpot_s: Histogram = field(default_factory=lambda: Histogram(TPOT_BUCKETS_S))
    iteration_tokens: Histogram = field(
        default_factory=lambda: Histogram(ITERATION_TOKEN_BUCKETS)
    )


def render_metrics(
    stats: EngineStats,
    model: str,
    *,
    block_size: int = 16,
    host: SimConfig | None = None,
) -> str:
    """Prometheus text exposition (format 0.0.4) of ``stats``; with ``host`` (the
    settings of a simulator with a host tier) also its per-tier families in the
    settings' dialect (:func:`host_tier_families`)."""
    label = f'model_name="{_escape(model)}"'
    out: list[str] = [
        # vLLM's info gauge: its labels say how the cache is laid out.
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="{block_size}",'
        'enable_prefix_caching="True",'
        f'num_gpu_blocks="{stats.num_gpu_blocks}",simulated="True"}} 1.0',
    ]

    def scalar(name: str, kind: str, help: str, value: float) -> None:
        out.append(f"# HELP {name} {help}")
        out.append(f"# TYPE {name} {kind}")
        out.append(f"{name}{{{label}}} {_number(value)}")

    scalar(
        "vllm:num_requests_running",
        "gauge",
        "Number of requests in model execution batches.",
        stats.running,
    )
    scalar(
        "vllm:num_requests_waiting",
        "gauge",
        "Number of requests waiting to be processed.",
        stats.waiting,
    )
    scalar(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage. 1 means 100 percent usage.",
        stats.kv_cache_usage,
    )
    scalar(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix cache queries, in terms of number of queried tokens.",
        stats.prefix_cache_queries_tokens,
    )
    scalar(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix cache hits, in terms of number of cached tokens.",
        stats.prefix_cache_hits_tokens,
    )
    scalar(
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        stats.prompt_tokens,
    )
    scalar(
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        stats.generation_tokens,
    )
    scalar(
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemption from the engine.",
        stats.preemptions,
    )
    scalar(
        "vllm:request_success_total",
        "counter",
        "Count of successfully processed requests.",
        stats.requests_success,
    )
    if host is not None:
        out.extend(host_tier_families(stats, label, host))
    for name, help, hist in (
        (
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            stats.ttft_s,
        ),
        (
            "vllm:e2e_request_latency_seconds",
            "Histogram of end to end request latency in seconds.",
            stats.e2e_s,
        ),
        (
            "vllm:time_per_output_token_seconds",
            "Histogram of time per output token in seconds.",
            stats.tpot_s,
        ),
        (
            "vllm:iteration_tokens_total",
            "Histogram of number of tokens per engine_step.",
            stats.iteration_tokens,
        ),
    ):
        out.append(f"# HELP {name} {help}")
        out.append(f"# TYPE {name} histogram")
        cumulative = 0
        for bound, n in zip((*hist.buckets, float("inf")), hist.counts, strict=True):
            cumulative += n
            le = "+Inf" if bound == float("inf") else _number(bound)
            out.append(f'{name}_bucket{{{label},le="{le}"}} {cumulative}')
        out.append(f"{name}_sum{{{label}}} {_number(hist.total)}")
        out.append(f"{name}_count{{{label}}} {hist.count}")
    return "\n".join(out) + "\n"


def host_tier_families(stats: EngineStats, label: str, host: SimConfig) -> list[str]:
    """The host tier as vLLM counts it (``vllm:prompt_tokens_by_source_total`` by
    ``source``, the offloading connector's CPU-to-GPU bytes and its CPU usage) or as
    SGLang does (``sglang:cached_tokens_total`` by ``cache_source``, HiCache's host
    tokens used and total, ``sglang:token_usage``)."""
    hits = stats.prefix_cache_hits_tokens
    host_hits = stats.host_hits_tokens
    capacity = host.host_capacity_tokens
    if host.host_dialect == "sglang":
        name = "sglang:cached_tokens_total"
        return [
            "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE sglang:prompt_tokens_total counter",
            f"sglang:prompt_tokens_total{{{label}}} "
            f"{float(stats.prefix_cache_queries_tokens)}",
            f"# HELP {name} Number of cached prompt tokens.",
            f"# TYPE {name} counter",
            f'{name}{{{label},cache_source="device"}} {float(hits - host_hits)}',
            f'{name}{{{label},cache_source="host"}} {float(host_hits)}',
            "# HELP sglang:token_usage The token usage.",
            "# TYPE sglang:token_usage gauge",
            f"sglang:token_usage{{{label}}} {_number(stats.kv_cache_usage)}",
            "# TYPE sglang:hicache_host_used_tokens gauge",
            f"sglang:hicache_host_used_tokens{{{label}}} "
            f"{float(stats.host_used_tokens)}",
            "# TYPE sglang:hicache_host_total_tokens gauge",
            f"sglang:hicache_host_total_tokens{{{label}}} {float(capacity)}",
        ]
    name = "vllm:prompt_tokens_by_source_total"
    computed = stats.prefix_cache_queries_tokens - hits
    moved = host_hits * host.host_bytes_per_token
    usage = stats.host_used_tokens / capacity if capacity else 0.0
    return [
        "# HELP vllm:prompt_tokens_by_source Number of prompt tokens by source.",
        "# TYPE vllm:prompt_tokens_by_source counter",
        f'{name}{{{label},source="local_compute"}} {float(computed)}',
        f'{name}{{{label},source="local_cache_hit"}} {float(hits - host_hits)}',
        f'{name}{{{label},source="external_kv_transfer"}} {float(host_hits)}',
        "# HELP vllm:kv_offload_total_bytes Number of bytes offloaded by KV connector",
        "# TYPE vllm:kv_offload_total_bytes counter",
        f'vllm:kv_offload_total_bytes_total{{{label},transfer_type="CPU_to_GPU"}} '
        f"{float(moved)}",
        "# TYPE vllm:kv_offload_cpu_cache_usage_perc gauge",
        f"vllm:kv_offload_cpu_cache_usage_perc{{{label}}} {_number(usage)}",
    ]


def _number(value: float) -> str:
    return repr(float(value)) if isinstance(value, float) else str(value)


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
