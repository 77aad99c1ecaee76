"""Runs the built-in simulated endpoint as a child process (its own core, its own
event loop) for a replay without an endpoint URL (`replayer run` without `--endpoint`,
`demo`, `sweep`): the one helper through which the launcher starts the simulator."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence

from replayer.errors import EndpointError
from replayer.sim.config import SimConfig

_URL = re.compile(r"https?://\S+")


def sim_config(args: Sequence[str]) -> SimConfig:
    """The simulator's effective settings for ``args`` (recorded in run.json)."""
    from replayer.sim.cli import sim

    ctx = sim.make_context("sim", [*_default_args(args), *args], resilient_parsing=True)
    params = {k: v for k, v in ctx.params.items() if k not in ("host", "port")}
    params["accept_any_model"] = True
    return SimConfig(**params)


def sim_settings(args: Sequence[str]) -> dict[str, object]:
    """:func:`sim_config` as a dict."""
    from dataclasses import asdict

    return asdict(sim_config(args))


def _default_args(args: Sequence[str]) -> list[str]:
    # Room for the largest AgentX requests (~840K tokens) unless the caller says.
    if any(a.startswith(("--max-model-len", "--kv-capacity-tokens")) for a in args):
        return []
    return ["--max-model-len", str(1 << 20), "--kv-capacity-tokens", str(1 << 21)]


@contextlib.contextmanager
def running_sim(
    args: Sequence[str] = (), *, startup_timeout_s: float = 60.0
) -> Iterator[str]:
    """Start `replayer sim --port 0 ARGS` on loopback; yield its base URL; stop it.
    The simulator dies with this process, kill -9 included: its parent-death signal
    is armed, and it watches its stdin, a pipe whose write end only we hold (see
    replayer/lifeline.py; enter this from the thread that will leave it)."""
    cmd = [
        sys.executable,
        "-m",
        "replayer",
        "sim",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--accept-any-model",
        *_default_args(args),
        *args,
    ]
    # The name is replayer.lifeline.ENV: the sim imports no engine module.
    env = {**os.environ, "REPLAYER_LIFELINE": f"{os.getpid()}:0"}
    proc = subprocess.Popen(
        cmd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        url = _read_url(proc, startup_timeout_s)
        # Keep draining its output: a full pipe would stall the simulator.
        for stream in (proc.stdout, proc.stderr):
            threading.Thread(target=_drain, args=(stream,), daemon=True).start()
        yield url
    finally:
        _stop(proc)


def _drain(stream: object) -> None:
    with contextlib.suppress(ValueError, OSError):
        for _ in stream:  # type: ignore[attr-defined]
            pass


def _read_url(proc: subprocess.Popen[str], timeout_s: float) -> str:
    found: list[str] = []

    def read() -> None:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        found.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout_s)
    line = found[0] if found else ""
    match = _URL.search(line)
    if match is None:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        err = proc.stderr.read() if proc.stderr is not None else ""
        last = (err.strip().splitlines() or ["no output"])[-1]
        raise EndpointError(f"the simulated endpoint did not start: {last}")
    return match.group(0)


def _stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
