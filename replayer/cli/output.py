"""What commands print: `--json` objects (strict JSON, NaN as null)."""

from __future__ import annotations

import json

import click


def _json_default(value: object) -> object:
    raise TypeError(f"not JSON serializable: {type(value).__name__}")


def echo_json(obj: object) -> None:
    """Print ``obj`` as one JSON object on stdout."""
    from replayer.records.rundir import (
        strict_json,  # the one NaN → null rule (heavy imports)
    )

    click.echo(json.dumps(strict_json(obj), default=_json_default))
