"""The KV knee from the engine model: the engine's prefix-cache hit against KV size at
one concurrency, each point a replay in virtual time (`trace cache-curve --engine`).
See docs/engine-model.md."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from replayer.config import EndpointConfig, Lanes, ReplayConfig
from replayer.launch import replay
from replayer.records.rundir import read_run_json
from replayer.runner.virtual import virtual_sim_config
from traces.materialize import PromptConfig


@dataclass(frozen=True, slots=True)
class EnginePoint:
    budget_tokens: int
    hit_rate: float | None  # over the requests served (None: none was)
    preemptions: int
    refused: int  # requests longer than this KV (the server would refuse them)
    # Of hit_rate, the share loaded from the host tier (None: the model has none).
    host_hit_rate: float | None = None


def engine_curve(
    trace_path: Path,
    source: str,
    budgets: Sequence[int],
    *,
    concurrency: int,
    think_scale: float,
    think_cap_s: float | None,
    max_inflight: int | None,
    tool_scale: float = 1.0,
    block_tokens: int | None,
    sim_args: Sequence[str] = (),
) -> list[EnginePoint]:
    """The engine's hit at each KV budget (rounded down to its block size), the
    trace replayed at ``concurrency`` lanes in virtual time on the engine model
    ``source`` (an ENGINE.json, or ``sim``) with its KV set to the budget."""
    sim = virtual_sim_config(source, sim_args)
    bs = sim.block_size
    points: list[EnginePoint] = []
    with tempfile.TemporaryDirectory(prefix="replayer-kv-") as tmp:
        for k, budget in enumerate(budgets):
            kv = budget // bs * bs
            if kv < 2 * bs:
                points.append(EnginePoint(budget, None, 0, 0))
                continue
            limit = min(sim.max_model_len, kv - bs)
            config = ReplayConfig(
                endpoint=EndpointConfig(),
                prompt=PromptConfig(block_tokens=block_tokens),
                schedule=Lanes(concurrency=concurrency),
                think_scale=think_scale,
                think_cap_s=think_cap_s,
                tool_scale=tool_scale,
                max_inflight=max_inflight,
                scrape_interval_s=0.0,
                sim_args=(
                    *sim_args,
                    "--kv-capacity-tokens",
                    str(kv),
                    "--max-model-len",
                    str(limit),
                ),
                virtual=source,
            )
            out = Path(tmp) / f"kv{k}"
            summary = replay(trace_path, config, out)
            virtual = read_run_json(out / "run.json").virtual
            assert virtual is not None
            assert virtual.engine is not None
            engine = virtual.engine
            queries = engine.prefix_cache_queries_tokens
            refused = summary.counts.failed
            hit = engine.prefix_cache_hits_tokens / queries if queries else None
            host = None
            if sim.host_capacity_tokens and queries:
                host = engine.prefix_cache_host_hits_tokens / queries
            points.append(EnginePoint(budget, hit, engine.preemptions, refused, host))
    return points
