"""Exceptions that stop a run, rooted at :class:`ReplayerError` (trace errors live in
``traces.errors``). Per-request failures are *not* exceptions; they are rows.
See docs/replaying.md#stopping-failures-and-exit-status."""

from __future__ import annotations


class ReplayerError(Exception):
    """Root of every error the command line turns into a one-line message.

    * ReplayerError
      x EndpointError      server unreachable or model missing at the startup check
      x RecorderError      output cannot be written
      x ConfigError        options that contradict each other
    """


class EndpointError(ReplayerError):
    """The endpoint cannot be reached or does not serve the requested model."""


class RecorderError(ReplayerError):
    """The run directory cannot be written (permissions, full disk)."""


class ConfigError(ReplayerError):
    """Options that cannot be used together or are out of range."""
