"""`replayer compact`: join the small request parts of runs that have ended (killed
ones, or ones written before runs joined their own) as a finished run joins them.
See docs/run-directory.md#part-files."""

from __future__ import annotations

from pathlib import Path

import click

from replayer.cli.errors import CommandError, errors_as_messages
from replayer.cli.output import echo_json
from replayer.cli.params import DIRECTORY


@click.command("compact")
@click.argument("run_dirs", nargs=-1, required=True, type=DIRECTORY)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def compact(run_dirs: tuple[Path, ...], as_json: bool) -> None:
    """Join each run's small request part files into parts of up to 1M rows.

    A run joins its parts when it ends; one that was killed keeps thousands of
    small parts, which `analyze` reads several times slower. The rows, their
    order and their values do not change. Only for runs that have ended.
    """
    from replayer.records.parts import compact_run

    done = []
    with errors_as_messages():
        for run_dir in run_dirs:
            if not (run_dir / "requests").is_dir():
                raise CommandError(f"{run_dir}: not a run directory (no requests/)")
            try:
                before, after = compact_run(run_dir)
            except OSError as exc:
                raise CommandError(
                    f"{run_dir}: cannot join its parts: {exc.strerror or exc}"
                ) from exc
            done.append({"run_dir": str(run_dir), "parts_before": before,
                         "parts_after": after})  # fmt: skip
            if not as_json:
                click.echo(f"{run_dir}: {before} part files -> {after}")
    if as_json:
        echo_json({"runs": done})
