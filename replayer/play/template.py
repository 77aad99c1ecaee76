"""What a chat server's template adds to the prompt tokens the replayer counts, learned
from the server's own usage reports, so that `--fit-context clamp` leaves room for it.
See docs/replaying.md#output-length-for-small-engines."""

from __future__ import annotations

import collections
import math
from dataclasses import dataclass, field

# Before the server has reported a chat prompt's size: a template's cost as the common
# ones run (Llama 3: ~5 tokens a message and ~30 of preamble; ChatML: ~5 a message).
DEFAULT_BASE = 32
DEFAULT_PER_MESSAGE = 8
_KEPT = 256  # recent observations the base is taken over


@dataclass(slots=True)
class TemplateCost:
    """The server's prompt tokens minus ours, as ``base + per_message * messages``:
    an upper envelope of what its responses reported. ``per_message`` is the
    largest growth seen between two requests of one session (its history grew by
    whole messages), ``base`` the largest rest over recent reports. Event-loop owned."""

    per_message: float = DEFAULT_PER_MESSAGE
    base: float = DEFAULT_BASE
    reports: int = 0
    _slope_seen: bool = False
    _recent: collections.deque[tuple[int, int]] = field(
        default_factory=lambda: collections.deque(maxlen=_KEPT)
    )

    def reserve(self, messages: int) -> int:
        """Tokens to leave for the template of a prompt of ``messages`` messages."""
        return max(0, math.ceil(self.base + self.per_message * messages))

    def observe(
        self, messages: int, excess: int, before: tuple[int, int] | None
    ) -> None:
        """A response reported ``excess`` more prompt tokens than we counted for a
        prompt of ``messages`` messages; ``before``: the same session's previous
        (messages, excess), if any."""
        if before is not None and messages > before[0]:
            slope = (excess - before[1]) / (messages - before[0])
            if not self._slope_seen or slope > self.per_message:
                self.per_message = max(0.0, slope)
                self._slope_seen = True
        self._recent.append((messages, excess))
        self.base = max(e - self.per_message * m for m, e in self._recent)
        self.reports += 1
