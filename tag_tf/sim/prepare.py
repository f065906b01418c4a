"""Flat arrays describing one (graph, topology, costs) triple, built once and reused for every
strategy the search evaluates. The native expander (kernels/expand.h) reads them.

Granularity: the planning graph (Identity/NoOp/Const folded into their hosts). Each planned op's
cost is the sum of its members' costs; each tensor crossing planned ops becomes one edge per
consuming op, with the producer's replicated state and the consumer's requirement from the
analysis — the same facts the compiler acts on.
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from tag_tf.analysis import Analysis
from tag_tf.analysis.states import Flag, Kind
from tag_tf.ir import TensorRef
from tag_tf.ir.opsets import VARIABLE_OPS
from tag_tf.placement.fusion import FusionFacts
from tag_tf.placement.layout import ColocationSets, keeps_state

if TYPE_CHECKING:
    from tag_tf.profile.comm import CommModel
    from tag_tf.profile.costs import OpCosts
    from tag_tf.profile.segmented import SegmentedLinear
    from tag_tf.topology.spec import Topology

STATE_CODE = {Kind.FULL: 0, Kind.SPLIT: 1, Kind.PARTIAL: 2, Kind.LOCAL: 3}
SOURCE, VARIABLE_SIDE, KEEPS_STATE, FORWARD = 1, 2, 4, 8          # op_flags bits
_READS = frozenset({"ReadVariableOp", "VarHandleOp", "VariableV2", "Variable", "Const"})


# The fields of `Prepared` each part of `prepare` fills (see there for what they hold).
class _OpFacts(TypedDict):
    op_group: np.ndarray
    op_coloc: np.ndarray
    op_flags: np.ndarray


class _OpCosts(TypedDict):
    op_fixed: np.ndarray
    op_per_sample: np.ndarray


class _OpBytes(TypedDict):
    op_out_fixed: np.ndarray
    op_out_batched: np.ndarray
    op_persist: np.ndarray


class _Edges(TypedDict):
    e_src: np.ndarray
    e_dst: np.ndarray
    e_tensor: np.ndarray
    e_bytes: np.ndarray
    e_state: np.ndarray
    e_need: np.ndarray
    c_src: np.ndarray
    c_dst: np.ndarray


class _TensorFacts(TypedDict):
    t_level: np.ndarray
    t_rank: np.ndarray
    t_dtype: np.ndarray
    t_bytes: np.ndarray
    t_fusable: np.ndarray


class _Devices(TypedDict):
    num_devices: int
    num_types: int
    num_hosts: int
    dev_type: np.ndarray
    dev_machine: np.ndarray
    dev_host: np.ndarray
    host_message: np.ndarray
    host_copy: np.ndarray
    host_collective: np.ndarray
    machine_kind: np.ndarray
    dev_capacity: np.ndarray
    type_mem_bw: np.ndarray
    type_launch: np.ndarray


class _Links(TypedDict):
    num_links: int
    link_res_ptr: np.ndarray
    link_res: np.ndarray
    link_bw: np.ndarray
    link_lat: np.ndarray
    fabric_bw: float
    hierarchical: bool
    feed_local: bool


@dataclasses.dataclass(frozen=True)
class Piecewise:
    """A fitted piecewise-linear time model: segment k covers bytes in [breaks[k], breaks[k+1])
    (breaks[0] = -inf) and predicts intercept[k] + slope[k] * bytes seconds."""

    breaks: np.ndarray            # float64
    slope: np.ndarray             # float64, seconds per byte
    intercept: np.ndarray         # float64, seconds

    def as_native(self) -> dict[str, np.ndarray]:
        return {"breaks": self.breaks, "slope": self.slope, "intercept": self.intercept}


@dataclasses.dataclass(frozen=True)
class CommFits:
    """A CommModel's fitted transfers, overriding the topology's analytical links."""

    host_message_s: float                        # CPU part of a cross-process transfer's latency
    p2p_intra: Piecewise | None                  # transfers within one machine (None: not fitted)
    p2p_inter: Piecewise | None                  # transfers between machines
    allreduce_intra: tuple[Piecewise | None, ...]   # all-reduce on one machine, by device count
    allreduce_inter: tuple[Piecewise | None, ...]   # all-reduce spanning machines, by device count

    def as_native(self) -> dict[str, object]:
        out: dict[str, object] = {"host_message_s": self.host_message_s}
        for scope in ("intra", "inter"):
            p2p = getattr(self, f"p2p_{scope}")
            if p2p is not None:
                out[f"p2p_{scope}"] = p2p.as_native()
            out[f"allreduce_{scope}"] = [None if f is None else f.as_native()
                                         for f in getattr(self, f"allreduce_{scope}")]
        return out


@dataclasses.dataclass(frozen=True, eq=False)
class Prepared:
    """What the native expander reads (field names are the keys kernels/simcore.cpp looks up; see
    `Prepared` in kernels/expand.h), plus the names reports use. Planned ops, tensors, devices and
    device types are numbered from 0; a D*D array is indexed [src * D + dst], a T*n one [type * n + op]."""

    num_ops: int                  # planned ops (n)
    num_groups: int               # op groups (G)
    num_devices: int              # D
    num_types: int                # device types (T)
    batch: int                    # the global batch size the costs are for
    num_links: int                # link resources (contended by transfers)
    # -- per planned op
    op_group: np.ndarray          # int32 [n]: its op group
    op_coloc: np.ndarray          # int32 [n]: colocation set id (PS: one server per set)
    op_flags: np.ndarray          # uint8 [n]: SOURCE | VARIABLE_SIDE | KEEPS_STATE | FORWARD
    op_fixed: np.ndarray          # float64 [T*n]: seconds per run, whatever the batch
    op_per_sample: np.ndarray     # float64 [T*n]: seconds per sample
    op_out_fixed: np.ndarray      # int64 [n]: output bytes that do not scale with the batch
    op_out_batched: np.ndarray    # int64 [n]: output bytes at the planning batch (scale with it)
    op_persist: np.ndarray        # int64 [n]: variable bytes it holds for the whole run
    # -- data edges: one per (tensor, consuming planned op)
    e_src: np.ndarray             # int32 [E]: producing planned op
    e_dst: np.ndarray             # int32 [E]: consuming planned op
    e_tensor: np.ndarray          # int32 [E]: tensor id
    e_bytes: np.ndarray           # int64 [E]: whole tensor at the planning batch size
    e_state: np.ndarray           # uint8 [E]: producer's replicated state (STATE_CODE)
    e_need: np.ndarray            # uint8 [E]: consumer's requirement (STATE_CODE)
    # -- control edges between planned ops
    c_src: np.ndarray             # int32 [C]
    c_dst: np.ndarray             # int32 [C]
    # -- per tensor id: the facts tag_tf.placement.fusion's bucket rule reads
    t_level: np.ndarray           # int32: synchronisation level
    t_rank: np.ndarray            # int32: production order
    t_dtype: np.ndarray           # int32: base dtype code
    t_bytes: np.ndarray           # int64
    t_fusable: np.ndarray         # uint8: a static shape lets it join a bucket
    # -- devices and device types
    dev_type: np.ndarray          # int32 [D]: index into device_types
    dev_machine: np.ndarray       # int32 [D]
    dev_host: np.ndarray          # int32 [D]: the executor a CPU device's ops hold, else -1 (see prepare)
    num_hosts: int                # host executors (one per machine; "one" mode uses the first)
    host_message: np.ndarray      # float64 [H]: CPU seconds a cross-process message takes from each (Machine.message_s)
    host_copy: np.ndarray         # float64 [H]: CPU seconds per byte of an all-reduce between machines (1 / Machine.copy_bandwidth)
    host_collective: np.ndarray   # float64 [H]: seconds an all-reduce step waits for each while it computes (Machine.collective_step_s)
    machine_kind: np.ndarray      # int32 [M]: machines of one kind are interchangeable (see machine_kinds)
    dev_capacity: np.ndarray      # int64 [D]: memory bytes
    type_mem_bw: np.ndarray       # float64 [T]: memory bandwidth, bytes/s (memcpy-like op costs)
    type_launch: np.ndarray       # float64 [T]: kernel launch overhead, seconds
    # -- links
    link_res_ptr: np.ndarray      # int32 [D*D+1]: CSR offsets into link_res per ordered device pair
    link_res: np.ndarray          # int32: link resource ids a pair's transfers hold
    link_bw: np.ndarray           # float64 [D*D]: bytes/s (1e30 on the diagonal)
    link_lat: np.ndarray          # float64 [D*D]: seconds
    fabric_bw: float              # bytes/s the network carries at once (Topology.fabric_bandwidth; 1e30: no limit)
    hierarchical: bool            # GPU all-reduces may run hierarchically (Topology.collectives)
    feed_local: bool              # every machine reads its own part of each batch (Topology.input)
    # -- names (for reports and SFB; not read by the native code)
    link_names: tuple[str, ...]   # by link resource id
    tensor_names: tuple[str, ...]  # by tensor id
    device_types: tuple[str, ...]  # by type index (a type once per machine speed: see device_kinds)
    comm: CommFits | None = None   # fitted communication, or None (the topology's analytical links)

    def as_native(self) -> dict[str, object]:
        """The dict kernels/simcore.cpp's Simulator reads (one key per field; fitted communication
        under its own keys, left out when there is none)."""
        out: dict[str, object] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "comm"}
        if self.comm is not None:
            out.update(self.comm.as_native())
        return out


def device_types(topology: Topology) -> tuple[str, ...]:
    return tuple(dict.fromkeys(d.type for d in topology.devices))


def device_kinds(topology: Topology) -> tuple[tuple[str, float], ...]:
    """The simulator's device types: (type, machine speed) pairs, so that one type on machines of
    other measured speeds (CPU tasks on other quotas) gets its own op times."""
    return tuple(dict.fromkeys((d.type, float(topology.machines[d.machine].speed)) for d in topology.devices))


CPU_EXECUTORS = ("per-process", "per-device", "one")


def prepare(analysis: Analysis, topology: Topology, costs: OpCosts, comm: CommModel | None = None, *,
            cpu_executor: str = "per-process") -> Prepared:
    """`costs`: OpCosts over the training ops (members of planned ops) for `device_types(topology)`;
    `comm`: a CommModel whose fitted models override the topology's analytical links, or None.

    CPU-typed devices are virtual devices of one TensorFlow process per machine. `cpu_executor`
    says whose ops run one at a time: "per-process" (a process with one inter-op thread: its
    devices share its executor), "per-device" (each device runs its own ops, as GPUs do), "one"
    (every CPU device of the topology: processes whose ops each use all cores of one host)."""
    if cpu_executor not in CPU_EXECUTORS:
        raise ValueError(f"cpu_executor {cpu_executor!r}: one of {', '.join(CPU_EXECUTORS)}")
    index = {n: i for i, n in enumerate(analysis.planning.ops)}
    kinds = device_kinds(topology)
    types = tuple(t for t, _ in kinds)      # one entry per kind (a type twice at two speeds)
    edges, tensor_refs = _edge_arrays(analysis, index)
    links, link_names = _link_arrays(topology)
    return Prepared(
        num_ops=len(analysis.planning.ops), num_groups=len(analysis.grouping.groups), batch=analysis.batch_size,
        **_op_facts(analysis), **_op_costs(analysis, index, kinds, costs), **_op_bytes(analysis, index),
        **edges, **_fusion_arrays(analysis, tensor_refs), **_device_arrays(topology, kinds, cpu_executor), **links,
        link_names=link_names, tensor_names=tuple(str(r) for r in tensor_refs), device_types=types,
        comm=None if comm is None else _comm_fits(comm, topology.num_devices))


# -- per planned op ------------------------------------------------------------------------------
def _op_facts(analysis: Analysis) -> _OpFacts:
    """op_group, op_coloc (colocation sets numbered in order of first op) and op_flags."""
    ops = analysis.planning.ops
    coloc = ColocationSets(analysis)
    members = analysis.planning.members()
    host = analysis.planning.host
    loss = analysis.graph.meta.loss
    cone = analysis.graph.ancestors([TensorRef.parse(loss).op]) if loss else set()
    forward = {host[o] for o in cone if o in host}
    roots: dict[int, int] = {}
    flags = np.zeros(len(ops), dtype=np.uint8)
    for i, o in enumerate(ops):
        if Flag.SOURCE in analysis.annotations[o].flags:
            flags[i] |= SOURCE
        if coloc.with_variable(o):
            flags[i] |= VARIABLE_SIDE
        if any(keeps_state(analysis.graph, m) for m in members.get(o, (o,))):
            flags[i] |= KEEPS_STATE          # pipelined plans run it once per device
        if o in forward:
            flags[i] |= FORWARD              # the loss's ancestors: a pipeline stage's forward pass
    return {"op_group": np.array([analysis.grouping.group_of[o] for o in ops], dtype=np.int32),
            "op_coloc": np.array([roots.setdefault(coloc.root(o), len(roots)) for o in ops], dtype=np.int32),
            "op_flags": flags}


def _op_costs(analysis: Analysis, index: dict[str, int], kinds: tuple[tuple[str, float], ...],
              costs: OpCosts) -> _OpCosts:
    """op_fixed and op_per_sample ([kind * n + op]): a planned op costs the sum of its members, over
    the speed of the kind's machines."""
    n = len(index)
    fixed = np.zeros((len(kinds), n))
    per_sample = np.zeros((len(kinds), n))
    cost_index = costs.op_index()
    pairs = [(cost_index[m], index[h]) for m, h in analysis.planning.host.items() if m in cost_index]
    member_rows = np.array([p[0] for p in pairs], dtype=np.int64)
    host_cols = np.array([p[1] for p in pairs], dtype=np.int64)
    for t, (dt, speed) in enumerate(kinds):
        d = costs.device_index(dt)
        np.add.at(fixed[t], host_cols, costs.fixed[d, member_rows] / speed)
        np.add.at(per_sample[t], host_cols, costs.per_sample[d, member_rows] / speed)
    return {"op_fixed": np.ascontiguousarray(fixed.reshape(-1)),
            "op_per_sample": np.ascontiguousarray(per_sample.reshape(-1))}


