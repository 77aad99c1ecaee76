"""The golden JSON of tests/test_golden_json.py: the input run directories
(``inputs``) and what the code at hand makes of them (``outputs``).

    python tests/data/golden/make.py            # inputs (live runs too), then outputs
    python tests/data/golden/make.py outputs    # outputs only, from the inputs there
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
INPUTS = HERE / "inputs"
OUTPUTS = HERE / "outputs"
ROOT = HERE.parents[2]
REPLAYER = [sys.executable, "-m", "replayer"]

# The search's and the virtual runs' options: fixed seed and salt, virtual time.
_VIRTUAL = ("--virtual", "sim", "--seed", "1", "--salt", "golden", "--quiet")
_CAPACITY = (
    "capacity", "trace.jsonl", *_VIRTUAL, "--slo", "ttft=300ms,tpot=20ms",
    "--duration", "20", "--max-level", "8",
)  # fmt: skip
_AGENTX = (
    "run", "trace.jsonl", *_VIRTUAL, "--profile", "agentx", "--concurrency", "3",
    "--cache-warmup", "5", "--duration", "40", "--gpus", "2", "--engine", "sim",
)  # fmt: skip
_PLAIN = ("run", "trace.jsonl", *_VIRTUAL, "--concurrency", "3", "--label", "x=1")

# analyze's argument lists over the inputs (paths relative to inputs/).
ANALYZE: dict[str, tuple[str, ...]] = {
    "analyze-plain": ("plain",),
    "analyze-plain-options": (
        "plain",
        "--gpus",
        "4",
        "--slo",
        "ttft=300ms,tpot=20ms",
        "--kv-capacity-tokens",
        "20000",
        "--host-capacity-tokens",
        "40000",
        "--trace",
        "trace.jsonl",
    ),
    "analyze-agentx": ("agentx",),
    "analyze-sweep": ("sweep",),
    "analyze-capacity": ("capacity",),
    "analyze-live": ("live",),
    "analyze-workers": ("workers",),
    "analyze-ray": ("ray",),
    "analyze-many": ("plain", "live", "agentx"),
}
# Commands whose output comes from a fresh replay or the trace alone.
COMMANDS: dict[str, tuple[str, ...]] = {
    "capacity": (*_CAPACITY, "--out", "{tmp}/cap", "--json"),
    "cache-curve": ("trace", "cache-curve", "trace.jsonl", "--concurrency", "3",
                    "--json"),
    "cache-curve-engine": (
        "trace", "cache-curve", "trace.jsonl", "--concurrency", "3", "--engine",
        "sim", "--budgets", "20000,60000", "--bytes-per-token", "131072", "--json",
    ),
}  # fmt: skip
# Fresh runs whose run.json is held, its volatile values masked.
RUNS: dict[str, tuple[str, ...]] = {
    "runjson-plain": (*_PLAIN, "--out", "{tmp}/plain"),
    "runjson-agentx": (*_AGENTX, "--out", "{tmp}/agentx"),
}
# run.json values that differ between two runs of the same inputs.
VOLATILE = {
    ("run_id",),
    ("tool_version",),
    ("python",),
    ("start_unix_ns",),
    ("end_unix_ns",),
    ("trace", "path"),
    ("virtual", "wall_s"),
}


def mask(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj`` (a run.json) with the :data:`VOLATILE` values replaced."""
    out = json.loads(json.dumps(obj))
    for path in VOLATILE:
        d = out
        for key in path[:-1]:
            d = d.get(key) or {}
        if path[-1] in d:
            d[path[-1]] = "<volatile>"
    return out


def invoke(args: tuple[str, ...]) -> str:
    """``replayer ARGS`` in this process (click's runner), from inputs/; its stdout."""
    import os

    from click.testing import CliRunner

    from replayer.cli import main

    cwd = Path.cwd()
    os.chdir(INPUTS)
    try:
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    finally:
        os.chdir(cwd)
    if result.exit_code != 0:
        raise RuntimeError(f"replayer {' '.join(args)}: {result.output}")
    return result.stdout


def run_json(args: tuple[str, ...], tmp: Path) -> str:
    """The masked run.json of a fresh run ``args``."""
    out = next(a for a in args if a.startswith("{tmp}")).format(tmp=tmp)
    invoke(tuple(a.format(tmp=tmp) for a in args))
    obj = json.loads((Path(out) / "run.json").read_text())
    return json.dumps(mask(obj), indent=2) + "\n"


def outputs(tmp: Path) -> dict[str, str]:
    """Every golden file's name and the content the code at hand gives it."""
    out: dict[str, str] = {}
    jobs: list[tuple[str, Callable[[], str]]] = [
        *((f"{k}.json", lambda a=a: invoke(("analyze", *a, "--json"))) for k, a in
          ANALYZE.items()),
        *((f"{k}.txt", lambda a=a: invoke(("analyze", *a))) for k, a in
          ANALYZE.items()),
        *((f"{k}.json", lambda a=a: invoke(tuple(x.format(tmp=tmp) for x in a)))
          for k, a in COMMANDS.items()),
        *((f"{k}.json", lambda a=a: run_json(a, tmp)) for k, a in RUNS.items()),
    ]  # fmt: skip
    for name, job in jobs:
        out[name] = job()
    return out


def _cli(*args: str) -> None:
    subprocess.run([*REPLAYER, *args], cwd=INPUTS, check=True)


def make_inputs() -> None:
    """The trace and the run directories: virtual ones (deterministic) and live
    ones against the built-in simulator (their self-check and server metrics),
    with --workers and --ray."""
    shutil.rmtree(INPUTS, ignore_errors=True)
    INPUTS.mkdir(parents=True)
    _cli("generate", "--preset", "demo", "--sessions", "6", "--seed", "3",
         "-o", "trace.jsonl")  # fmt: skip
    _cli(*_PLAIN, "--out", "plain")
    _cli(*_AGENTX, "--out", "agentx")
    _cli("sweep", "trace.jsonl", *_VIRTUAL, "--concurrency", "1,3", "--out", "sweep")
    _cli(*_CAPACITY, "--out", "capacity")
    live = ("--sim-args", "--speed 40", "--seed", "1", "--quiet", "--concurrency", "3")
    _cli("run", "trace.jsonl", *live, "--out", "live")
    _cli("run", "trace.jsonl", *live, "--workers", "2", "--out", "workers")
    sys.path.insert(0, str(ROOT))
    from tests.ray_cluster import loopback_cluster

    with loopback_cluster(2) as cluster:
        # Actors take paths as given, in Ray's cwd: absolute ones.
        _cli("run", str(INPUTS / "trace.jsonl"), *live, "--ray", cluster.address,
             "--ray-workers", "2", "--out", str(INPUTS / "ray"))  # fmt: skip


def main() -> None:
    import tempfile

    if sys.argv[1:] != ["outputs"]:
        make_inputs()
    shutil.rmtree(OUTPUTS, ignore_errors=True)
    OUTPUTS.mkdir()
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in outputs(Path(tmp)).items():
            (OUTPUTS / name).write_text(text)


if __name__ == "__main__":
    main()
