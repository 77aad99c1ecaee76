"""capacity.json: the typed document of a capacity search (its settings, its cells
in the order they ran, the result, a live confirmation). See docs/capacity.md."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from typing import Any

from replayer.records.meta import SteadyRecord


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(str(v) for v in value) if isinstance(value, list | tuple) else ()


@dataclass(frozen=True, slots=True, kw_only=True)
class SloCheck:
    """One objective judged over a cell's steady-state window."""

    slo: str  # the objective: ttft_ms, tpot_ms, e2e_ms
    metric: str  # the latency judged (queue-inclusive for TTFT and E2E)
    target_ms: float
    value_ms: float  # the percentile (NaN: no data)
    ci_ms: tuple[float, float]  # its 95% CI
    passed: bool  # value <= target
    borderline: bool  # the CI contains the target

    def as_dict(self) -> dict[str, Any]:
        return {
            "slo": self.slo,
            "metric": self.metric,
            "target_ms": self.target_ms,
            "value_ms": self.value_ms,
            "ci_ms": list(self.ci_ms),
            "pass": self.passed,
            "borderline": self.borderline,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SloCheck:
        lo, hi = d["ci_ms"]
        return cls(
            slo=d["slo"],
            metric=d["metric"],
            target_ms=d["target_ms"],
            value_ms=_num(d["value_ms"]),
            ci_ms=(_num(lo), _num(hi)),
            passed=d["pass"],
            borderline=d["borderline"],
        )


def _num(value: Any) -> float:
    """A number read back: null (NaN when written) is NaN again."""
    return float("nan") if value is None else float(value)


@dataclass(frozen=True, slots=True, kw_only=True)
class SearchSettings:
    """What was searched and when a cell passes (``capacity.json`` ``search``)."""

    mode: str  # concurrency | session_rate
    slo: dict[str, float]  # objective -> target, ms
    percentile: float
    start: float = 1.0
    growth: float = 2.0
    max_level: float | None = None
    cell_duration_s: float = 60.0
    max_cells: int | None = None
    max_time_s: float | None = None
    max_error_rate: float = 0.1
    reset_cache: bool = False
    widen_borderline: bool = True
    gpus: int | None = None
    # The engine model the cells ran on in virtual time ("sim" or an ENGINE.json);
    # None: live cells, measured on a server.
    virtual: str | None = None

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SearchSettings:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityCell:
    """One cell: a run directory at one level, and its verdict."""

    name: str  # its run directory in the capacity folder
    level: float  # concurrency (a whole number) or session rate
    duration_s: float | None
    widened_from: str | None  # the borderline cell this one runs again, longer
    passed: bool  # the SLO passed and the client did not limit the cell
    slo_pass: bool  # what the SLO alone said
    client_limited: bool
    client_reasons: tuple[str, ...]
    borderline: bool
    requests: int
    ok: int
    error_rate: float | None
    window: SteadyRecord | None  # the steady-state window judged
    window_requests: int
    checks: tuple[SloCheck, ...]
    reasons: tuple[str, ...]  # why it failed

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "level": self.level,
            "duration_s": self.duration_s,
            "widened_from": self.widened_from,
            "pass": self.passed,
            "slo_pass": self.slo_pass,
            "client_limited": self.client_limited,
            "client_reasons": list(self.client_reasons),
            "borderline": self.borderline,
            "requests": self.requests,
            "ok": self.ok,
            "error_rate": self.error_rate,
            "window": None if self.window is None else self.window.as_dict(),
            "window_requests": self.window_requests,
            "checks": [c.as_dict() for c in self.checks],
            "reasons": list(self.reasons),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CapacityCell:
        return cls(
            name=d["name"],
            level=d["level"],
            duration_s=d.get("duration_s"),
            widened_from=d.get("widened_from"),
            passed=d["pass"],
            slo_pass=d.get("slo_pass", d["pass"]),
            client_limited=bool(d.get("client_limited")),
            client_reasons=_strs(d.get("client_reasons")),
            borderline=bool(d.get("borderline")),
            requests=d.get("requests", 0),
            ok=d.get("ok", 0),
            error_rate=d.get("error_rate"),
            window=SteadyRecord.from_dict(d.get("window")),
            window_requests=d.get("window_requests", 0),
            checks=tuple(SloCheck.from_dict(c) for c in d.get("checks") or ()),
            reasons=_strs(d.get("reasons")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheResets:
    """The server's prefix-cache resets between cells (``reset_cache``)."""

    url: str | None  # the reset endpoint that answered
    resets: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class FirstFailure:
    """The first cell that failed on the server's account."""

    name: str
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientLimit:
    """The client-limited cell that bounds the answer from above."""

    name: str
    level: float
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityResult:
    """The answer (``capacity.json`` ``result``); ``max_concurrency`` or
    ``max_session_rate`` repeats ``max_level`` under the mode's own name."""

    status: str  # found | ceiling | budget | interrupted | running
    rate: bool  # a session-rate search (decides the name above)
    max_level: float  # the highest level within the SLO (0: none)
    per_gpu: float | None
    next_level: float | None  # the lowest failing level
    cells: int
    borderline_cells: int
    failed_because: tuple[str, ...]
    first_failure: FirstFailure | None
    stopped_because: str | None  # a budget that ended the search
    client_limited_cells: tuple[str, ...] = ()
    lower_bound_by_client: bool = False
    client_limit: ClientLimit | None = None
    answer_range: tuple[float, float] | None = None  # what the cells support
    thin: bool = False  # the range is wider than the answer
    thin_because: tuple[str, ...] = ()
    # "virtual": predicted by an engine model in virtual time, not measured;
    # "live": the cells were measured on a server.
    source: str = "live"

    def as_dict(self) -> dict[str, Any]:
        key = "max_session_rate" if self.rate else "max_concurrency"
        return {
            "source": self.source,
            "status": self.status,
            key: self.max_level,
            "max_level": self.max_level,
            "per_gpu": self.per_gpu,
            "next_level": self.next_level,
            "cells": self.cells,
            "borderline_cells": self.borderline_cells,
            "failed_because": list(self.failed_because),
            "first_failure": None
            if self.first_failure is None
            else {
                "name": self.first_failure.name,
                "reasons": list(self.first_failure.reasons),
            },
            "stopped_because": self.stopped_because,
            "client_limited_cells": list(self.client_limited_cells),
            "lower_bound_by_client": self.lower_bound_by_client,
            "client_limit": None
            if self.client_limit is None
            else {
                "name": self.client_limit.name,
                "level": self.client_limit.level,
                "reasons": list(self.client_limit.reasons),
            },
            "answer_range": None
            if self.answer_range is None
            else list(self.answer_range),
            "thin": self.thin,
            "thin_because": list(self.thin_because),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CapacityResult:
        first, limit, span = (
            d.get("first_failure"),
            d.get("client_limit"),
            d.get("answer_range"),
        )
        return cls(
            status=d["status"],
            rate="max_session_rate" in d,
            max_level=d["max_level"],
            per_gpu=d.get("per_gpu"),
            next_level=d.get("next_level"),
            cells=d.get("cells", 0),
            borderline_cells=d.get("borderline_cells", 0),
            failed_because=_strs(d.get("failed_because")),
            first_failure=None
            if not isinstance(first, dict)
            else FirstFailure(name=first["name"], reasons=_strs(first.get("reasons"))),
            stopped_because=d.get("stopped_because"),
            client_limited_cells=_strs(d.get("client_limited_cells")),
            lower_bound_by_client=bool(d.get("lower_bound_by_client")),
            client_limit=None
            if not isinstance(limit, dict)
            else ClientLimit(
                name=limit["name"],
                level=limit["level"],
                reasons=_strs(limit.get("reasons")),
            ),
            answer_range=(span[0], span[1])
            if isinstance(span, list | tuple) and len(span) == 2
            else None,
            thin=bool(d.get("thin")),
            thin_because=_strs(d.get("thin_because")),
            source=str(d.get("source") or "live"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfirmCell:
    """One side of a confirmed level: the virtual cell or the live one."""

    name: str
    passed: bool
    client_limited: bool | None  # the live side's (None: the virtual side)
    ok: int
    checks: tuple[SloCheck, ...]
    hit: float | None  # the server's prefix-cache hit over measured ok rows

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"name": self.name, "pass": self.passed}
        if self.client_limited is not None:
            d["client_limited"] = self.client_limited
        d.update(ok=self.ok, checks=[c.as_dict() for c in self.checks], hit=self.hit)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ConfirmCell:
        return cls(
            name=d["name"],
            passed=d["pass"],
            client_limited=d.get("client_limited"),
            ok=d.get("ok", 0),
            checks=tuple(SloCheck.from_dict(c) for c in d.get("checks") or ()),
            hit=d.get("hit"),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class ConfirmLevel:
    """A level replayed live beside its virtual prediction."""

    level: float
    predicted: ConfirmCell | None  # None: no virtual cell at this level
    measured: ConfirmCell


@dataclass(frozen=True, slots=True, kw_only=True)
class Confirmation:
    """``capacity --virtual --confirm``: the answer and the level above, live."""

    endpoint: str | None  # None: the built-in simulator
    cell_duration_s: float
    levels: tuple[ConfirmLevel, ...]
    agrees: bool  # every level's live verdict is the predicted one

    def as_dict(self) -> dict[str, Any]:
        return {
            "endpoint": self.endpoint,
            "cell_duration_s": self.cell_duration_s,
            "levels": [
                {
                    "level": r.level,
                    "predicted": None if r.predicted is None else r.predicted.as_dict(),
                    "measured": r.measured.as_dict(),
                }
                for r in self.levels
            ],
            "agrees": self.agrees,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Confirmation:
        return cls(
            endpoint=d.get("endpoint"),
            cell_duration_s=d["cell_duration_s"],
            levels=tuple(
                ConfirmLevel(
                    level=r["level"],
                    predicted=None
                    if r.get("predicted") is None
                    else ConfirmCell.from_dict(r["predicted"]),
                    measured=ConfirmCell.from_dict(r["measured"]),
                )
                for r in d.get("levels") or ()
            ),
            agrees=bool(d.get("agrees")),
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class CapacityDoc:
    """``capacity.json``: rewritten after every cell."""

    search: SearchSettings
    cells: tuple[CapacityCell, ...] = ()
    reset_cache: CacheResets | None = None  # None: no reset asked or none due
    result: CapacityResult | None = None  # None: before the first cell ended
    confirm: Confirmation | None = field(default=None)

    def as_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "search": asdict(self.search),
            "cells": [c.as_dict() for c in self.cells],
            "reset_cache": None
            if self.reset_cache is None
            else asdict(self.reset_cache),
        }
        if self.result is not None:
            d["result"] = self.result.as_dict()
        if self.confirm is not None:
            d["confirm"] = self.confirm.as_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CapacityDoc:
        """Raises KeyError, TypeError or ValueError on a document that is not one."""
        resets, result, confirm = (
            d.get("reset_cache"),
            d.get("result"),
            d.get("confirm"),
        )
        return cls(
            search=SearchSettings.from_dict(d["search"]),
            cells=tuple(CapacityCell.from_dict(c) for c in d["cells"]),
            reset_cache=None if not isinstance(resets, dict) else CacheResets(**resets),
            result=None
            if not isinstance(result, dict)
            else CapacityResult.from_dict(result),
            confirm=None
            if not isinstance(confirm, dict)
            else Confirmation.from_dict(confirm),
        )
