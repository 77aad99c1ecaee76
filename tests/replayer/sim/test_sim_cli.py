"""`replayer sim` as a real subprocess: URL line, /health, clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import signal
import sys

import aiohttp
from click.testing import CliRunner

from replayer.cli import main


async def test_cli_sim_port_zero_prints_url_serves_and_stops_on_sigterm() -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "replayer", "sim", "--port", "0", "--speed", "100",
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), timeout=20)).decode()
        assert line.startswith("replayer-sim (simulated endpoint) listening on ")
        url = line.split()[-1]
        assert url.startswith("http://127.0.0.1:")
        async with aiohttp.ClientSession() as session:
            async with session.get(url + "/health") as resp:
                assert resp.status == 200
            async with session.post(
                url + "/v1/completions",
                json={"model": "sim", "prompt": [1, 2, 3], "max_tokens": 2},
            ) as resp:
                assert (await resp.json())["usage"]["completion_tokens"] >= 1
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await proc.communicate()


def test_cli_sim_help_says_simulator() -> None:
    result = CliRunner().invoke(main, ["sim", "--help"])
    assert result.exit_code == 0
    assert "SIMULATED" in result.output
    assert "--kv-capacity-tokens" in result.output
    assert "--accept-any-model" in result.output


def test_cli_sim_rejects_contradicting_options() -> None:
    result = CliRunner().invoke(
        main, ["sim", "--kv-capacity-tokens", "100", "--max-model-len", "1000"]
    )
    assert result.exit_code == 2
    assert "kv_capacity_tokens must be >= max_model_len" in result.output


def test_cli_sim_cannot_listen_is_one_line() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(main, ["sim", "--port", str(port)])
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.output
    assert "Traceback" not in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)


def test_cli_sim_bounds_seed_and_sizes() -> None:
    for args, says in (
        (["--seed", "-1"], "seed must be >= 0"),
        (["--kv-capacity-tokens", str(10**20)], "kv_capacity_tokens must be <="),
        (
            ["--kv-capacity-tokens", str(1 << 30), "--block-size", "16"],
            "blocks (the block pool sizes its arrays by it)",
        ),
    ):
        result = CliRunner().invoke(main, ["sim", *args])
        assert result.exit_code == 2, args
        assert says in result.output
