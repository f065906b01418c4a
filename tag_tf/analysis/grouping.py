"""Op grouping with METIS (paper: "Grouping ops").

Vertices are colocation sets of planned ops (a variable, its reads, optimizer update and slots must
share a device, so they are one vertex), each joined by the ops bound to its parameters (a dense
layer's forward and gradient ops, which exchange more bytes with the weights than with anything
else); vertex weights are compute time, edge weights tensor bytes.
METIS partitions into at most `num_groups` parts minimising the bytes cut, with the compute of each
part balanced within `balance_factor` of the mean. That bound is kept, not only asked for: when one
vertex (a single op, say a Transformer's vocabulary projection) outweighs `balance_factor` times the
mean of `num_groups` parts, fewer parts are made, so the mean grows until it fits (and where METIS
misses its target, fewer again) -- but never fewer than MIN_BALANCED_GROUPS: a small graph whose one
op outweighs the rest keeps enough groups to be spread over a cluster (the six paper models keep
the bound with 19 to 60 groups).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sys
import types
from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from tag_tf.analysis.simplify import PlanningGraph
from tag_tf.ir import Graph

MIN_BALANCED_GROUPS = 8     # the balance bound never takes the group count below this


@dataclasses.dataclass(frozen=True)
class OpGroup:
    id: int
    ops: tuple[str, ...]          # planned ops, topological order
    compute: float                # sum of the ops' grouping weights (reference_weights: estimated seconds)
    param_bytes: int              # bytes of the variables placed with this group


@dataclasses.dataclass(frozen=True)
class Grouping:
    groups: tuple[OpGroup, ...]
    group_of: Mapping[str, int]           # every training op (planned or folded) -> group id
    edges: np.ndarray                     # [E, 2] group -> group data edges
    edge_bytes: np.ndarray                # [E]

    @property
    def balance(self) -> float:
        """Largest group compute over the mean (the paper bounds it by the balance factor)."""
        compute = np.array([g.compute for g in self.groups])
        return float(compute.max() / compute.mean()) if len(compute) and compute.mean() > 0 else 1.0

    def by_compute(self) -> list[int]:
        """Group ids in descending compute, ties in id order: the order the planner decides them in
        (the first decided groups fill the rest of a partial plan)."""
        return [int(g) for g in np.argsort([-g.compute for g in self.groups], kind="stable")]


@contextlib.contextmanager
def _quiet_stdout() -> Iterator[None]:
    """METIS prints diagnostics (e.g. when one vertex outweighs a part) with C printf on stdout,
    which would corrupt JSON output; send file descriptor 1 to /dev/null meanwhile."""
    sys.stdout.flush()
    saved = os.dup(1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 1)
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)
        os.close(devnull)


class UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, a: int) -> int:
        while self.parent[a] != a:
            self.parent[a] = self.parent[self.parent[a]]
            a = self.parent[a]
        return a

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            self.parent[max(ra, rb)] = min(ra, rb)


def colocation_pairs(graph: Graph, ops: Sequence[str]) -> list[tuple[str, str]]:
    """Pairs of ops TF must place together: `_class: loc:@x` attributes, consumers of ref or
    resource tensors (a variable's reads, assigns and optimizer updates run on its device), and all
    of TF1 control flow (every copy of a loop is one frame: a loop and its gradient loop, which
    share stacks, are one group with one layout)."""
    from tag_tf.analysis.annotate import v1_control_flow

    pairs: list[tuple[str, str]] = []
    names = set(ops)
    in_loops = v1_control_flow(graph)
    looped = [name for name in ops if name in in_loops]
    pairs.extend((name, looped[0]) for name in looped[1:])
    for name in ops:
        op = graph.op(name)
        for other in op.colocate_with:
            if other in names:
                pairs.append((name, other))
        for ref in op.inputs:
            t = graph.tensor(ref)
            if (t.is_ref or t.is_resource) and ref.op in names:
                pairs.append((name, ref.op))
    return pairs


def _join_parameter_bound_ops(graph: Graph, planning: PlanningGraph, index: Mapping[str, int],
                              uf: UnionFind) -> None:
    """Join each op to a variable's colocation set when it exchanges more bytes with that set (reads
    the weights, produces their gradient) than with everything else (activations): a fully
    connected layer's forward and gradient ops then share the group of its weights, so a plan can
    move the layer without shipping the weights every step. Convolutions, whose activations
    outweigh their kernels, stay free for METIS to balance."""
    n = len(planning.ops)
    holds = np.zeros(n, dtype=bool)
    for var in graph.variables.values():
        if var.name in planning.host:
            holds[uf.find(index[planning.host[var.name]])] = True
    root = np.array([uf.find(i) for i in range(n)])
    param = np.zeros(n)            # per op: bytes exchanged with variable sets (largest one)
    other = np.zeros(n)            # per op: bytes exchanged with everything else
    best_set = np.full(n, -1)
    per_set: dict[tuple[int, int], float] = {}
    for (src, dst), nbytes in zip(planning.edges, planning.edge_bytes):
        for op, peer in ((src, dst), (dst, src)):
            if root[op] == root[peer]:
                continue
            if holds[root[peer]] and not holds[root[op]]:
                key = (int(op), int(root[peer]))
                per_set[key] = per_set.get(key, 0.0) + float(nbytes)
                if per_set[key] > param[op]:
                    param[op], best_set[op] = per_set[key], root[peer]
            else:
                other[op] += float(nbytes)
    for op in np.flatnonzero((best_set >= 0) & (param > other)):
        uf.union(int(op), int(best_set[op]))


def group_ops(graph: Graph, planning: PlanningGraph, weights: np.ndarray, *, num_groups: int = 60,
              balance_factor: float = 2.0, seed: int = 0) -> Grouping:
    """`weights[i]` is the compute weight of `planning.ops[i]` (seconds; any positive scale works)."""
    n = len(planning.ops)
    weights = np.asarray(weights, dtype=float)
    total = float(weights.sum())
    index = {name: i for i, name in enumerate(planning.ops)}
    uf = UnionFind(n)
    members = list(planning.host)
    for a, b in colocation_pairs(graph, members):
        uf.union(index[planning.host[a]], index[planning.host[b]])
    _join_parameter_bound_ops(graph, planning, index, uf)
    roots = sorted({uf.find(i) for i in range(n)})
    vertex_of_root = {r: v for v, r in enumerate(roots)}
    vertex = np.array([vertex_of_root[uf.find(i)] for i in range(n)], dtype=np.int64)
    nv = len(roots)

    vweight = np.zeros(nv)
    np.add.at(vweight, vertex, np.asarray(weights, dtype=float))
    adjacency: list[dict[int, int]] = [dict() for _ in range(nv)]
    for (src, dst), nbytes in zip(planning.edges, planning.edge_bytes):
        va, vb = int(vertex[src]), int(vertex[dst])
        if va == vb:
            continue
        w = max(1, int(nbytes) // 1024)           # METIS wants integers: KiB, at least 1
        adjacency[va][vb] = adjacency[va].get(vb, 0) + w
        adjacency[vb][va] = adjacency[vb].get(va, 0) + w

    # METIS's bisection fails when asked for about as many parts as vertices (tiny graphs); and no
    # part can be lighter than the heaviest vertex, so the mean must be at least 1/balance of it.
    nparts = min(num_groups, max(1, nv // 2))
    floor = min(nparts, MIN_BALANCED_GROUPS)
    if total > 0 and vweight.max() > 0:
        nparts = max(floor, min(nparts, int(balance_factor * total / vweight.max())))
    while True:
        membership = _partition(adjacency, vweight, nparts, balance_factor, seed)
        sizes = np.bincount(membership, weights=vweight)
        sizes = sizes[sizes > 0]
        # METIS's balance is a target; where it misses, ask for fewer (heavier) parts.
        if nparts <= floor or total <= 0 or sizes.max() <= balance_factor * total / len(sizes) * (1 + 1e-9):
            break
        nparts = max(floor, nparts - max(1, nparts // 10))

    # Renumber groups in order of their first op (topological), dropping empty parts.
    op_group = membership[vertex]
    renumber: dict[int, int] = {}
    for g in op_group:
        renumber.setdefault(int(g), len(renumber))
    op_group = np.array([renumber[int(g)] for g in op_group], dtype=np.int64)
    return build_grouping(graph, planning, op_group, weights)


def _partition(adjacency: Sequence[Mapping[int, int]], vweight: np.ndarray, nparts: int, balance_factor: float,
               seed: int) -> np.ndarray:
    """METIS's part of each vertex (k-way, minimising the cut bytes, balance as a target)."""
    import pymetis

    nv = len(vweight)
    if nparts <= 1:
        membership = np.zeros(nv, dtype=np.int64)
    else:
        xadj, adjncy, eweights = [0], [], []
        for nbrs in adjacency:
            for b, w in sorted(nbrs.items()):
                adjncy.append(b)
                eweights.append(min(w, 2**30))
            xadj.append(len(adjncy))
        scale = 1e6 / max(vweight.max(), 1e-12)   # integer vertex weights, ~6 significant digits
        vw = [max(1, int(round(w * scale))) for w in vweight]
        opts = pymetis.Options(ufactor=int(round((balance_factor - 1.0) * 1000)), seed=seed)
        with _quiet_stdout():
            _, parts = pymetis.part_graph(nparts, pymetis.CSRAdjacency(xadj, adjncy), vweights=vw,
                                          eweights=eweights, options=opts)
        membership = np.asarray(parts, dtype=np.int64)
    return membership


