"""Trace loading speed and memory on the shared Weka sample (issue 2 "Foundation").

Run: /work/venv/bin/python bench/bench_load.py [--repeats N] [--data DIR]

Measures, side by side in one run (interleaved, median of N repeats), MB/s of JSON
bytes loaded by: plain ``json.load``; ``orjson.loads`` + ``np.array(hash_ids, int64)``
per request; our reader (``traces.read_trace`` on the folder, full validation); our
Parquet trace store (``read_trace`` on the converted ``.parquet``). Then the peak RSS
of loading the sample in a fresh subprocess. Goals: our JSON reader >= orjson + numpy;
the store >= 5x orjson + numpy; peak RSS well under 300 MB.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from traces import read_trace, write_trace

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DATA = REPO / ".." / "shared" / "data" / "weka"


def _json_baseline(files: list[Path]) -> list[object]:
    docs = []
    for f in files:
        with f.open("rb") as fh:
            docs.append(json.load(fh))
    return docs


def _orjson_numpy_baseline(files: list[Path]) -> list[object]:
    def walk(entries: list[dict[str, Any]]) -> None:
        for e in entries:
            if e.get("type") == "subagent":
                walk(e["requests"])
            else:
                e["hash_ids"] = np.array(e["hash_ids"], dtype=np.int64)

    docs = [orjson.loads(f.read_bytes()) for f in files]
    for doc in docs:
        walk(doc["requests"])
    return docs


def _time_s(fn: Callable[[], object]) -> float:
    gc.collect()  # no leftovers of the previous case collected on this one's clock
    t0 = time.perf_counter()
    result = fn()
    elapsed = time.perf_counter() - t0
    del result  # freeing is not loading: it happens outside the timed span
    return elapsed


def _peak_rss_mb(path: Path) -> tuple[float, float]:
    """(peak RSS after imports only, peak RSS after loading ``path``), fresh process.

    VmHWM, not ru_maxrss: the latter survives exec, so a child would report the peak
    of this (parent) process.
    """
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "import numpy, orjson, pyarrow.parquet, traces\n"
        "def hwm():\n"
        "    for line in Path('/proc/self/status').read_text().splitlines():\n"
        "        if line.startswith('VmHWM:'):\n"
        "            return int(line.split()[1])\n"
        "base = hwm()\n"
        "t = traces.read_trace(sys.argv[1])\n"
        "print(base, hwm(), t.request_count())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(path)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return int(out[0]) / 1024, int(out[1]) / 1024  # VmHWM is in KiB


def _say(line: str = "") -> None:
    sys.stdout.write(line + "\n")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    args = parser.parse_args()
    data = args.data.resolve()
    files = sorted(data.glob("*.json"))
    if not files:
        sys.exit(f"no Weka .json files in {data}")
    mb = sum(f.stat().st_size for f in files) / 1e6
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "weka.parquet"
        write_trace(read_trace(data), store)
        cases: dict[str, Callable[[], object]] = {
            "json.load": lambda: _json_baseline(files),
            "orjson + numpy": lambda: _orjson_numpy_baseline(files),
            "read_trace (JSON)": lambda: read_trace(data),
            "read_trace (Parquet store)": lambda: read_trace(store),
        }
        times: dict[str, list[float]] = {name: [] for name in cases}
        for _ in range(args.repeats):
            for name, fn in cases.items():  # interleaved: drift hits all alike
                times[name].append(_time_s(fn))
        store_mb = store.stat().st_size / 1e6
        rss_json = _peak_rss_mb(data)
        rss_store = _peak_rss_mb(store)

    med = {name: statistics.median(ts) for name, ts in times.items()}
    ref = med["orjson + numpy"]
    _say(f"command: {sys.executable} bench/bench_load.py --repeats {args.repeats}")
    _say(f"machine: nproc={os.cpu_count()}, CPU: {_cpu_model()}")
    _say(f"python {platform.python_version()}, numpy {np.__version__}")
    _say(
        f"data: {data} ({len(files)} files, {mb:.1f} MB JSON; store {store_mb:.2f} MB)"
    )
    _say()
    _say("| loader | median s | MB/s (JSON MB) | speed vs orjson + numpy |")
    _say("|---|---:|---:|---:|")
    for name, m in med.items():
        _say(f"| {name} | {m:.3f} | {mb / m:.0f} | {ref / m:.2f}x |")
    _say()
    for label, (base, peak) in (("JSON", rss_json), ("Parquet store", rss_store)):
        _say(
            f"peak RSS loading the sample ({label}) in a fresh process: {peak:.0f} MB "
            f"(after imports, before loading: {base:.0f} MB)"
        )
    json_ok = med["read_trace (JSON)"] <= ref
    store_ratio = ref / med["read_trace (Parquet store)"]
    _say()
    _say(f"goal JSON reader >= orjson + numpy: {'met' if json_ok else 'NOT met'}")
    _say(
        f"goal store >= 5x orjson + numpy: {store_ratio:.1f}x, "
        f"{'met' if store_ratio >= 5 else 'NOT met'}"
    )
    _say(f"goal peak RSS < 300 MB: {'met' if rss_json[1] < 300 else 'NOT met'}")


if __name__ == "__main__":
    main()
