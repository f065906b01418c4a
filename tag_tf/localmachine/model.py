"""The local machine model: a Simulator that predicts real runs of compiled strategies on this machine.

    sim = local_simulator(analysis, 4, model=ZooModel("mlp", tiny=True))            # 4 virtual CPUs, 1 process
    sim = local_simulator(analysis, 4, processes=2, model=ZooModel("mlp", tiny=True))  # 2 servers x 2 CPUs
    sim = local_simulator(analysis, 2, processes=2, model=..., runtime=TF_DEFAULTS, between_graph=True)
    sim.simulate(strategy).iteration_time_s    # predicted seconds per session.run of the train op

Setups (`LocalSetup`):
  * one TensorFlow process with N virtual CPU devices (`DeviceMap.local_cpus(N)`): topology `local:N`;
  * P local processes with n virtual CPU devices each: topology `cpu_topology(P, n)`, one topology
    machine per process; one client drives them all (`local_servers(P, n)`), or, `between_graph`,
    each process is a TF_CONFIG task driving its own part of every step.

Runtimes (`tag_tf.localmachine.runtime`): PINNED (one thread per op, oneDNN and Grappler off: the
simulator-accuracy benchmark's) or TF_DEFAULTS (what a program gets). Each keys its own
measurements; the measuring process must run it.

What the model is made of (everything measured on this machine, cached in the ProfileDB):
  * an OpProfile of the graph (`profile_model` at PROFILE_BATCH_SIZES, single device, traced as
    written), stored under device type `device_type_key(runtime)`;
  * a correction per graph so that one device's predictions add up to the untraced steps real runs
    see: PINNED, the untraced step minus the traced op times spread over the ops
    (`executor_overhead`); TF_DEFAULTS, a shift per op and a factor on per-sample times fitted to
    untraced steps run with Grappler (`step_correction`; its rewrites change whole-step time);
  * TF_DEFAULTS only: how the setup's devices overlap when each runs a replica (`corun`,
    `serial_share`): the simulator's devices then run side by side, and the prediction is blended
    with one where every op of the machine runs one at a time;
  * per setup (`LocalMachine`): a CommModel fitted to TensorFlow's own Send/Recv between two virtual
    devices of one process ("intra" p2p), gRPC RecvTensor between processes ("inter" p2p), and
    CollectiveReduceV2 chains over k devices of one process ("intra:k") or spanning processes
    ("inter:k"), plus the executor time a cross-process transfer takes from the ops of both
    processes (`measure_message_cost`); a "cpu" device type whose per-op cost and bandwidth are
    fitted to the compiler's ConcatV2/AddN/ZerosLike on this CPU (the simulator charges conversions
    launch + bytes / bandwidth); and the per-step cost of a session.run (one process: client and
    executor; several: as TF_CONFIG tasks, with the step's first meeting of the others,
    `tasksteps`), linear in the fed bytes. The simulator's makespan plus that per-step cost is the
    predicted wall time of one `session.run(train_op)`.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import numpy as np

from tag_tf.errors import ProfileError
from tag_tf.localmachine.corun import corun_walls
from tag_tf.localmachine.probes import (
    fit_line,
    measure_collectives,
    measure_conversions,
    measure_message_cost,
    measure_step_overhead,
    measure_transfers,
)

# configure_runtime, the runtimes and session_config are re-exported: callers use the model through this module.
from tag_tf.localmachine.runtime import (
    PINNED,
    RUNTIME_ENV,
    RUNTIME_TAG,
    RUNTIMES,
    TF_DEFAULTS,
    THREADS,
    LocalSetup,
    Runtime,
    SetupRunner,
    configure_runtime,
    local_servers,
    session_config,
)
from tag_tf.localmachine.tasksteps import measure_task_steps
from tag_tf.profile.segmented import SegmentedLinear
from tag_tf.sim.simulator import SimReport, Simulator, training_costs

if TYPE_CHECKING:
    from tag_tf.analysis import Analysis
    from tag_tf.ir.graph import Graph
    from tag_tf.profile.comm import CommModel
    from tag_tf.profile.costs import OpCosts
    from tag_tf.profile.db import ProfileDB
    from tag_tf.profile.op_profile import OpProfile
    from tag_tf.strategy import Strategy
    from tag_tf.topology.spec import Topology

log = logging.getLogger(__name__)

PROFILE_BATCH_SIZES: tuple[int, ...] = (8, 16, 32, 64)
COMM_SIZES: tuple[int, ...] = tuple(64 * 4 ** k for k in range(10))     # 64 B .. 16 MiB
FEED_SIZES: tuple[int, ...] = (4, 1 << 20, 4 << 20)                     # bytes fed per step
def device_type_key(runtime: Runtime) -> str:
    """ProfileDB device-type key of op profiles measured under `runtime`."""
    return f"cpu-{runtime.tag}"


# ---------------------------------------------------------------------------------------------
# The local machine (per setup)
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class LocalMachine:
    """What one setup costs beyond the ops: communication, conversions, the step itself."""

    setup: LocalSetup
    p2p: Mapping[str, list]                 # "intra" / "inter" -> [(bytes, seconds)]
    allreduce: Mapping[str, list]           # "intra:k" / "inter:k" -> [(bytes, seconds)]
    conversion_launch_s: float              # per Split/Concat/AddN/zeros op
    conversion_bandwidth: float             # bytes/s of the bytes the simulator charges them
    step_fixed_s: float                     # a session.run with no work
    step_per_feed_byte_s: float             # ... plus this per fed byte
    single_step_fixed_s: float              # the same in one process with one device (the profiler's session)
    single_step_per_feed_byte_s: float
    host_message_s: float = 0.0             # executor time per cross-process transfer (0 in one process)
    info: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def comm_model(self, topology: Topology) -> CommModel:
        from tag_tf.profile.comm import CommModel

        p2p = {k: _fit_samples(v) for k, v in self.p2p.items() if v}
        ar = {k: _fit_samples(v) for k, v in self.allreduce.items() if v}
        return CommModel(topology, p2p, ar, host_message_s=self.host_message_s)

    def topology(self) -> Topology:
        """The setup's topology with the "cpu" device type replaced by this machine's measured one
        (custom types take precedence over GPU_TYPES; only conversion costs read these numbers)."""
        from tag_tf.topology.gpus import GPU_TYPES, GpuType

        base = self.setup.topology()
        cpu = GPU_TYPES["cpu"]
        measured = GpuType("cpu", cpu.peak_flops, self.conversion_bandwidth, cpu.memory_bytes,
                           self.conversion_launch_s)
        return dataclasses.replace(base, gpu_types=(measured,))

    def step_overhead(self, feed_bytes: float) -> float:
        return self.step_fixed_s + self.step_per_feed_byte_s * feed_bytes

    def single_step_overhead(self, feed_bytes: float) -> float:
        return self.single_step_fixed_s + self.single_step_per_feed_byte_s * feed_bytes

    def to_dict(self) -> dict[str, object]:
        return {"setup": self.setup.to_dict(), "runtime": self.setup.runtime.tag,
                "p2p": {k: [list(s) for s in v] for k, v in self.p2p.items()},
                "allreduce": {k: [list(s) for s in v] for k, v in self.allreduce.items()},
                "conversion_launch_s": self.conversion_launch_s,
                "conversion_bandwidth": self.conversion_bandwidth,
                "step_fixed_s": self.step_fixed_s, "step_per_feed_byte_s": self.step_per_feed_byte_s,
                "single_step_fixed_s": self.single_step_fixed_s,
                "single_step_per_feed_byte_s": self.single_step_per_feed_byte_s,
                "host_message_s": self.host_message_s, "info": dict(self.info)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LocalMachine:
        return cls(LocalSetup.from_dict(d["setup"]), {k: [tuple(s) for s in v] for k, v in d["p2p"].items()},
                   {k: [tuple(s) for s in v] for k, v in d["allreduce"].items()},
                   float(d["conversion_launch_s"]), float(d["conversion_bandwidth"]),
                   float(d["step_fixed_s"]), float(d["step_per_feed_byte_s"]), float(d["single_step_fixed_s"]),
                   float(d["single_step_per_feed_byte_s"]), float(d["host_message_s"]), dict(d.get("info", {})))


def _fit_samples(samples: Sequence[Sequence[float]]) -> SegmentedLinear:
    """The three-segment fit of (bytes, seconds) samples."""
    nbytes, seconds = zip(*samples)
    return SegmentedLinear.fit(nbytes, seconds, max_segments=3)


MACHINE_MODEL_VERSION = 3      # part of the ProfileDB key: bump when LocalMachine gains a measurement


def _db_key(setup: LocalSetup) -> str:
    return f"local-{setup.name}-{setup.runtime.tag}-m{MACHINE_MODEL_VERSION}-{setup.topology().fingerprint}"


def _ring_devices(setup: LocalSetup, k: int) -> list[int]:
    """k devices spanning the processes, dealt round-robin (process 0 device 0, process 1 device 0,
    ...), in topology order: the shape of a group that spans machines."""
    n = setup.devices_per_process
    order = [p * n + i for i in range(n) for p in range(setup.processes)]
    return sorted(order[:k])


class MeasureOptions(TypedDict, total=False):
    """`measure_machine`'s options."""

    sizes: Sequence[int]
    repeats: int


