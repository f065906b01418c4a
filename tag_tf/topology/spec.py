"""The cluster model: machines of GPUs, the links between them, and derived devices and groups.

All values are SI: bandwidth in bytes/s, memory in bytes, latency in seconds. Every class is a frozen
dataclass; derived views (`devices`, `groups`) are computed once per Topology and cached.

Link model (what `Topology.link` returns, so a simulator can charge contention). A transfer holds
every resource id in the returned tuple for its duration:

* same device: ``()`` - no transfer.
* NVLink: ``(("nvlink", m, i, j),)`` - one resource per *ordered* GPU pair: NVLink is point-to-point
  and full duplex, so i->j does not slow j->i or any other pair.
* PCIe / "local": ``(("pcie_tx", m, i), ("pcie_rx", m, j))`` (or "local_tx"/"local_rx") - each GPU's
  own x16 port, one resource per direction. Behind a PCIe switch two transfers only contend when they
  share a sending or a receiving GPU; modelling the whole machine as one shared bus would make a
  k-GPU ring k times slower than what NCCL measures on such machines.
* Switch between machines: ``(("nic_tx", ma), ("nic_rx", mb))`` - the sender's uplink and the
  receiver's downlink (full-duplex ports on a non-blocking switch).
* Bandwidth matrix between machines: ``(("wan", min(ma, mb), max(ma, mb)),)`` - one resource per
  unordered machine pair, shared by both directions.
The inter-machine hop does not also charge the GPUs' PCIe ports (the NIC is usually the bottleneck).

Default latencies (per message, added to bytes/bandwidth): NVLink 5 us, PCIe 5 us, "local" (virtual
devices in one process) 1 us, network 25 us (gRPC over a datacenter switch).
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
from collections.abc import Hashable, Iterable, Sequence

from tag_tf.errors import TopologyError
from tag_tf.topology.gpus import GPU_TYPES, GpuType, gpu_type
from tag_tf.topology.units import format_bandwidth, format_bytes, format_time

LINK_KINDS = ("nvlink", "pcie", "local")
DEFAULT_INTRA_LATENCY = {"nvlink": 5e-6, "pcie": 5e-6, "local": 1e-6}
DEFAULT_INTER_LATENCY = 25e-6
COLLECTIVES = ("ring", "hierarchical")
INPUTS = ("client", "local")

# A switch (every machine's port bandwidth unless its Machine.nic_bandwidth says otherwise),
# a full machine-by-machine matrix (diagonal ignored), or None (single machine, or every machine
# names its own nic_bandwidth).
InterBandwidth = float | tuple[tuple[float, ...], ...] | None


def _check_bw(value: float, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TopologyError(f"{field}: bandwidth must be a number (bytes/s), got {value!r}")
    if not (value > 0) or math.isinf(value):
        raise TopologyError(f"{field}: bandwidth must be positive and finite, got {value!r}")
    return float(value)


def _check_latency(value: float, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (value >= 0) \
            or math.isinf(value):
        raise TopologyError(f"{field}: latency must be a non-negative number of seconds, got {value!r}")
    return float(value)


@dataclasses.dataclass(frozen=True)
class GpuSpec:
    """One GPU of a machine."""

    type: str           # a GPU_TYPES key or the name of one of Topology.gpu_types
    memory_bytes: int   # usable device memory (defaults to the type's memory)


@dataclasses.dataclass(frozen=True)
class Machine:
    name: str
    gpus: tuple[GpuSpec, ...]        # one entry per GPU, in device-index order
    intra_bandwidth: float           # bytes/s between any two GPUs of this machine
    intra_link: str = "pcie"         # "nvlink" | "pcie" | "local"
    nic_bandwidth: float | None = None    # this machine's switch port, bytes/s (switch only)
    intra_latency: float | None = None    # seconds; None = DEFAULT_INTRA_LATENCY[intra_link]
    # Compute speed of its devices against their type's numbers (discovery measures it for CPU
    # tasks: a task on a quarter of a core is 0.25 of the fastest): op times are divided by it.
    speed: float = 1.0
    # CPU seconds one cross-process message (a gRPC transfer, sent or received) takes from this
    # machine's executor while it computes (discovery measures it on CPU tasks: on a quarter of a
    # core it is several times a full core's); 0: not charged.
    message_s: float = 0.0
    # Bytes per second this machine's CPU moves of an all-reduce between two machines beyond what
    # its link takes (gRPC copies, serialisation, the sums; discovery measures it on CPU tasks; rings
    # of three or more overlap it with their transfers, kernels/expand.h); None: not charged.
    copy_bandwidth: float | None = None
    # Seconds each step of an all-reduce between machines waits for this machine while it computes
    # (a step is a message it takes, sums and passes on; discovery measures it on CPU tasks: on a
    # quarter of a core its quota runs out within steps): a ring's steps take at least the slowest
    # member's. 0: the link's latency alone.
    collective_step_s: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "gpus", tuple(self.gpus))
        where = f"machine {self.name!r}"
        if not isinstance(self.name, str) or not self.name:
            raise TopologyError(f"machine name must be a non-empty string, got {self.name!r}")
        if not self.gpus:
            raise TopologyError(f"{where}: gpus: a machine needs at least one GPU")
        for i, g in enumerate(self.gpus):
            if not isinstance(g, GpuSpec):
                raise TopologyError(f"{where}: gpus[{i}]: expected a GpuSpec, got {g!r}")
            if isinstance(g.memory_bytes, bool) or not isinstance(g.memory_bytes, int) \
                    or g.memory_bytes <= 0:
                raise TopologyError(f"{where}: gpus[{i}].memory: must be a positive number of "
                                    f"bytes, got {g.memory_bytes!r}")
        _check_bw(self.intra_bandwidth, f"{where}: intra.bandwidth")
        if self.intra_link not in LINK_KINDS:
            raise TopologyError(f"{where}: intra.link: must be one of {', '.join(LINK_KINDS)}, "
                                f"got {self.intra_link!r}")
        if self.nic_bandwidth is not None:
            _check_bw(self.nic_bandwidth, f"{where}: nic")
        if isinstance(self.speed, bool) or not isinstance(self.speed, (int, float)) or not 0 < self.speed < 1e6:
            raise TopologyError(f"{where}: speed: must be a positive number, got {self.speed!r}")
        if isinstance(self.message_s, bool) or not isinstance(self.message_s, (int, float)) \
                or not 0 <= self.message_s < 1.0:
            raise TopologyError(f"{where}: message: must be a number of seconds in [0, 1), got {self.message_s!r}")
        if self.copy_bandwidth is not None:
            _check_bw(self.copy_bandwidth, f"{where}: copy")
        if isinstance(self.collective_step_s, bool) or not isinstance(self.collective_step_s, (int, float)) \
                or not 0 <= self.collective_step_s < 1.0:
            raise TopologyError(f"{where}: collective: must be a number of seconds in [0, 1), got "
                                f"{self.collective_step_s!r}")
        if self.intra_latency is not None:
            _check_latency(self.intra_latency, f"{where}: intra.latency")

    @classmethod
    def of(cls, name: str, gpu: str, count: int, intra_bandwidth: float, intra_link: str = "pcie",
           nic_bandwidth: float | None = None, memory_bytes: int | None = None) -> Machine:
        """A machine of `count` identical GPUs of a built-in type (aliases accepted)."""
        t = gpu_type(gpu)
        spec = GpuSpec(t.name, memory_bytes or t.memory_bytes)
        return cls(name, (spec,) * count, intra_bandwidth, intra_link, nic_bandwidth)

    @property
    def num_gpus(self) -> int:
        return len(self.gpus)

    @property
    def latency(self) -> float:
        return DEFAULT_INTRA_LATENCY[self.intra_link] if self.intra_latency is None \
            else self.intra_latency


@dataclasses.dataclass(frozen=True)
class Device:
    id: int             # global index in Topology.devices
    machine: int        # index in Topology.machines
    index: int          # index within its machine
    type: str
    memory_bytes: int


@dataclasses.dataclass(frozen=True)
class DeviceGroup:
    """Homogeneous GPUs of one machine: same type, same bandwidth between each pair."""

    id: int
    machine: int
    devices: tuple[int, ...]   # global device ids, ascending
    type: str


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str
    machines: tuple[Machine, ...]
    inter_bandwidth: InterBandwidth = None
    inter_latency: float = DEFAULT_INTER_LATENCY
    gpu_types: tuple[GpuType, ...] = ()   # custom GPU types, in addition to GPU_TYPES
    # What the network carries at once with every machine sending (bytes/s; None: non-blocking, each
    # link its own bandwidth). A ring over m machines moves each hop at most fabric / m. Measured by
    # discovery where a ring all-reduce over every machine moves its hops slower than its links alone
    # (an emulated cluster's one kernel and its hosts' CPUs).
    fabric_bandwidth: float | None = None
    # How GPU all-reduces across machines run: "ring" (one flat ring over every member, the model the
    # paper's clusters were calibrated with) or "hierarchical" (also NCCL's and Horovod's two-level
    # form: reduce inside each machine, a ring over the machines, gather inside each machine; the
    # faster of the two is taken, as NCCL tunes its algorithm per size).
    collectives: str = "ring"
    # Where each batch's inputs are read: "client" (one program feeds them, as the paper's in-graph
    # runs: the batch is split on the device that reads it and sent to the replicas) or "local" (every
    # machine reads its own part, as between-graph runs and multi-worker input pipelines do).
    input: str = "client"

    # ---- construction and validation ------------------------------------------------------
    def __post_init__(self) -> None:
        object.__setattr__(self, "machines", tuple(self.machines))
        object.__setattr__(self, "gpu_types", tuple(self.gpu_types))
        if not self.machines:
            raise TopologyError("machines: a topology needs at least one machine")
        names = set()
        for m in self.machines:
            if not isinstance(m, Machine):
                raise TopologyError(f"machines: expected Machine objects, got {m!r}")
            if m.name in names:
                raise TopologyError(f"machines: duplicate machine name {m.name!r}")
            names.add(m.name)
        custom = {t.name for t in self.gpu_types}
        for m in self.machines:
            for i, g in enumerate(m.gpus):
                if g.type not in GPU_TYPES and g.type not in custom:
                    raise TopologyError(
                        f"machine {m.name!r}: gpus[{i}].type: unknown GPU type {g.type!r}; known "
                        f"types: {', '.join(list(GPU_TYPES) + sorted(custom))}")
        _check_latency(self.inter_latency, "inter.latency")
        if self.fabric_bandwidth is not None:
            object.__setattr__(self, "fabric_bandwidth", _check_bw(self.fabric_bandwidth, "inter.fabric"))
        if self.input not in INPUTS:
            raise TopologyError(f"input: must be one of {', '.join(INPUTS)}, got {self.input!r}")
        if self.collectives not in COLLECTIVES:
            raise TopologyError(f"inter.collectives: must be one of {', '.join(COLLECTIVES)}, got {self.collectives!r}")
        self._check_inter()

    def _check_inter(self) -> None:
        bw, n = self.inter_bandwidth, len(self.machines)
        if bw is None:
            missing = [m.name for m in self.machines if m.nic_bandwidth is None]
            if n > 1 and missing:
                raise TopologyError(f"inter: no inter-machine bandwidth for machine "
                                    f"{missing[0]!r} (give inter.switch, inter.matrix or its nic)")
            return
        if isinstance(bw, (int, float)) and not isinstance(bw, bool):
            object.__setattr__(self, "inter_bandwidth", _check_bw(bw, "inter.switch"))
            return
        if not isinstance(bw, (list, tuple)) or not all(isinstance(r, (list, tuple)) for r in bw):
            raise TopologyError(f"inter: bandwidth must be a number (switch) or a matrix, got {bw!r}")
        if len(bw) != n or any(len(r) != n for r in bw):
            shape = f"{len(bw)}x{'/'.join(str(len(r)) for r in bw)}"
            raise TopologyError(f"inter.matrix: must be {n}x{n} (one row and column per machine), "
                                f"got {shape}")
        rows = tuple(tuple(0.0 if i == j else _check_bw(v, f"inter.matrix[{i}][{j}]")
                           for j, v in enumerate(r)) for i, r in enumerate(bw))
        object.__setattr__(self, "inter_bandwidth", rows)
        for m in self.machines:
            if m.nic_bandwidth is not None:
                raise TopologyError(f"machine {m.name!r}: nic: a machine's nic bandwidth only "
                                    f"applies with inter.switch, not inter.matrix")

    # ---- derived views ----------------------------------------------------------------------
    @functools.cached_property
    def devices(self) -> tuple[Device, ...]:
        out: list[Device] = []
        for mi, m in enumerate(self.machines):
            for k, g in enumerate(m.gpus):
                out.append(Device(len(out), mi, k, g.type, g.memory_bytes))
        return tuple(out)

    @functools.cached_property
    def groups(self) -> tuple[DeviceGroup, ...]:
        out: list[DeviceGroup] = []
        for mi in range(len(self.machines)):
            by_type: dict[str, list[int]] = {}
            for d in self.devices:
                if d.machine == mi:
                    by_type.setdefault(d.type, []).append(d.id)
            for t, ids in by_type.items():   # in order of first appearance within the machine
                out.append(DeviceGroup(len(out), mi, tuple(ids), t))
        return tuple(out)

    @functools.cached_property
    def _group_index(self) -> tuple[int, ...]:
        index = [0] * len(self.devices)
        for g in self.groups:
            for d in g.devices:
                index[d] = g.id
        return tuple(index)

    @property
    def num_devices(self) -> int:
        return len(self.devices)

    @property
    def num_machines(self) -> int:
        return len(self.machines)

    @property
    def is_switch(self) -> bool:
        return not isinstance(self.inter_bandwidth, tuple)

    def device(self, device_id: int) -> Device:
        if isinstance(device_id, bool) or not isinstance(device_id, int) \
                or not 0 <= device_id < len(self.devices):
            raise TopologyError(f"topology {self.name!r}: no device {device_id!r} "
                                f"(devices are 0..{len(self.devices) - 1})")
        return self.devices[device_id]

    def group_of(self, device_id: int) -> DeviceGroup:
        return self.groups[self._group_index[self.device(device_id).id]]

    def gpu_type(self, type_or_device: str | int) -> GpuType:
        """The GpuType of a device id or a type name (custom types first, then GPU_TYPES)."""
        name = self.device(type_or_device).type if isinstance(type_or_device, int) \
            else type_or_device
        for t in self.gpu_types:
            if t.name == name:
                return t
        return gpu_type(name)

    # ---- links --------------------------------------------------------------------------------
    def port_bandwidth(self, machine: int) -> float:
        """A machine's switch port bandwidth (switch topologies only)."""
        m = self.machines[machine]
        if m.nic_bandwidth is not None:
            return m.nic_bandwidth
        assert isinstance(self.inter_bandwidth, float), "port_bandwidth needs a switch"
        return self.inter_bandwidth

    def _machine_bandwidth(self, ma: int, mb: int) -> float:
        if isinstance(self.inter_bandwidth, tuple):
            return self.inter_bandwidth[ma][mb]
        return min(self.port_bandwidth(ma), self.port_bandwidth(mb))

    def bandwidth(self, a: int, b: int) -> float:
        """bytes/s of a transfer from device a to device b (inf when a == b: nothing moves)."""
        da, db = self.device(a), self.device(b)
        if a == b:
            return math.inf
        if da.machine == db.machine:
            return self.machines[da.machine].intra_bandwidth
        return self._machine_bandwidth(da.machine, db.machine)

    def latency(self, a: int, b: int) -> float:
        """Seconds of fixed cost per message from device a to device b (0 when a == b)."""
        da, db = self.device(a), self.device(b)
        if a == b:
            return 0.0
        if da.machine == db.machine:
            return self.machines[da.machine].latency
        return self.inter_latency

    def link(self, a: int, b: int) -> tuple[Hashable, ...]:
        """The resource ids a transfer a->b holds (see the module docstring for the model)."""
        da, db = self.device(a), self.device(b)
        if a == b:
            return ()
        if da.machine == db.machine:
            m = da.machine
            kind = self.machines[m].intra_link
            if kind == "nvlink":
                return (("nvlink", m, da.index, db.index),)
            return ((f"{kind}_tx", m, da.index), (f"{kind}_rx", m, db.index))
        if isinstance(self.inter_bandwidth, tuple):
            return (("wan", min(da.machine, db.machine), max(da.machine, db.machine)),)
        return (("nic_tx", da.machine), ("nic_rx", db.machine))

    def ring_order(self, devices: Iterable[int]) -> tuple[int, ...]:
        """The ring we assume for collectives: distinct devices in machine-major order, so a ring
        crosses each machine boundary once (what NCCL's ring search finds on such clusters)."""
        ids = sorted({self.device(d).id for d in devices})
        if not ids:
            raise TopologyError("ring over no devices")
        return tuple(ids)

    def ring_bandwidth(self, devices: Iterable[int]) -> float:
        """Bottleneck bandwidth (bytes/s) of the ring over `devices` (inf for a single device).
        Under the link model every hop of this ring uses distinct resources, so the slowest hop
        is the ring's bandwidth."""
        ring = self.ring_order(devices)
        if len(ring) == 1:
            return math.inf
        return min(self.bandwidth(a, b) for a, b in zip(ring, ring[1:] + ring[:1]))

    def ring_latency(self, devices: Iterable[int]) -> float:
        """Largest per-hop latency of the ring over `devices` (0 for a single device)."""
        ring = self.ring_order(devices)
        if len(ring) == 1:
            return 0.0
        return max(self.latency(a, b) for a, b in zip(ring, ring[1:] + ring[:1]))

    # ---- serialisation ----------------------------------------------------------------------
    def to_dict(self) -> dict:
        """A JSON-able dict in the topology file format, with SI units declared in `units`, so
        `load_topology(t.to_dict())` and `topology_from_dict` give back an equal Topology."""
        machines = []
        for m in self.machines:
            gpus: list[dict] = []
            for g in m.gpus:   # run-length encode consecutive identical GPUs
                if gpus and gpus[-1]["type"] == g.type and gpus[-1]["memory"] == g.memory_bytes:
                    gpus[-1]["count"] += 1
                else:
                    gpus.append({"type": g.type, "count": 1, "memory": g.memory_bytes})
            intra: dict = {"link": m.intra_link, "bandwidth": m.intra_bandwidth}
            if m.intra_latency is not None:
                intra["latency"] = m.intra_latency
            md: dict = {"name": m.name, "gpus": gpus, "intra": intra}
            if m.nic_bandwidth is not None:
                md["nic"] = m.nic_bandwidth
            if m.speed != 1.0:
                md["speed"] = m.speed
            if m.message_s:                         # only when given: other files' fingerprints stay
                md["message"] = m.message_s
            if m.copy_bandwidth is not None:        # likewise
                md["copy"] = m.copy_bandwidth
            if m.collective_step_s:                 # likewise
                md["collective"] = m.collective_step_s
            machines.append(md)
        inter: dict = {"latency": self.inter_latency}
        if isinstance(self.inter_bandwidth, tuple):
            inter["matrix"] = [list(r) for r in self.inter_bandwidth]
        elif self.inter_bandwidth is not None:
            inter["switch"] = self.inter_bandwidth
        if self.fabric_bandwidth is not None:       # only when given: other files' fingerprints stay
            inter["fabric"] = self.fabric_bandwidth
        if self.collectives != "ring":              # likewise
            inter["collectives"] = self.collectives
        d = {"name": self.name, "units": {"bandwidth": "B/s", "memory": "B", "latency": "s"},
             "machines": machines, "inter": inter}
        if self.input != "client":                  # only when given: other files' fingerprints stay
            d["input"] = self.input
        if self.gpu_types:
            d["gpu_types"] = [{"name": t.name, "peak_flops": t.peak_flops,
                               "mem_bandwidth": t.mem_bandwidth, "memory": t.memory_bytes,
                               "launch_overhead": t.launch_overhead_s,
                               # only what was given (older files' fingerprints stay as they were)
                               **({"tf32_tflops": t.tf32_flops / 1e12} if t.tf32_flops else {}),
                               **({"half_tflops": t.half_flops / 1e12} if t.half_flops else {}),
                               **({"sm_count": t.sm_count} if t.sm_count else {}),
                               **({"capability": t.capability} if t.capability else {})} for t in self.gpu_types]
        return d

    @functools.cached_property
    def fingerprint(self) -> str:
        """12 hex digits of SHA-256 over the content (not the name: renaming a cluster keeps its
        profiles valid)."""
        d = self.to_dict()
        del d["name"]
        blob = json.dumps(d, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def describe(self) -> str:
        lines = [f"topology {self.name!r} ({self.fingerprint}): {self.num_devices} devices, "
                 f"{self.num_machines} machine(s), {len(self.groups)} group(s)"]
        for mi, m in enumerate(self.machines):
            ids = [d.id for d in self.devices if d.machine == mi]
            kinds = ", ".join(f"{sum(1 for g in m.gpus if g.type == t)}x {t} "
                              f"({format_bytes(next(g.memory_bytes for g in m.gpus if g.type == t))})"
                              for t in dict.fromkeys(g.type for g in m.gpus))
            nic = f", nic {format_bandwidth(m.nic_bandwidth)}" if m.nic_bandwidth else ""
            nic += f", speed {m.speed:.3g}x" if m.speed != 1.0 else ""
            nic += f", {format_time(m.message_s)} CPU per message" if m.message_s else ""
            nic += f", collectives' CPU {format_bandwidth(m.copy_bandwidth)}" if m.copy_bandwidth else ""
            nic += f", {format_time(m.collective_step_s)} per all-reduce step" if m.collective_step_s else ""
            lines.append(f"  machine {mi} {m.name!r}: {kinds}; devices {_span(ids)}; "
                         f"{m.intra_link} {format_bandwidth(m.intra_bandwidth)}, "
                         f"latency {format_time(m.latency)}{nic}")
        if self.num_machines > 1:
            if isinstance(self.inter_bandwidth, tuple):
                lines.append(f"  inter-machine: bandwidth matrix, latency "
                             f"{format_time(self.inter_latency)}")
                for i, row in enumerate(self.inter_bandwidth):
                    cells = ", ".join("-" if i == j else format_bandwidth(v).split(" (")[0]
                                      for j, v in enumerate(row))
                    lines.append(f"    {self.machines[i].name}: {cells}")
            else:
                default = "per-machine nic" if self.inter_bandwidth is None \
                    else format_bandwidth(self.inter_bandwidth)
                lines.append(f"  inter-machine: switch, {default} per port, latency "
                             f"{format_time(self.inter_latency)}")
            if self.input != "client":
                lines.append("  inputs: every machine reads its own part of each batch")
            if self.collectives != "ring":
                lines.append("  all-reduces across machines: hierarchical (inside each machine, then a ring over the machines)")
            if self.fabric_bandwidth is not None:
                lines.append(f"  the network carries {format_bandwidth(self.fabric_bandwidth)} at once "
                             f"(a ring over m machines: each hop at most that / m)")
        for g in self.groups:
            lines.append(f"  group {g.id}: machine {g.machine}, {len(g.devices)}x {g.type}, "
                         f"devices {_span(g.devices)}")
        return "\n".join(lines)


def _span(ids: Sequence[int]) -> str:
    ids = list(ids)
    if ids == list(range(ids[0], ids[-1] + 1)):
        return str(ids[0]) if len(ids) == 1 else f"{ids[0]}-{ids[-1]}"
    return ",".join(map(str, ids))


def restrict(topo: Topology, machines: Sequence[int]) -> Topology:
    """`topo` with only `machines` (indices, in the order given: machine i of the result is
    `machines[i]`), their links and speeds as measured; the cluster an elastic run goes on with."""
    keep = list(machines)
    if not keep or len(set(keep)) != len(keep) or not all(0 <= m < topo.num_machines for m in keep):
        raise TopologyError(f"restrict: machines {keep} are not distinct machines of {topo.name!r} "
                            f"(0..{topo.num_machines - 1})")
    bw = topo.inter_bandwidth
    if isinstance(bw, tuple):
        bw = tuple(tuple(bw[a][b] for b in keep) for a in keep)
    name = topo.name if keep == list(range(topo.num_machines)) else f"{topo.name}[{','.join(map(str, keep))}]"
    return dataclasses.replace(topo, name=name, machines=tuple(topo.machines[m] for m in keep), inter_bandwidth=bw)
