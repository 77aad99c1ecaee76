"""Side-by-side benchmark against a peer load generator (NVIDIA AIPerf), in one run.

    /work/venv/bin/python bench/bench_peers.py [--reps 3] [--out DIR]

Every tool drives the same workload against a fresh `replayer sim` (pinned to CPU 0;
the client under test pinned to CPU 1): single-turn streamed chat requests whose prompt
the sim counts as 2,000 tokens, 128 output tokens (ignore_eos), closed loop at
concurrency C. Tools:

- ours: `replayer run` on a trace of one-request sessions (`--api chat --think-scale 0`),
  figures from `replayer analyze --json`;
- aiperf 0.13.0, installed by this script into its own venv
  ($HOME/.cache/replayer-bench/venv-aiperf), fed the same prompt texts through a
  `single_turn` dataset file, figures from its `profile_export_aiperf.json`;
- a bare asyncio + aiohttp client (bench/peers/aiohttp_client.py): the floor.

Configurations (interleaved, each repeated --reps times, medians printed):
- fast-c8 / fast-c32: sim `--speed 1e6` (modeled delays ~0: the client is the cost),
  400 requests: wall time, client CPU seconds, startup, and reported TTFT/TPOT;
- timed-c16: sim `--speed 1` (default timing: 8 ms + 0.25 ms/seq per decode step,
  60 us per prompt token), 96 requests: TTFT/TPOT each tool reports against the sim's
  own Prometheus histograms (vllm:time_to_first_token_seconds,
  vllm:time_per_output_token_seconds) as referee.

If aiperf cannot be installed or run, the error is printed and the table has ours vs
the aiohttp baseline only.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
REPLAYER = str(Path(PY).with_name("replayer"))
PEER_VENV = Path(
    os.environ.get(
        "REPLAYER_BENCH_PEER_VENV", Path.home() / ".cache/replayer-bench/venv-aiperf"
    )
)
AIPERF_VERSION = "0.13.0"
# aiperf needs a HuggingFace tokenizer (no network here: its `builtin` tiktoken one
# downloads o200k_base); with --use-server-token-count it only loads it.
TOKENIZER = ROOT.parent / "shared/models/tiny-random-llama"
ISL, OSL = 2000, 128
CONFIGS = [  # name, sim args, concurrency, requests
    ("fast-c8", ["--speed", "1000000"], 8, 400),
    ("fast-c32", ["--speed", "1000000"], 32, 400),
    ("timed-c16", ["--speed", "1"], 16, 96),
]
CLK_TCK = os.sysconf("SC_CLK_TCK")
SIM_CPU, CLIENT_CPU = "0", "1"


# ---------------------------------------------------------------- process CPU
def _tree_cpu(root: int, seen: dict[int, float]) -> float:
    """utime+stime of root and all its descendants (last value kept for exited ones)."""
    stack = [root]
    while stack:
        pid = stack.pop()
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            seen[pid] = (int(fields[11]) + int(fields[12])) / CLK_TCK
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as f:
                    stack.extend(int(c) for c in f.read().split())
        except (OSError, IndexError, ValueError):
            continue
    return sum(seen.values())


def run_measured(
    cmd: list[str], env: dict | None = None, log: Path | None = None
) -> dict:
    """Run cmd pinned to the client CPU; wall, CPU (rusage of reaped children, and a
    0.05 s /proc poll of the tree for a timeline), start time."""
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    out = open(log, "wb") if log else subprocess.DEVNULL
    proc = subprocess.Popen(
        ["taskset", "-c", CLIENT_CPU, *cmd],
        env=env,
        stdout=out,
        stderr=subprocess.STDOUT,
    )
    seen: dict[int, float] = {}
    timeline: list[tuple[float, float]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            timeline.append((time.time(), _tree_cpu(proc.pid, seen)))
            stop.wait(0.05)

    th = threading.Thread(target=poll, daemon=True)
    th.start()
    rc = proc.wait()
    t1 = time.time()
    stop.set()
    th.join()
    if log:
        out.close()
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_ru = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)
    polled = timeline[-1][1] if timeline else 0.0
    return {
        "rc": rc,
        "t0": t0,
        "wall_s": t1 - t0,
        "cpu_s": max(cpu_ru, polled),
        "timeline": timeline,
    }


def cpu_between(timeline: list[tuple[float, float]], a: float, b: float) -> float:
    def at(t: float) -> float:
        prev = (timeline[0][0], 0.0) if timeline else (t, 0.0)
        for ts, v in timeline:
            if ts >= t:
                if ts == prev[0]:
                    return v
                return prev[1] + (v - prev[1]) * (t - prev[0]) / (ts - prev[0])
            prev = (ts, v)
        return prev[1]

    return at(b) - at(a)


# ---------------------------------------------------------------- the sim
class Sim:
    def __init__(self, args: list[str]):
        self.proc = subprocess.Popen(
            [
                "taskset",
                "-c",
                SIM_CPU,
                REPLAYER,
                "sim",
                "--port",
                "0",
                "--accept-any-model",
                "--model",
                "sim",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)", line)
        if not m:
            self.proc.kill()
            raise RuntimeError(f"sim did not start: {line!r}")
        self.url = f"http://127.0.0.1:{m.group(1)}"

    def metrics(self) -> dict:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for name, key in (
            ("vllm:time_to_first_token_seconds", "ttft"),
            ("vllm:time_per_output_token_seconds", "tpot"),
        ):
            buckets, total, count = [], 0.0, 0.0
            for line in text.splitlines():
                if line.startswith(name + "_bucket"):
                    le = re.search(r'le="([^"]+)"', line).group(1)
                    buckets.append((float(le), float(line.rsplit(" ", 1)[1])))
                elif line.startswith(name + "_sum"):
                    total = float(line.rsplit(" ", 1)[1])
                elif line.startswith(name + "_count"):
                    count = float(line.rsplit(" ", 1)[1])
            out[key] = {
                "mean": 1e3 * total / count if count else None,
                "p50": _hist_q(buckets, 0.5),
                "p90": _hist_q(buckets, 0.9),
                "count": count,
            }
        m = re.search(r"^vllm:prompt_tokens_total\S* (\S+)$", text, re.M)
        n = re.search(r"^vllm:request_success_total\S* (\S+)$", text, re.M)
        if m and n and float(n.group(1)):
            out["prompt_tokens_per_request"] = float(m.group(1)) / float(n.group(1))
        return out

    def cpu_s(self) -> float:
        return _tree_cpu(self.proc.pid, {})

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _hist_q(buckets: list[tuple[float, float]], q: float) -> float | None:
    """Upper bound (ms) of the histogram bucket holding quantile q: the sim's buckets
    are vLLM's (TPOT: 10, 25, 50 ms ...), too coarse to interpolate honestly."""
    buckets = sorted(buckets)
    if not buckets or buckets[-1][1] == 0:
        return None
    rank = q * buckets[-1][1]
    for le, c in buckets:
        if c >= rank:
            return 1e3 * le
    return None


