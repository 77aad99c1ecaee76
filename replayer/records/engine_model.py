"""ENGINE.json: a calibrated engine model (step-time terms, KV cache shape, limits,
its origin and fit), written by ``replayer calibrate``, read by ``--virtual``.
Field names are the simulator's knobs. See docs/engine-model.md."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from replayer.errors import ReplayerError

ENGINE_MODEL_VERSION = 1


class EngineModelError(ReplayerError):
    """An ENGINE.json that cannot be used: unreadable, another schema version, or a
    field out of range."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StepTerms:
    """What one engine step costs (the simulator's step-time model)."""

    prefill_us_per_token: float  # per prompt token computed (not cached)
    gpu_hit_us_per_token: float = 0.0  # per prompt token found in the GPU tier
    host_hit_us_per_token: float = 0.0  # per prompt token loaded from the host tier
    request_overhead_us: float = 0.0  # per request scheduled for the first time
    decode_base_ms: float  # fixed time of a step
    decode_per_seq_ms: float  # per decoding sequence in the step
    decode_us_per_context_token: float  # per KV token the decoding sequences read


@dataclass(frozen=True, slots=True, kw_only=True)
class CacheShape:
    """The server's KV cache and batch limits (from its metrics or flags)."""

    block_size: int  # tokens per KV block (vllm:cache_config_info block_size)
    kv_capacity_tokens: int  # GPU tier: num_gpu_blocks x block_size
    host_capacity_tokens: int = 0  # host tier (0: none)
    max_model_len: int  # prompt + output past it is refused (HTTP 400)
    max_num_seqs: int  # running sequences at most
    max_num_batched_tokens: int  # tokens one step computes at most
    policy: str = "vllm"  # the simulator's scheduling ("vllm", "vllm-chunk", "reserve")


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerInfo:
    """The server the model was fitted on (runs of other servers are refused)."""

    endpoint: str | None = None  # public form: no credentials
    model: str | None = None
    engine: str | None = None  # e.g. "vllm", from the runs' labels or metrics
    version: str | None = None
    labels: dict[str, str] = field(default_factory=dict)  # free-form run labels


@dataclass(frozen=True, slots=True, kw_only=True)
class HostFit:
    """The host tier's part of the fit: its size, the cost model, whether the load
    term was fitted (else why not) and the residuals of the steps that loaded host
    hits."""

    capacity_tokens: int
    cost_model: str
    fitted: bool
    steps_with_host_hits: int = 0
    host_tokens_in_steps: float = 0.0
    reason: str | None = None  # why the term was not fitted
    median_rel_residual: float | None = None
    p90_rel_residual: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class FitReport:
    """How the terms were found and how well they fit the runs they came from."""

    method: str  # e.g. "scipy.optimize.least_squares on per-request latencies"
    runs: tuple[str, ...] = ()  # run directories (as given) fitted on
    rows: int = 0  # successful measured rows used
    # Root-mean-square relative error per fitted figure (e.g. "ttft", "tpot").
    residuals: dict[str, float] = field(default_factory=dict)
    # The host tier: its size, the cost model, whether host_hit_us_per_token was
    # fitted (else why not) and the residuals of the steps that loaded host hits.
    host: HostFit | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineModel:
    """One ENGINE.json."""

    schema_version: int = ENGINE_MODEL_VERSION
    steps: StepTerms
    cache: CacheShape
    server: ServerInfo = field(default_factory=ServerInfo)
    fit: FitReport | None = None

    def __post_init__(self) -> None:
        if self.schema_version != ENGINE_MODEL_VERSION:
            raise EngineModelError(
                f"engine model schema version {self.schema_version}; this replayer "
                f"reads version {ENGINE_MODEL_VERSION} (re-run replayer calibrate)"
            )
        for f in fields(StepTerms):
            value = getattr(self.steps, f.name)
            if not (
                isinstance(value, int | float) and math.isfinite(value) and value >= 0
            ):
                raise EngineModelError(
                    f"steps.{f.name} must be a number >= 0 (got {value!r})"
                )
        for name in (
            "block_size",
            "kv_capacity_tokens",
            "max_model_len",
            "max_num_seqs",
            "max_num_batched_tokens",
        ):
            value = getattr(self.cache, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise EngineModelError(
                    f"cache.{name} must be an integer >= 1 (got {value!r})"
                )
        if self.cache.host_capacity_tokens < 0:
            raise EngineModelError("cache.host_capacity_tokens must be >= 0")

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        if out["fit"] is not None and out["fit"]["host"] is None:
            del out["fit"]["host"]  # as ENGINE.json was before the host fit
        return out

    @classmethod
    def from_dict(cls, obj: Any, where: str = "engine model") -> EngineModel:
        if not isinstance(obj, dict):
            raise EngineModelError(f"{where}: expected a JSON object")
        version = obj.get("schema_version")
        if version != ENGINE_MODEL_VERSION:
            raise EngineModelError(
                f"{where}: schema version {version!r}; this replayer reads version "
                f"{ENGINE_MODEL_VERSION} (re-run replayer calibrate)"
            )
        try:
            fit = obj.get("fit")
            server = obj.get("server") or {}
            return cls(
                schema_version=version,
                steps=StepTerms(**obj["steps"]),
                cache=CacheShape(**obj["cache"]),
                server=ServerInfo(
                    **{**server, "labels": dict(server.get("labels") or {})}
                ),
                fit=None
                if fit is None
                else FitReport(
                    **{
                        **fit,
                        "runs": tuple(fit.get("runs") or ()),
                        "host": None
                        if fit.get("host") is None
                        else HostFit(**fit["host"]),
                    }
                ),
            )
        except EngineModelError as exc:
            raise EngineModelError(f"{where}: {exc}") from None
        except (KeyError, TypeError, AttributeError) as exc:
            raise EngineModelError(
                f"{where}: missing or unknown field ({exc})"
            ) from None


def read_engine_model(path: Path) -> EngineModel:
    """Load ENGINE.json; a one-line EngineModelError names the file and the fault."""
    try:
        obj = json.loads(path.read_text())
    except OSError as exc:
        raise EngineModelError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise EngineModelError(f"{path}: not JSON ({exc})") from None
    return EngineModel.from_dict(obj, where=str(path))


def write_engine_model(path: Path, model: EngineModel) -> None:
    path.write_text(json.dumps(model.as_dict(), indent=2, sort_keys=True) + "\n")
