"""tf.estimator integration: an existing Estimator trains through tag_tf, its `model_fn` unchanged.

The one line a user adds::

    estimator = tag_tf.estimator.distributed(estimator, strategy="dp")

`estimator.train(...)` (also when called by `tf.estimator.train_and_evaluate`) then runs under
`tag_tf.distribute(...)`: Estimator trains with a MonitoredTrainingSession, whose first training run
is compiled and distributed; checkpoints keep the original variable names. `evaluate` and `predict`
build graphs without a train op and run single-device on the latest checkpoint, exactly as before.
Wrapping the call works too: ``with tag_tf.distribute(): estimator.train(input_fn, steps=...)``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeVar, cast

from tag_tf.frontend.distribute import Distribution
from tag_tf.frontend.options import (
    CalibrationRequest,
    ClusterRequest,
    DistributeOptions,
    StrategyRequest,
    TopologyRequest,
)

if TYPE_CHECKING:
    import tensorflow as tf

E = TypeVar("E", bound="tf.estimator.Estimator")


def distributed(estimator: E, strategy: StrategyRequest = "auto", topology: TopologyRequest = None,
                cluster: ClusterRequest = None, cache_dir: str | None = None, budget_s: float | None = None,
                verify: bool = False, exact_batch_stats: bool = False, fallback: str = "error",
                inference: bool = False, calibration: CalibrationRequest = "default", trusted_network: bool = False,
                sfb: bool = True, elastic: bool | None = None, min_tasks: int | None = None) -> E:
    """A copy of `estimator` whose `train` runs under `tag_tf.distribute(strategy, topology, ...)`.

    With `inference=True`, `predict` runs distributed too (forward only, same planner and compiler).

    The copy is an instance of a subclass of the estimator's own class (so `isinstance` checks, e.g.
    in `train_and_evaluate`, still pass) sharing its configuration, model_fn and model_dir. The
    options are checked now (OptionsError naming a bad one), not at the first `train`."""
    options = DistributeOptions(strategy=strategy, topology=topology, cluster=cluster, cache_dir=cache_dir,
                                budget_s=budget_s, verify=verify, exact_batch_stats=exact_batch_stats,
                                fallback=fallback, calibration=calibration, trusted_network=trusted_network, sfb=sfb,
                                elastic=elastic, min_tasks=min_tasks)
    base = type(estimator)

    def train(self: E, *args: object, **kwargs: object) -> E:
        with Distribution(self._tag_tf_options) as scope:
            self.tag_tf_plans = scope.plans
            return base.train(self, *args, **kwargs)

    def predict(self: E, *args: object, **kwargs: object) -> Iterator[object]:
        if not inference:
            yield from base.predict(self, *args, **kwargs)
            return
        with Distribution(dataclasses.replace(self._tag_tf_options, inference=True)) as scope:
            self.tag_tf_plans = scope.plans
            yield from base.predict(self, *args, **kwargs)

    train.__doc__ = f"{base.__name__}.train, distributed by tag_tf."
    predict.__doc__ = f"{base.__name__}.predict (distributed by tag_tf with inference=True)."
    cls = type(f"Distributed{base.__name__}", (base,), {"train": train, "predict": predict, "__module__": __name__})
    # Estimator.__init__ refuses subclasses that override `train`; the copy skips __init__ and
    # shares the wrapped estimator's already-validated state instead.
    copy = cast(E, object.__new__(cls))
    copy.__dict__.update(estimator.__dict__)
    copy._tag_tf_options = options
    copy.tag_tf_plans = []
    return copy


__all__ = ["distributed"]