# ---------------------------------------------------------------- workload
WORDS = [
    f"{a}{b}"
    for a in ("ka", "lo", "mi", "nu", "pe", "ri", "so", "tu")
    for b in ("ba", "de", "fi", "go", "hu", "ja", "ke", "la", "mo", "na", "po", "ru")
]


def write_workloads(tmp: Path, n_max: int) -> tuple[Path, Path]:
    """Our trace (one-request sessions) and the same number of random-word prompts for
    the peers. The sim counts a chat prompt as words + 1 per message, so 1,999 words in
    one user message = 2,000 tokens, as our chat materialization of a 2,000-token
    request is counted."""
    import numpy as np

    sys.path.insert(0, str(ROOT))
    from traces.io import write_trace
    from traces.model import Request, Session, Trace

    blocks = -(-ISL // 64)
    sessions = tuple(
        Session(
            session_id=f"s{i:05d}",
            requests=(
                Request(
                    input_tokens=ISL,
                    output_tokens=OSL,
                    hash_ids=np.arange(i * blocks, (i + 1) * blocks, dtype=np.int64),
                ),
            ),
        )
        for i in range(n_max)
    )
    trace = write_trace(Trace(sessions=sessions), tmp / "trace.jsonl")
    rng = random.Random(0)
    prompts = tmp / "prompts.jsonl"
    with prompts.open("w") as f:
        for i in range(n_max):
            words = [f"req{i}"] + [rng.choice(WORDS) for _ in range(ISL - 2)]
            f.write(json.dumps({"text": " ".join(words)}) + "\n")
    return trace, prompts


def head(path: Path, n: int, out: Path) -> Path:
    with path.open() as f, out.open("w") as g:
        for i, line in enumerate(f):
            if i >= n:
                break
            g.write(line)
    return out


# ---------------------------------------------------------------- tools
def run_ours(url: str, trace: Path, conc: int, n: int, work: Path) -> dict:
    out = work / "run"
    t = head(trace, n, work / "trace.jsonl")
    m = run_measured(
        [
            REPLAYER,
            "run",
            str(t),
            "--endpoint",
            url,
            "--model",
            "sim",
            "--api",
            "chat",
            "--concurrency",
            str(conc),
            "--think-scale",
            "0",
            "--out",
            str(out),
            "--quiet",
        ],
        log=work / "log.txt",
    )
    if m["rc"] != 0:
        raise RuntimeError(
            f"replayer run failed: {(work / 'log.txt').read_text()[-500:]}"
        )
    a = json.loads(
        subprocess.run(
            [REPLAYER, "analyze", str(out), "--json"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    import pyarrow.parquet as pq

    rows = pq.read_table(
        glob.glob(str(out / "requests/*.parquet")), columns=["start_ns", "end_ns"]
    ).to_pydict()
    base = json.loads((out / "run.json").read_text())["start_unix_ns"] / 1e9
    first, last = base + min(rows["start_ns"]) / 1e9, base + max(rows["end_ns"]) / 1e9
    return _result(m, first, last, a["ok"], a["ttft_ms"], a["tpot_ms"])


def run_aiperf(url: str, prompts: Path, conc: int, n: int, work: Path) -> dict:
    art = work / "artifacts"
    p = head(prompts, n, work / "prompts.jsonl")
    env = dict(os.environ)  # (HF_HUB_OFFLINE=1 makes it reject the local path)
    m = run_measured(
        [
            str(PEER_VENV / "bin/aiperf"),
            "profile",
            "--model",
            "sim",
            "--url",
            url,
            "--endpoint-type",
            "chat",
            "--streaming",
            "--concurrency",
            str(conc),
            "--request-count",
            str(n),
            "--custom-dataset-type",
            "single_turn",
            "--input-file",
            str(p),
            "--dataset-sampling-strategy",
            "sequential",
            "--output-tokens-mean",
            str(OSL),
            "--output-tokens-stddev",
            "0",
            "--extra-inputs",
            "ignore_eos:true",
            "--use-server-token-count",
            "--tokenizer",
            str(TOKENIZER),
            "--random-seed",
            "0",
            "--ui-type",
            "none",
            "--artifact-dir",
            str(art),
        ],
        env=env,
        log=work / "log.txt",
    )
    summary = art / "profile_export_aiperf.json"
    if m["rc"] != 0 or not summary.exists():
        raise RuntimeError(
            f"aiperf failed (rc {m['rc']}): "
            f"{(work / 'log.txt').read_text(errors='replace')[-800:]}"
        )
    d = json.loads(summary.read_text())
    starts, ends = [], []
    with (art / "profile_export.jsonl").open() as f:
        for line in f:
            md = json.loads(line)["metadata"]
            starts.append(md["request_start_ns"] / 1e9)
            ends.append(md["request_end_ns"] / 1e9)

    def pick(k: str) -> dict:
        v = d.get(k) or {}
        return {"mean": v.get("avg"), "p50": v.get("p50"), "p90": v.get("p90")}

    ok = int(
        (d.get("completed_request_count") or d.get("request_count") or {}).get("avg", 0)
    )
    # aiperf's inter_token_latency = (request_latency - TTFT) / (OSL - 1): our TPOT.
    return _result(
        m,
        min(starts),
        max(ends),
        ok,
        pick("time_to_first_token"),
        pick("inter_token_latency"),
    )


def run_baseline(url: str, prompts: Path, conc: int, n: int, work: Path) -> dict:
    p = head(prompts, n, work / "prompts.jsonl")
    m = run_measured(
        [
            PY,
            str(ROOT / "bench/peers/aiohttp_client.py"),
            url,
            str(p),
            str(work / "out.json"),
            "--concurrency",
            str(conc),
            "--max-tokens",
            str(OSL),
        ],
        log=work / "log.txt",
    )
    rows = json.loads((work / "out.json").read_text())
    ok = [r for r in rows if r["ok"]]
    ttft = [(r["first_ns"] - r["start_ns"]) / 1e6 for r in ok]
    tpot = [(r["end_ns"] - r["first_ns"]) / 1e6 / (r["output_tokens"] - 1) for r in ok]
    return _result(
        m,
        min(r["start_ns"] for r in rows) / 1e9,
        max(r["end_ns"] for r in rows) / 1e9,
        len(ok),
        _stats(ttft),
        _stats(tpot),
    )


def _stats(xs: list[float]) -> dict:
    import numpy as np

    a = np.asarray(xs)
    return {
        "mean": float(a.mean()),
        "p50": float(np.percentile(a, 50)),
        "p90": float(np.percentile(a, 90)),
    }


def _result(
    m: dict, first: float, last: float, ok: int, ttft: dict, tpot: dict
) -> dict:
    return {
        "ok": ok,
        "wall_s": m["wall_s"],
        "cpu_s": m["cpu_s"],
        "startup_s": first - m["t0"],
        "window_s": last - first,
        "cpu_window_s": cpu_between(m["timeline"], first, last),
        "ttft": ttft,
        "tpot": tpot,
    }


# ---------------------------------------------------------------- peer venv
def ensure_aiperf() -> str | None:
    """Create/reuse the peer venv; return an error string if aiperf is unusable."""
    exe = PEER_VENV / "bin/aiperf"
    if not exe.exists():
        print(f"installing aiperf=={AIPERF_VERSION} into {PEER_VENV} ...", flush=True)
        PEER_VENV.parent.mkdir(parents=True, exist_ok=True)
        py = shutil.which("python3.11") or shutil.which("python3") or "python3"
        r = subprocess.run(
            [py, "-m", "venv", str(PEER_VENV)], capture_output=True, text=True
        )
        if r.returncode == 0:
            r = subprocess.run(
                [
                    str(PEER_VENV / "bin/pip"),
                    "install",
                    "-q",
                    f"aiperf=={AIPERF_VERSION}",
                ],
                capture_output=True,
                text=True,
            )
        if r.returncode != 0:
            return (r.stderr or r.stdout).strip().splitlines()[-1]
    if not TOKENIZER.exists():
        return f"no local tokenizer at {TOKENIZER} (aiperf needs one; no network)"
    r = subprocess.run(
        [str(PEER_VENV / "bin/pip"), "show", "aiperf"], capture_output=True, text=True
    )
    ver = re.search(r"^Version: (\S+)", r.stdout, re.M)
    return None if ver else "aiperf not importable in the peer venv"


# ---------------------------------------------------------------- main
def med(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x: float | None, nd: int = 2) -> str:
    return "-" if x is None else f"{x:,.{nd}f}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, help="write all samples as JSON here")
    ap.add_argument("--configs", default=",".join(c[0] for c in CONFIGS))
    args = ap.parse_args()

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in open("/proc/cpuinfo")
            if line.startswith("model name")
        ),
        "?",
    )
    print(f"machine: nproc={os.cpu_count()} cpu={cpu!r} load={os.getloadavg()[0]:.1f}")
    err = ensure_aiperf()
    tools = {"ours": run_ours, "baseline": run_baseline}
    if err:
        print(f"aiperf UNAVAILABLE: {err}\n-> comparing with the aiohttp baseline only")
    else:
        tools["aiperf"] = run_aiperf
        ver = subprocess.run(
            [str(PEER_VENV / "bin/pip"), "show", "aiperf"],
            capture_output=True,
            text=True,
        ).stdout
        print("peer: aiperf", re.search(r"^Version: (\S+)", ver, re.M).group(1))

    configs = [c for c in CONFIGS if c[0] in args.configs.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    trace, prompts = write_workloads(tmp, max(c[3] for c in configs))
    samples: dict = {}  # (config, tool) -> list of result dicts, plus sim figures
    t_start = time.time()
    for rep in range(args.reps):
        for name, sim_args, conc, n in configs:
            order = list(tools)
            order = order[rep % len(order) :] + order[: rep % len(order)]  # rotate
            for tool in order:
                work = tmp / f"{name}-{tool}-{rep}"
                work.mkdir()
                sim = Sim(sim_args)
                sim_cpu0 = sim.cpu_s()
                try:
                    src = trace if tool == "ours" else prompts
                    r = tools[tool](sim.url, src, conc, n, work)
                    r["sim"] = sim.metrics()
                    r["sim_cpu_s"] = sim.cpu_s() - sim_cpu0
                except Exception as exc:
                    print(f"  {name} {tool} rep {rep}: FAILED {exc}")
                    continue
                finally:
                    sim.stop()
                samples.setdefault((name, tool), []).append(r)
                print(
                    f"  rep {rep} {name:9s} {tool:8s} wall {r['wall_s']:6.2f}s "
                    f"window {r['window_s']:6.2f}s cpu {r['cpu_s']:6.2f}s sim cpu {r['sim_cpu_s']:5.2f}s "
                    f"ttft p50 {fmt(r['ttft']['p50'])} ms (sim {fmt(r['sim']['ttft']['mean'])} mean) "
                    f"tpot p50 {fmt(r['tpot']['p50'], 3)} ms ok {r['ok']}",
                    flush=True,
                )
    print(f"total bench time {time.time() - t_start:.0f} s; samples in {tmp}")

    names = [t for t in ("ours", "aiperf", "baseline") if t in tools]
    print("\n## Client cost (medians over reps)")
    print(
        "| config | tool | requests ok | command wall s | load window s | startup s "
        "| CPU s total | CPU s / 1k req (window) | CPU s / 1k req (total) | sim CPU s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, _, _, n in configs:
        for tool in names:
            rs = samples.get((name, tool), [])
            if not rs:
                continue
            print(
                f"| {name} | {tool} | {med([r['ok'] for r in rs]):.0f} "
                f"| {fmt(med([r['wall_s'] for r in rs]))} "
                f"| {fmt(med([r['window_s'] for r in rs]))} "
                f"| {fmt(med([r['startup_s'] for r in rs]))} "
                f"| {fmt(med([r['cpu_s'] for r in rs]))} "
                f"| {fmt(med([1000 * r['cpu_window_s'] / r['ok'] for r in rs]))} "
                f"| {fmt(med([1000 * r['cpu_s'] / r['ok'] for r in rs]))} "
                f"| {fmt(med([r['sim_cpu_s'] for r in rs]))} |"
            )
    print(
        "\n## Ratios (peer / ours; > 1 = ours cheaper or faster), medians of per-rep ratios"
    )
    print(
        "| config | peer | command wall | load window | startup | CPU total | CPU window |"
    )
    print("|---|---|---:|---:|---:|---:|---:|")
    for name, *_ in configs:
        ours = samples.get((name, "ours"), [])
        for tool in names[1:]:
            theirs = samples.get((name, tool), [])
            k = min(len(ours), len(theirs))
            if not k:
                continue
            row = []
            for key in ("wall_s", "window_s", "startup_s", "cpu_s", "cpu_window_s"):
                row.append(
                    fmt(
                        med(
                            [
                                theirs[i][key]
                                / ours[i][key]
                                / theirs[i]["ok"]
                                * ours[i]["ok"]
                                if key.startswith("cpu")
                                else theirs[i][key] / ours[i][key]
                                for i in range(k)
                                if ours[i][key] > 0
                            ]
                        )
                    )
                )
            print(f"| {name} | {tool} | " + " | ".join(f"{x}x" for x in row) + " |")
    print(
        "\n## Agreement: what each tool reports vs the sim's own histograms (ms, medians over reps)"
    )
    print(
        "(sim p50/p90 = upper bound of the vLLM histogram bucket holding it; mean exact)"
    )
    print(
        "| config | tool | TTFT p50 | TTFT p90 | TTFT mean | sim TTFT p50 / p90 / mean "
        "| TPOT p50 | TPOT p90 | TPOT mean | sim TPOT p50 / p90 / mean | sim prompt tok/req |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, *_ in configs:
        for tool in names:
            rs = samples.get((name, tool), [])
            if not rs:
                continue
            c = [
                fmt(med([r[m][q] for r in rs]), 3 if m == "tpot" else 1)
                for m in ("ttft",)
                for q in ("p50", "p90", "mean")
            ]
            s1 = " / ".join(
                fmt(med([r["sim"]["ttft"][q] for r in rs]), 1)
                for q in ("p50", "p90", "mean")
            )
            t = [
                fmt(med([r["tpot"][q] for r in rs]), 3) for q in ("p50", "p90", "mean")
            ]
            s2 = " / ".join(
                fmt(med([r["sim"]["tpot"][q] for r in rs]), 3)
                for q in ("p50", "p90", "mean")
            )
            pt = fmt(med([r["sim"].get("prompt_tokens_per_request") for r in rs]), 0)
            print(
                f"| {name} | {tool} | {' | '.join(c)} | {s1} | {' | '.join(t)} | {s2} | {pt} |"
            )
    if args.out:
        args.out.write_text(
            json.dumps(
                {
                    f"{k[0]}/{k[1]}": [{kk: vv for kk, vv in r.items()} for r in v]
                    for k, v in samples.items()
                },
                indent=1,
                default=str,
            )
        )


if __name__ == "__main__":
    main()
