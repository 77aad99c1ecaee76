"""A replay in virtual time: the replayer's own schedule, sessions and recorder on a
virtual-time loop, the simulated engine in place of a server. See
docs/engine-model.md."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any, TextIO

from click.core import ParameterSource

from replayer.config import ReplayConfig
from replayer.errors import ConfigError
from replayer.play.client import Outcome
from replayer.play.progress import ReplayOutcome
from replayer.records import RunMeta, VirtualEngineStats, VirtualRecord
from replayer.records.engine_model import (
    CacheShape,
    EngineModel,
    ServerInfo,
    StepTerms,
    read_engine_model,
)
from replayer.runner.local import replay_trace
from replayer.runner.vloop import VirtualClock, VirtualLoop, run_virtual
from replayer.sim.cache import Ids, as_ids, block_hashes
from replayer.sim.config import SimConfig
from replayer.sim.core import CoreRequest
from replayer.sim.dice import roll
from replayer.sim.prompts import ChatHashes, PromptHashes
from replayer.sim.virtual import VirtualEngine, VirtualRequest
from replayer.sim.wire import (
    ApiError,
    GenerateRequest,
    Kind,
    chat_messages,
    check_request,
    load_body,
    parse_request,
    word_table,
)

# --virtual's value for "the built-in simulator's settings (and --sim-args)".
BUILT_IN = "sim"


def engine_model_of(config: SimConfig) -> EngineModel:
    """The engine model a simulator's settings amount to."""
    values = asdict(config)
    steps = {f.name: values[f.name] for f in fields(StepTerms)}
    # The model's host term is the whole load: bytes over bandwidth folded in.
    steps["host_hit_us_per_token"] = config.host_load_us_per_token
    cache = {f.name: values[f.name] for f in fields(CacheShape)}
    return EngineModel(
        steps=StepTerms(**steps),
        cache=CacheShape(**cache),
        server=ServerInfo(model=config.model, engine="replayer-sim"),
    )


def virtual_sim_config(source: str, sim_args: Sequence[str]) -> SimConfig:
    """The simulator settings of ``--virtual SOURCE``: an ENGINE.json, or ``sim``
    (the built-in simulator's). ``--sim-args`` given on the command line override
    either (a what-if: another KV size, a host tier, another policy).

    Raises:
        EngineModelError: the ENGINE.json cannot be used.
        ConfigError: the settings are out of range.
    """
    from replayer.sim.process import sim_settings

    settings: dict[str, Any]
    if source == BUILT_IN:
        settings = dict(sim_settings(sim_args))
    else:
        model = read_engine_model(Path(source))
        settings = {
            **asdict(model.steps),
            **asdict(model.cache),
            "model": model.server.model or "sim",
            "accept_any_model": True,
            **_explicit_sim_args(sim_args),
        }
    settings["accept_any_model"] = True
    known = {f.name for f in fields(SimConfig)}
    return SimConfig(**{k: v for k, v in settings.items() if k in known})


def _explicit_sim_args(args: Sequence[str]) -> dict[str, Any]:
    from replayer.sim.cli import sim

    if not args:
        return {}
    ctx = sim.make_context("sim", list(args), resilient_parsing=True)
    return {
        name: value
        for name, value in ctx.params.items()
        if name not in ("host", "port")
        and ctx.get_parameter_source(name) == ParameterSource.COMMANDLINE
    }


