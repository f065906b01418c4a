"""Flat arrays describing one (graph, topology, costs) triple, built once and reused for every
strategy the search evaluates. The native expander (kernels/expand.h) reads them.

Granularity: the planning graph (Identity/NoOp/Const folded into their hosts). Each planned op's
cost is the sum of its members' costs; each tensor crossing planned ops becomes one edge per
consuming op, with the producer's replicated state and the consumer's requirement from the
analysis — the same facts the compiler acts on.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from tag_tf.analysis import Analysis
from tag_tf.analysis.states import Flag, Kind
from tag_tf.compiler.fusion import FusionFacts
from tag_tf.compiler.placement import ColocationSets
from tag_tf.ir import TensorRef
from tag_tf.ir.opsets import VARIABLE_OPS

STATE_CODE = {Kind.FULL: 0, Kind.SPLIT: 1, Kind.PARTIAL: 2, Kind.LOCAL: 3}
SOURCE, VARIABLE_SIDE = 1, 2
_READS = frozenset({"ReadVariableOp", "VarHandleOp", "VariableV2", "Variable", "Const"})


def device_types(topology: Any) -> tuple[str, ...]:
    return tuple(dict.fromkeys(d.type for d in topology.devices))


def prepare(analysis: Analysis, topology: Any, costs: Any, comm: Any = None) -> dict[str, Any]:
    """`costs`: OpCosts over the training ops (members of planned ops) for `device_types(topology)`;
    `comm`: a CommModel whose fitted models override the topology's analytical links, or None.

    CPU-typed devices are virtual devices of one TensorFlow process per machine: they share that
    process's executor, so the simulator runs their ops one at a time per machine."""
    planning = analysis.planning
    graph = analysis.graph_b1
    ops = planning.ops
    index = {n: i for i, n in enumerate(ops)}
    host = planning.host
    types = device_types(topology)
    n = len(ops)

    # -- per planned op ----------------------------------------------------------------------
    group = np.array([analysis.grouping.group_of[o] for o in ops], dtype=np.int32)
    coloc = ColocationSets(analysis)
    roots: dict[int, int] = {}
    op_coloc = np.array([roots.setdefault(coloc.root(o), len(roots)) for o in ops], dtype=np.int32)
    flags = np.zeros(n, dtype=np.uint8)
    for i, o in enumerate(ops):
        if Flag.SOURCE in analysis.annotations[o].flags:
            flags[i] |= SOURCE
        if coloc.with_variable(o):
            flags[i] |= VARIABLE_SIDE

    fixed = np.zeros((len(types), n))
    per_sample = np.zeros((len(types), n))
    cost_index = costs.op_index()
    pairs = [(cost_index[m], index[h]) for m, h in host.items() if m in cost_index]
    member_rows = np.array([p[0] for p in pairs], dtype=np.int64)
    host_cols = np.array([p[1] for p in pairs], dtype=np.int64)
    for t, dt in enumerate(types):          # a planned op costs the sum of its members
        d = costs.device_index(dt)
        np.add.at(fixed[t], host_cols, costs.fixed[d, member_rows])
        np.add.at(per_sample[t], host_cols, costs.per_sample[d, member_rows])

    out_fixed = np.zeros(n, dtype=np.int64)
    out_batched = np.zeros(n, dtype=np.int64)
    persist = np.zeros(n, dtype=np.int64)
    for member, h in host.items():
        op = graph.op(member)
        i = index[h]
        if op.type in VARIABLE_OPS and member in graph.variables:
            persist[i] += graph.variables[member].nbytes
        if op.type in _READS:
            continue      # variable reads alias the variable's buffer; consts are tiny
        for j, t in enumerate(op.outputs):
            size = t.nbytes or 0
            if analysis.batch.of(TensorRef(member, j)).batched:
                out_batched[i] += size
            else:
                out_fixed[i] += size

    # -- edges ------------------------------------------------------------------------------
    tensor_ids: dict[TensorRef, int] = {}
    edges: dict[tuple[int, int], tuple[int, int, int, int, int]] = {}
    controls: set[tuple[int, int]] = set()
    for member, h in host.items():
        op = graph.op(member)
        dst = index[h]
        ann = analysis.annotations[member]
        for i, ref in enumerate(op.inputs):
            if ref.op not in host:
                continue
            src = index[host[ref.op]]
            if src == dst:
                continue
            tid = tensor_ids.setdefault(ref, len(tensor_ids))
            state = STATE_CODE[analysis.annotations[ref.op].outputs[ref.index].kind]
            need = STATE_CODE[ann.requires[i].kind]
            edges.setdefault((tid, dst), (src, dst, tid, graph.tensor(ref).nbytes or 0, state * 4 + need))
        for c in op.control_inputs:
            # Planned ops are in topological order; a control edge pointing backwards only ordered
            # some folded zero-cost op (an Identity of a gradient tuple) and would form a cycle.
            if c in host and index[host[c]] < dst:
                controls.add((index[host[c]], dst))
    e = np.array(list(edges.values()), dtype=np.int64).reshape(-1, 5)
    c = np.array(sorted(controls), dtype=np.int32).reshape(-1, 2)
    fusion = _fusion_arrays(analysis, list(tensor_ids))

    # -- devices and links -------------------------------------------------------------------
    from tag_tf.topology.gpus import gpu_type

    devices = topology.devices
    D = len(devices)
    type_index = {t: k for k, t in enumerate(types)}
    gpus = [topology.gpu_type(t) if hasattr(topology, "gpu_type") else gpu_type(t) for t in types]
    link_ids: dict[Any, int] = {}
    link_ptr, link_res = [0], []
    bw = np.zeros(D * D)
    lat = np.zeros(D * D)
    for a in range(D):
        for b in range(D):
            if a != b:
                for key in topology.link(a, b):
                    link_res.append(link_ids.setdefault(key, len(link_ids)))
                bw[a * D + b] = topology.bandwidth(a, b)
                lat[a * D + b] = topology.latency(a, b)
            else:
                bw[a * D + b] = math.inf
            link_ptr.append(len(link_res))
    bw[~np.isfinite(bw)] = 1e30

    prepared: dict[str, Any] = {
        "num_ops": n, "num_groups": len(analysis.grouping.groups), "num_devices": D, "num_types": len(types),
        "batch": analysis.batch_size, "num_links": len(link_ids),
        "op_group": group, "op_coloc": op_coloc, "op_flags": flags,
        "op_fixed": np.ascontiguousarray(fixed.reshape(-1)), "op_per_sample": np.ascontiguousarray(per_sample.reshape(-1)),
        "op_out_fixed": out_fixed, "op_out_batched": out_batched, "op_persist": persist,
        "e_src": e[:, 0].astype(np.int32), "e_dst": e[:, 1].astype(np.int32), "e_tensor": e[:, 2].astype(np.int32),
        "e_bytes": e[:, 3].astype(np.int64), "e_state": (e[:, 4] // 4).astype(np.uint8),
        "e_need": (e[:, 4] % 4).astype(np.uint8),
        "c_src": np.ascontiguousarray(c[:, 0]), "c_dst": np.ascontiguousarray(c[:, 1]),
        **fusion,
        "dev_type": np.array([type_index[d.type] for d in devices], dtype=np.int32),
        "dev_machine": np.array([d.machine for d in devices], dtype=np.int32),
        "dev_host": np.array([d.machine if d.type == "cpu" else -1 for d in devices], dtype=np.int32),
        "num_hosts": topology.num_machines,
        "dev_capacity": np.array([d.memory_bytes for d in devices], dtype=np.int64),
        "type_mem_bw": np.array([g.mem_bandwidth for g in gpus], dtype=np.float64),
        "type_launch": np.array([g.launch_overhead_s for g in gpus], dtype=np.float64),
        "link_res_ptr": np.array(link_ptr, dtype=np.int32), "link_res": np.array(link_res, dtype=np.int32),
        "link_bw": bw, "link_lat": lat,
        "link_names": tuple(str(k) for k in link_ids),
        "tensor_names": tuple(str(r) for r in tensor_ids),      # by tensor id (for SFB and reports)
        "device_types": types,
    }
    if comm is not None:
        prepared.update(_comm_fits(comm, D))
    return prepared


def _fusion_arrays(analysis: Analysis, refs: list[TensorRef]) -> dict[str, np.ndarray]:
    """Per tensor id, the facts tag_tf.compiler.fusion's bucket rule reads (rank: production order)."""
    facts = FusionFacts(analysis)
    ranks = [facts.rank(r) for r in refs]
    rank = np.empty(len(refs), dtype=np.int32)
    rank[sorted(range(len(refs)), key=ranks.__getitem__)] = np.arange(len(refs), dtype=np.int32)
    dtypes: dict[str, int] = {}
    return {"t_level": np.array([facts.level(r) for r in refs], dtype=np.int32), "t_rank": rank,
            "t_dtype": np.array([dtypes.setdefault(analysis.graph.tensor(r).base_dtype, len(dtypes)) for r in refs],
                                dtype=np.int32),
            "t_bytes": np.array([facts.nbytes(r) for r in refs], dtype=np.int64),
            "t_fusable": np.array([facts.fusable(r) for r in refs], dtype=np.uint8)}


def _piecewise(fit: Any) -> dict[str, np.ndarray]:
    return {"breaks": np.array((-math.inf, *fit.breakpoints), dtype=np.float64),
            "slope": np.array(fit.slopes, dtype=np.float64), "intercept": np.array(fit.intercepts, dtype=np.float64)}


def _comm_fits(comm: Any, num_devices: int) -> dict[str, Any]:
    out: dict[str, Any] = {"host_message_s": float(comm.host_message_s)}
    for scope in ("intra", "inter"):
        if scope in comm.p2p_fits:
            out[f"p2p_{scope}"] = _piecewise(comm.p2p_fits[scope])
        fits: list[Any] = [None] * (num_devices + 1)
        for key, fit in comm.allreduce_fits.items():
            s, _, d = key.partition(":")
            if s == scope and int(d) <= num_devices:
                fits[int(d)] = _piecewise(fit)
        out[f"allreduce_{scope}"] = fits
    return out

