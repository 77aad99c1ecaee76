"""Expected command failures: one line on stderr, exit status 2."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import click


class CommandError(click.ClickException):
    """An expected failure: click prints `Error: <one line>`; exit status 2."""

    exit_code = 2


@contextmanager
def errors_as_messages() -> Iterator[None]:
    """Turn expected errors into `Error: <one line>` and exit status 2."""
    from replayer.errors import ReplayerError
    from traces.errors import TraceError

    try:
        yield
    except (ReplayerError, TraceError) as exc:
        raise CommandError(" ".join(str(exc).split())) from exc


__all__ = ["CommandError", "errors_as_messages"]
