"""Expected command failures: one line on stderr, exit status 2. The one translator
of the three packages' error roots (ReplayerError, TraceError, AnalysisError)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click


class CommandError(click.ClickException):
    """An expected failure: click prints `Error: <one line>`; exit status 2."""

    exit_code = 2


def _expected() -> tuple[type[Exception], ...]:
    from replayer.errors import ReplayerError
    from traces.errors import TraceError

    roots: tuple[type[Exception], ...] = (ReplayerError, TraceError)
    # Only a loaded analysis can have raised its errors: importing it here would
    # load pandas for every command.
    analysis_errors = sys.modules.get("analysis.errors")
    if analysis_errors is not None:
        roots += (analysis_errors.AnalysisError,)
    return roots


@contextmanager
def errors_as_messages() -> Iterator[None]:
    """Turn expected errors into `Error: <one line>` and exit status 2; a bug's
    traceback stays as it is."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, _expected()):
            raise CommandError(" ".join(str(exc).split())) from exc
        raise


def interrupted(run_dir: object | None) -> None:
    """Ctrl-C or SIGTERM: say where the partial run is; exit status 130."""
    where = f"; partial run in {run_dir}" if run_dir else ""
    click.echo(f"interrupted{where}", err=True)
    raise SystemExit(130)


__all__ = ["CommandError", "errors_as_messages", "interrupted"]