def measure_machine(setup: LocalSetup, *, sizes: Sequence[int] = COMM_SIZES, repeats: int = 7) -> LocalMachine:
    """Measure everything `LocalMachine` holds for `setup` (starts and stops its servers)."""
    t0 = time.perf_counter()
    if setup.processes == 1:
        return _measure(setup, SetupRunner(setup), sizes, repeats, t0)
    with local_servers(setup.processes, setup.devices_per_process, setup.runtime) as spec:
        return _measure(setup, SetupRunner(setup, spec), sizes, repeats, t0)


def _measure(setup: LocalSetup, runner: SetupRunner, sizes: Sequence[int], repeats: int, t0: float) -> LocalMachine:
    n = setup.devices_per_process
    p2p: dict[str, list] = {}
    allreduce: dict[str, list] = {}
    if n > 1:
        p2p["intra"] = measure_transfers(runner, 0, 1, sizes, repeats)
        for k in range(2, n + 1):
            allreduce[f"intra:{k}"] = measure_collectives(runner, list(range(k)), sizes, repeats)
    message_s = 0.0
    if setup.processes > 1:
        p2p["inter"] = measure_transfers(runner, 0, n, sizes, repeats)
        message_s = measure_message_cost(runner, 0, n, max(repeats, 15))
        for k in range(2, setup.num_devices + 1):
            allreduce[f"inter:{k}"] = measure_collectives(runner, _ring_devices(setup, k), sizes, repeats)
    # A step's own cost. Between-graph, and under TensorFlow's runtime (which describes TF_CONFIG
    # tasks: the chief's in-process master drives every part): measured on such tasks, meeting the
    # others once. The pinned runtime's client-driven setups (the simulator-accuracy and
    # real-execution benchmarks: a client beside `local_servers`) keep a client's no-op step.
    tasks = setup.processes > 1 and (setup.between_graph or not setup.runtime.one_op_at_a_time)
    step = (measure_task_steps(setup, FEED_SIZES, max(repeats, 40)) if tasks else
            measure_step_overhead(runner, FEED_SIZES, max(repeats, 15)))
    single_setup = LocalSetup(1, 1, setup.runtime)
    single = step if setup == single_setup else \
        measure_step_overhead(SetupRunner(single_setup), FEED_SIZES, max(repeats, 15))
    conv = measure_conversions(repeats=repeats, runtime=setup.runtime)
    launch, per_byte = fit_line(conv)
    return LocalMachine(setup, p2p, allreduce, launch, 1.0 / per_byte if per_byte > 0 else 1e12,
                        *fit_line(step), *fit_line(single), message_s,
                        {"step_samples": [list(s) for s in step], "single_step_samples": [list(s) for s in single],
                         "conversion_samples": [list(s) for s in conv],
                         "measure_s": round(time.perf_counter() - t0, 1), "repeats": repeats})


