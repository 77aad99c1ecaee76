"""The `replayer` command line: click commands that parse options, build the typed
config and call one library function; heavy imports inside the commands, errors one line
and exit 2 (``replayer.cli.errors``). See docs/cli.md."""

from __future__ import annotations

import click

from replayer import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="replayer")
def main() -> None:
    """Replay agentic coding-session traces against OpenAI-compatible servers."""


def _register_subcommands() -> None:
    # Each of these modules defines click commands with lazy heavy imports.
    from replayer.cli.analysis import analyze, compare, report
    from replayer.cli.calibrate import calibrate
    from replayer.cli.capacity import capacity
    from replayer.cli.compact import compact
    from replayer.cli.demo import demo
    from replayer.cli.generate import generate
    from replayer.cli.history import history
    from replayer.cli.run import run, sweep
    from replayer.cli.trace import trace
    from replayer.sim.cli import sim

    for command in (
        trace,
        sim,
        run,
        sweep,
        capacity,
        calibrate,
        demo,
        generate,
        analyze,
        compare,
        report,
        history,
        compact,
    ):
        main.add_command(command)


_register_subcommands()
