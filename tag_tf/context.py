"""The context every pass receives: typed options, named timers, IR instruments and a deadline.

Passes are pure functions of (context, input) -> output; they never mutate their input and keep no
global state. The context is the one place where cross-cutting concerns live.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import time
from collections.abc import Callable, Iterator

from tag_tf.deadline import Deadline
from tag_tf.errors import DeadlineExceeded

log = logging.getLogger("tag_tf")


@dataclasses.dataclass(frozen=True)
class Options:
    """Options shared by the pipeline's passes. Frozen: derive a new one with `dataclasses.replace`."""

    num_groups: int = 60            # METIS groups (paper: 60)
    balance_factor: float = 2.0     # METIS balance on compute time (paper: 2)
    seed: int = 0
    exact_batch_stats: bool = False  # BatchNorm: per-replica statistics (False) or synchronized (True)
    cache_dir: str | None = None    # plans, profiles, topologies; None: default_cache_dir()

    def cache_root(self) -> str:
        return self.cache_dir or default_cache_dir()


CACHE_ENV = "TAG_TF_CACHE_DIR"
# Set by `tag-tf emulate` on each task: the emulated host it runs on (its name in discovery).
EMULATED_HOST_ENV = "TAG_TF_EMULATED_HOST"


def default_cache_dir() -> str:
    """The one cache root (plans/, profiles/, topology/ below it): $TAG_TF_CACHE_DIR, else
    ~/.cache/tag_tf, never a folder relative to wherever a command runs."""
    return os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "tag_tf")


@dataclasses.dataclass
class Timer:
    name: str
    seconds: float = 0.0
    calls: int = 0


class PassContext:
    """Carries options, per-phase timers, instruments (callbacks after each pass) and a deadline
    (`tag_tf.deadline.Deadline`: `deadline`, or `deadline_s` seconds from now; none by default),
    which passes hand down to their long loops (`ctx.deadline`)."""

    def __init__(self, options: Options | None = None, deadline_s: float | None = None,
                 instruments: tuple[Callable[[str, object], None], ...] = (), *, deadline: Deadline | None = None):
        self.options = options or Options()
        self.deadline = deadline if deadline is not None else (
            Deadline.never() if deadline_s is None else Deadline.after(deadline_s))
        self.deadline_s = deadline_s if deadline_s is not None else (
            max(0.0, self.deadline.left()) if self.deadline.bounded else None)
        self.instruments = tuple(instruments)
        self.timers: dict[str, Timer] = {}

    @contextlib.contextmanager
    def timer(self, name: str) -> Iterator[None]:
        """Time a phase; a phase never starts after the deadline (checked here, between phases)."""
        self.check_deadline(name)
        t = self.timers.setdefault(name, Timer(name))
        start = time.perf_counter()
        try:
            yield
        finally:
            t.seconds += time.perf_counter() - start
            t.calls += 1

    def time_left(self) -> float | None:
        return self.deadline.left() if self.deadline.bounded else None

    def check_deadline(self, what: str) -> None:
        if self.deadline.expired():
            raise DeadlineExceeded(f"{what}: the deadline of {self.deadline_s:g} s ran out before it started")

    def after_pass(self, name: str, result: object) -> None:
        for instrument in self.instruments:
            instrument(name, result)

    def timing_report(self) -> dict[str, float]:
        return {name: round(t.seconds, 4) for name, t in self.timers.items()}
