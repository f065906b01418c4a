"""The planning graph: the training subgraph with zero-cost plumbing folded away.

Identity-like ops fold into the op producing their input, NoOps into the op they wait for, Consts into
their first consumer; ops that reach neither the train op nor the loss are left out of planning
(init, save/restore, summaries). Nothing is deleted from the IR: `host` records, for every training
op, the planned op it travels with, so the compiler can still rebuild the full graph.
"""
from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping

import numpy as np

from tag_tf.analysis.rules import PASS_THROUGH
from tag_tf.ir import Graph, TensorRef

_FOLD_INTO_PRODUCER = PASS_THROUGH
_FOLD_INTO_CONSUMER = frozenset({"Const"})


@dataclasses.dataclass(frozen=True)
class PlanningGraph:
    ops: tuple[str, ...]                     # planned ops, topological order
    host: Mapping[str, str]                  # every training op -> the planned op it folds into
    edges: np.ndarray                        # [E, 2] int32 (producer index, consumer index), deduplicated
    edge_bytes: np.ndarray                   # [E] int64 bytes at the planning batch size
    folded: Mapping[str, int]                # counts of folded ops by kind

    def members(self) -> dict[str, list[str]]:
        """Planned op -> all training ops hosted by it (itself first)."""
        out: dict[str, list[str]] = {name: [name] for name in self.ops}
        for op, host in self.host.items():
            if op != host:
                out[host].append(op)
        return out


def training_ops(graph: Graph) -> set[str]:
    roots = [graph.meta.train_op] if graph.meta.train_op else []
    if graph.meta.loss:
        roots.append(TensorRef.parse(graph.meta.loss).op)
    return graph.ancestors(roots)


def simplify(graph: Graph) -> PlanningGraph:
    """`graph` should carry static shapes (the planning batch size) so edge sizes are known."""
    train = training_ops(graph)
    position = {n: i for i, n in enumerate(graph.order)}
    host: dict[str, str] = {}
    folded = {"identity": 0, "noop": 0, "const": 0, "dangling": len(graph) - len(train)}
    deferred: list[str] = []
    for op in graph:
        if op.name not in train:
            continue
        if op.type in _FOLD_INTO_PRODUCER and op.inputs and op.name != graph.meta.train_op:
            host[op.name] = host.get(op.inputs[0].op, op.inputs[0].op)
            folded["identity"] += 1
        elif op.type == "NoOp" and op.control_inputs and op.name != graph.meta.train_op:
            # The last of the ops it waits for: the others all come before it, so no cycle forms.
            last = max(op.control_inputs, key=position.__getitem__)
            host[op.name] = host.get(last, last)
            folded["noop"] += 1
        elif op.type in _FOLD_INTO_CONSUMER or (op.type == "NoOp" and op.name != graph.meta.train_op):
            deferred.append(op.name)
        else:
            host[op.name] = op.name
    # Consts (and input-less NoOps) follow their first consumer in the training subgraph.
    for name in reversed(deferred):
        consumers = [c for c in graph.op_consumers(name) + graph.control_consumers(name) if c in train]
        target = next((host[c] for c in consumers if c in host), None)
        if target is None:
            host[name] = name
        else:
            host[name] = target
            folded["const" if graph.op(name).type == "Const" else "noop"] += 1
    # Hosts may themselves have been folded (a chain): resolve to a fixed point.
    for name in list(host):
        h = host[name]
        while host.get(h, h) != h:
            h = host[h]
        host[name] = h

    kept = tuple(n for n in graph.order if n in train and host[n] == n)
    index = {n: i for i, n in enumerate(kept)}
    edge_bytes: dict[tuple[int, int], int] = {}
    for name in graph.order:
        if name not in train:
            continue
        dst = index[host[name]]
        for ref in graph.op(name).inputs:
            if ref.op not in host or graph.op(ref.op).type in ("NextIteration", "RefNextIteration"):
                continue        # a TF1 loop's back edge: the planning graph stays a DAG
            src = index[host[ref.op]]
            if src != dst:
                nbytes = graph.tensor(ref).nbytes or 0
                edge_bytes[(src, dst)] = edge_bytes.get((src, dst), 0) + nbytes
    edges = np.array(list(edge_bytes), dtype=np.int32).reshape(-1, 2)
    sizes = np.array(list(edge_bytes.values()), dtype=np.int64)
    return PlanningGraph(kept, types.MappingProxyType(host), edges, sizes, types.MappingProxyType(folded))
