"""`python -m replayer` runs the command line."""

from __future__ import annotations

from replayer.cli import main
from replayer.lifeline import hold_from_env

if __name__ == "__main__":
    hold_from_env()  # started by a replayer (its built-in sim): dies with it
    main()
