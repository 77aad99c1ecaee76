"""CLI fuzz over every command's options, found on the click objects: hypothesis over
all of them, and each numeric one with nan, inf and huge values; the exit status is 0,
1 or 2 and no output holds a traceback (docs/replaying.md, "Stopping, failures ...")."""

from __future__ import annotations

import contextlib
import itertools
import math
import os
import signal
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replayer.cli import main
from replayer.cli.params import HttpUrl, Quantity, ShellArgs
from tests.builders import growing_session, trace_of
from traces.io import write_trace

# Examples stay cheap: runs replay a 2-session trace in virtual time (`--virtual
# sim`), studies get one short cell, `generate` a few sessions, `sim` is stopped once
# it listens. URLs are loopback or do not parse: nothing leaves this machine.
EXAMPLES = 200


def _commands(
    group: click.Group, prefix: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        if isinstance(command, click.Group):
            yield from _commands(command, (*prefix, name))
        else:
            yield (*prefix, name), command


COMMANDS = dict(_commands(main))


@dataclass
class World:
    """Files the examples point at, made once."""

    root: Path
    paths: dict[str, Path]
    port: int  # a free loopback port for `sim`
    fresh: Iterator[int] = field(default_factory=itertools.count)

    def new(self, suffix: str) -> Path:
        return self.root / f"new{next(self.fresh)}{suffix}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    root = tmp_path_factory.mktemp("fuzz")
    trace = trace_of(
        growing_session("a", 2, think=0.5, block_size=16),
        growing_session("b", 2, block_size=16),
    )
    paths = {
        "trace": write_trace(trace, root / "trace.jsonl"),
        "parquet": write_trace(trace, root / "trace.parquet"),
        "folder": root / "folder",
        "garbage": root / "garbage.json",
        "empty": root / "empty.jsonl",
        "run": root / "run",
        "sweep": root / "sweep",
        "missing": root / "missing" / "nothing.jsonl",
        # What outputs may overwrite: never an input of another example.
        "scratch": root / "scratch.jsonl",
        "scratch_dir": root / "scratch",
    }
    paths["folder"].mkdir()
    paths["scratch"].write_bytes(b"old")
    paths["scratch_dir"].mkdir()
    write_trace(trace, paths["folder"] / "t.jsonl")
    paths["garbage"].write_bytes(b'{"format": [1, 2], "nan": NaN, \x00\xff')
    paths["empty"].write_bytes(b"")
    virtual = ["--virtual", "sim", "--quiet"]
    for argv in (
        ["run", paths["trace"], *virtual, "--out", paths["run"]],
        [
            "sweep",
            paths["trace"],
            *virtual,
            "--concurrency",
            "1,2",
            "--out",
            paths["sweep"],
        ],
    ):
        res = CliRunner().invoke(main, [str(a) for a in argv])
        assert res.exit_code == 0, res.output
    return World(root=root, paths=paths, port=_free_port())


# -- values ------------------------------------------------------------------------

_URLS = [
    "http://127.0.0.1:9",
    "http://127.0.0.1:9/v1?key=s3cret&jwt=x",
    "https://[::1]:9/v1",
    "http://localhost:1",
    "http://[::1",
    "http://127.0.0.1:port",
    "ftp://127.0.0.1",
    "127.0.0.1:9",
    "",
    "http://",
]
_GARBAGE = ["", "x", "-", "--", "0x10", "1e999", "nan", "-1", "\x00", "é", " 1 "]
# Options whose values would start long work, or leave the machine: only these.
_POOLS: dict[str, list[str]] = {
    "--duration": ["1", "0.5", "0", "-1", "nan", "inf", "1e8"],
    "--cache-warmup": ["0", "0.5", "-1", "nan", "1e8"],
    "--sessions": ["1", "0", "-1", "1000001", "x"],
    "--block-tokens": ["1", "8", "0", "-1", "1048577", "x"],
    "--block-size": ["1", "16", "0", "-1", "x"],
    "--workers": ["1", "0", "1025", "x"],  # 2: processes, tested elsewhere
    "--ray-workers": ["1", "0", "1025"],
    "--max-cells": ["1", "0", "x"],
    "--max-level": ["1", "2", "0", "nan", "inf"],
    "--start": ["1", "2", "0", "100001"],
    "--resamples": ["100", "99", "200", "100001", "x"],
    "--host": ["127.0.0.1", "localhost"],
    "--ray": ["127.0.0.1:1", "x"],  # only ever with --virtual: refused before Ray
    "--max-time": ["1", "0", "nan", "1e8"],
    "--max-input-tokens": ["1", "100", "0", "x"],
    "--engine": ["sim", "x", "missing.json"],  # one virtual replay per budget
    "--sim-args": [
        "",
        "--speed 100",
        '--speed "10',
        "--kv-capacity-tokens 4096 --max-model-len 1024",
        "--policy nope",
        "--bogus",
        "--speed nan",
        "\\",
    ],
}
_CONCURRENCY = {
    "run": ["1", "2", "0", "-1", "100001", "x"],
    "sweep": ["1", "1,2", "0", "x", "1,100001", "", ",,"],
    "trace cache-curve": ["1", "4", "0", "100001"],
    "demo": ["1", "0", "100001"],  # a demo starts the simulator: one valid value
}


def _number(low: float | None, high: float | None, integer: bool) -> list[str]:
    """Values at and around the bounds, and the usual suspects."""
    out = ["0", "1", "2", "-1", "nan", "inf", "-inf", "1e308", "9" * 30]
    for bound in (low, high):
        if bound is not None and math.isfinite(bound):
            for d in (-1, 0, 1):
                v = bound + d
                if integer:
                    # A bound of tens of thousands means work in proportion.
                    if abs(v) <= 1000 or d != 0:
                        out.append(str(int(v)))
                else:
                    out.append(repr(float(v)))
    if integer:
        out += [str(2**63 - 1), str(2**63), str(2**64)]
    return out


def _pool(command: str, param: click.Parameter, world: World) -> list[str]:
    name = max(param.opts, key=len) if param.opts else param.name or ""
    if command == "sim" and name == "--port":
        return [str(world.port), "-1", "65536", "x"]
    if command == "demo" and name == "--out":  # each demo starts the simulator
        return ["NEW", str(world.paths["garbage"])]
    if name == "--concurrency" and command in _CONCURRENCY:
        return _CONCURRENCY[command]
    if name in _POOLS:
        return _POOLS[name]
    kind = param.type
    p = world.paths
    if isinstance(kind, HttpUrl) or name in ("--endpoint", "--url"):
        return _URLS
    if isinstance(kind, click.Choice):
        return [str(c) for c in kind.choices] + ["nope", ""]
    new = [f"NEW{s}" for s in (".jsonl", ".parquet", ".html", ".json", "")]
    if isinstance(kind, click.Path) and not kind.exists:  # an output
        return [*new, str(p["scratch"]), str(p["scratch_dir"]), str(p["missing"])]
    if isinstance(kind, click.Path) or name in ("--virtual", "--trace"):
        files = [p["trace"], p["parquet"], p["folder"], p["garbage"], p["empty"]]
        runs = [p["run"], p["sweep"]]
        extra = ["sim"] if name == "--virtual" else []
        return [str(x) for x in [*files, *runs, p["missing"]]] + new + extra
    if isinstance(kind, ShellArgs):
        return _POOLS["--sim-args"]
    if isinstance(kind, click.types.IntParamType):
        ints = kind if isinstance(kind, click.IntRange) else None
        low = ints.min if ints is not None else None
        high = ints.max if ints is not None else None
        values = _number(low, high, integer=True)
        if ints is None:  # an unbounded int: keep the work it may start small
            values = [v for v in values if len(v) < 7]
        return values
    if isinstance(kind, click.types.FloatParamType | Quantity):
        r = kind if isinstance(kind, click.FloatRange) else None
        return _number(r.min if r else None, r.max if r else None, integer=False)
    return [
        *_GARBAGE,
        "ttft=2s,tpot=50ms",
        "ttft=nan",
        "key=value",
        "0.25-0.75",
        "1000-30000",
        "0-1",
        "1,2,4",
        "off",
    ]


def _good(command: str, param: click.Parameter, world: World) -> list[str]:
    """Values that let the command get on with its work."""
    name = max(param.opts, key=len) if param.opts else param.name or ""
    p = world.paths
    if isinstance(param, click.Argument):
        if param.name in ("run_dirs", "run_a", "run_b"):
            return [str(p["run"]), str(p["sweep"])]
        if isinstance(param.type, click.Path):
            return [str(p["trace"]), str(p["parquet"]), str(p["folder"])]
        return []
    if name == "--slo":
        return ["ttft=10s,tpot=1s", "ttft=1ms"]
    if name == "--port":  # never a default port: another server may hold it
        return [str(world.port)]
    if name == "--out" and command in ("generate", "trace convert", "trace import"):
        return ["NEW.jsonl", "NEW.parquet"]
    if name == "--out":
        return ["NEW.html" if command == "report" else "NEW"]
    if name == "--concurrency" and command in ("sweep", "demo"):
        return ["1"]
    if name == "--sessions" and command == "demo":
        return ["1"]
    default = param.default
    if not isinstance(default, str | int | float) or isinstance(default, bool):
        return []  # none, a flag's, a multiple option's, or click's UNSET sentinel
    return [str(default)]


# Per mille of option values drawn from the good ones (the rest from the pool): the
# commands whose every valid example starts seconds of work get fewer.
_GOOD_SHARE = {"sweep": 200, "capacity": 200, "report": 200, "demo": 300}


def _value(draw: st.DrawFn, good: list[str], pool: list[str], share: int) -> str:
    if good and draw(st.integers(0, 999)) < share:
        return draw(st.sampled_from(good))
    return draw(st.sampled_from(pool))


Key = tuple[tuple[str, ...], frozenset[tuple[str, ...]]]


def _argv(
    draw: st.DrawFn, path: tuple[str, ...], command: click.Command, world: World
) -> tuple[list[str], Key]:
    """The arguments of one example, and what identifies its outcome: the
    positionals and the set of (option, value) pairs, fresh paths all alike."""
    name = " ".join(path)
    share = _GOOD_SHARE.get(name, 500)
    argv: list[str] = list(path)
    for param in command.params:
        if not isinstance(param, click.Argument):
            continue
        pool, good = _pool(name, param, world), _good(name, param, world)
        n = 1 if param.nargs == 1 else draw(st.integers(1, 2))
        argv += [_value(draw, good, pool, 800) for _ in range(n)]
    positional = tuple(argv)
    options = [
        p
        for p in command.params
        if isinstance(p, click.Option) and not {"--help", "--version"} & set(p.opts)
    ]
    # Several options at once: each may be wrong, so most examples end in a usage
    # error and few start the (short) work; the required ones always come.
    required = [p for p in options if p.required]
    optional = [p for p in options if not p.required]
    chosen = required + (
        draw(st.lists(st.sampled_from(optional), max_size=6, unique_by=id))
        if optional
        else []
    )
    flags = {max(p.opts, key=len) for p in chosen}
    if "--endpoint" in flags and "--virtual" not in flags:
        # A real replay then: no Ray (it would start or join a cluster).
        chosen = [p for p in chosen if "--ray" not in p.opts]
    given: set[str] = set()
    pairs: list[tuple[str, ...]] = []
    for param in chosen:
        flag = max(param.opts, key=len)
        given.add(flag)
        if param.is_flag:
            pairs.append((draw(st.sampled_from([*param.opts, *param.secondary_opts])),))
            continue
        pool, good = _pool(name, param, world), _good(name, param, world)
        for _ in range(draw(st.integers(1, 2)) if param.multiple else 1):
            value = _value(draw, good, pool, 800 if param.required else share)
            pairs.append((flag, value))
    pairs += _cheap(name, given, world)
    argv += [a for pair in pairs for a in pair]
    key = (positional, frozenset(pairs))
    fresh = [world.new(a[3:]).as_posix() if a.startswith("NEW") else a for a in argv]
    return fresh, key


def _cheap(command: str, given: set[str], world: World) -> list[tuple[str, ...]]:
    """What keeps an example short when it does not set it itself."""
    out: list[tuple[str, ...]] = []

    def default(flag: str, *value: str) -> None:
        if flag not in given:
            out.append((flag, *value))

    if command in ("run", "sweep", "capacity", "demo"):
        default("--quiet")
        if "--endpoint" not in given:
            default("--virtual", "sim")
        if given & {"--profile", "--loop"} or command == "capacity":
            default("--duration", "1")
            default("--cache-warmup", "0")
        if command == "capacity":
            default("--max-cells", "1")
        default("--connect-timeout", "0.5")
    if command == "demo":
        default("--sessions", "1")
        default("--concurrency", "1")
    if command == "generate":
        default("--sessions", "2")
    if command == "sim":
        default("--port", str(world.port))
    if command in ("run", "demo"):  # their default folders are in the current one
        default("--out", "NEW")
    return out


@contextlib.contextmanager
def _stop_sim_once_listening(port: int, patience_s: float = 20.0) -> Iterator[None]:
    """`sim` runs until SIGINT: send it once its port accepts (its own handler is
    installed by then, and it stops only on that signal)."""
    done = threading.Event()

    def watch() -> None:
        # A sim that never listens (or on another port) is stopped anyway.
        for _ in range(int(patience_s / 0.02)):
            if done.is_set():
                return
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                    pass
            except OSError:
                done.wait(0.02)
                continue
            break
        if not done.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


# Examples whose flags all parse start the command's work: at most this many of
# them run, per command (every example that fails to parse runs: that is cheap).
_WORK_BUDGET = {
    "run": 60,
    "sweep": 10,
    "capacity": 10,
    "report": 10,
    "demo": 3,
    "sim": 40,
    "trace cache-curve": 40,
}


def _parses(command: click.Command, path: tuple[str, ...], argv: list[str]) -> bool:
    """Whether click accepts every value (the command's work would start)."""
    try:
        with command.make_context(path[-1], argv[len(path) :]):
            return True
    except click.ClickException:
        return False
    except Exception:  # a parser's bug: _check runs it and reports it
        return False


def _check(argv: list[str], world: World) -> None:
    for a in argv:
        with contextlib.suppress(ValueError):  # a URL that does not parse goes nowhere
            assert urlsplit(a).hostname in (None, "127.0.0.1", "::1", "localhost"), a
    if argv[0] in ("run", "sweep", "capacity") and "--virtual" not in argv:
        assert "--ray" not in argv  # Ray is refused beside --virtual only
    guard = (
        _stop_sim_once_listening(world.port)
        if argv[0] == "sim"
        else contextlib.nullcontext()
    )
    with guard:
        res = CliRunner().invoke(main, argv, catch_exceptions=True)
    assert "Traceback" not in res.output, (argv, res.output)
    assert res.exit_code in (0, 1, 2), (argv, res.exit_code, res.output)
    assert res.exception is None or isinstance(res.exception, SystemExit), (
        argv,
        repr(res.exception),
        res.output,
    )


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_cli_fuzz_every_option_exits_0_1_or_2_without_traceback(
    path: tuple[str, ...], world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    command = COMMANDS[path]
    monkeypatch.chdir(world.root)  # anything written by default lands there
    seen: set[Key] = set()
    name = " ".join(path)
    budget = [_WORK_BUDGET.get(name, EXAMPLES)]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(st.data())
    def fuzz(data: st.DataObject) -> None:
        argv, key = data.draw(st.composite(lambda d: _argv(d, path, command, world))())
        if key in seen:  # the same arguments give the same outcome
            return
        seen.add(key)
        if _parses(command, path, argv):
            if budget[0] <= 0:
                return
            budget[0] -= 1
        _check(argv, world)

    fuzz()


def test_cli_fuzz_covers_every_command() -> None:
    # The walk finds the commands of groups too (trace ...), and the known ones.
    names = {" ".join(p) for p in COMMANDS}
    assert {"run", "sweep", "capacity", "sim", "trace validate", "generate"} <= names


# -- numbers: every numeric option, the values that break arithmetic ---------------

_NUMBERS = ["nan", "inf", "-inf", "-1e308", "1e308", str(2**63 + 5), "-0"]
_NEVER_A_NUMBER = {"nan", "inf", "-inf"}  # whatever the option: exit status 2


def _numeric_options(command: click.Command) -> list[click.Option]:
    return [
        p
        for p in command.params
        if isinstance(p, click.Option)
        and not p.is_flag
        and isinstance(p.type, click.types.IntParamType | click.types.FloatParamType)
    ]


NUMERIC = {path: _numeric_options(c) for path, c in COMMANDS.items()}


def _base_argv(path: tuple[str, ...], flag: str, world: World) -> list[str]:
    """The command with good positionals and required options, kept short, and
    ``flag`` left for the value under test."""
    name, command = " ".join(path), COMMANDS[path]
    argv, given = list(path), {flag}
    for param in command.params:
        if param.required or isinstance(param, click.Argument):
            good = _good(name, param, world) or _pool(name, param, world)
            if isinstance(param, click.Option):
                if max(param.opts, key=len) == flag:
                    continue
                given.add(max(param.opts, key=len))
                argv.append(max(param.opts, key=len))
            argv.append(good[0])
    argv += [a for pair in _cheap(name, given, world) for a in pair]
    return [world.new(a[3:]).as_posix() if a.startswith("NEW") else a for a in argv]


@pytest.mark.parametrize(
    "path", sorted(p for p, options in NUMERIC.items() if options), ids=" ".join
)
def test_cli_fuzz_numeric_options_refuse_nan_inf_and_huge_without_traceback(
    path: tuple[str, ...], world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each numeric option of the command (found on the click object: a new one is
    covered) with each value of _NUMBERS: nan and inf are usage errors (exit 2), the
    rest too or a run that ends (0, 1 or 2), never a traceback. A demo starts the
    simulator and replays: only the values it refuses are run (its replay options
    are `run`'s, run in virtual time)."""
    monkeypatch.chdir(world.root)
    command = COMMANDS[path]
    for param in NUMERIC[path]:
        flag = max(param.opts, key=len)
        for value in _NUMBERS:
            argv = [*_base_argv(path, flag, world), flag, value]
            if path == ("demo",) and _parses(command, path, argv):
                continue
            guard = (
                _stop_sim_once_listening(world.port, patience_s=3.0)
                if path == ("sim",)
                else contextlib.nullcontext()
            )
            with guard:
                res = CliRunner().invoke(main, argv, catch_exceptions=True)
            assert "Traceback" not in res.output, (argv, res.output)
            assert res.exception is None or isinstance(res.exception, SystemExit), (
                argv,
                repr(res.exception),
                res.output,
            )
            codes = (2,) if value in _NEVER_A_NUMBER else (0, 1, 2)
            assert res.exit_code in codes, (argv, res.exit_code, res.output)
