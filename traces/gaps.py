"""The gap rule: how long a replay waits before each request of a session, from the
trace's think gap and its parts (tool time scaled apart from the rest). One definition
for the engine and the offline send-order model. See docs/traces.md#gap-parts."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from traces.model import Request
from traces.table import request_column

_SLACK_S = 1e-6  # parts and gaps are rounded to the millisecond


def parts_past_gap(think_s: float, tool_s: float, human_s: float) -> str | None:
    """Why a request's gap parts (None counted 0) are invalid: their sum past the
    gap (``think_time``); None when they fit."""
    if tool_s + human_s <= think_s + _SLACK_S:
        return None
    return (
        f"tool_wait + human_wait ({tool_s:g} + {human_s:g}) exceed think_time "
        f"({think_s:g})"
    )


@dataclass(frozen=True, slots=True)
class GapRule:
    """``--think-scale``, ``--think-cap`` and ``--tool-scale``.

    A request's gap is ``min(non_tool * think_scale, think_cap_s) + tool *
    tool_scale``: ``tool`` is its ``tool_wait_s`` (0 when the trace does not know it:
    the whole gap is then scaled as think time, as before the parts existed) and
    ``non_tool`` the rest of its ``think_time_s`` (human input wait and other time).
    """

    think_scale: float = 1.0
    think_cap_s: float | None = None
    tool_scale: float = 1.0

    def __post_init__(self) -> None:
        if not self.think_scale >= 0 or math.isinf(self.think_scale):
            raise ValueError(f"think scale must be >= 0 (got {self.think_scale})")
        if self.think_cap_s is not None and not self.think_cap_s >= 0:
            raise ValueError(f"think cap must be >= 0 s (got {self.think_cap_s})")
        if not self.tool_scale >= 0 or math.isinf(self.tool_scale):
            raise ValueError(f"tool scale must be >= 0 (got {self.tool_scale})")

    def gap_s(self, think_s: float, tool_s: float | None) -> float:
        """One request's gap, seconds (``gaps_s``'s arithmetic on one value: the
        same floats)."""
        tool = min(max(0.0 if tool_s is None else tool_s, 0.0), max(think_s, 0.0))
        other = max(think_s - tool, 0.0) * self.think_scale
        if self.think_cap_s is not None:
            other = min(other, self.think_cap_s)
        return other + tool * self.tool_scale

    def gaps_s(self, requests: Sequence[Request]) -> npt.NDArray[np.float64]:
        """The gap before each of ``requests`` (one session's), seconds."""
        think = request_column(requests, "think_time_s").astype(np.float64)
        tool = request_column(requests, "tool_wait_s")
        tool = np.clip(np.nan_to_num(tool, nan=0.0), 0.0, np.maximum(think, 0.0))
        other = np.maximum(think - tool, 0.0) * self.think_scale
        if self.think_cap_s is not None:
            other = np.minimum(other, self.think_cap_s)
        gaps: npt.NDArray[np.float64] = other + tool * self.tool_scale
        return gaps