def local_machine(setup: LocalSetup, db: ProfileDB | None = None, *, refresh: bool = False,
                  **measure_kw: Unpack[MeasureOptions]) -> LocalMachine:
    """The setup's LocalMachine from the ProfileDB, or measured now (and stored)."""
    key = _db_key(setup)
    if db is not None and not refresh:
        found = db.get_comm(key)
        if found is not None:
            try:
                return LocalMachine.from_dict(found)
            except (KeyError, TypeError, ValueError) as e:
                log.warning("ignoring malformed local machine model %s (%s)", key, e)
    machine = measure_machine(setup, **measure_kw)
    if db is not None:
        db.put_comm(key, machine.to_dict())
    return machine


# ---------------------------------------------------------------------------------------------
# The op profile (per graph)
# ---------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ZooModel:
    """How to rebuild the analysed graph at other batch sizes: a zoo model name and build arguments
    (everything but batch_size, exactly as the analysed graph was built)."""

    name: str
    kwargs: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, name: str, **kwargs: object) -> ZooModel:
        return cls(name, tuple(sorted(kwargs.items())))


def local_profile(analysis: Analysis, model: ZooModel | None, db: ProfileDB | None = None, *,
                  batch_sizes: Sequence[int] = PROFILE_BATCH_SIZES, repeats: int = 7,
                  refresh: bool = False, runtime: Runtime = PINNED) -> OpProfile:
    """The graph's OpProfile on this CPU under `runtime`'s threads: from the ProfileDB (keyed by the
    analysed graph's fingerprint and `device_type_key(runtime)`), or measured with `profile_model`
    (single device, full tracing, `repeats` traced steps per batch size, as written) and stored."""
    from tag_tf.measure.ops import profile_model

    fingerprint = analysis.graph.fingerprint
    sizes = tuple(sorted(set(int(b) for b in batch_sizes)))

    def measure():
        if model is None:
            raise ProfileError("no stored profile of this graph on this CPU: pass model=ZooModel(...) "
                               "so it can be measured")
        prof = profile_model(model.name, sizes, repeats=repeats, inter_op_threads=runtime.threads, **dict(model.kwargs))
        return dataclasses.replace(prof, fingerprint=fingerprint,
                                   info={**prof.info, "runtime": runtime.tag, "env": runtime.env})

    key = device_type_key(runtime)
    if db is None:
        return measure()
    if refresh:
        prof = measure()
        db.put_op_profile(prof, fingerprint, key, sizes)
        return prof
    prof, _ = db.op_profile(fingerprint, key, sizes, measure)
    return prof


