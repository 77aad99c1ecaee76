"""Service-level objectives (``--slo ttft=2s,tpot=50ms``): their type and parser, in
a module that imports neither pandas nor Arrow, so the command line parses them before
``analyze`` sets its heap up (:mod:`analysis.heap`). See docs/metrics.md."""

from __future__ import annotations

import re
from dataclasses import dataclass

from analysis.errors import SloError


@dataclass(frozen=True, slots=True, kw_only=True)
class Slo:
    """Service-level objectives, ms; None = no objective on that metric."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def as_dict(self) -> dict[str, float]:
        return {
            k: v
            for k, v in (
                ("ttft_ms", self.ttft_ms),
                ("tpot_ms", self.tpot_ms),
                ("e2e_ms", self.e2e_ms),
            )
            if v is not None
        }


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|us)?\s*$")
_UNIT_MS = {"ms": 1.0, "s": 1000.0, "us": 0.001, None: 1000.0}


def parse_slo(text: str) -> Slo:
    """``"ttft=2s,tpot=50ms,e2e=30s"`` → :class:`Slo` (a bare number is seconds).

    Raises:
        SloError: unknown metric or malformed duration (the message says which).
    """
    values: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, raw = item.partition("=")
        key = key.strip().lower()
        if not sep or key not in ("ttft", "tpot", "e2e"):
            raise SloError(
                f"bad SLO {item!r}: expected ttft=..., tpot=... or e2e=... "
                "(e.g. ttft=2s,tpot=50ms)"
            )
        m = _DURATION.match(raw)
        if m is None:
            raise SloError(f"bad SLO duration {raw!r} for {key} (e.g. 2s, 50ms)")
        values[f"{key}_ms"] = float(m.group(1)) * _UNIT_MS[m.group(2)]
    if not values:
        raise SloError("empty SLO: give e.g. ttft=2s,tpot=50ms")
    return Slo(**values)
