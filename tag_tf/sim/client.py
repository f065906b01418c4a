"""The client's part of a step on a real cluster: what the simulator's devices do not see.

The simulator prices a plan as if its inputs appeared on every device that reads them and nobody
had to start the step, as in the paper's in-graph runs. On a cluster of TF_CONFIG tasks, one client
(the chief's program, on its machine) feeds each batch and drives each step unless every task can
drive its own part (between-graph execution: only plans of whole replicas that meet in collectives,
`Strategy.whole_replicas`, spanning two or more tasks). A plan the client drives pays, every step:

- the batch's move to the other machines it places work on: each machine's part of the fed bytes
  (its devices' batch shares) over the client's link to it, the links in parallel, the slowest one
  setting the time (the feed precedes the step's compute there);
- one round trip to drive each other machine (`drive_s`, measured by discovery:
  `measure.links.measure_drive`).

Measured on the emulated link cluster (benchmarks/RESULTS.md, TAG for real): a best-subset plan on
the one host behind a 50 Mbit/s link, which the simulator alone rated as fast as the chief's own
host, ran 25.9 ms a step against 1.7 ms there; the batch's move and the drive are that difference.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tag_tf.analysis import Analysis
    from tag_tf.strategy import Strategy
    from tag_tf.topology.spec import Topology


@dataclasses.dataclass(frozen=True)
class Client:
    """The program that feeds and drives each step: on `machine`, feeding `fed_bytes` per step (the
    batch inputs at the planned batch size), paying `drive_s` per other machine it drives; where
    `between_graph`, plans of whole replicas on two or more machines are driven by every task
    itself (and fed there: nothing charged)."""

    fed_bytes: float
    drive_s: float = 0.0
    between_graph: bool = True
    machine: int = 0

    def drives_itself(self, strategy: Strategy, topology: Topology) -> bool:
        """Whether every task drives and feeds its own part of `strategy` (between-graph: whole
        replicas on two or more machines): nothing to charge, and each task reads its own inputs."""
        return self.between_graph and strategy.whole_replicas and len(strategy.machines(topology)) > 1

    def charge(self, strategy: Strategy, topology: Topology) -> float:
        """Seconds the client adds to each step of `strategy` on `topology`."""
        if self.drives_itself(strategy, topology):
            return 0.0
        used = strategy.machines(topology)
        others = sorted(used - {self.machine})
        if not others:
            return 0.0
        client = next((d.id for d in topology.devices if d.machine == self.machine), None)
        if client is None:
            return math.inf
        devices = sorted({d for g in strategy.groups for d in g.devices})
        weights = {d: (1.0 if strategy.shares is None else float(strategy.shares[d])) for d in devices}
        total = sum(weights.values()) or 1.0
        feed = 0.0
        for m in others:
            here = [d for d in devices if topology.devices[d].machine == m]
            part = self.fed_bytes * sum(weights[d] for d in here) / total
            feed = max(feed, part / topology.bandwidth(client, here[0]) + topology.latency(client, here[0]))
        return feed + self.drive_s * len(others)


def fed_bytes(analysis: Analysis) -> float:
    """Bytes the client feeds every step (the batch inputs at the planned batch size)."""
    graph, total = analysis.graph, 0
    for name in graph.meta.feeds:
        try:
            t = graph.tensor(name)
        except KeyError:
            continue
        shape = t.shape
        if not shape or any(n < 0 for n in shape[1:]):
            continue
        rows = shape[0] if shape[0] >= 0 else (analysis.batch_size or 1)
        total += math.prod(shape[1:]) * int(rows) * t.itemsize
    return float(total)
