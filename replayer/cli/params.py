"""Option types and values the commands share the parsing of, with the bounds they
share (docs/replaying.md). A bad value is a one-line usage error, exit status 2."""

from __future__ import annotations

import math
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import click

if TYPE_CHECKING:
    from analysis.slo import Slo

# Integers an option may hold at most: beyond these a value only allocates (one lane,
# process or session object each) or overflows an int64 column.
INT64_MAX = (1 << 63) - 1
MAX_LANES = 100_000  # --concurrency, capacity --start: one task and lane each
MAX_PROCESSES = 1_024  # --workers, --ray-workers: one process or actor each
MAX_SESSIONS = 1_000_000  # generate/demo --sessions: built in memory at once
# Tokens per materialized block: a block is built as one array (~80 bytes a token
# while it is encoded); a million tokens is 8x the largest context served today.
MAX_BLOCK_TOKENS = 1 << 20
# Token ids: no vocabulary has more than a few hundred thousand, and chat text keeps
# one word per id of the range in memory.
MAX_TOKEN_ID = 1 << 21
# Fewer ids than this and blocks stop being distinct content (0-1: every block is
# the same one token repeated, so a server's prefix cache sees sharing the trace
# does not have); with 256 ids an 8-token block has 2^64 contents, as many as seeds.
MIN_TOKEN_IDS = 256


class Quantity(click.FloatRange):
    """A float that means an amount (seconds, a rate, a factor): finite and within
    its bounds; ``nan`` and ``inf`` are usage errors, not silent no-ops."""

    name = "number"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Any:
        if isinstance(value, float) and math.isfinite(value):
            return super().convert(value, param, ctx)
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


def count(minimum: int = 0, maximum: int = INT64_MAX) -> click.IntRange:
    """An integer within [minimum, maximum] (default: what an int64 column holds)."""
    return click.IntRange(min=minimum, max=maximum)


# Quantities: a duration past ~116 days, or a rate or factor past a million, is a
# typo; within these, every time scaled from them stays an int64 of nanoseconds.
MAX_SECONDS = 1e7
MAX_FACTOR = 1e3  # think-time scale: hour-long gaps stay within MAX_SECONDS
MAX_RATE = 1e6

SEED = count(0)  # numpy's generators take non-negative seeds only
# A folder that must exist: run, sweep and capacity directories.
DIRECTORY = click.Path(exists=True, file_okay=False, path_type=Path)
LANES = count(1, MAX_LANES)
PROCESSES = count(1, MAX_PROCESSES)
SESSIONS = count(1, MAX_SESSIONS)
BLOCK_TOKENS = count(1, MAX_BLOCK_TOKENS)
TOKENS = count(0)  # a token budget or KV size
SECONDS = Quantity(min=0, max=MAX_SECONDS)  # a duration that may be zero
POSITIVE_SECONDS = Quantity(min=0, min_open=True, max=MAX_SECONDS)
FACTOR = Quantity(min=0, max=MAX_FACTOR)  # a scale that may be zero
POSITIVE = Quantity(min=0, min_open=True, max=MAX_RATE)  # a rate, speed-up or shape
FRACTION = Quantity(min=0, max=1)


class HttpUrl(click.ParamType[str]):
    """An http(s) URL that parses (host and port included); the value is kept as
    given. A bad one is named without its query string, which may hold a secret."""

    name = "url"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Any:
        text = str(value)
        shown = text.split("?", 1)[0].split("#", 1)[0]
        try:
            parts = urlsplit(text)
            port = parts.port  # parses the port: "http://h:x" raises here
        except ValueError as exc:
            self.fail(f"{shown!r} is not a URL: {exc}", param, ctx)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            self.fail(
                f"expected an http(s) URL like http://HOST:PORT, got {shown!r}",
                param,
                ctx,
            )
        del port
        return text


