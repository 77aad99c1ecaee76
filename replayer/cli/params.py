"""Option values the commands share the parsing of."""

from __future__ import annotations

import click


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