def executor_overhead(profile: OpProfile, machine: LocalMachine, feed_bytes: Mapping[int, float]) -> float:
    """Seconds to add to every profiled op so that the fitted single-device step adds up to the
    untraced one: median over profiled batch sizes of (wall step - per-step overhead - sum of fitted
    op times) / ops. Positive: the executor's dispatch between ops; negative: tracing inflated the
    traced times (small ops)."""
    if profile.step_times is None or profile.num_ops == 0:
        return 0.0
    per_op = []
    for k, b in enumerate(profile.batch_sizes):
        rest = profile.step_times[k] - machine.single_step_overhead(feed_bytes.get(b, 0.0)) - profile.total(b)
        per_op.append(rest / profile.num_ops)
    return float(np.median(per_op))


def feed_bytes_of(graph: Graph) -> float:
    """Bytes fed per step (the batch inputs at the graph's batch size)."""
    total = 0
    for name in graph.meta.feeds:
        total += graph.tensor(name).nbytes or 0
    return float(total)


def step_correction(profile: OpProfile, machine: LocalMachine, walls: Mapping[int, float],
                    feed_bytes: Mapping[int, float]) -> tuple[float, float]:
    """(seconds added to every profiled op, factor on every op's per-sample time) such that the
    corrected op times add up to the untraced steps `walls` (batch size -> seconds, one device,
    run as the runtime's real runs are): the line through (batch, wall - per-step cost - sum of
    profiled op times) gives both, its intercept spread over the ops and its slope over their
    per-sample times. What it carries: the executor's dispatch, tracing's inflation of small ops,
    and the graph optimizations of real runs (the profile is traced as written; measured here,
    Grappler's remapper doubles the transformer's per-sample time)."""
    sizes = [b for b in profile.batch_sizes if b in walls]
    if profile.num_ops == 0 or not sizes:
        return 0.0, 1.0
    rest = [walls[b] - machine.single_step_overhead(feed_bytes.get(b, 0.0)) - profile.total(b) for b in sizes]
    if len(sizes) < 2:
        return rest[0] / profile.num_ops, 1.0
    slope, intercept = np.polyfit(np.asarray(sizes, dtype=np.float64), np.asarray(rest), 1)
    per_sample = profile.total(1) - profile.total(0)
    scale = 1.0 + slope / per_sample if per_sample > 0 else 1.0
    return float(intercept) / profile.num_ops, float(max(scale, 0.1))