def _op_bytes(analysis: Analysis, index: dict[str, int]) -> _OpBytes:
    """op_out_fixed, op_out_batched (output bytes by whether they scale with the batch) and op_persist."""
    graph = analysis.graph_b1
    n = len(index)
    out_fixed = np.zeros(n, dtype=np.int64)
    out_batched = np.zeros(n, dtype=np.int64)
    persist = np.zeros(n, dtype=np.int64)
    for member, h in analysis.planning.host.items():
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
    return {"op_out_fixed": out_fixed, "op_out_batched": out_batched, "op_persist": persist}


# -- edges ---------------------------------------------------------------------------------------
def _edge_arrays(analysis: Analysis, index: dict[str, int]) -> tuple[_Edges, list[TensorRef]]:
    """The data edges (e_*) and control edges (c_*) between planned ops, and the tensors by id."""
    graph = analysis.graph_b1
    host = analysis.planning.host
    tensor_ids: dict[TensorRef, int] = {}
    edges: dict[tuple[int, int], tuple[int, int, int, int, int]] = {}
    controls: set[tuple[int, int]] = set()
    for member, h in host.items():
        op = graph.op(member)
        dst = index[h]
        ann = analysis.annotations[member]
        for i, ref in enumerate(op.inputs):
            if ref.op not in host or graph.op(ref.op).type in ("NextIteration", "RefNextIteration"):
                continue        # a TF1 loop's back edge: the task graph stays a DAG
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
    ctl = np.array(sorted(controls), dtype=np.int32).reshape(-1, 2)
    arrays: _Edges = {"e_src": e[:, 0].astype(np.int32), "e_dst": e[:, 1].astype(np.int32), "e_tensor": e[:, 2].astype(np.int32),
              "e_bytes": e[:, 3].astype(np.int64), "e_state": (e[:, 4] // 4).astype(np.uint8),
              "e_need": (e[:, 4] % 4).astype(np.uint8),
              "c_src": np.ascontiguousarray(ctl[:, 0]), "c_dst": np.ascontiguousarray(ctl[:, 1])}
    return arrays, list(tensor_ids)


def _fusion_arrays(analysis: Analysis, refs: list[TensorRef]) -> _TensorFacts:
    """Per tensor id, the facts tag_tf.placement.fusion's bucket rule reads (rank: production order)."""
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


# -- devices and links -----------------------------------------------------------------------------
def _device_arrays(topology: Topology, kinds: tuple[tuple[str, float], ...], cpu_executor: str = "per-process"
                   ) -> _Devices:
    """num_devices, num_types, num_hosts and the dev_* and type_* arrays."""
    from tag_tf.topology.gpus import gpu_type

    devices = topology.devices
    type_index = {kind: k for k, kind in enumerate(kinds)}
    gpus = [topology.gpu_type(t) if hasattr(topology, "gpu_type") else gpu_type(t) for t, _ in kinds]
    return {"num_devices": len(devices), "num_types": len(kinds), "num_hosts": topology.num_machines,
            "dev_type": np.array([type_index[(d.type, float(topology.machines[d.machine].speed))] for d in devices],
                                 dtype=np.int32),
            "dev_machine": np.array([d.machine for d in devices], dtype=np.int32),
            "dev_host": np.array([-1 if d.type != "cpu" or cpu_executor == "per-device" else
                                  0 if cpu_executor == "one" else d.machine for d in devices], dtype=np.int32),
            "host_message": np.array([m.message_s for m in topology.machines], dtype=np.float64),
            "host_copy": np.array([1.0 / m.copy_bandwidth if m.copy_bandwidth else 0.0 for m in topology.machines],
                                  dtype=np.float64),
            "host_collective": np.array([m.collective_step_s for m in topology.machines], dtype=np.float64),
            "machine_kind": machine_kinds(topology),
            "dev_capacity": np.array([d.memory_bytes for d in devices], dtype=np.int64),
            "type_mem_bw": np.array([g.mem_bandwidth for g in gpus], dtype=np.float64),
            "type_launch": np.array([g.launch_overhead_s for g in gpus], dtype=np.float64)}


def machine_kinds(topology: Topology) -> np.ndarray:
    """Per machine, a kind: on a switch, machines with the same GPUs, links, port and speed are
    interchangeable (swapping two is a symmetry of the cluster), so the native expander may simulate
    devices a plan treats alike on them once (kernels/expand.h, device classes). With a bandwidth
    matrix every machine is its own kind."""
    kinds: dict[Any, int] = {}
    out = []
    for i, m in enumerate(topology.machines):
        key: Any = i if not topology.is_switch else (
            m.gpus, m.intra_bandwidth, m.intra_link, m.latency, m.speed, m.message_s, m.copy_bandwidth,
            m.collective_step_s,
            topology.port_bandwidth(i)
            if topology.num_machines > 1 else None)
        out.append(kinds.setdefault(key, len(kinds)))
    return np.array(out, dtype=np.int32)


def _link_arrays(topology: Topology) -> tuple[_Links, tuple[str, ...]]:
    """num_links and the link_* arrays over ordered device pairs, and the link resources' names."""
    D = len(topology.devices)
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
    arrays: _Links = {"num_links": len(link_ids), "link_res_ptr": np.array(link_ptr, dtype=np.int32),
              "link_res": np.array(link_res, dtype=np.int32), "link_bw": bw, "link_lat": lat,
              "fabric_bw": float(topology.fabric_bandwidth or 1e30),
              "hierarchical": topology.collectives == "hierarchical", "feed_local": topology.input == "local"}
    return arrays, tuple(str(k) for k in link_ids)


def _piecewise(fit: SegmentedLinear) -> Piecewise:
    return Piecewise(np.array((-math.inf, *fit.breakpoints), dtype=np.float64),
                     np.array(fit.slopes, dtype=np.float64), np.array(fit.intercepts, dtype=np.float64))


def _comm_fits(comm: CommModel, num_devices: int) -> CommFits:
    p2p: dict[str, Piecewise | None] = {}
    allreduce: dict[str, tuple[Piecewise | None, ...]] = {}
    for scope in ("intra", "inter"):
        p2p[scope] = _piecewise(comm.p2p_fits[scope]) if scope in comm.p2p_fits else None
        fits: list[Piecewise | None] = [None] * (num_devices + 1)
        for key, fit in comm.allreduce_fits.items():
            s, _, d = key.partition(":")
            if s == scope and int(d) <= num_devices:
                fits[int(d)] = _piecewise(fit)
        allreduce[scope] = tuple(fits)
    return CommFits(float(comm.host_message_s), p2p["intra"], p2p["inter"], allreduce["intra"], allreduce["inter"])


__all__ = ["CommFits", "FORWARD", "KEEPS_STATE", "Piecewise", "Prepared", "SOURCE", "STATE_CODE", "VARIABLE_SIDE", "device_types", "prepare"]
