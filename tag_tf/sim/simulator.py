"""The simulator: predict one training iteration of a strategy on a topology.

    sim = Simulator(analysis, topology)            # prepares flat arrays once (costs, links, edges)
    report = sim.simulate(strategy)               # native expansion + event simulation, ~ms
    detail = sim.simulate(strategy, detail=True)  # also the task graph, for traces and Gantt charts

Predicted numbers are simulated: op times come from the profile (device types measured here) or
the analytical cost model (GPU types not present), transfers and collectives from the topology's
bandwidths or fitted communication profiles.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np

from tag_tf.analysis import Analysis
from tag_tf.analysis.simplify import training_ops
from tag_tf.analysis.states import Flag
from tag_tf.errors import StrategyError
from tag_tf.placement.layout import ColocationSets, mp_partition, validated_duplicates
from tag_tf.sim.calibration import CalibrationChoice, member_counts
from tag_tf.sim.calibration import resolve as resolve_calibration
from tag_tf.sim.client import Client
from tag_tf.sim.prepare import SOURCE, Prepared, device_types, prepare
from tag_tf.strategy import Option, Strategy

if TYPE_CHECKING:
    from tag_tf.profile.comm import CommModel
    from tag_tf.profile.costmodel import CostModel
    from tag_tf.profile.costs import OpCosts
    from tag_tf.profile.op_profile import OpProfile
    from tag_tf.topology.gpus import GpuType
    from tag_tf.topology.spec import Topology

OPTION_CODE = {Option.ALLREDUCE: 0, Option.PS: 1, Option.DUPLICATE: 2, Option.MODEL_PARALLEL: 3}
TASK_KINDS = ("compute", "transfer", "split", "concat", "addn", "allreduce", "zeros", "pack", "unpack")


@dataclasses.dataclass(frozen=True)
class SimReport:
    """One simulated iteration (all times in seconds)."""

    iteration_time_s: float
    peak_memory_bytes: tuple[int, ...]        # per device
    persistent_bytes: tuple[int, ...]         # per device: variables and optimizer slots
    capacity_bytes: tuple[int, ...]
    oom_devices: tuple[int, ...]
    device_idle: tuple[float, ...]            # per device: fraction of the iteration its queue idles
    link_idle: Mapping[str, float]            # per link resource
    group_makespan: np.ndarray                # per op group: first start to last end of its ops
    group_busy: np.ndarray                    # per op group: summed compute time of its instances
    group_out_wait: np.ndarray                # per op group: mean wait from output ready to its transfer
    conversions: Mapping[str, int]
    num_tasks: int
    sim_ms: float
    tasks: Mapping[str, np.ndarray] | None = dataclasses.field(default=None, repr=False)
    client_s: float = 0.0                     # of iteration_time_s: the client's feed and drive (sim.client)
    devices_simulated: int = 0                # devices expanded (device classes: the rest stand with them)
    exact: bool = True                        # False: an approximate collapsed run (simulate(approximate=True))

    @property
    def oom(self) -> bool:
        return bool(self.oom_devices)

    def to_dict(self) -> dict[str, object]:
        return {"iteration_time_s": self.iteration_time_s, "peak_memory_bytes": list(self.peak_memory_bytes),
                "oom": self.oom, "oom_devices": list(self.oom_devices), "sim_ms": round(self.sim_ms, 3),
                "device_idle": [round(x, 4) for x in self.device_idle],
                "link_idle": {k: round(v, 4) for k, v in self.link_idle.items()},
                "conversions": dict(self.conversions), "num_tasks": self.num_tasks,
                "devices_simulated": self.devices_simulated, "exact": self.exact,
                **({"client_s": self.client_s} if self.client_s else {})}


class OpEdges(NamedTuple):
    """Data edges between planned ops, one per (tensor, consuming planned op); states are
    tag_tf.sim.prepare.STATE_CODE values."""

    src: np.ndarray             # producing planned op
    dst: np.ndarray             # consuming planned op
    tensor: np.ndarray          # tensor id
    nbytes: np.ndarray          # int64: whole tensor at the planning batch size
    state: np.ndarray           # the producer's replicated state
    need: np.ndarray            # the consumer's requirement


class Simulator:
    def __init__(self, analysis: Analysis, topology: Topology, costs: OpCosts | None = None,
                 comm: CommModel | None = None, profile: OpProfile | Iterable[OpProfile] | None = None,
                 calibration: CalibrationChoice = "default", cost_model: CostModel | None = None, *,
                 cpu_executor: str = "per-process"):
        """`costs`: OpCosts for the training ops (default: a measured `profile` -- one OpProfile or
        several -- where its device type matches, else the analytical `cost_model`); `comm`: a CommModel with fitted transfers, or None;
        `calibration`: "default" (the shipped fit for the `testbed`/`cloud` presets, datasheet
        physics elsewhere), None or "nominal" (datasheet), a calibration file or a Calibration;
        `cpu_executor`: whose CPU ops run one at a time (see `prepare`)."""
        from tag_tf import _simcore

        self.analysis = analysis
        self.topology = topology
        if costs is None:
            costs = training_costs(analysis, device_types(topology), profile, cost_model, resolve=topology.gpu_type)
        self.costs = costs
        self._comm = comm
        self._regrouped: dict[tuple[int, ...], Simulator] = {}
        self._own_groups = analysis.op_groups
        self.cpu_executor = cpu_executor
        self.nominal: Prepared = prepare(analysis, topology, costs, comm,       # datasheet physics
                                         cpu_executor=cpu_executor)
        self.calibration = resolve_calibration(calibration, topology)
        self._members = member_counts(analysis)
        self.prepared: Prepared = (self.nominal if self.calibration is None
                                   else self.calibration.apply(self.nominal, self._members, topology))
        self._native = _simcore.Simulator(self.prepared.as_native())
        self._mp_cache: dict[tuple[int, int], dict[str, int]] = {}
        self._op_index = {n: i for i, n in enumerate(analysis.planning.ops)}
        self._coloc_sets: ColocationSets | None = None
        self._hosted: dict[str, list[str]] | None = None     # planned op -> its ops (SFB checks)
        D = topology.num_devices
        self._num_devices = D
        self._link_names = self.prepared.link_names
        self.client: Client | None = None
        self._native_fed_locally = None       # (with a between-graph client) built when first asked

    def with_client(self, client: Client | None) -> Simulator:
        """The same simulator, its reports charging `client`'s feed and drive (sim.client) to each
        plan; None: the devices' iteration alone. A subclass stays itself (its own costs kept)."""
        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.client = client
        other._regrouped = {}
        return other

    def with_calibration(self, calibration: CalibrationChoice) -> Simulator:
        """The same graph and cluster under another calibration (op costs and expansion inputs are
        reused: this is what a calibration fit evaluates many times)."""
        from tag_tf import _simcore

        other = object.__new__(type(self))
        other.__dict__.update(self.__dict__)
        other.calibration = resolve_calibration(calibration, self.topology)
        other.prepared = (self.nominal if other.calibration is None
                          else other.calibration.apply(self.nominal, self._members, self.topology))
        other._native = _simcore.Simulator(other.prepared.as_native())
        other._native_fed_locally = None
        other._mp_cache = dict(self._mp_cache)
        other._regrouped = {}
        return other

    def for_strategy(self, strategy: Strategy) -> Simulator:
        """The simulator of the groups `strategy` plans (itself, unless the plan carries refined
        groups: then the same costs and physics on those groups, made once per grouping)."""
        if strategy.op_groups is None or tuple(strategy.op_groups) == self._own_groups:
            return self
        key = tuple(strategy.op_groups)
        if key not in self._regrouped:
            other = self._regrouped_simulator(self.analysis.for_strategy(strategy))
            other.client = self.client
            self._regrouped[key] = other
        return self._regrouped[key]

    def _regrouped_simulator(self, analysis: Analysis) -> Simulator:
        """This simulator's costs and physics on `analysis` (the same graph, other groups); a
        subclass whose reports add costs of their own makes one of its kind."""
        return Simulator(analysis, self.topology, costs=self.costs, comm=self._comm, calibration=self.calibration,
                         cpu_executor=self.cpu_executor)

    @property
    def colocation(self) -> ColocationSets:
        """TF's colocation sets of this simulator's graph (built on first use)."""
        if self._coloc_sets is None:
            self._coloc_sets = ColocationSets(self.analysis)
        return self._coloc_sets

    @property
    def calibration_name(self) -> str:
        return "nominal" if self.calibration is None else self.calibration.name

    # -- the graph and cluster, as the search reads them ------------------------------------------
    @property
    def num_groups(self) -> int:
        return len(self.analysis.grouping.groups)

    @property
    def num_ops(self) -> int:
        """Planned ops (the granularity of op-level facts below)."""
        return self.prepared.num_ops

    @property
    def num_devices(self) -> int:
        return self._num_devices

    @property
    def batch_size(self) -> int:
        """The global batch size op costs are for."""
        return self.prepared.batch

    @property
    def op_names(self) -> Sequence[str]:
        """Planned op names, by planned op index."""
        return self.analysis.planning.ops

    @property
    def op_group(self) -> np.ndarray:
        """The op group of each planned op."""
        return self.prepared.op_group

    @property
    def device_type_index(self) -> np.ndarray:
        """Per device, the index of its type in the per-type arrays (`op_per_sample_s`, `group_times`)."""
        return self.prepared.dev_type

    @property
    def tensor_names(self) -> tuple[str, ...]:
        """By tensor id (`OpEdges.tensor`)."""
        return self.prepared.tensor_names

    @property
    def tensor_bytes(self) -> np.ndarray:
        """Bytes of each tensor, by tensor id."""
        return self.prepared.t_bytes

    def groups_by_compute(self) -> list[int]:
        """Op groups in descending estimated compute (ties in group order)."""
        return self.analysis.grouping.by_compute()

    def op_per_sample_s(self) -> np.ndarray:
        """Seconds per sample of each planned op on each device type, [type, op] (calibrated)."""
        p = self.prepared
        return np.asarray(p.op_per_sample, dtype=np.float64).reshape(-1, p.num_ops)

    def group_times(self) -> tuple[np.ndarray, np.ndarray]:
        """Compute time of each op group on each device type, [group, type] (calibrated): the fixed
        seconds per run and the seconds per sample, each the sum over the group's planned ops."""
        p = self.prepared
        n, G = p.num_ops, p.num_groups
        groups = np.asarray(p.op_group, dtype=np.int64)
        fixed = np.asarray(p.op_fixed, dtype=np.float64).reshape(-1, n)
        per_sample = np.asarray(p.op_per_sample, dtype=np.float64).reshape(-1, n)
        T = fixed.shape[0]
        group_fixed = np.zeros((G, T))
        group_per_sample = np.zeros((G, T))
        for t in range(T):
            np.add.at(group_fixed[:, t], groups, fixed[t])
            np.add.at(group_per_sample[:, t], groups, per_sample[t])
        return group_fixed, group_per_sample

    def group_traffic(self) -> np.ndarray:
        """Bytes per iteration the ops of group a send to ops of another group b, [a, b] (whole
        tensors at the planning batch size, once per consuming planned op)."""
        p = self.prepared
        src = np.asarray(p.op_group)[np.asarray(p.e_src)]
        dst = np.asarray(p.op_group)[np.asarray(p.e_dst)]
        cross = src != dst
        traffic = np.zeros((self.num_groups, self.num_groups))
        np.add.at(traffic, (src[cross], dst[cross]), np.asarray(p.e_bytes, dtype=np.float64)[cross])
        return traffic

    def op_edges(self) -> OpEdges:
        """The data edges between planned ops, one per (tensor, consuming planned op)."""
        p = self.prepared
        return OpEdges(np.asarray(p.e_src), np.asarray(p.e_dst), np.asarray(p.e_tensor),
                       np.asarray(p.e_bytes, dtype=np.int64), np.asarray(p.e_state), np.asarray(p.e_need))

    def source_ops(self) -> np.ndarray:
        """Per planned op: whether it is a source (an input the batch is fed to)."""
        return (np.asarray(self.prepared.op_flags) & SOURCE) != 0

    def duplicable_ops(self) -> np.ndarray:
        """Per planned op: whether it may run duplicated (SFB): none of its members is a source or
        beside a variable (placement.layout.validated_duplicates refuses the others)."""
        if self._hosted is None:
            self._hosted = self.analysis.planning.members()
        members, coloc, annotations = self._hosted, self.colocation, self.analysis.annotations
        return np.array([not any(Flag.SOURCE in annotations[m].flags or coloc.with_variable(m) for m in members[op])
                         for op in self.op_names], dtype=bool)

    def link_times(self) -> tuple[np.ndarray, np.ndarray]:
        """Bandwidth (bytes/s) and latency (s) between each ordered pair of devices, [src, dst]
        (calibrated; the topology's analytical links, not fitted communication profiles)."""
        p, D = self.prepared, self._num_devices
        return (np.asarray(p.link_bw, dtype=np.float64).reshape(D, D),
                np.asarray(p.link_lat, dtype=np.float64).reshape(D, D))

    def lower_bound_s(self) -> float:
        """Compute lower bound of one iteration: the whole batch's compute spread over all devices
        in proportion to their speed, communication free (sum of per-device rates)."""
        p = self.prepared
        n, batch = p.num_ops, p.batch
        per_type = (p.op_fixed.reshape(-1, n) + p.op_per_sample.reshape(-1, n) * batch).sum(axis=1)
        rate = sum(1.0 / per_type[t] for t in p.dev_type if per_type[t] > 0)
        return 1.0 / rate if rate > 0 else 0.0

    def split_floor_s(self) -> float:
        """Compute floor of a plan that splits the batch (data parallel, uneven shares, any subset of
        devices; communication free): each device computing runs every op once per step, paying the
        op's fixed cost in full, and takes the share of the batch that makes every device finish
        together; a device whose fixed costs alone take longer takes none. `lower_bound_s` spreads
        the fixed costs too, as if each device computed whole batches of its own: no plan that
        splits one batch over devices reaches it where fixed costs are a large part of a step (a
        step of a few samples per GPU)."""
        p = self.prepared
        n, batch = p.num_ops, p.batch
        fixed = p.op_fixed.reshape(-1, n).sum(axis=1)
        per_sample = p.op_per_sample.reshape(-1, n).sum(axis=1)
        devices = [(float(fixed[t]), float(per_sample[t])) for t in p.dev_type if per_sample[t] > 0]
        # A device whose ops cost nothing per sample takes the whole batch in its fixed costs.
        free = min((float(fixed[t]) for t in p.dev_type if not per_sample[t] > 0), default=math.inf)
        while devices:   # T with sum((T - F_d) / P_d) = batch over the devices whose F_d <= T
            rate = sum(1.0 / ps for _, ps in devices)
            floor = (batch + sum(f / ps for f, ps in devices)) / rate
            kept = [(f, ps) for f, ps in devices if f <= floor]     # the least F_d always stays
            if len(kept) == len(devices):
                return min(floor, free)
            devices = kept
        return free if math.isfinite(free) else 0.0

    def device_rates(self) -> list[float]:
        """Samples per second each device computes the whole graph at, by this simulator's (calibrated)
        op costs: a better capacity for batch shares than datasheet peaks."""
        p = self.prepared
        n = p.num_ops
        per_sample = (p.op_per_sample.reshape(-1, n)).sum(axis=1)
        return [1.0 / per_sample[t] if per_sample[t] > 0 else 0.0 for t in p.dev_type]

    def encode(self, strategy: Strategy) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray | None,
                                                  np.ndarray | None, int, bool, np.ndarray | None]:
        """The strategy as the flat arrays the native expander reads."""
        if strategy.op_groups is not None and tuple(strategy.op_groups) != self._own_groups:
            raise StrategyError("the strategy plans refined op groups: encode with sim.for_strategy(strategy)")
        strategy.validate(self.num_groups, self._num_devices)
        ptr = np.zeros(self.num_groups + 1, dtype=np.int32)
        devs: list[int] = []
        options = np.zeros(self.num_groups, dtype=np.uint8)
        mp = None
        for g, plan in enumerate(strategy.groups):
            devs.extend(plan.devices)
            ptr[g + 1] = len(devs)
            options[g] = OPTION_CODE[plan.option]
            if plan.option is Option.MODEL_PARALLEL and len(plan.devices) > 1:
                if mp is None:
                    mp = np.full(len(self._op_index), -1, dtype=np.int32)
                key = (g, len(plan.devices))
                if key not in self._mp_cache:
                    self._mp_cache[key] = mp_partition(self.analysis, g, len(plan.devices))
                for op, part in self._mp_cache[key].items():
                    mp[self._op_index[op]] = part
        shares = None if strategy.shares is None else np.asarray(strategy.shares, dtype=np.float64)
        dup = None
        if strategy.sfb:
            dup = np.zeros(len(self._op_index), dtype=np.uint8)
            if self._hosted is None:         # checked on every SFB plan simulated: built once
                self._hosted = self.analysis.planning.members()
            for op in validated_duplicates(self.analysis, strategy, self.colocation, self._hosted):
                dup[self._op_index[op]] = 1
        return (ptr, np.asarray(devs, dtype=np.int32), options, shares, mp, int(strategy.fusion_bytes or 0),
                bool(strategy.sync_after_backward), dup)

    def fed_locally(self, strategy: Strategy) -> bool:
        """Whether every replica of `strategy` reads its own part of each batch where the topology
        says one client feeds them: a between-graph client runs such plans as one program per task,
        each fed there (`Client.drives_itself`). Simulated with the client's split and sends, such a
        plan paid the batch's move over the slowest link: horovod-p of the mlp at batch 480 on the
        emulated link cluster was predicted 566 ms, 82 ms of it that send, and measured 491 ms."""
        c = self.client
        return c is not None and not self.prepared.feed_local and c.drives_itself(strategy, self.topology)

    def _native_for(self, strategy: Strategy):
        """The native simulator for `strategy`: inputs read on every replica where `fed_locally`."""
        if not self.fed_locally(strategy):
            return self._native
        if self._native_fed_locally is None:
            from tag_tf import _simcore

            self._native_fed_locally = _simcore.Simulator(
                dataclasses.replace(self.prepared, feed_local=True).as_native())
        return self._native_fed_locally

    @staticmethod
    def _pipelined(strategy: Strategy) -> dict[str, int]:
        return {"microbatches": strategy.microbatches} if strategy.microbatches > 1 else {}

    def simulate(self, strategy: Strategy, *, detail: bool = False, collapse: bool | None = None,
                 approximate: bool = False) -> SimReport:
        """One iteration of `strategy`. `collapse`: devices the plan treats alike on interchangeable
        machines are simulated once (kernels/expand.h, device classes), which is exact wherever those
        classes only receive, compute and meet in collectives (every whole-replica plan); where a
        class sends, its transfers go out as one block, and the plan is simulated again device by
        device unless `approximate` (a search's inner loop on a large cluster: `report.exact` then
        says which it got). False expands every device, as `detail` (the task graph) always does.
        None: collapse when approximating or when every machine reads its own inputs (with one
        client feeding them, the pieces queue at its port and a collapsed run is rarely exact)."""
        if collapse is None:
            collapse = approximate or self.topology.input == "local"
        if strategy.op_groups is not None and tuple(strategy.op_groups) != self._own_groups:
            return self.for_strategy(strategy).simulate(strategy, detail=detail, collapse=collapse,
                                                        approximate=approximate)
        args = self.encode(strategy)
        native = self._native_for(strategy)
        start = time.perf_counter()
        try:
            micro = self._pipelined(strategy)
            out = native.run(*args, with_tasks=detail, collapse=collapse and not detail, **micro)
            if not out["exact"] and not approximate:
                out = native.run(*args, with_tasks=detail, collapse=False, **micro)
        except ValueError as e:
            raise StrategyError(str(e)) from None
        sim_ms = (time.perf_counter() - start) * 1e3
        report = self._report(out, sim_ms, detail)
        if self.client is not None and not report.oom:
            charge = self.client.charge(strategy, self.topology, self.analysis.op_groups)
            if charge:
                report = dataclasses.replace(report, iteration_time_s=report.iteration_time_s + charge, client_s=charge)
        return report

    def _report(self, out: Mapping[str, Any], sim_ms: float, detail: bool) -> SimReport:
        D = self._num_devices
        makespan = float(out["makespan"])
        busy = out["busy"]
        idle = tuple(float(1 - busy[d] / makespan) if makespan > 0 else 0.0 for d in range(D))
        links = _LinkIdle(self._link_names, busy[2 * D:2 * D + len(self._link_names)], makespan)
        oom = tuple(int(d) for d in np.flatnonzero(out["oom"]))
        tasks = None
        if detail:
            tasks = {k: out[k] for k in ("duration", "start", "end", "res_ptr", "res", "succ_ptr", "succ",
                                         "succ_data", "mem_device", "mem_bytes", "capacity_bytes", "kind",
                                         "op", "device", "src")}
            tasks["num_resources"] = int(out["num_resources"])
        return SimReport(makespan, tuple(int(x) for x in out["peak_bytes"]),
                         tuple(int(x) for x in out["persistent_bytes"]),
                         tuple(int(d.memory_bytes) for d in self.topology.devices), oom, idle, links,
                         out["group_end"] - out["group_start"], out["group_busy"], out["group_out_wait"],
                         dict(out["conversions"]), int(out["num_tasks"]), sim_ms, tasks,
                         devices_simulated=int(out["devices_simulated"]), exact=bool(out["exact"]))

    # -- traces -----------------------------------------------------------------------------
    def task_graph(self, report: SimReport):
        """The simulated iteration as an engine TaskGraph + SimResult (for traces and Gantt charts)."""
        from tag_tf.sim.engine import make_task_graph, simulate

        if report.tasks is None:
            raise ValueError("simulate(..., detail=True) first")
        t = report.tasks
        D = self._num_devices
        names = self.analysis.planning.ops
        task_names = tuple(_task_name(int(k), int(o), names) for k, o in zip(t["kind"], t["op"]))
        hosts = self.topology.num_machines
        kinds = ["device"] * D + ["collective"] * D + ["link"] * len(self._link_names) + ["host"] * hosts
        resource_names = ([f"dev{d} ({self.topology.devices[d].type})" for d in range(D)]
                          + [f"dev{d} collectives" for d in range(D)] + list(self._link_names)
                          + [f"machine{m} executor" for m in range(hosts)])
        graph = make_task_graph(
            duration=t["duration"], res_ptr=t["res_ptr"], res=t["res"], succ_ptr=t["succ_ptr"], succ=t["succ"],
            succ_data=t["succ_data"], mem_device=t["mem_device"], mem_bytes=t["mem_bytes"],
            persistent_bytes=np.asarray(report.persistent_bytes, dtype=np.int64),
            capacity_bytes=np.asarray(t["capacity_bytes"], dtype=np.int64), num_resources=t["num_resources"],
            names=task_names, categories=tuple(TASK_KINDS[int(k)] for k in t["kind"]),
            resource_names=tuple(resource_names), resource_kinds=tuple(kinds),
            pool_names=tuple(f"dev{d}" for d in range(D)))
        result = simulate(graph)   # the engine is deterministic: same times as the native run
        return graph, result


