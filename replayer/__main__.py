"""`python -m replayer` runs the command line."""

from __future__ import annotations

from replayer.cli import main

if __name__ == "__main__":
    main()
