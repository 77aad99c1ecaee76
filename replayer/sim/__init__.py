"""The built-in simulated endpoint (`replayer sim`): an OpenAI-compatible server that
behaves like a continuous-batching engine with a block prefix cache, writing
placeholder words. See docs/replaying.md ("Against the built-in simulator")."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from replayer.sim.config import SimConfig

if TYPE_CHECKING:
    from replayer.sim.server import make_app, serve

__all__ = ["SimConfig", "make_app", "serve"]


# Import-light: make_app and serve (aiohttp) load on first use.
def __getattr__(name: str) -> Any:
    if name in ("make_app", "serve"):
        from replayer.sim import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
