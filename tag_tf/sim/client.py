"""The client's part of a step on a real cluster: what the simulator's devices do not see.

The simulator prices a plan as if its inputs appeared on every device that reads them and nobody
had to start the step, as in the paper's in-graph runs. On a cluster of TF_CONFIG tasks, one client
(the chief's program, on its machine) feeds each batch and drives each step unless every task can
drive its own part (between-graph execution: only plans of whole replicas that meet in collectives,
`Strategy.whole_replicas`, spanning two or more tasks). A plan the client drives pays, every step:

- the batch's move to the other machines it places work on: each machine's part of the fed bytes
  over the client's link to it, the links in parallel, the slowest one setting the time (the feed
  precedes the step's compute there). A machine's part of one input is its devices' batch shares
  among the devices of the groups reading that input: a pipeline's first stage takes the features,
  its last the labels, and the stages between read neither (charged by every device's share, the
  compute cluster's pipelined mlp was predicted 17% slow);
- one round trip to drive each other machine (`drive_s`, measured by discovery:
  `measure.links.measure_drive`).

Measured on the emulated link cluster (benchmarks/RESULTS.md, TAG for real): a best-subset plan on
the one host behind a 50 Mbit/s link, which the simulator alone rated as fast as the chief's own
host, ran 25.9 ms a step against 1.7 ms there; the batch's move and the drive are that difference.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
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
    # Each fed input: its bytes and the planned ops reading it (`feeds_of`); empty: every device
    # reads its share of all of `fed_bytes`.
    feeds: tuple[Feed, ...] = ()

    def drives_itself(self, strategy: Strategy, topology: Topology) -> bool:
        """Whether every task drives and feeds its own part of `strategy` (between-graph: whole
        replicas on two or more machines): nothing to charge, and each task reads its own inputs."""
        return self.between_graph and strategy.whole_replicas and len(strategy.machines(topology)) > 1

    def charge(self, strategy: Strategy, topology: Topology, op_groups: Sequence[int] | None = None) -> float:
        """Seconds the client adds to each step of `strategy` on `topology` (`op_groups`: the group
        of each planned op, which says who reads each of `feeds`)."""
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
        # Each input with the devices reading it (without `feeds`: all of it, read by every device).
        inputs = ([(f.nbytes, sorted({d for i in f.readers for d in strategy.groups[op_groups[i]].devices}))
                   for f in self.feeds] if self.feeds and op_groups is not None else [(self.fed_bytes, devices)])
        parts = dict.fromkeys(others, 0.0)
        for nbytes, readers in inputs:
            total = sum(weights[d] for d in readers) or 1.0
            for d in readers:
                if topology.devices[d].machine in parts:
                    parts[topology.devices[d].machine] += nbytes * weights[d] / total
        feed = 0.0
        for m in others:
            here = next(d for d in devices if topology.devices[d].machine == m)
            if parts[m] > 0:
                feed = max(feed, parts[m] / topology.bandwidth(client, here) + topology.latency(client, here))
        return feed + self.drive_s * len(others)


@dataclasses.dataclass(frozen=True)
class Feed:
    """One input the client feeds: its bytes per step and the planned ops (indices) reading it."""

    nbytes: float
    readers: tuple[int, ...]


def fed_bytes(analysis: Analysis) -> float:
    """Bytes the client feeds every step (the batch inputs at the planned batch size)."""
    return float(sum(nbytes for _, nbytes in _fed(analysis)))


def feeds_of(analysis: Analysis) -> tuple[Feed, ...]:
    """Each fed input's bytes per step and the planned ops reading it (an input no planned op
    reads, e.g. one only an evaluation op takes, is left out)."""
    from tag_tf.ir import TensorRef

    graph, planning = analysis.graph, analysis.planning
    index = {op: i for i, op in enumerate(planning.ops)}
    out = []
    for name, nbytes in _fed(analysis):
        ref = TensorRef.parse(name)
        readers = sorted({index[planning.host[op]] for op, _ in graph.consumers(ref)
                          if op in planning.host and planning.host[op] in index})
        if not readers and ref.op in planning.host and planning.host[ref.op] in index:
            readers = [index[planning.host[ref.op]]]         # folded into the op that reads it
        if readers:
            out.append(Feed(float(nbytes), tuple(readers)))
    return tuple(out)


def _fed(analysis: Analysis) -> list[tuple[str, int]]:
    graph, out = analysis.graph, []
    for name in graph.meta.feeds:
        try:
            t = graph.tensor(name)
        except KeyError:
            continue
        shape = t.shape
        if not shape or any(n < 0 for n in shape[1:]):
            continue
        rows = shape[0] if shape[0] >= 0 else (analysis.batch_size or 1)
        out.append((name, math.prod(shape[1:]) * int(rows) * t.itemsize))
    return out
