"""The `replayer` command line: parse options, build config, call one library function.

Heavy imports (pandas, pyarrow, aiohttp) happen inside the commands so `--help` is fast.
Every ReplayerError/TraceError becomes a one-line message and exit status 2.
"""

from __future__ import annotations

import click

from replayer import __version__


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="replayer")
def main() -> None:
    """Replay agentic coding-session traces against OpenAI-compatible servers."""


def _register_subcommands() -> None:
    from replayer.sim.cli import sim

    main.add_command(sim)


_register_subcommands()
