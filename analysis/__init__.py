"""Offline analysis of run directories: metrics, summaries, comparisons and reports.

Imports ``traces`` and ``replayer.records`` only; never aiohttp.
"""

from __future__ import annotations

__all__: list[str] = []