class ShellArgs(click.ParamType[tuple[str, ...]]):
    """Arguments in shell syntax ('--speed 10 --model "a b"') → a tuple of words."""

    name = "args"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Any:
        if isinstance(value, tuple):
            return value
        try:
            return tuple(shlex.split(str(value)))
        except ValueError as exc:  # "No closing quotation", "No escaped character"
            self.fail(f"{value!r}: {str(exc).lower()}", param, ctx)


class TokenRange(click.ParamType[tuple[int, int]]):
    """Token ids ``MIN-MAX`` (MAX exclusive) → (MIN, MAX): enough ids to keep blocks
    distinct, none beyond any vocabulary."""

    name = "range"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Any:
        if isinstance(value, tuple):
            return value
        try:
            lo, hi = (int(x) for x in str(value).split("-", 1))
        except ValueError:
            self.fail(f"expected MIN-MAX, got {value!r}", param, ctx)
        if not 0 <= lo < hi <= MAX_TOKEN_ID:
            self.fail(
                f"expected 0 <= MIN < MAX <= {MAX_TOKEN_ID:,}, got {value!r}",
                param,
                ctx,
            )
        if hi - lo < MIN_TOKEN_IDS:
            self.fail(
                f"{value!r} holds {hi - lo} token ids: blocks would repeat the same "
                f"few tokens; give at least {MIN_TOKEN_IDS}",
                param,
                ctx,
            )
        return lo, hi


class Ratio(click.ParamType[tuple[float, float] | None]):
    """``MIN-MAX`` with 0 <= MIN <= MAX <= 1 → (MIN, MAX), or ``off`` → None."""

    name = "ratio"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> Any:
        if value is None or isinstance(value, tuple) or value == "off":
            return None if value == "off" else value
        try:
            lo, hi = (float(x) for x in str(value).split("-", 1))
        except ValueError:
            self.fail(f"expected MIN-MAX or off, got {value!r}", param, ctx)
        if not 0 <= lo <= hi <= 1:  # nan fails every comparison
            self.fail(f"expected 0 <= MIN <= MAX <= 1, got {value!r}", param, ctx)
        return lo, hi


def int_list(
    text: str, *, minimum: int, example: str, maximum: int = INT64_MAX
) -> list[int]:
    """``text`` as comma-separated integers in [minimum, maximum] (``_`` separators
    allowed); a bad value is a click.BadParameter that quotes ``example``."""
    items = text.split(",")
    if len(items) > 1 and not all(x.strip() for x in items):
        # "1,,2": a value lost between the commas, not a list of two.
        raise click.BadParameter(
            f"expected a list like {example}, got {text!r} (an empty value)"
        )
    try:
        values = [int(x.replace("_", "")) for x in items if x.strip()]
    except ValueError:
        raise click.BadParameter(
            f"expected a list like {example}, got {text!r}"
        ) from None
    if not values or min(values) < minimum:
        raise click.BadParameter(f"values must be >= {minimum}, got {text!r}")
    if max(values) > maximum:
        raise click.BadParameter(f"values must be <= {maximum:,}, got {text!r}")
    return values


def parse_slo_option(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> Slo | None:
    """An ``--slo`` option's callback: the parsed SLO, or a usage error."""
    if value is None:
        return None
    # Not analysis.metrics: a callback runs before `analyze` sets its heap up, which
    # must come before pandas and Arrow are imported (analysis.heap).
    from analysis.errors import AnalysisError
    from analysis.slo import parse_slo

    try:
        return parse_slo(value)
    except AnalysisError as exc:
        raise click.BadParameter(str(exc)) from exc


MOONCAKE_ROWS = ("auto", "delta", "cumulative")  # = traces.mooncake.MOONCAKE_ROWS
mooncake_rows_option = click.option(
    "--mooncake-rows",
    type=click.Choice(MOONCAKE_ROWS),
    default="auto",
    show_default=True,
    help="Mooncake rows of one session: each a full prompt (cumulative), or the new "
    "turn only, the history added (delta); auto: as their hash ids say (a warning "
    "tells which).",
)
