"""What commands print: `--json` objects (strict JSON, NaN as null)."""

from __future__ import annotations

import json
import math
from typing import Any

import click


def _json_default(value: object) -> object:
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def _clean(value: Any) -> Any:
    """NaN → null recursively, so `--json` output is strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def echo_json(obj: object) -> None:
    """Print ``obj`` as one JSON object on stdout."""
    click.echo(json.dumps(_clean(obj), default=_json_default))