class VirtualClient:
    """The replayer's client on the virtual engine: each request is parsed as the
    simulator parses it, gets the simulator's seeded fate, and ends when the engine
    says; no sockets."""

    def __init__(
        self, loop: VirtualLoop, engine: VirtualEngine, config: SimConfig, kind: Kind
    ) -> None:
        self.loop = loop
        self.engine = engine
        self.config = config
        self.kind = kind
        self.rng = random.Random(config.seed)
        self.requests = 0
        self.prompts = PromptHashes(config.block_size)
        self.chats = ChatHashes(config.block_size)

    async def check(self) -> list[str] | None:
        return None if self.config.accept_any_model else [self.config.model]

    async def send(
        self,
        body: bytes,
        out: Outcome | None = None,
        *,
        headers: Mapping[str, str] | None = None,
    ) -> Outcome:
        out = out if out is not None else Outcome()
        loop = self.loop
        out.start_ns = loop.now_ns
        out.slot_wait_ns = out.connect_ns = 0
        cfg = self.config
        try:
            req, tokens, hashes = self._parse(body)
        except ApiError as exc:
            out.http_status = exc.status
            out.fail("http_error", f"HTTP {exc.status}", exc.message)
            out.end_ns = loop.now_ns
            return out
        dice = roll(self.rng, cfg, req)
        if dice.fail:
            out.http_status = 500
            out.fail("http_error", "HTTP 500", "simulated server error")
            out.end_ns = loop.now_ns
            return out
        self.requests += 1
        done: asyncio.Future[None] = loop.create_future()
        vreq = VirtualRequest(
            CoreRequest(tokens, dice.output_tokens, hashes),
            loop.now_ns,
            on_event=_waker(done),
        )
        vreq.core.handle = vreq
        self.engine.submit(vreq, loop.now_ns)
        out.http_status = 200
        try:
            await done
        except asyncio.CancelledError:
            self.engine.abort(vreq, loop.now_ns)
            self._fill(out, vreq, req.max_tokens, dice.word_offset)
            out.end_ns = loop.now_ns
            out.fail("cancelled", "CancelledError", "cancelled")
            raise
        self._fill(out, vreq, req.max_tokens, dice.word_offset)
        out.end_ns = vreq.token_times_ns[-1]
        return out

    def _parse(self, body: bytes) -> tuple[GenerateRequest, int, Ids]:
        """The request as the simulator parses it, its prompt's length and block
        hashes; a token-id prompt is hashed only past what a recent one shared."""
        cfg = self.config
        if self.kind == "chat":
            data = load_body(body)
            tokens, hashes = self.chats.hash(chat_messages(data, cfg))
            return check_request(data, self.kind, cfg, [], tokens), tokens, hashes
        if self.kind == "completions":
            split = self.prompts.split(body)
            if split is not None:
                data = load_body(split.rest)
                req = check_request(data, self.kind, cfg, [], split.tokens)
                return req, split.tokens, split.hash_ids
        req = parse_request(body, self.kind, cfg)
        ids = req.prompt_ids
        return req, len(ids), as_ids(block_hashes(ids, cfg.block_size))

    def _fill(
        self, out: Outcome, vreq: VirtualRequest, max_tokens: int, word_offset: int
    ) -> None:
        times = vreq.token_times_ns
        core = vreq.core
        out.server_prompt_tokens = core.prompt_tokens
        out.cached_tokens = max(0, core.cached_tokens)
        if self.config.host_capacity_tokens and core.cached_tokens >= 0:
            # The split the live simulator's usage gives with a host tier.
            out.cached_host_tokens = core.host_hit_tokens
            out.cached_gpu_tokens = core.cached_tokens - core.host_hit_tokens
        if not times:
            return
        start = out.start_ns
        out.first_token_ns = times[0]
        out.chunk_times_ns = [t - start for t in times]
        out.last_byte_ns = times[-1]
        out.completion_tokens = len(times)
        if core.finished:
            out.finish_reason = "length" if len(times) >= max_tokens else "stop"
        if out.text is not None:
            words = word_table()
            out.text.append(
                b" ".join(
                    words[(word_offset + i) % len(words)] for i in range(len(times))
                ).decode()
            )


def _waker(done: asyncio.Future[None]) -> Any:
    def wake(_req: VirtualRequest) -> None:
        if not done.done():
            done.set_result(None)

    return wake


def replay_virtual(
    trace: Any,
    config: ReplayConfig,
    run_dir: Path,
    *,
    meta: RunMeta,
    progress: TextIO | None = None,
) -> ReplayOutcome:
    """Replay ``trace`` per ``config`` in virtual time against the engine model
    ``config.virtual`` names; the run directory is a live run's, and its run.json
    says ``virtual``."""
    assert config.virtual is not None
    if config.workers > 1 or config.ray_address is not None:
        raise ConfigError("--virtual runs in one process: drop --workers and --ray")
    sim = virtual_sim_config(config.virtual, config.sim_args)
    model = engine_model_of(sim)
    kind: Kind = "chat" if config.endpoint.api == "chat" else "completions"
    endpoint = replace(config.endpoint, model=config.endpoint.model or sim.model)
    config = replace(config, endpoint=endpoint, flush_interval_s=1e9)
    assert config.virtual is not None
    virtual = VirtualRecord(
        source=config.virtual,
        engine_model=model,
        sim_args=" ".join(config.sim_args),
    )
    meta = replace(meta, virtual=virtual)
    started = time.perf_counter()
    engines: list[VirtualEngine] = []

    async def main(loop: VirtualLoop) -> ReplayOutcome:
        engine = VirtualEngine(sim)
        engines.append(engine)
        loop.driver = engine
        client = VirtualClient(loop, engine, sim, kind)
        return await replay_trace(
            trace,
            config,
            run_dir,
            meta=meta,
            clock=VirtualClock(loop),
            client=client,
            progress=None,
            virtual=True,
        )

    summary = run_virtual(main)
    engine = engines[0]
    from replayer.records.rundir import read_run_json, write_run_json

    path = run_dir / "run.json"
    if path.is_file():
        done = read_run_json(path)
        stats = engine.core.stats
        account = replace(
            virtual,
            engine=VirtualEngineStats(
                wall_s=round(time.perf_counter() - started, 3),
                steps=engine.steps,
                busy_s=engine.busy_ns / 1e9,
                preemptions=stats.preemptions,
                prefix_cache_queries_tokens=stats.prefix_cache_queries_tokens,
                prefix_cache_hits_tokens=stats.prefix_cache_hits_tokens,
                prefix_cache_host_hits_tokens=stats.host_hits_tokens,
            ),
        )
        write_run_json(path, replace(done, virtual=account))
    if progress is not None:
        progress.write(
            f"virtual: {engine.steps:,} engine steps, "
            f"{time.perf_counter() - started:.1f} s wall\n"
        )
    return summary
