"""The AgentX protocol's bookkeeping: the checks before a replay (the duplication
factor) and run.json's ``protocol`` record. The behaviour lives where it acts
(``session``, ``schedule``, ``analysis.validity``); see docs/agentx.md."""

from __future__ import annotations

from replayer.config import Lanes, ReplayConfig
from replayer.errors import ConfigError
from replayer.records.meta import ProtocolInfo
from traces.model import Trace


def duplication_factor(trace: Trace, config: ReplayConfig) -> float | None:
    """Live trees per distinct tree of the trace (lanes only): above 1, some trees
    play in more than one lane at once."""
    schedule = config.schedule
    if not isinstance(schedule, Lanes) or not trace.sessions:
        return None
    return schedule.concurrency / len(trace.sessions)


def check_duplication(trace: Trace, config: ReplayConfig) -> None:
    """Clones without a cache-bust marker would hit each other's cache and inflate
    the hit rate: more lanes than distinct trees needs per-replay markers."""
    factor = duplication_factor(trace, config)
    if factor is not None and factor > 1 and not config.prompt.replay_markers:
        assert isinstance(config.schedule, Lanes)
        raise ConfigError(
            f"--concurrency {config.schedule.concurrency} is more than the trace's "
            f"{len(trace.sessions)} session trees (duplication factor {factor:.2f}) "
            "and --no-replay-markers makes the clones share cache; drop "
            "--no-replay-markers or lower --concurrency"
        )


def window_s(config: ReplayConfig) -> float | None:
    """The measured window's planned length: ``--duration`` after a warm-up phase;
    without one, ``--duration`` less the flag-only ``--warmup`` (both count from the
    run's start then). None: no duration (the trace decides)."""
    if config.duration_s is None:
        return None
    if config.phased:
        return config.duration_s
    return max(0.0, config.duration_s - config.warmup_s)


def protocol_meta(trace: Trace, config: ReplayConfig) -> ProtocolInfo:
    """``run.json`` ``protocol`` before the run: the resolved settings."""
    return ProtocolInfo(
        profile=config.profile,
        start_ratio=config.start_ratio,
        cache_warmup_s=config.cache_warmup_s,
        window_s=window_s(config),
        idle_skip_s=config.idle_skip_s,
        recycle=config.loop,
        replay_markers=config.prompt.replay_markers,
        on_error=config.on_error,
        session_header=config.session_header,
        session_id_scope=config.session_id_scope,
        live_assistant=config.live_assistant,
        distinct_trees=len(trace.sessions),
        duplication_factor=duplication_factor(trace, config),
    )
