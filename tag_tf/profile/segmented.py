"""Segmented (piecewise-linear) regression of transfer time against message size.

Communication time is close to linear in bytes, but with a few regimes (latency-bound small messages,
protocol/chunking switches in gRPC and collectives, caches), so one straight line misfits either the
small or the large sizes. `SegmentedLinear.fit` fits a *continuous* piecewise-linear function:

    t(x) = c0 + c1*x + sum_j h_j * max(0, x - b_j)

with breakpoints b_j chosen among the measured sizes by exhaustive least squares (sizes double, so
there are only ~20 candidates and <= 2 interior breakpoints: a few hundred tiny solves). Continuity
keeps predictions monotone-looking between fitted regimes and safe just past a breakpoint.

The least squares is *relative*: each residual is divided by max(t, floor_s), because sizes span six
orders of magnitude and an absolute fit would ignore every small message. Breakpoint choices that
give a segment a negative slope are rejected (a bigger message never takes less time; a dip in the
data is noise). The number of segments k minimises the Bayesian information criterion
n*ln(err^2) + 2k*ln(n) (2k free parameters: k+1 coefficients, k-1 breakpoints), so clean linear data
gets one segment and noise does not buy extra segments.

Outside the fitted range the first/last segment extrapolates; predictions are clamped at >= 0.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence

import numpy as np

from tag_tf.errors import ProfileError


@dataclasses.dataclass(frozen=True)
class SegmentedLinear:
    """Segment s covers [breakpoints[s-1], breakpoints[s]) (open-ended at both extremes) and
    predicts intercepts[s] + slopes[s] * bytes seconds."""

    breakpoints: tuple[float, ...]   # interior boundaries, ascending (k-1 of them for k segments)
    slopes: tuple[float, ...]        # seconds per byte, one per segment
    intercepts: tuple[float, ...]    # seconds, one per segment
    error: float = 0.0               # relative RMS error on the fitted data
    fit_range: tuple[float, float] | None = None   # smallest and largest fitted size, bytes

    def __post_init__(self) -> None:
        for name in ("breakpoints", "slopes", "intercepts"):
            object.__setattr__(self, name, tuple(float(v) for v in getattr(self, name)))
        if self.fit_range is not None:
            object.__setattr__(self, "fit_range", tuple(float(v) for v in self.fit_range))
        k = len(self.slopes)
        if k < 1 or len(self.intercepts) != k or len(self.breakpoints) != k - 1:
            raise ProfileError(f"segmented model: need k slopes, k intercepts and k-1 breakpoints, "
                               f"got {len(self.slopes)}, {len(self.intercepts)}, "
                               f"{len(self.breakpoints)}")
        if list(self.breakpoints) != sorted(self.breakpoints):
            raise ProfileError("segmented model: breakpoints must ascend")

    @property
    def num_segments(self) -> int:
        return len(self.slopes)

    @property
    def segments(self) -> list[tuple[float, float, float, float]]:
        """(start, end, slope, intercept) per segment; start/end are -inf/inf at the extremes."""
        edges = (-np.inf, *self.breakpoints, np.inf)
        return [(edges[s], edges[s + 1], self.slopes[s], self.intercepts[s])
                for s in range(self.num_segments)]

    def predict(self, nbytes: float | Sequence[float] | np.ndarray) -> float | np.ndarray:
        """Seconds for messages of `nbytes` (a scalar gives a float, an array an array)."""
        x = np.asarray(nbytes, dtype=np.float64)
        seg = np.searchsorted(np.asarray(self.breakpoints), x, side="right")
        t = np.asarray(self.intercepts)[seg] + np.asarray(self.slopes)[seg] * x
        t = np.maximum(t, 0.0)
        return float(t) if t.ndim == 0 else t

    # ---- fitting --------------------------------------------------------------------------------
    @classmethod
    def fit(cls, nbytes: Sequence[float], seconds: Sequence[float], max_segments: int = 3,
            min_gap: int = 2, floor_s: float = 1e-5) -> SegmentedLinear:
        """Least-squares fit (see the module docstring). Breakpoints are measured sizes, at least
        `min_gap` points apart and away from both ends."""
        x = np.asarray(nbytes, dtype=np.float64)
        y = np.asarray(seconds, dtype=np.float64)
        if x.shape != y.shape or x.ndim != 1:
            raise ProfileError("segmented fit: sizes and times must be 1-D and of equal length")
        if len(x) < 2 or not np.all(np.isfinite(x)) or not np.all(np.isfinite(y)):
            raise ProfileError(f"segmented fit: need >= 2 finite points, got {len(x)}")
        order = np.argsort(x, kind="stable")
        x, y = x[order], y[order]
        if max_segments < 1:
            raise ProfileError("segmented fit: max_segments must be >= 1")
        scale = float(x.max()) or 1.0       # solve in [0, 1] for conditioning
        xs = x / scale
        w = 1.0 / np.maximum(y, floor_s)
        best: list[tuple[float, tuple[int, ...], np.ndarray]] = []
        for k in range(1, max_segments + 1):
            trial = None
            for idx in _breakpoint_sets(len(x), k - 1, min_gap):
                coef, err = _solve(xs, y, w, [xs[i] for i in idx])
                if coef is None or np.any(np.cumsum(coef[1:]) < 0):   # a falling segment
                    continue
                if trial is None or err < trial[0] - 1e-12:
                    trial = (err, idx, coef)
            if trial is not None:
                best.append(trial)
        if not best:   # only when the data falls overall: fall back to the unconstrained line
            coef, err = _solve(xs, y, w, [])
            best.append((err, (), coef))
        n = len(x)
        err, idx, coef = min(best, key=lambda b: n * np.log(max(b[0], 1e-9) ** 2)
                             + 2 * (len(b[1]) + 1) * np.log(n))
        return cls._from_hinges(coef, [x[i] for i in idx], scale, err, (float(x[0]), float(x[-1])))

    @classmethod
    def _from_hinges(cls, coef: np.ndarray, breaks: list[float], scale: float, err: float,
                     fit_range: tuple[float, float]) -> SegmentedLinear:
        c0, slope = float(coef[0]), float(coef[1]) / scale
        intercept = c0
        slopes, intercepts = [slope], [intercept]
        for b, h in zip(breaks, coef[2:]):
            h = float(h) / scale
            slope += h
            intercept -= h * b        # continuity at b
            slopes.append(slope)
            intercepts.append(intercept)
        return cls(tuple(breaks), tuple(slopes), tuple(intercepts), float(err), fit_range)

    # ---- serialisation --------------------------------------------------------------------------
    def to_dict(self) -> dict:
        return {"breakpoints": list(self.breakpoints), "slopes": list(self.slopes),
                "intercepts": list(self.intercepts), "error": self.error,
                "fit_range": None if self.fit_range is None else list(self.fit_range)}

    @classmethod
    def from_dict(cls, d: Mapping) -> SegmentedLinear:
        try:
            return cls(tuple(d["breakpoints"]), tuple(d["slopes"]), tuple(d["intercepts"]),
                       float(d.get("error", 0.0)),
                       None if d.get("fit_range") is None else tuple(d["fit_range"]))
        except (KeyError, TypeError, ValueError) as e:
            raise ProfileError(f"segmented model: malformed dict ({e})") from None


def _breakpoint_sets(n: int, k: int, min_gap: int):
    """Index tuples of k interior breakpoints, each >= min_gap from its neighbours and the ends."""
    for idx in itertools.combinations(range(min_gap, n - min_gap), k):
        if all(b - a >= min_gap for a, b in zip(idx, idx[1:])):
            yield idx


def _solve(xs: np.ndarray, y: np.ndarray, w: np.ndarray, breaks: list[float]):
    cols = [np.ones_like(xs), xs] + [np.maximum(0.0, xs - b) for b in breaks]
    a = np.stack(cols, axis=1)
    if len(xs) < a.shape[1]:
        return None, np.inf
    coef, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    resid = (a @ coef - y) * w
    return coef, float(np.sqrt(np.mean(resid ** 2)))
