"""Named, serializable distributions for the synthetic generator: sampling, the JSON
form and the two-sample KS distance. No scipy: the normal quantile is Acklam's rational
approximation (relative error < 1.2e-9). See docs/traces.md#synthetic-traces."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, TypeVar

import numpy as np
import numpy.typing as npt

from traces.errors import TraceError

FloatArray = npt.NDArray[np.float64]
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True, kw_only=True)
class LogNormal:
    """exp(N(ln median, sigma²)), clipped to [low, high].

    LogNormal(median=444, sigma=1.0, low=1, high=32_000)
    """

    kind: ClassVar[str] = "lognormal"
    median: float
    sigma: float
    low: float = 0.0
    high: float = math.inf

    def __post_init__(self) -> None:
        if not self.median > 0 or self.sigma < 0 or self.low > self.high:
            raise ValueError(f"bad lognormal parameters: {self}")

    def ppf(self, u: FloatArray) -> FloatArray:
        x = self.median * np.exp(self.sigma * norm_ppf(u))
        return np.clip(x, self.low, self.high)


@dataclass(frozen=True, slots=True, kw_only=True)
class Gamma:
    """Gamma(shape, scale), clipped to [low, high]; drawn unstratified (no ppf).

    Gamma(shape=1.0, scale=2.0) is an exponential with mean 2.
    """

    kind: ClassVar[str] = "gamma"
    shape: float
    scale: float
    low: float = 0.0
    high: float = math.inf

    def __post_init__(self) -> None:
        if not (self.shape > 0 and self.scale > 0) or self.low > self.high:
            raise ValueError(f"bad gamma parameters: {self}")


@dataclass(frozen=True, slots=True, kw_only=True)
class Empirical:
    """A quantile table: ``values[i]`` is the quantile at ``probs[i]``.

    ``probs`` defaults to evenly spaced points on [0, 1]. Between knots the quantile
    function is linear, or log-linear with ``log=True`` (values must then be > 0).

    Empirical(values=(4, 12))  # uniform on [4, 12]
    """

    kind: ClassVar[str] = "empirical"
    values: tuple[float, ...]
    probs: tuple[float, ...] | None = None
    log: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", tuple(float(v) for v in self.values))
        if self.probs is not None:
            object.__setattr__(self, "probs", tuple(float(p) for p in self.probs))
        v = np.asarray(self.values)
        p = self._probs()
        if v.size == 0 or np.any(np.diff(v) < 0) or not np.all(np.isfinite(v)):
            raise ValueError("empirical values must be finite and non-decreasing")
        ends_ok = v.size == 1 or (p[0] == 0 and p[-1] == 1)
        if p.size != v.size or np.any(np.diff(p) < 0) or not ends_ok:
            raise ValueError("empirical probs must rise from 0 to 1, one per value")
        if self.log and v[0] <= 0:
            raise ValueError("empirical log interpolation needs values > 0")

    def _probs(self) -> FloatArray:
        if self.probs is not None:
            return np.asarray(self.probs, dtype=np.float64)
        n = len(self.values)
        return np.linspace(0.0, 1.0, n) if n > 1 else np.array([0.0])

    def ppf(self, u: FloatArray) -> FloatArray:
        v = np.asarray(self.values, dtype=np.float64)
        if v.size == 1:
            return np.full(np.shape(u), v[0])
        p = self._probs()
        if self.log:
            return np.exp(np.interp(u, p, np.log(v)))
        return np.interp(u, p, v)

    @classmethod
    def fit(cls, sample: npt.ArrayLike, knots: int = 257) -> Empirical:
        """The quantile table of ``sample`` at ``knots`` evenly spaced probabilities."""
        arr = np.asarray(sample, dtype=np.float64)
        arr = arr[np.isfinite(arr)]
        if arr.size == 0:
            raise ValueError("cannot fit an empirical distribution to no data")
        q = np.quantile(arr, np.linspace(0.0, 1.0, knots))
        return cls(values=tuple(np.maximum.accumulate(q).tolist()))


Distribution = LogNormal | Gamma | Empirical
_KINDS: dict[str, type[LogNormal] | type[Gamma] | type[Empirical]] = {
    c.kind: c for c in (LogNormal, Gamma, Empirical)
}


def stratified_uniform(
    rng: np.random.Generator, n: int, *, centered: bool = False
) -> FloatArray:
    """n uniforms, one in each of n equal strata, in random order.

    The sample's quantiles then match the target's to within one stratum, so small
    corpora hit their percentiles far closer than i.i.d. draws would. ``centered``
    takes each stratum's midpoint: the sample's median is then the target's even for a
    few dozen draws (only the order is random).
    """
    jitter = np.full(n, 0.5) if centered else rng.random(n)
    return (rng.permutation(n) + jitter) / max(n, 1)


def draw(
    dist: Distribution,
    rng: np.random.Generator,
    n: int,
    *,
    stratified: bool = True,
    centered: bool = False,
) -> FloatArray:
    """n draws from ``dist`` (stratified unless asked not to; Gamma never is)."""
    if isinstance(dist, Gamma):
        x = rng.gamma(dist.shape, dist.scale, n)
        return np.clip(x, dist.low, dist.high)
    if stratified:
        return dist.ppf(stratified_uniform(rng, n, centered=centered))
    return dist.ppf(rng.random(n))


def quantile(dist: Distribution, u: npt.ArrayLike) -> FloatArray:
    """The quantile function of ``dist`` at ``u`` (not defined for Gamma)."""
    if isinstance(dist, Gamma):
        raise TypeError("Gamma has no closed-form quantile function here")
    return dist.ppf(np.asarray(u, dtype=np.float64))


def dist_to_dict(dist: Distribution) -> dict[str, Any]:
    """JSON form: ``{"kind": "lognormal", "median": ..., ...}``."""
    d: dict[str, Any] = {"kind": dist.kind, **asdict(dist)}
    for key, value in d.items():
        if isinstance(value, float) and math.isinf(value):
            d[key] = None  # JSON has no infinity; None = unbounded
        elif isinstance(value, tuple):
            d[key] = list(value)
    return d


def dist_from_dict(obj: object, name: str) -> Distribution:
    """Inverse of :func:`dist_to_dict`; raises TraceError naming the field."""
    if not isinstance(obj, Mapping) or obj.get("kind") not in _KINDS:
        raise TraceError(
            f"config field {name!r}: expected an object with kind "
            f"{' | '.join(sorted(_KINDS))}"
        )
    cls = _KINDS[obj["kind"]]
    allowed = {f.name for f in fields(cls)}
    unknown = set(obj) - allowed - {"kind"}
    if unknown:
        raise TraceError(f"config field {name!r}: unknown keys {sorted(unknown)}")
    kwargs: dict[str, Any] = {}
    for key, value in obj.items():
        if key == "kind":
            continue
        if key == "high" and value is None:
            value = math.inf
        elif isinstance(value, Sequence) and not isinstance(value, str):
            value = tuple(value)
        kwargs[key] = value
    return construct(cls, kwargs, f"config field {name!r}")


def construct(cls: type[_T], kwargs: Mapping[str, Any], what: str) -> _T:
    """``cls(**kwargs)``; a rejected value becomes a TraceError led by ``what``."""
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise TraceError(f"{what}: {exc}") from exc


def ks_distance(a: npt.ArrayLike, b: npt.ArrayLike) -> float:
    """Two-sample Kolmogorov-Smirnov statistic: sup |F_a(x) - F_b(x)|."""
    x = np.sort(np.asarray(a, dtype=np.float64))
    y = np.sort(np.asarray(b, dtype=np.float64))
    if x.size == 0 or y.size == 0:
        return float("nan")
    grid = np.concatenate([x, y])
    fx = np.searchsorted(x, grid, side="right") / x.size
    fy = np.searchsorted(y, grid, side="right") / y.size
    return float(np.max(np.abs(fx - fy)))


# Acklam's coefficients for the inverse normal CDF.
_A = (-39.69683028665376, 220.9460984245205, -275.9285104469687,
      138.3577518672690, -30.66479806614716, 2.506628277459239)  # fmt: skip
_B = (-54.47609879822406, 161.5858368580409, -155.6989798598866,
      66.80131188771972, -13.28068155288572)  # fmt: skip
_C = (-0.007784894002430293, -0.3223964580411365, -2.400758277161838,
      -2.549732539343734, 4.374664141464968, 2.938163982698783)  # fmt: skip
_D = (0.007784695709041462, 0.3224671290700398, 2.445134137142996,
      3.754408661907416)  # fmt: skip
_P_LOW = 0.02425


def _poly(coef: Sequence[float], x: FloatArray) -> FloatArray:
    out = np.zeros_like(x)
    for c in coef:
        out = out * x + c
    return out


def norm_ppf(u: npt.ArrayLike) -> FloatArray:
    """Standard normal quantile; u is clipped into (0, 1) so the result is finite."""
    p = np.clip(np.asarray(u, dtype=np.float64), 1e-12, 1 - 1e-12)
    out = np.empty_like(p)
    lo = p < _P_LOW
    hi = p > 1 - _P_LOW
    mid = ~(lo | hi)
    q = p[mid] - 0.5
    r = q * q
    out[mid] = q * _poly(_A, r) / (_poly(_B, r) * r + 1)
    for mask, sign, tail in ((lo, 1.0, p[lo]), (hi, -1.0, 1 - p[hi])):
        s = np.sqrt(-2 * np.log(tail))
        out[mask] = sign * _poly(_C, s) / (_poly(_D, s) * s + 1)
    return out