def serial_share(alone: Mapping[int, float], side_by_side: Mapping[int, float], devices: int, batch: float) -> float:
    """How much of the setup's devices run one after the other when each runs a replica: 0 when
    side by side costs one replica alone (they overlap fully), 1 when it costs `devices` of them
    (the cores were busy already), read at the profiled batch size nearest `batch`."""
    sizes = [b for b in alone if b in side_by_side]
    if devices < 2 or not sizes:
        return 0.0
    b = min(sizes, key=lambda s: abs(s - batch))
    ratio = side_by_side[b] / alone[b]
    return float(min(max((ratio - 1.0) / (devices - 1), 0.0), 1.0))


def corrected_costs(analysis: Analysis, profile: OpProfile, per_op_s: float, per_sample_scale: float = 1.0) -> OpCosts:
    """Training op costs from the profile, each profiled op's fixed time shifted by `per_op_s`
    (clipped at 0) and its per-sample time scaled by `per_sample_scale`."""
    costs = training_costs(analysis, ("cpu",), profile)
    index = profile.index()
    rows = np.array([n in index for n in costs.op_names], dtype=bool)
    fixed = costs.fixed.copy()
    fixed[:, rows] = np.maximum(fixed[:, rows] + per_op_s, 0.0)
    per_sample = costs.per_sample.copy()
    per_sample[:, rows] *= per_sample_scale
    return dataclasses.replace(costs, fixed=fixed, per_sample=per_sample)


# ---------------------------------------------------------------------------------------------
# The simulator
# ---------------------------------------------------------------------------------------------
class LocalSimulator(Simulator):
    """A Simulator whose reports add the per-step cost of a session.run: iteration_time_s is the
    predicted wall time of one training step on the local setup.

    Under a runtime with one inter-op thread a process runs its devices' ops one at a time
    ("per-process" executors). Under TensorFlow's own pools ops run side by side but share the
    machine's cores, which the engine cannot split: the prediction blends the step with every
    device running its own ops ("per-device") and the step with every op of the machine one at a
    time ("one"), weighted by `serial`, measured for the graph (`serial_share`)."""

    def __init__(self, analysis: Analysis, machine: LocalMachine, profile: OpProfile, per_op_s: float,
                 per_sample_scale: float = 1.0, serial: float = 0.0, run_layer_s: float = 0.0):
        topology = machine.topology()
        costs = corrected_costs(analysis, profile, per_op_s, per_sample_scale)
        comm = machine.comm_model(topology)
        # With one device per process, its executor is the device's: a collective across processes
        # then holds both (their gRPC work competes with the ops), as under the pinned runtime.
        per_process = machine.setup.runtime.one_op_at_a_time or machine.setup.devices_per_process == 1
        super().__init__(analysis, topology, costs=costs, comm=comm,
                         cpu_executor="per-process" if per_process else "per-device")
        self.machine = machine
        self.profile = profile
        self.per_op_s = per_op_s
        self.per_sample_scale = per_sample_scale
        self.serial = 0.0 if machine.setup.runtime.one_op_at_a_time else serial
        self.run_layer_s = run_layer_s
        self._serial = (Simulator(analysis, topology, costs=costs, comm=comm, cpu_executor="one")
                        if self.serial > 0 else None)
        # Between-graph, every task is fed the whole batch (and takes its shards of it).
        self.step_overhead_s = machine.step_overhead(feed_bytes_of(analysis.graph_b1)) + run_layer_s

    def _regrouped_simulator(self, analysis: Analysis) -> Simulator:
        """The local machine's simulator of refined groups: the same machine, profile and per-step
        costs, so that a search's steps judged on the regrouped graph (SFB, batch shares) price a
        step as `simulate` does."""
        return LocalSimulator(analysis, self.machine, self.profile, self.per_op_s, self.per_sample_scale, self.serial,
                              self.run_layer_s)

    def simulate(self, strategy: Strategy, *, detail: bool = False, collapse: bool | None = None,
                 approximate: bool = False) -> SimReport:
        regrouped = self.for_strategy(strategy)
        if regrouped is not self:         # refined groups: their own local simulator, costs added once
            return regrouped.simulate(strategy, detail=detail, collapse=collapse, approximate=approximate)
        report = super().simulate(strategy, detail=detail, collapse=collapse, approximate=approximate)
        seconds = report.iteration_time_s
        if self._serial is not None:
            seconds += self.serial * (self._serial.simulate(strategy).iteration_time_s - seconds)
        return dataclasses.replace(report, iteration_time_s=seconds + self.step_overhead_s)


