"""Option values the commands share the parsing of."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

if TYPE_CHECKING:
    from analysis.metrics import Slo


def int_list(text: str, *, minimum: int, example: str) -> list[int]:
    """``text`` as comma-separated integers >= ``minimum`` (``_`` separators allowed);
    a bad value is a click.BadParameter that quotes ``example``."""
    try:
        values = [int(x.replace("_", "")) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(
            f"expected a list like {example}, got {text!r}"
        ) from None
    if not values or min(values) < minimum:
        raise click.BadParameter(f"values must be >= {minimum}, got {text!r}")
    return values


def parse_slo_option(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> Slo | None:
    """An ``--slo`` option's callback: the parsed SLO, or a usage error."""
    if value is None:
        return None
    from analysis.errors import AnalysisError
    from analysis.metrics import parse_slo

    try:
        return parse_slo(value)
    except AnalysisError as exc:
        raise click.BadParameter(str(exc)) from exc
