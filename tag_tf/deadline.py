"""`Deadline`: the one type for a time budget. The pass context carries one (`PassContext.deadline`);
planning hands it down to the search, SFB, calibration and profiling, and each checks it inside its
long loops: `expired()` where the work ends early and keeps what it has, `check(what)` where it
stops with `DeadlineExceeded` naming what ran out of time.

    deadline = Deadline.after(30.0)
    polish = deadline.share(0.25)          # a quarter of what is left now, never past `deadline`
    while not polish.expired(): ...
"""
from __future__ import annotations

import dataclasses
import math
import time

from tag_tf.errors import DeadlineExceeded


@dataclasses.dataclass(frozen=True)
class Deadline:
    """A moment (`time.perf_counter()`) work must be done by; `end` is inf for none (`never()`)."""

    end: float

    @classmethod
    def after(cls, seconds: float) -> Deadline:
        return cls(time.perf_counter() + seconds)

    @classmethod
    def never(cls) -> Deadline:
        return cls(math.inf)

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.end)

    def left(self) -> float:
        """Seconds until the deadline (negative past it; inf without one)."""
        return self.end - time.perf_counter()

    def expired(self) -> bool:
        return time.perf_counter() >= self.end

    def check(self, what: str) -> None:
        """DeadlineExceeded naming `what` once the deadline has passed."""
        if self.expired():
            raise DeadlineExceeded(f"{what}: out of time ({-self.left():.3g} s past its deadline)")

    def within(self, seconds: float) -> Deadline:
        """`seconds` from now, or this deadline where it comes first."""
        return Deadline(min(self.end, time.perf_counter() + seconds))

    def share(self, fraction: float) -> Deadline:
        """`fraction` of the time left now (none left: now); without a deadline, none either."""
        if not self.bounded:
            return self
        return Deadline(time.perf_counter() + fraction * max(0.0, self.left()))


__all__ = ["Deadline"]