def local_simulator(analysis: Analysis, num_devices: int, processes: int = 1, *, db: ProfileDB | None = None,
                    model: ZooModel | None = None, profile: OpProfile | None = None, machine: LocalMachine | None = None,
                    refresh: bool = False, profile_repeats: int = 7, comm_repeats: int = 7,
                    runtime: Runtime = PINNED, between_graph: bool = False, run_layer_s: float = 0.0) -> LocalSimulator:
    """A simulator of `analysis` on this machine: `num_devices` virtual CPU devices spread evenly
    over `processes` local TensorFlow processes run by `runtime` (this process must run it too), one
    client driving them all or (`between_graph`) each task its own part. The op profile and the
    machine measurements come from `db` (a ProfileDB) when stored there, else they are measured now
    (the profile needs `model` to rebuild the graph at the profiled batch sizes) and stored.
    `profile` / `machine` override. `run_layer_s`: what the program's driver adds to every step
    beyond a plain session.run (`tag_tf.frontend.run_cost` measures tag_tf's session layer)."""
    if num_devices < 1 or processes < 1 or num_devices % processes:
        raise ProfileError(f"local simulator: {num_devices} devices do not split evenly over {processes} processes")
    setup = LocalSetup(processes, num_devices // processes, runtime, between_graph)
    if machine is not None and machine.setup != setup:
        raise ProfileError(f"local simulator: the machine given was measured for {machine.setup}, not {setup}")
    if machine is None:
        machine = local_machine(setup, db, refresh=refresh, repeats=comm_repeats)
    if profile is None:
        profile = local_profile(analysis, model, db, repeats=profile_repeats, refresh=refresh, runtime=runtime)
    feeds = _profile_feed_bytes(analysis, profile)
    if runtime.one_op_at_a_time:
        return LocalSimulator(analysis, machine, profile, executor_overhead(profile, machine, feeds),
                              run_layer_s=run_layer_s)
    # TensorFlow's pools: corrected to one device's untraced steps, blended by how the setup's
    # devices overlap when each runs a replica.
    alone = corun(analysis, LocalSetup(1, 1, runtime), profile, model, db, repeats=profile_repeats, refresh=refresh)
    side = corun(analysis, setup, profile, model, db, repeats=profile_repeats, refresh=refresh)
    serial = serial_share(alone, side, setup.num_devices, analysis.batch_size / setup.num_devices)
    return LocalSimulator(analysis, machine, profile, *step_correction(profile, machine, alone, feeds), serial,
                          run_layer_s)


def corun(analysis: Analysis, setup: LocalSetup, profile: OpProfile, model: ZooModel | None, db: ProfileDB | None,
          *, repeats: int = 7, refresh: bool = False) -> dict[int, float]:
    """The graph's step at each profiled batch size with every device of `setup` running a replica
    side by side (`corun.corun_walls`): from the ProfileDB, or measured now and stored."""
    key = (f"corun-{analysis.graph.fingerprint}-{setup.processes}x{setup.devices_per_process}-{setup.runtime.tag}-"
           f"{'-'.join(map(str, profile.batch_sizes))}")
    if db is not None and not refresh:
        found = db.get_comm(key)
        if found is not None and isinstance(found.get("walls"), dict):
            return {int(b): float(t) for b, t in found["walls"].items()}
    if model is None:
        raise ProfileError("no stored side-by-side steps of this graph on this CPU: pass model=ZooModel(...) "
                           "so they can be measured")
    walls = corun_walls(model.name, dict(model.kwargs), setup, profile.batch_sizes, repeats)
    if db is not None:
        db.put_comm(key, {"walls": {str(b): t for b, t in walls.items()}, "setup": setup.to_dict()})
    return walls


def _profile_feed_bytes(analysis: Analysis, profile: OpProfile) -> dict[int, float]:
    """Fed bytes at each profiled batch size (the analysed graph's feed scaled by batch)."""
    per_sample = feed_bytes_of(analysis.graph_b1) / analysis.batch_size
    return {b: per_sample * b for b in profile.batch_sizes}


__all__ = ["THREADS", "RUNTIME_ENV", "RUNTIME_TAG", "PINNED", "TF_DEFAULTS", "RUNTIMES", "Runtime", "PROFILE_BATCH_SIZES", "LocalSetup", "LocalMachine", "LocalSimulator", "ZooModel",
           "configure_runtime", "local_servers", "session_config", "local_machine", "measure_machine",
           "local_profile", "local_simulator", "executor_overhead"]
