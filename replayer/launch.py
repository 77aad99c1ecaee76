"""The library entry: :func:`replay` takes a trace and a typed config and writes a run
directory, picking the topology (one process, ``--workers`` or ``--ray``) and nothing
else. See docs/architecture.md."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import TextIO

from replayer import __version__
from replayer.clock import MonotonicClock
from replayer.config import (
    EndpointConfig,
    Lanes,
    ReplayConfig,
    public_url,
)
from replayer.errors import ConfigError, EndpointError
from replayer.play.client import Client
from replayer.play.progress import ReplayOutcome
from replayer.records import RunMeta, SimRecord, TraceInfo
from replayer.records.rundir import (
    check_new_run_dir,
    new_run_id,
    read_run_json,
    trace_content_hash,
    write_run_json,
)
from replayer.runner.local import (
    check_prompt_memory,
    fit_warnings,
    replay_trace,
    run_async,
)
from traces.model import Trace
from traces.table import request_column


def replay(
    trace: str | Path | Trace,
    config: ReplayConfig,
    run_dir: str | Path | None = None,
    *,
    run_id: str | None = None,
    progress: TextIO | None = None,
    sim: SimRecord | None = None,
) -> ReplayOutcome:
    """Replay ``trace`` (a path, or a loaded Trace for one worker) per ``config``
    into ``run_dir`` (default ``runs/<run id>``); return its :class:`ReplayOutcome`.
    ``sim``: the settings of the built-in simulator ``config``'s URL already points
    at (a study that started it once, from :func:`running_endpoint`).

    Raises:
        ReplayerError, TraceError: bad input, an unreachable endpoint, a worker that
            died; the message names what and where.
        KeyboardInterrupt: Ctrl-C or SIGTERM; the run directory is readable.

    Example::

        from replayer.launch import replay
        config = ReplayConfig(endpoint=EndpointConfig(base_url=URL, model=MODEL))
        outcome = replay("trace.jsonl", config, "runs/x")
    """
    from replayer.runner.workers import replay_with_workers
    from traces.io import read_trace

    run_id = run_id or new_run_id()
    out = Path(run_dir) if run_dir is not None else Path("runs") / run_id
    check_new_run_dir(out)
    trace_path = None if isinstance(trace, Trace) else Path(trace)
    if trace_path is None and config.workers > 1:
        raise ConfigError("--workers needs a trace file that each worker reads")
    if trace_path is None and config.ray_address is not None:
        raise ConfigError("--ray needs a trace file that each actor reads")
    # Bad input fails before any server starts; with workers, each reads its own.
    loaded: Trace | None = trace if isinstance(trace, Trace) else None
    notes: list[str] = []
    if trace_path is not None and config.workers == 1 and not config.ray_address:
        loaded = read_trace(trace_path, mooncake_rows=config.mooncake_rows, notes=notes)
    if loaded is not None:
        check_prompt_memory(loaded, config)
    meta = RunMeta(
        run_id=run_id,
        tool_version=__version__,
        python=sys.version.split()[0],
        trace=TraceInfo(
            path=None if trace_path is None else str(trace_path.absolute()),
            content_hash=None if trace_path is None else trace_content_hash(trace_path),
        ),
    )
    meta = _said(meta, notes, progress)
    if config.virtual is not None:
        from replayer.runner.virtual import replay_virtual, virtual_sim_config

        if loaded is None:
            raise ConfigError("--virtual runs in one process: drop --workers and --ray")
        engine = virtual_sim_config(config.virtual, config.sim_args)
        config = replace(config, max_model_len=engine.max_model_len)
        meta = _say_fit(meta, loaded, config, progress)
        summary = replay_virtual(loaded, config, out, meta=meta, progress=progress)
        _record_steady_state(summary)
        return summary
    with running_endpoint(config) as (config, started):
        sim = started if started is not None else sim
        meta = replace(meta, simulated=sim is not None, sim=sim)
        if sim is not None and loaded is not None:
            said = sim_fit_warnings(loaded, config, sim)
            meta = replace(meta, warnings=[*meta.warnings, *said])
        if config.max_model_len is None:
            length = run_async(lambda: served_context(config.endpoint))
            config = replace(config, max_model_len=length)
        if loaded is not None:
            meta = _say_fit(meta, loaded, config, progress)
        if config.ray_address is not None:
            from replayer.runner.ray_actors import replay_with_ray

            assert trace_path is not None
            summary = replay_with_ray(
                trace_path, config, out, meta=meta, progress=progress
            )
        elif loaded is None:
            assert trace_path is not None
            summary = replay_with_workers(
                trace_path, config, out, meta=meta, progress=progress
            )
        else:
            ready: Trace = loaded
            summary = run_async(
                lambda: replay_trace(ready, config, out, meta=meta, progress=progress)
            )
    _record_steady_state(summary)
    return summary


def _say_fit(
    meta: RunMeta, trace: Trace, config: ReplayConfig, progress: TextIO | None
) -> RunMeta:
    """Say now (and in run.json's warnings) how many requests cannot fit the
    server's context."""
    return _said(meta, fit_warnings(trace, config), progress)


def _said(meta: RunMeta, said: list[str], progress: TextIO | None) -> RunMeta:
    """``said`` written now as warnings, and kept in run.json's."""
    if progress is not None:
        for line in said:
            progress.write(f"warning: {line}\n")
    return replace(meta, warnings=[*meta.warnings, *said])


def _record_steady_state(summary: ReplayOutcome) -> None:
    """The finished run's steady-state window into its run.json (every worker's
    rows: computed from the part files once the run is whole)."""
    path = summary.run_dir / "run.json"
    if summary.steady is not None and path.is_file():
        meta = read_run_json(path)
        write_run_json(path, replace(meta, steady_state=summary.steady.record()))


def sim_fit_warnings(trace: Trace, config: ReplayConfig, sim: SimRecord) -> list[str]:
    """Whether the built-in simulator's KV cache holds what the replay keeps live:
    with N lanes, about the N largest session trees' longest prompts (as sent)."""
    schedule = config.schedule
    capacity = sim.settings.kv_capacity_tokens
    if not isinstance(schedule, Lanes) or capacity <= 0:
        return []
    peaks = []
    for root in trace.sessions:
        peak = 0
        for s, _ in root.walk():
            scale = (config.prompt.block_tokens or s.block_size) / s.block_size
            inputs = request_column(s.requests, "input_tokens")
            if inputs.size:
                peak = max(peak, int(inputs.max() * scale))
        peaks.append(min(peak, config.prompt.max_input_tokens or peak))
    live = sum(sorted(peaks, reverse=True)[: schedule.concurrency])
    if live <= capacity:
        return []
    return [
        f"the simulated endpoint's KV cache ({capacity:,} tokens) is smaller than "
        f"what {schedule.concurrency} live session trees hold (~{live:,} tokens): "
        "prefixes will be evicted and recomputed. Shrink contexts with "
        "--block-tokens, or give the simulator room with "
        "--sim-args '--kv-capacity-tokens N'"
    ]


@contextlib.contextmanager
def running_endpoint(
    config: ReplayConfig,
) -> Iterator[tuple[ReplayConfig, SimRecord | None]]:
    """``config`` with a URL and a model: the built-in simulated endpoint is started
    (and stopped after) when it names no URL; yields the simulator's settings too.
    A ``--virtual`` config is yielded as it is (each replay makes its own engine)."""
    sim: SimRecord | None = None
    if config.virtual is not None:  # an engine model in virtual time: no server
        yield config, None
        return
    with contextlib.ExitStack() as stack:
        endpoint = config.endpoint
        if endpoint.base_url is None:
            from replayer.sim.process import running_sim, sim_config

            url = stack.enter_context(running_sim(config.sim_args))
            endpoint = replace(endpoint, base_url=url)
            sim = SimRecord(
                args=" ".join(config.sim_args), settings=sim_config(config.sim_args)
            )
        if endpoint.model is None:
            model = run_async(lambda: served_model(replace(endpoint, model="?")))
            endpoint = replace(endpoint, model=model)
        yield replace(config, endpoint=endpoint), sim


async def served_context(endpoint: EndpointConfig) -> int | None:
    """The ``max_model_len`` the server's /v1/models gives the model (None: not
    given, or no model list)."""
    async with Client(endpoint, MonotonicClock(), limit=1) as client:
        models = await client.models()
    return None if models is None else models.get(str(endpoint.model))


async def served_model(endpoint: EndpointConfig) -> str:
    """The first model the server lists (when the user named none)."""
    async with Client(endpoint, MonotonicClock(), limit=1) as client:
        models = await client.check()
    shown = public_url(endpoint.base_url)
    if models is None:
        raise EndpointError(f"{shown} has no /v1/models to pick a model; pass --model")
    if not models:
        raise EndpointError(f"{shown} lists no models; pass --model")
    return models[0]