class _LinkIdle(Mapping[str, float]):
    """Per link resource, the fraction of the iteration it idles: computed when read (a report per
    candidate plan, thousands of links on a large cluster, rarely read)."""

    def __init__(self, names: Sequence[str], busy: np.ndarray, makespan: float):
        self._names, self._busy, self._makespan = names, busy, makespan
        self._index: dict[str, int] | None = None

    def __getitem__(self, name: str) -> float:
        if self._index is None:
            self._index = {n: k for k, n in enumerate(self._names)}
        k = self._index[name]
        return float(1 - self._busy[k] / self._makespan) if self._makespan > 0 else 0.0

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __repr__(self) -> str:
        return f"<link idle of {len(self._names)} links>"


def _task_name(kind: int, op: int, names: Sequence[str]) -> str:
    base = names[op] if 0 <= op < len(names) else "?"
    return base if kind == 0 else f"{TASK_KINDS[kind]}:{base}"


def training_costs(analysis: Analysis, types: Sequence[str], profile: OpProfile | Iterable[OpProfile] | None = None,
                   model: CostModel | None = None, resolve: Callable[[str], GpuType] | None = None) -> OpCosts:
    """OpCosts for every training op on the given device types (profile where measured, else model;
    `resolve`: a type name's GpuType, e.g. `Topology.gpu_type` for a topology's own custom types)."""
    from tag_tf.profile.costs import op_costs

    train = training_ops(analysis.graph)
    names = [n for n in analysis.graph.order if n in train]
    return op_costs(analysis.graph_b1, analysis.graph_b2, analysis.batch.b1, analysis.batch.b2, names,
                    list(types), profile=profile, model=model, resolve=resolve)
