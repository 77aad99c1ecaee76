"""`replayer sim`: run the simulated endpoint until SIGINT/SIGTERM, one flag per
SimConfig field (generated from the dataclass, so the two never drift). See
docs/replaying.md ("Against the built-in simulator")."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable
from dataclasses import MISSING, fields
from typing import Any

import click

from replayer.errors import ConfigError
from replayer.sim.config import SimConfig

_CLICK_TYPES: dict[str, Any] = {"int": int, "float": float, "str": str}


def _config_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for f in reversed(fields(SimConfig)):
        flag = "--" + f.name.replace("_", "-")
        assert f.default is not MISSING
        if f.type == "bool":
            option = click.option(flag, is_flag=True, help=f.metadata["help"])
        else:
            option = click.option(
                flag,
                type=_CLICK_TYPES[str(f.type)],
                default=f.default,
                show_default=True,
                help=f.metadata["help"],
            )
        command = option(command)
    return command


@click.command(
    "sim",
    epilog="usage.prompt_tokens_details.cached_tokens = GPU-tier hits + host-tier "
    "hits, whole blocks of a leading run; as in vLLM the last prompt token is always "
    "recomputed, so a fully cached prompt stops one block short when its length is a "
    "multiple of --block-size. Requests must name the served --model (else 404) "
    "unless --accept-any-model is given. Text prompts are counted with the replayer's "
    "text rule: one token per whitespace-separated word, plus one per chat message.",
)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=8000,
    show_default=True,
    help="Port; 0 picks a free one.",
)
@_config_options
def sim(host: str, port: int, **options: Any) -> None:
    """Run the SIMULATED OpenAI-compatible endpoint (no model: placeholder words).

    It behaves like a continuous-batching engine with a block prefix cache: queueing,
    chunked prefill, decode steps slowing with batch size, LRU eviction to an optional
    host tier, vLLM-named Prometheus metrics on /metrics and seeded faults. The first
    line of output is the URL it listens on.
    """
    try:
        config = SimConfig(**options)
    except ConfigError as exc:
        raise click.BadParameter(str(exc)) from exc
    try:
        asyncio.run(_serve_until_signal(config, host, port))
    except OSError as exc:  # the port is taken, the host is not an address here
        raise click.ClickException(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        ) from None


async def _serve_until_signal(config: SimConfig, host: str, port: int) -> None:
    from replayer.sim.server import serve  # aiohttp here: `replayer --help` stays fast

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    async with serve(config, host, port) as url:
        click.echo(f"replayer-sim (simulated endpoint) listening on {url}")
        await stop.wait()
    click.echo("replayer-sim stopped", err=True)
