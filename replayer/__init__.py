"""Agentic workload trace replayer: replays coding-agent sessions against an
OpenAI-compatible endpoint and records every request to Parquet.

Import-light on purpose: nothing here imports aiohttp, so ``analysis`` may import
``replayer.records`` without pulling the HTTP stack in.
"""

from __future__ import annotations

from replayer.errors import ReplayerError

__version__ = "0.1.0"

__all__ = ["ReplayerError", "__version__"]
