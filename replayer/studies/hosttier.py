"""`capacity --virtual ENGINE.json --host-tier SIZE,...`: the capacity search in
virtual time without a host tier and with each size, and each answer's hits per tier.
See docs/capacity.md ("A host tier, what if")."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from replayer.errors import ConfigError

if TYPE_CHECKING:
    from replayer.config import ReplayConfig
    from replayer.records.capacity import CapacityCell, CapacityDoc
    from replayer.studies.capacity import CapacitySearch

_SIZE = re.compile(r"(\d+(?:\.\d+)?)([kmg]?)", re.IGNORECASE)
_UNIT = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
HOST_TIER_FILE = "host_tier.json"


def parse_host_sizes(text: str) -> tuple[int, ...]:
    """``SIZE[,SIZE...]``: host-tier sizes in tokens, each a whole count with an
    optional binary suffix (``65536``, ``64K``, ``1.5M``, ``2G``; K = 1,024).

    Raises:
        ConfigError: an empty list, a size of 0 or one that is not a count of tokens.
    """
    sizes: list[int] = []
    for part in text.split(","):
        word = part.strip()
        match = _SIZE.fullmatch(word)
        if match is None:
            raise ConfigError(
                f"--host-tier: {word!r} is not a size in tokens (e.g. 65536, 64K, "
                "2M; K = 1,024 tokens)"
            )
        tokens = float(match.group(1)) * _UNIT[match.group(2).lower()]
        if tokens < 1 or tokens != math.floor(tokens):
            raise ConfigError(
                f"--host-tier: {word!r} must be a whole number of tokens >= 1 (the "
                "run without a host tier is always compared)"
            )
        sizes.append(int(tokens))
    return tuple(dict.fromkeys(sizes))


@dataclass(frozen=True, slots=True, kw_only=True)
class HostTierAnswer:
    """One host-tier size's search: its answer and the tiers' hits at it."""

    host_capacity_tokens: int  # 0: no host tier
    folder: str  # the capacity folder of this size, under the output folder
    max_level: float
    status: str
    gpu_hit: float | None  # at the answer's cell (None: no cell passed)
    host_hit: float | None
    hit: float | None

    def as_dict(self) -> dict[str, Any]:
        return {
            "host_capacity_tokens": self.host_capacity_tokens,
            "folder": self.folder,
            "max_level": self.max_level,
            "status": self.status,
            "gpu_hit": self.gpu_hit,
            "host_hit": self.host_hit,
            "hit": self.hit,
        }


def run_host_tiers(
    trace_path: Path,
    config: ReplayConfig,
    search: CapacitySearch,
    out: Path,
    sizes: Sequence[int],
    *,
    progress: Any = None,
    on_cell: Callable[[CapacityCell], None] | None = None,
) -> tuple[list[HostTierAnswer], list[CapacityDoc]]:
    """The capacity search once without a host tier (``host-0``) and once with each
    of ``sizes`` (``host-SIZE``), each in virtual time on the engine model with
    ``--host-capacity-tokens SIZE`` over it; writes ``host_tier.json`` in ``out``.

    Raises:
        ConfigError: the search is not in virtual time.
    """
    from replayer.studies.capacity import run_capacity

    if not config.virtual:
        raise ConfigError(
            "--host-tier is a what-if on an engine model: add --virtual ENGINE.json"
        )
    out.mkdir(parents=True, exist_ok=True)
    answers: list[HostTierAnswer] = []
    docs: list[CapacityDoc] = []
    for size in (0, *sizes):
        folder = out / f"host-{size}"
        args = (*config.sim_args, "--host-capacity-tokens", str(size))
        doc = run_capacity(
            trace_path,
            replace(config, sim_args=args),
            search,
            folder,
            progress=progress,
            on_cell=on_cell,
        )
        docs.append(doc)
        answers.append(_answer(size, folder, doc))
    (out / HOST_TIER_FILE).write_text(
        json.dumps({"host_tiers": [a.as_dict() for a in answers]}, indent=2) + "\n"
    )
    return answers, docs


def _answer(size: int, folder: Path, doc: CapacityDoc) -> HostTierAnswer:
    from analysis import metrics as m
    from analysis.load import load_run
    from analysis.tiers import tier_rates

    result = doc.result
    assert result is not None
    best = [c for c in doc.cells if c.passed and c.level == result.max_level]
    gpu = host = hit = None
    if best:
        run = load_run(folder / best[-1].name)
        df = m.numeric_view(run.requests)
        hit = m.server_hit_rate(df)
        tiers = tier_rates(df, run.server_metrics)
        gpu, host = (hit, 0.0) if tiers is None else (tiers.gpu, tiers.host)
    return HostTierAnswer(
        host_capacity_tokens=size,
        folder=folder.name,
        max_level=result.max_level,
        status=result.status,
        gpu_hit=gpu,
        host_hit=host,
        hit=hit,
    )


def format_host_tiers(answers: Sequence[HostTierAnswer], what: str) -> str:
    """The answers side by side, as `capacity --host-tier` prints them."""
    header = ["host tier (tokens)", f"max {what}", "status", "GPU hit", "host hit",
              "hit"]  # fmt: skip

    def pct(v: float | None) -> str:
        return "-" if v is None or not math.isfinite(v) else f"{v:.1%}"

    rows = [
        [
            "none" if a.host_capacity_tokens == 0 else f"{a.host_capacity_tokens:,}",
            f"{a.max_level:g}",
            a.status,
            pct(a.gpu_hit),
            pct(a.host_hit),
            pct(a.hit),
        ]
        for a in answers
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in [header, *rows]
    ]
    lines.append("(in virtual time on the engine model; hits at each answer's level)")
    return "\n".join(lines)
