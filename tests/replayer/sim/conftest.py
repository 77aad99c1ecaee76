"""Fixtures for the simulator tests: a real sim on loopback and a small SSE client."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from replayer.sim import SimConfig, serve


@dataclass
class Result:
    """What one request saw: status, content chunks with arrival times, usage."""

    status: int
    start_s: float
    body: Any = None  # JSON of a non-streaming or error response
    chunks: list[str] = field(default_factory=list)
    chunk_times_s: list[float] = field(default_factory=list)
    role_chunks: int = 0
    usage: dict[str, Any] | None = None
    finish_reason: str | None = None
    done: bool = False  # saw data: [DONE]
    dropped: bool = False  # the connection ended without [DONE]

    @property
    def ttft_s(self) -> float:
        return self.chunk_times_s[0] - self.start_s

    @property
    def tpot_s(self) -> float:
        return (self.chunk_times_s[-1] - self.chunk_times_s[0]) / (len(self.chunks) - 1)

    @property
    def cached_tokens(self) -> int:
        assert self.usage is not None
        return int(self.usage["prompt_tokens_details"]["cached_tokens"])


class SimClient:
    """A plain aiohttp client for one running simulator."""

    def __init__(self, session: aiohttp.ClientSession, url: str, model: str) -> None:
        self.session = session
        self.url = url
        self.model = model

    async def completion(self, prompt: Any, **body: Any) -> Result:
        return await self.post("/v1/completions", {"prompt": prompt, **body})

    async def chat(self, messages: list[dict[str, Any]], **body: Any) -> Result:
        return await self.post("/v1/chat/completions", {"messages": messages, **body})

    async def post(self, path: str, body: dict[str, Any]) -> Result:
        payload = {
            "model": self.model,
            "max_tokens": 1,
            "stream": True,
            "stream_options": {"include_usage": True},
            **body,
        }
        if not payload["stream"]:
            payload.pop("stream_options")
        return await self.post_raw(path, json.dumps(payload).encode())

    async def post_raw(self, path: str, data: bytes) -> Result:
        start = time.perf_counter()
        async with self.session.post(self.url + path, data=data) as resp:
            result = Result(status=resp.status, start_s=start)
            if resp.content_type != "text/event-stream":
                result.body = await resp.json()
                result.usage = result.body.get("usage")
                return result
            try:
                async for line in resp.content:
                    self._on_line(result, line)
            except aiohttp.ClientPayloadError:
                result.dropped = True
            result.dropped = result.dropped or not result.done
            return result

    @staticmethod
    def _on_line(result: Result, line: bytes) -> None:
        if not line.startswith(b"data: "):
            return
        data = line[6:].strip()
        if data == b"[DONE]":
            result.done = True
            return
        chunk = json.loads(data)
        if chunk.get("usage"):
            result.usage = chunk["usage"]
        for choice in chunk["choices"]:
            delta = choice.get("delta", {})
            text = delta.get("content") if "delta" in choice else choice.get("text")
            if delta.get("role"):
                result.role_chunks += 1
            if text:
                result.chunks.append(text)
                result.chunk_times_s.append(time.perf_counter())
            if choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]

    async def _samples(self) -> Iterator[Any]:
        async with self.session.get(self.url + "/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
        return (s for f in text_string_to_metric_families(text) for s in f.samples)

    async def metrics(self) -> dict[str, float]:
        """Samples by name (labels dropped: the sim has one model)."""
        samples: dict[str, float] = {}
        for sample in await self._samples():
            key = sample.name
            if "le" in sample.labels:
                key += f"[{sample.labels['le']}]"
            samples[key] = sample.value
        return samples

    async def metrics_by_labels(self) -> dict[str, float]:
        """Samples by name and labels other than model_name, as
        ``name[label=value]...`` (labels sorted)."""
        out: dict[str, float] = {}
        for s in await self._samples():
            extra = sorted((k, v) for k, v in s.labels.items() if k != "model_name")
            out[s.name + "".join(f"[{k}={v}]" for k, v in extra)] = s.value
        return out


StartSim = Callable[..., contextlib.AbstractAsyncContextManager[SimClient]]


@pytest.fixture
def start_sim() -> StartSim:
    """``async with start_sim(block_size=4) as client:`` (zero delays by default)."""

    @contextlib.asynccontextmanager
    async def start(
        config: SimConfig | None = None, **knobs: Any
    ) -> AsyncIterator[SimClient]:
        cfg = config if config is not None else SimConfig.fast(**knobs)
        async with serve(cfg) as url, aiohttp.ClientSession() as session:
            yield SimClient(session, url, cfg.model)

    return start


@pytest.fixture
def modelled_steps(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """Every step time the simulated engine models, in seconds, in order: what it
    sleeps, however loaded the machine. A request's share is what it adds while it
    runs alone."""
    from replayer.sim.engine import Engine

    steps: list[float] = []
    sleep = Engine._sleep

    async def recorded(self: Engine, duration_s: float) -> None:
        steps.append(duration_s)
        await sleep(self, duration_s)

    monkeypatch.setattr(Engine, "_sleep", recorded)
    return steps
