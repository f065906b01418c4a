"""The baselines every search must beat and may start from (`baselines_to_beat`): each fixed rule of
the registry, HeteroG's search from the best of them, best-subset and the pipeline baseline, each
simulated by the search's own evaluator."""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

from tag_tf.deadline import Deadline
from tag_tf.search.baselines import BEST_SUBSET, best_subset
from tag_tf.search.heterog import heterog_search
from tag_tf.search.registry import baseline, fixed_baselines
from tag_tf.search.stages import PIPELINE, PIPELINE_MAX_S, PIPELINE_SHARE, pipeline_search
from tag_tf.strategy import Strategy

if TYPE_CHECKING:
    from tag_tf.search.moves import Evaluator
    from tag_tf.topology.spec import Topology

HETEROG = "heterog"


@dataclasses.dataclass
class Starts:
    """Every baseline's plan (those that run) and simulated time (inf: it does not run)."""

    plans: dict[str, Strategy]
    times: dict[str, float]

    def best(self, leave_out: tuple[str, ...] = ()) -> str:
        """The fastest baseline's name, of those not left out."""
        return min((n for n in self.times if n not in leave_out), key=self.times.__getitem__)


def baselines_to_beat(cost: Evaluator, topology: Topology, deadline: Deadline, *, heterog_share: float,
                      heterog_max_s: float = math.inf, heterog: bool = True, pipeline: bool = True,
                      singles: bool = False, progress: bool = False) -> Starts:
    """The baselines, judged by `cost`. HeteroG searches from the best fixed rule for
    `heterog_share` of the time left (at most `heterog_max_s`); the pipeline baseline for
    PIPELINE_SHARE of it (at most PIPELINE_MAX_S). `singles`: best-subset also tries one device
    per machine (where a client feeds every host)."""
    budget = deadline.left()
    n_groups = cost.sim.num_groups
    plans = {name: baseline(name, n_groups, topology) for name in fixed_baselines()}
    times = {name: cost(s) for name, s in plans.items()}
    first = min(times, key=times.__getitem__)
    times[HETEROG] = math.inf
    if heterog and math.isfinite(times[first]):
        # HeteroG's decision space, searched from the best fixed baseline: a baseline to beat too.
        until = deadline.share(heterog_share).within(heterog_max_s)
        plans[HETEROG], times[HETEROG] = heterog_search(cost, topology, plans[first], times[first], until,
                                                        progress=progress)
    plans[BEST_SUBSET], times[BEST_SUBSET] = best_subset(cost, n_groups, topology, singles=singles)
    times[PIPELINE] = math.inf
    if pipeline:
        until = Deadline.after(min(PIPELINE_SHARE * budget, PIPELINE_MAX_S))
        piped, times[PIPELINE] = pipeline_search(cost, cost.sim.analysis, topology, None, math.inf, until)
        if piped is not None:
            plans[PIPELINE] = piped
        else:
            times[PIPELINE] = math.inf
    return Starts(plans, times)


__all__ = ["HETEROG", "Starts", "baselines_to_beat"]
