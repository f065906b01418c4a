"""`DistributeOptions`: what `tag_tf.distribute(...)` and `tag_tf.estimator.distributed(...)` accept,
typed and validated once, when the options are made: one `OptionsError` naming the first bad field
(a `StrategyError` for a strategy that names no baseline and no file).

    opts = DistributeOptions(strategy="dp", topology="local:2", budget_s=5)
    with tag_tf.distribute(**opts.as_kwargs()): ...      # or Distribution(opts) (frontend/distribute.py)
"""
from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Mapping
from typing import Union

from tag_tf.errors import OptionsError
from tag_tf.frontend.planning import StrategyRequest, check_request
from tag_tf.frontend.target import ClusterRequest, TopologyRequest
from tag_tf.sim.calibration import Calibration
from tag_tf.strategy import Strategy
from tag_tf.topology.spec import Topology

# What each option may be (the docstring of `distribute` says what each form means).
CalibrationRequest = Union[str, "os.PathLike[str]", Calibration, None]

FALLBACKS = ("error", "single")
CALIBRATION_NAMES = ("default", "nominal")
_FLAGS = ("verify", "exact_batch_stats", "inference", "trusted_network", "sfb")


@dataclasses.dataclass(frozen=True)
class DistributeOptions:
    """The options of one `tag_tf.distribute` context (see `distribute` for each one's meaning).
    Frozen: derive others with `dataclasses.replace` (validated again)."""

    strategy: StrategyRequest = "auto"
    topology: TopologyRequest = None
    cluster: ClusterRequest = None
    cache_dir: str | None = None
    budget_s: float | None = None
    verify: bool = False
    exact_batch_stats: bool = False
    fallback: str = "error"
    inference: bool = False
    calibration: CalibrationRequest = "default"
    trusted_network: bool = False
    sfb: bool = True
    elastic: bool | None = None     # None: $TAG_TF_ELASTIC=1 turns it on (`elastic_on`)
    min_tasks: int | None = None    # None: $TAG_TF_MIN_TASKS, else 1 (`fewest_tasks`)

    def __post_init__(self) -> None:
        self._check_strategy()
        if not isinstance(self.topology, (str, os.PathLike, Mapping, Topology, type(None))):
            raise OptionsError("topology", f"expected a preset name, a topology file, a dict or a Topology, "
                                           f"got {type(self.topology).__name__}")
        self._check_cluster()
        if self.cache_dir is not None and not isinstance(self.cache_dir, (str, os.PathLike)):
            raise OptionsError("cache_dir", f"expected a directory path, got {type(self.cache_dir).__name__}")
        if self.budget_s is not None and (isinstance(self.budget_s, bool)
                                          or not isinstance(self.budget_s, (int, float))
                                          or not math.isfinite(self.budget_s) or self.budget_s < 0):
            raise OptionsError("budget_s", f"expected a number of seconds >= 0 (or None), got {self.budget_s!r}")
        for name in _FLAGS:
            if not isinstance(getattr(self, name), bool):
                raise OptionsError(name, f"expected True or False, got {getattr(self, name)!r}")
        if self.fallback not in FALLBACKS:
            raise OptionsError("fallback", f"expected one of {', '.join(map(repr, FALLBACKS))}, got {self.fallback!r}")
        self._check_calibration()
        if self.elastic is not None and not isinstance(self.elastic, bool):
            raise OptionsError("elastic", f"expected True, False or None, got {self.elastic!r}")
        if self.min_tasks is not None and (isinstance(self.min_tasks, bool) or not isinstance(self.min_tasks, int)
                                           or self.min_tasks < 1):
            raise OptionsError("min_tasks", f"expected a number of tasks >= 1, got {self.min_tasks!r}")

    @property
    def elastic_on(self) -> bool:
        """Whether a TF_CONFIG run goes on after losing a task: `elastic`, else $TAG_TF_ELASTIC=1
        (so that a launcher can ask for it without touching the script)."""
        if self.elastic is not None:
            return self.elastic
        return os.environ.get("TAG_TF_ELASTIC", "0") == "1"

    @property
    def fewest_tasks(self) -> int:
        """The fewest tasks an elastic run goes on with: `min_tasks`, else $TAG_TF_MIN_TASKS, else 1."""
        if self.min_tasks is not None:
            return self.min_tasks
        text = os.environ.get("TAG_TF_MIN_TASKS", "1")
        if not text.isdigit() or int(text) < 1:
            raise OptionsError("min_tasks", f"$TAG_TF_MIN_TASKS must be a number of tasks >= 1, got {text!r}")
        return int(text)

    def _check_strategy(self) -> None:
        if not isinstance(self.strategy, (str, os.PathLike, Strategy)):
            raise OptionsError("strategy", f"expected a strategy name, a Strategy or a strategy JSON file, "
                                           f"got {type(self.strategy).__name__}")
        check_request(self.strategy)    # StrategyError for an unknown name or a missing file: here, not mid-training

    def _check_cluster(self) -> None:
        if self.cluster is None or isinstance(self.cluster, (str, os.PathLike)):
            return
        from tag_tf.runtime import roles
        from tag_tf.runtime.cluster import ClusterSpec

        if not isinstance(self.cluster, ClusterSpec) and not roles.is_resolver(self.cluster):
            raise OptionsError("cluster", f"expected 'tf_config', a cluster file, a ClusterSpec or a ClusterResolver, "
                                          f"got {type(self.cluster).__name__}")

    def _check_calibration(self) -> None:
        c = self.calibration
        if c is None or isinstance(c, Calibration) or (isinstance(c, str) and c in CALIBRATION_NAMES):
            return
        if not isinstance(c, (str, os.PathLike)):
            raise OptionsError("calibration", f"expected 'default', 'nominal', a calibration file or a Calibration, "
                                              f"got {type(c).__name__}")
        if not os.path.isfile(os.fspath(c)):
            raise OptionsError("calibration", f"{os.fspath(c)!r} is neither 'default', 'nominal' nor an existing "
                                              f"calibration file (`tag-tf calibrate` writes one)")

    def as_kwargs(self) -> dict[str, object]:
        """The options as `distribute`'s keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


__all__ = ["CALIBRATION_NAMES", "FALLBACKS", "CalibrationRequest", "ClusterRequest", "DistributeOptions",
           "StrategyRequest", "TopologyRequest"]
