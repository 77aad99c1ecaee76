"""SimConfig: every knob of the simulated endpoint, its default and reason, validated
once at construction (no I/O, no aiohttp). See docs/engine-model.md."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from replayer.errors import ConfigError

POLICIES = ("vllm", "vllm-chunk", "reserve")
# How a host tier's hits are reported: vLLM's usage split and prompt_tokens_by_source,
# or SGLang's cache_source split.
HOST_DIALECTS = ("vllm", "sglang")


# Upper bounds: far past any server, short of what would exhaust this machine.
_MOST: dict[str, int] = {
    "block_size": 1 << 20,
    "kv_capacity_tokens": 1 << 40,
    "host_capacity_tokens": 1 << 40,
    "max_model_len": 1 << 40,
    "max_num_seqs": 1 << 20,
    "max_num_batched_tokens": 1 << 31,
    "mean_output_tokens": 1 << 31,
    "seed": (1 << 63) - 1,
}
_MOST_BLOCKS = 1 << 23  # GPU blocks of the block pool (its arrays, ~100 bytes a block)


def _knob(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """Configuration of the simulated OpenAI-compatible endpoint.

    The defaults model one H100-class GPU serving an ~8B model with vLLM: 128 KiB of
    KV cache per token, ~60 GiB of it for KV (about 500K tokens), ~16K prefill tok/s.

        SimConfig(model="Qwen/Qwen3-8B", kv_capacity_tokens=200_000, speed=10.0)
        SimConfig.fast()  # zero delays, for tests
    """

    model: str = _knob("sim", "Served model name (what /v1/models lists).")
    accept_any_model: bool = _knob(
        False, "Serve requests for any model name instead of answering 404."
    )
    block_size: int = _knob(16, "Prefix-cache block size in tokens (vLLM's default).")
    kv_capacity_tokens: int = _knob(
        524_288, "GPU-tier KV cache capacity in tokens (~64 GiB at 128 KiB/token)."
    )
    host_capacity_tokens: int = _knob(
        0, "Host-tier (CPU memory) KV capacity in tokens; 0 disables the tier."
    )
    max_model_len: int = _knob(
        262_144, "Longest prompt + max_tokens accepted; longer requests get 400."
    )
    max_num_seqs: int = _knob(256, "Most sequences running at once; others queue.")
    max_num_batched_tokens: int = _knob(
        8192, "Token budget of one engine step (chunked prefill, as vLLM)."
    )
    prefill_us_per_token: float = _knob(
        60.0, "Prefill cost per uncached prompt token, microseconds (~16K tok/s)."
    )
    host_hit_us_per_token: float = _knob(
        5.0, "Cost per prompt token loaded from the host tier, microseconds."
    )
    host_bytes_per_token: float = _knob(
        0.0,
        "KV bytes per token loaded from the host tier; with --host-bandwidth-gbs "
        "each host hit also costs bytes / bandwidth (0: no such term).",
    )
    host_bandwidth_gbs: float = _knob(
        0.0, "Host-to-device bandwidth for host-tier loads, GB/s (1e9 bytes/s)."
    )
    host_dialect: str = _knob(
        "vllm",
        "How host-tier hits are reported: 'vllm' (usage local_cached_tokens / "
        "external_cached_tokens, vllm:prompt_tokens_by_source_total) or 'sglang' "
        "(usage cached_tokens_details device/host, "
        "sglang:cached_tokens_total{cache_source}).",
    )
    gpu_hit_us_per_token: float = _knob(
        0.0, "Cost per prompt token found in the GPU tier, microseconds."
    )
    request_overhead_us: float = _knob(
        0.0, "Added step time per request scheduled for the first time, microseconds."
    )
    decode_base_ms: float = _knob(
        8.0, "Fixed time of one engine step, milliseconds (TPOT of a lone request)."
    )
    decode_per_seq_ms: float = _knob(
        0.25, "Added step time per decoding sequence, milliseconds (batch cost)."
    )
    decode_us_per_context_token: float = _knob(
        0.04, "Added step time per KV token read by decoding sequences, microseconds."
    )
    policy: str = _knob(
        "vllm",
        "Scheduling: 'vllm' (vLLM v1: KV allocated as computed, newest preempted "
        "when blocks run out, a waiting request admitted only when its whole prompt "
        "fits, as --scheduler-reserve-full-isl, vLLM's default), 'vllm-chunk' (the "
        "same, admitted when its first chunk fits: vLLM with "
        "--no-scheduler-reserve-full-isl and before that flag) or 'reserve' (whole "
        "output reserved at admission, no preemption).",
    )
    mean_output_tokens: int = _knob(
        512, "Mean length before the seeded EOS when ignore_eos is not set."
    )
    speed: float = _knob(1.0, "Divides every modeled delay (10 = ten times faster).")
    fail_rate: float = _knob(0.0, "Fraction of requests answered with HTTP 500.")
    disconnect_rate: float = _knob(
        0.0, "Fraction of streams whose connection is dropped mid-stream."
    )
    stall_rate: float = _knob(0.0, "Fraction of streams that stall mid-stream.")
    stall_s: float = _knob(
        5.0, "Length of a stall, wall-clock seconds (not divided by --speed)."
    )
    seed: int = _knob(0, "Seed of output lengths, generated words and faults.")

    def __post_init__(self) -> None:
        for name in ("block_size", "max_num_seqs", "max_num_batched_tokens"):
            _require(getattr(self, name) >= 1, name, ">= 1", getattr(self, name))
        _require(self.seed >= 0, "seed", ">= 0", self.seed)
        for name, most in _MOST.items():
            value = getattr(self, name)
            _require(value <= most, name, f"<= {most:,}", value)
        blocks = self.kv_capacity_tokens // max(1, self.block_size)
        _require(
            blocks <= _MOST_BLOCKS,
            "kv_capacity_tokens / block_size",
            f"<= {_MOST_BLOCKS:,} blocks (the block pool sizes its arrays by it)",
            blocks,
        )
        _require(
            self.mean_output_tokens >= 1,
            "mean_output_tokens",
            ">= 1",
            self.mean_output_tokens,
        )
        _require(self.max_model_len >= 1, "max_model_len", ">= 1", self.max_model_len)
        _require(
            self.host_capacity_tokens >= 0,
            "host_capacity_tokens",
            ">= 0",
            self.host_capacity_tokens,
        )
        if self.kv_capacity_tokens < self.max_model_len + self.block_size:
            raise ConfigError(
                "kv_capacity_tokens must be >= max_model_len + block_size so that "
                f"the longest request fits (got {self.kv_capacity_tokens} < "
                f"{self.max_model_len} + {self.block_size})"
            )
        for name in (
            "prefill_us_per_token",
            "host_hit_us_per_token",
            "host_bytes_per_token",
            "host_bandwidth_gbs",
            "gpu_hit_us_per_token",
            "request_overhead_us",
            "decode_base_ms",
            "decode_per_seq_ms",
            "decode_us_per_context_token",
            "stall_s",
        ):
            value = getattr(self, name)
            _require(math.isfinite(value) and value >= 0, name, ">= 0", value)
        _require(
            math.isfinite(self.speed) and self.speed > 0, "speed", "> 0", self.speed
        )
        for name in ("fail_rate", "disconnect_rate", "stall_rate"):
            value = getattr(self, name)
            _require(0.0 <= value <= 1.0, name, "in [0, 1]", value)
        _require(bool(self.model), "model", "non-empty", self.model)
        rule = f"one of {', '.join(POLICIES)}"
        _require(self.policy in POLICIES, "policy", rule, self.policy)
        rule = f"one of {', '.join(HOST_DIALECTS)}"
        dialect = self.host_dialect
        _require(dialect in HOST_DIALECTS, "host_dialect", rule, dialect)
        if self.host_bytes_per_token > 0 and self.host_bandwidth_gbs <= 0:
            raise ConfigError(
                "host_bytes_per_token needs host_bandwidth_gbs > 0 (the load's "
                f"bandwidth; got {self.host_bandwidth_gbs!r})"
            )

    @property
    def host_load_us_per_token(self) -> float:
        """What one token loaded from the host tier costs, µs: the per-token term
        plus its bytes over the host-to-device bandwidth."""
        moved = 0.0
        if self.host_bytes_per_token > 0:
            moved = self.host_bytes_per_token / (self.host_bandwidth_gbs * 1e3)
        return self.host_hit_us_per_token + moved

    @classmethod
    def fast(cls, **overrides: Any) -> SimConfig:
        """A config with zero modeled delays (tests, benchmarks); ``overrides`` win."""
        zero = {
            "prefill_us_per_token": 0.0,
            "host_hit_us_per_token": 0.0,
            "gpu_hit_us_per_token": 0.0,
            "request_overhead_us": 0.0,
            "decode_base_ms": 0.0,
            "decode_per_seq_ms": 0.0,
            "decode_us_per_context_token": 0.0,
        }
        return cls(**{**zero, **overrides})


def _require(ok: bool, name: str, rule: str, got: object) -> None:
    if not ok:
        raise ConfigError(f"{name} must be {rule} (got {got!r})")
