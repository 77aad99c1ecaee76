"""Replays coding-agent sessions against an OpenAI-compatible endpoint, every request to
Parquet. Import-light (no aiohttp here), so ``analysis`` may import ``replayer.records``
without the HTTP stack; see docs/architecture.md."""

from __future__ import annotations

from replayer.errors import ReplayerError

__version__ = "0.1.0"

__all__ = ["ReplayerError", "__version__"]