def build_grouping(graph: Graph, planning: PlanningGraph, op_group: np.ndarray, weights: np.ndarray
                   ) -> Grouping:
    """Assemble a Grouping from a group id per planned op."""
    ng = int(op_group.max()) + 1 if len(op_group) else 0
    ops_of: list[list[str]] = [[] for _ in range(ng)]
    compute = np.zeros(ng)
    for i, name in enumerate(planning.ops):
        ops_of[op_group[i]].append(name)
        compute[op_group[i]] += weights[i]
    index = {name: i for i, name in enumerate(planning.ops)}
    group_of = {op: int(op_group[index[h]]) for op, h in planning.host.items()}
    param_bytes = np.zeros(ng, dtype=np.int64)
    for var in graph.variables.values():
        if var.name in group_of:
            param_bytes[group_of[var.name]] += var.nbytes
    gb: dict[tuple[int, int], int] = {}
    for (src, dst), nbytes in zip(planning.edges, planning.edge_bytes):
        a, b = int(op_group[src]), int(op_group[dst])
        if a != b:
            gb[(a, b)] = gb.get((a, b), 0) + int(nbytes)
    groups = tuple(OpGroup(g, tuple(ops_of[g]), float(compute[g]), int(param_bytes[g])) for g in range(ng))
    edges = np.array(list(gb), dtype=np.int32).reshape(-1, 2)
    return Grouping(groups, types.MappingProxyType(group_of), edges,
                    np.array(list(gb.values()), dtype=np.int64))
