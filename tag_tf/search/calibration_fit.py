"""Fit a `Calibration` to measured per-iteration times: bounded least squares on log time.

Each case is a simulator (nominal physics) with the strategy that was measured and the measured
seconds. The fit moves the free parameters (in log space for rates and fractions, linear for the
per-op overhead, which may be 0) with a projected Levenberg-Marquardt on

    r_i = ln(simulated_i) - ln(measured_i)          (one per fitted figure)
    p_k = PRIOR_WEIGHT * (x_k - x_k(nominal)) / width_k     (a weak pull to the datasheet)

The prior keeps parameters the figures cannot identify (e.g. the V100's efficiency when every DP
step waits for the slower GPUs) near their datasheet values instead of drifting. No per-model
parameter exists anywhere: every case shares the same physics.

Figures from mixed clusters often cannot tell WHICH GPU type is the straggler: on the paper's
testbed a slow P100 and a slow V100 explain the DP figures equally well (MAPE 11.2% against 11.3%).
`fit_basins` therefore fits from several starts (nominal, and each GPU type as the straggler) and,
among the fits the figures cannot tell apart, keeps the one that inverts the fewest pairs of the
datasheet's order of GPU speeds; every basin is reported.

Which fits the figures cannot tell apart: Akaike's criterion. With Gaussian errors on n fitted
figures, AIC = n ln(SSR / n) + 2k; every basin fits the same k parameters, so two basins differ by
n ln(cost_b / cost_a), and fits within AIC_TIE (2, Burnham & Anderson's "substantial support" for
both) of the best are tied: cost_b <= cost_a * exp(AIC_TIE / n), 20% for the paper's 11 figures. A
relative cost within `TIE` always ties (and is the whole rule where a result has no residuals).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tag_tf.deadline import Deadline
from tag_tf.errors import TagError
from tag_tf.sim.calibration import Calibration, parameter_of

if TYPE_CHECKING:
    from tag_tf.sim.simulator import Simulator
    from tag_tf.strategy import Strategy

PRIOR_WEIGHT = 0.05
MAX_ITERATIONS = 40
TIE = 0.01                 # relative cost within which two fits are always indistinguishable
AIC_TIE = 2.0              # Akaike-criterion difference within which two fits are indistinguishable
STRAGGLER_START = 0.15     # compute_eff a straggler start gives its GPU type


@dataclasses.dataclass(frozen=True)
class Case:
    label: str             # e.g. "testbed/dp/vgg19"
    sim: Simulator         # with nominal physics (calibration=None)
    strategy: Strategy
    seconds: float         # measured


@dataclasses.dataclass(frozen=True)
class FitResult:
    calibration: Calibration
    residuals: dict[str, float]        # label -> simulated/measured - 1 (relative error)
    simulated: dict[str, float]
    iterations: int
    evaluations: int
    cost: float = math.nan             # the objective at the result (residuals and prior)

    @property
    def mape(self) -> float:
        return float(np.mean([abs(r) for r in self.residuals.values()])) if self.residuals else 0.0


def _encode(name: str, value: float) -> float:
    return value / 1e-5 if name == "op_overhead_s" else math.log(value)


def _decode(name: str, x: float) -> float:
    return x * 1e-5 if name == "op_overhead_s" else math.exp(x)


def _bounds(name: str) -> tuple[float, float]:
    spec = parameter_of(name)
    return _encode(name, spec.low if spec.low > 0 or name == "op_overhead_s" else 1e-12), _encode(name, spec.high)


def simulate_cases(cases: Sequence[Case], calibration: Calibration | None) -> list[float]:
    """Simulated seconds of every case under `calibration` (inf where a case runs out of memory)."""
    out = []
    for case in cases:
        report = case.sim.with_calibration(calibration).simulate(case.strategy)
        out.append(math.inf if report.oom else float(report.iteration_time_s))
    return out


def fit(cases: Sequence[Case], free: Sequence[str], *, name: str = "fitted", start: dict[str, float] | None = None,
        fixed: dict[str, float] | None = None, progress: Callable[[int, float], None] | None = None,
        deadline: Deadline | None = None) -> FitResult:
    """Fit the `free` parameters (names as in PARAMETERS, `compute_eff:<GPU type>` per type) to
    `cases`; `fixed` values are held; `start` defaults to nominal values. Past `deadline`, the fit
    ends with the best values found so far."""
    if not cases:
        raise TagError("calibrate: no measurements to fit")
    free = list(dict.fromkeys(free))
    fixed = dict(fixed or {})
    nominal = {k: (parameter_of(k).nominal if k != "inter_latency_s" else _latency_nominal(cases)) for k in free}
    x0 = np.array([_encode(k, (start or {}).get(k, nominal[k])) for k in free])
    prior = np.array([_encode(k, nominal[k]) for k in free])
    lo = np.array([_bounds(k)[0] for k in free])
    hi = np.array([_bounds(k)[1] for k in free])
    width = np.maximum(hi - lo, 1e-9)
    measured = np.log([c.seconds for c in cases])
    evaluations = 0

    def calibration_at(x: np.ndarray) -> Calibration:
        values = dict(fixed)
        values.update({k: float(np.clip(_decode(k, xi), parameter_of(k).low, parameter_of(k).high))
                       for k, xi in zip(free, x)})
        return Calibration(name, values)

    def residual(x: np.ndarray) -> np.ndarray:
        nonlocal evaluations
        evaluations += 1
        sim = np.array(simulate_cases(cases, calibration_at(x)))
        sim = np.where(np.isfinite(sim), sim, 1e3)          # OOM: far off, but finite for the solver
        return np.concatenate([np.log(sim) - measured, PRIOR_WEIGHT * (x - prior) / width])

    x, cost, iterations = _levenberg_marquardt(residual, np.clip(x0, lo, hi), lo, hi, progress,
                                               deadline or Deadline.never())
    calibration = calibration_at(x)
    simulated = simulate_cases(cases, calibration)
    residuals = {c.label: s / c.seconds - 1 for c, s in zip(cases, simulated)}
    return FitResult(calibration, residuals, {c.label: s for c, s in zip(cases, simulated)}, iterations, evaluations,
                     cost)


def _levenberg_marquardt(residual: Callable[[np.ndarray], np.ndarray], x: np.ndarray, lo: np.ndarray,
                         hi: np.ndarray, progress: Callable[[int, float], None] | None, deadline: Deadline
                         ) -> tuple[np.ndarray, float, int]:
    """Damped Gauss-Newton on the squared residuals within the box [lo, hi] (forward-difference
    Jacobian): the best point, its cost and the iterations run."""
    r = residual(x)
    cost = float(r @ r)
    damping = 1e-2
    iterations = 0
    for iterations in range(1, MAX_ITERATIONS + 1):
        if deadline.expired():
            iterations -= 1                  # this one did not run
            break
        J = np.empty((len(r), len(x)))
        for k in range(len(x)):
            h = 1e-3 * max(1.0, abs(x[k]))
            step = x.copy()
            step[k] = step[k] + h if step[k] + h <= hi[k] else step[k] - h
            J[:, k] = (residual(step) - r) / (step[k] - x[k])
        g = J.T @ r
        A = J.T @ J
        improved = False
        for _ in range(8):
            delta = np.linalg.solve(A + damping * np.diag(np.diag(A) + 1e-9), -g)
            candidate = np.clip(x + delta, lo, hi)
            rc = residual(candidate)
            cc = float(rc @ rc)
            if cc < cost:
                x, r, cost = candidate, rc, cc
                damping = max(damping / 3, 1e-6)
                improved = True
                break
            damping *= 4
        if progress is not None:
            progress(iterations, cost)
        if not improved or np.max(np.abs(delta)) < 1e-4:
            break
    return x, cost, iterations


def speed_inversions(calibration: Calibration, peak_flops: dict[str, float]) -> int:
    """Pairs of GPU types whose calibrated speed (efficiency x datasheet peak) is in the opposite
    order of their datasheet peaks."""
    speed = {t: calibration.value(f"compute_eff:{t}") * p for t, p in peak_flops.items()}
    types = sorted(peak_flops)
    return sum(1 for i, a in enumerate(types) for b in types[i + 1:]
               if (peak_flops[a] - peak_flops[b]) * (speed[a] - speed[b]) < 0)


def tie_limit(results: Sequence[FitResult]) -> float:
    """The highest cost the figures cannot tell from the best of `results` (module docstring: within
    AIC_TIE of the best fit's Akaike criterion on its n figures, or within TIE)."""
    best = min(r.cost for r in results)
    n = max((len(r.residuals) for r in results), default=0)
    factor = max(1 + TIE, math.exp(AIC_TIE / n)) if n else 1 + TIE
    return best * factor + 1e-12


def choose_basin(results: Sequence[FitResult], peak_flops: dict[str, float]) -> FitResult:
    """The lowest-cost fit, unless others are as good (`tie_limit`): then the one keeping the
    datasheet's order of GPU speeds best (fewest inversions), then the lower cost."""
    limit = tie_limit(results)
    tied = [r for r in results if r.cost <= limit]
    return min(tied, key=lambda r: (speed_inversions(r.calibration, peak_flops), r.cost))


def fit_basins(cases: Sequence[Case], free: Sequence[str], peak_flops: dict[str, float], *,
               name: str = "fitted", progress: Callable[[int, float], None] | None = None,
               deadline: Deadline | None = None,
               ) -> tuple[FitResult, list[dict[str, Any]]]:
    """`fit` from the nominal start and from each fitted GPU type as the straggler; the chosen
    result (`choose_basin`) and a summary of every basin."""
    types = [k for k in free if k.startswith("compute_eff:")]
    starts: list[tuple[str, dict[str, float] | None]] = [("nominal", None)]
    if len(types) > 1:
        starts += [(f"{k.partition(':')[2]} straggler", {k: STRAGGLER_START}) for k in types]
    results = []
    for _label, start in starts:
        results.append(fit(cases, free, name=name, start=start, progress=progress, deadline=deadline))
    chosen = choose_basin(results, peak_flops)
    limit = tie_limit(results)
    basins = [{"start": label, "cost": r.cost, "mape": r.mape, "values": dict(r.calibration.values),
               "speed_inversions": speed_inversions(r.calibration, peak_flops), "chosen": r is chosen,
               "tied": r.cost <= limit}
              for (label, _), r in zip(starts, results)]
    return chosen, basins


def _latency_nominal(cases: Sequence[Case]) -> float:
    return float(cases[0].sim.topology.inter_latency)


__all__ = ["Case", "FitResult", "choose_basin", "fit", "fit_basins", "simulate_cases", "speed_inversions", "tie_limit"]
