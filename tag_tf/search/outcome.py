"""What every search result reports beside its plan: how it compares with the baselines."""
from __future__ import annotations

import math

import numpy as np


class BaselineComparison:
    """Mixin for results with `iteration_time_s` (simulated, inf: nothing runs) and `baselines`
    (name -> simulated seconds, inf where that baseline does not run)."""

    iteration_time_s: float
    baselines: dict[str, float]

    @property
    def found(self) -> bool:
        """False when no strategy tried runs (out of memory, fewer samples than replicas)."""
        return bool(np.isfinite(self.iteration_time_s))

    @property
    def best_baseline(self) -> str | None:
        """The fastest baseline that runs, or None."""
        name = min(self.baselines, key=self.baselines.__getitem__)
        return name if np.isfinite(self.baselines[name]) else None

    def speedup_over(self, name: str) -> float | None:
        """None when that baseline or the plan does not run (out of memory, batch smaller than the devices)."""
        base, t = self.baselines.get(name, math.inf), self.iteration_time_s
        if not (self.found and np.isfinite(base)) or t <= 0:
            return None
        return base / t

    @property
    def speedup_over_dp(self) -> float | None:
        return self.speedup_over("dp")

    @property
    def speedup_over_best_baseline(self) -> float | None:
        best = self.best_baseline
        return None if best is None else self.speedup_over(best)


__all__ = ["BaselineComparison"]
