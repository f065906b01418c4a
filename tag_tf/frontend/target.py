"""Where compiled graphs run: this process (virtual CPUs or its GPUs) or a cluster of `tag-tf server`s.

`resolve_target` turns a `distribute(topology=, cluster=)` request into a `Target` (topology, device
map, cluster), refusing topologies that cannot run here."""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Union

from tag_tf.errors import TopologyError
from tag_tf.topology.spec import Topology

if TYPE_CHECKING:
    import tensorflow as tf
    from tensorflow.core.protobuf.config_pb2 import ConfigProto
    from tensorflow.distribute.cluster_resolver import ClusterResolver

    from tag_tf.compiler import DeviceMap
    from tag_tf.runtime.cluster import ClusterSpec
    from tag_tf.runtime.roles import Role

# Where `distribute(topology=, cluster=)` may say compiled graphs run (see `resolve_target`).
TopologyRequest = Union[str, "os.PathLike[str]", Mapping[str, object], Topology, None]
ClusterRequest = Union[str, "os.PathLike[str]", "ClusterSpec", "ClusterResolver", None]

COMPILED_RUN_TIMEOUT_MS = 600_000     # one step of a compiled graph; generous: a first GPU step autotunes


@dataclasses.dataclass(frozen=True)
class Target:
    topology: Topology
    devices: DeviceMap
    cluster: ClusterSpec | None = None   # None: this process
    num_cpus: int = 1          # virtual CPU devices this process needs (local runs)
    role: Role | None = None   # the cluster from TF_CONFIG or a ClusterResolver
    local_server: str = ""     # target of this process's own server (the chief's): its master is in-process
    discover: bool = False     # no topology was given: take it from the running servers (`discovered`)
    # Seconds per step and per other task that a plan only one client can drive pays on top of its
    # work, where every task could drive its own part of each step (between-graph execution, TF_CONFIG
    # roles); measured with the links when the topology is discovered; 0: not known, or every plan
    # pays it alike.
    drive_s: float = 0.0

    @property
    def session_target(self) -> str:
        if self.local_server:
            return self.local_server
        return self.cluster.target if self.cluster is not None else ""

    def check(self) -> None:
        if self.cluster is not None:
            self.cluster.check()

    def alone_on_chief(self, devices: Iterable[int]) -> Target | None:
        """On the chief of a TF_CONFIG cluster, for a plan whose `devices` are all its own machine's:
        the same devices in this process (job "localhost", no cluster), so that each step runs in a
        session of this process rather than through its server's master (a gRPC round trip and a
        copy of every feed and fetch per step: measured 0.2-0.3 ms on a 1.5 ms step, 1-1.8 ms on a
        15 ms one). None elsewhere (other tasks, an in-graph client, plans spanning machines)."""
        from tag_tf.compiler import DeviceMap

        if self.cluster is None or self.role is None or not self.role.is_chief:
            return None
        if any(self.topology.devices[d].machine != 0 for d in devices):
            return None
        names = list(self.devices.names)
        ours = [d for d in self.topology.devices if d.machine == 0]
        prefix = f"/job:{self.cluster.job}/replica:0/task:0/"
        for d in ours:
            names[d.id] = names[d.id].replace(prefix, "/job:localhost/replica:0/task:0/")
        host = self.devices.host.replace(prefix, "/job:localhost/replica:0/task:0/")
        cpus = sum(1 for d in ours if d.type == "cpu") or 1
        local = DeviceMap(tuple(names), host, self.devices.machines, self.devices.gpu)
        return dataclasses.replace(self, devices=local, cluster=None, num_cpus=cpus, local_server="")

    def discovered(self, cache_dir: str | None) -> Target:
        """With `discover`: this target on the topology its servers report (devices, measured links)."""
        if not self.discover or self.cluster is None:
            return self
        import logging

        from tag_tf.measure.links import discover

        self.cluster.check()            # a task that is not up is named now, not after a read deadline
        topo, report = discover(self.cluster, cache_dir=cache_dir)
        links = report["links"]
        logging.getLogger("tag_tf.distribute").info(
            "tag_tf: cluster topology %r from its servers (%d device(s)%s)", topo.name, topo.num_devices,
            ("" if links is None else
             f"; links {_links_text(links)}, {links['latency'] * 1e6:.0f} us, "
             f"{float(links.get('drive_s') or 0) * 1e3:.2f} ms to drive a task's part "
             f"of a step{', cached' if report['cached'] else ', measured'}") +
            ("" if all(m.speed == 1.0 for m in topo.machines) else
             "; task speeds " + "/".join(f"{m.speed:.2g}" for m in topo.machines)))
        replaced = cluster_target(topo, self.cluster, self.role)
        drive = 0.0
        if links is not None and self.role is not None and os.environ.get("TAG_TF_BETWEEN_GRAPH", "1") != "0":
            drive = float(links.get("drive_s") or 0.0)
        return dataclasses.replace(replaced, local_server=self.local_server, drive_s=drive)

    def config(self, user_config: ConfigProto | None = None, as_written: bool = False) -> ConfigProto:
        """The user's ConfigProto with this target's devices (and the cluster's settings); with
        `as_written`, TensorFlow's graph rewrites off (`Program.as_written`)."""
        import tensorflow as tf

        from tag_tf.runtime.sessions import keep_as_written, session_config

        config = tf.compat.v1.ConfigProto()
        if user_config is not None:
            config.CopyFrom(user_config)
        if self.cluster is not None or self.role is not None:
            # The compiled graph spans every task (or runs in this process: `alone_on_chief`):
            # filters the user's code set for its own graph (Estimator's RunConfig under TF_CONFIG
            # keeps a chief to itself) would hide its devices.
            del config.device_filters[:]
        if self.cluster is not None:
            ours = self.cluster.session_config()
        else:
            ours = session_config(max(self.num_cpus, config.device_count.get("CPU", 1)),
                                  timeout_ms=config.operation_timeout_in_ms or COMPILED_RUN_TIMEOUT_MS)
        # Soft placement, CPU devices, the cluster's leader, and always a timeout: a collective whose
        # peers never arrive blocks without using CPU (on one machine the user's own timeout wins).
        config.MergeFrom(ours)
        if as_written:
            keep_as_written(config)
        return config

    def session(self, graph: tf.Graph, user_config: ConfigProto | None = None, as_written: bool = False
                ) -> tf.compat.v1.Session:
        import tensorflow as tf

        sess = tf.compat.v1.Session(self.session_target, graph=graph, config=self.config(user_config, as_written))
        sess._tag_tf_internal = True      # our own session: the patch passes it straight through
        return sess

    def task_session(self, graph: tf.Graph, task: int, user_config: ConfigProto | None = None,
                     as_written: bool = False) -> tf.compat.v1.Session:
        """A session on this process's server that sees task `task`'s devices only (its own part
        of each step: it never waits for, or disturbs, another task's master)."""
        import tensorflow as tf

        config = self.config(user_config, as_written)
        assert self.cluster is not None, "a task session needs a cluster"
        config.device_filters.append(f"/job:{self.cluster.job}/replica:0/task:{task}")
        sess = tf.compat.v1.Session(self.session_target, graph=graph, config=config)
        sess._tag_tf_internal = True
        return sess

    def explain(self, error: Exception) -> Exception:
        """A TF error from a cluster run turned into a ClusterError naming a dead task, if any."""
        if self.cluster is not None and self.cluster.unreachable():
            return self.cluster.explain(error)
        return error


def resolve_target(topology: TopologyRequest = None, cluster: ClusterRequest = None,
                   trusted_network: bool = False) -> Target:
    """Topology + cluster -> the devices compiled graphs run on; TopologyError when they cannot run.

    `cluster`: None (then `TF_CONFIG` when it is set), "tf_config", a ClusterResolver, a ClusterSpec
    or a cluster file."""
    from tag_tf.compiler import DeviceMap
    from tag_tf.errors import ClusterError
    from tag_tf.runtime import roles
    from tag_tf.runtime.cluster import ClusterSpec, check_trusted, cpu_topology
    from tag_tf.topology import load_topology, local

    role = None
    if cluster is None:
        role = roles.from_tf_config()
    elif isinstance(cluster, str) and cluster.lower() == "tf_config":
        role = roles.from_tf_config()
        if role is None:
            raise ClusterError("cluster='tf_config': TF_CONFIG is not set, or names a cluster of one task")
    elif roles.is_resolver(cluster):
        role = roles.from_resolver(cluster)
    if role is not None:
        cluster = role.spec
    if cluster is not None:
        spec = cluster if isinstance(cluster, ClusterSpec) else ClusterSpec.load(os.fspath(cluster))
        check_trusted(spec, trusted_network)
        # Without a topology, a placeholder until the servers are asked (`Target.discovered`).
        topo = cpu_topology(len(spec.tasks), spec.cpus_per_task) if topology is None else load_topology(topology)
        return cluster_target(topo, spec, role, discover=topology is None)
    topo = local() if topology is None else load_topology(topology)
    _check_runs_here(topo)
    if all(d.type == "cpu" for d in topo.devices):
        return Target(topo, DeviceMap.local_cpus(topo.num_devices), None, topo.num_devices)
    return Target(topo, DeviceMap.for_topology(topo, job="localhost"), None, 1)


def cluster_target(topo: Topology, spec: ClusterSpec, role: Role | None = None, discover: bool = False) -> Target:
    """The Target running `topo` on the servers of `spec` (TopologyError when they do not match)."""
    from tag_tf.compiler import DeviceMap

    if topo.num_machines != len(spec.tasks):
        raise TopologyError(f"topology {topo.name!r} has {topo.num_machines} machine(s) but the cluster has "
                            f"{len(spec.tasks)} task(s); task i runs machine i, so they must match")
    for m in topo.machines:
        if all(g.type == "cpu" for g in m.gpus) and m.num_gpus > spec.cpus_per_task:
            raise TopologyError(f"topology {topo.name!r}: machine {m.name!r} has {m.num_gpus} CPU devices "
                                f"but the cluster's servers have cpus_per_task={spec.cpus_per_task}")
    return Target(topo, DeviceMap.for_topology(topo, job=spec.job), spec, role=role, discover=discover)


def _check_runs_here(topo: Topology) -> None:
    """A topology runs in this process only if it is one machine whose GPUs are all present."""
    import tensorflow as tf

    gpus = [d.type for d in topo.devices if d.type != "cpu"]
    present = len(tf.config.list_physical_devices("GPU"))
    if topo.num_machines == 1 and len(gpus) <= present:
        return
    kinds = ", ".join(f"{gpus.count(t)}x {t}" for t in dict.fromkeys(gpus)) or "CPU devices"
    raise TopologyError(
        f"topology {topo.name!r} ({topo.num_machines} machine(s), {kinds}) does not match the devices "
        f"present (1 machine, {present} GPU(s)): such topologies can be planned and simulated but not run "
        f"here; to run it pass cluster= with one server per machine")


def _links_text(links: dict) -> str:
    bws = [float(p["bandwidth"]) * 8 / 1e9 for p in links.get("pairs") or []] or [links["bandwidth"] * 8 / 1e9]
    return f"{min(bws):.3g} Gbps" if max(bws) <= 1.2 * min(bws) else f"{min(bws):.3g}-{max(bws):.3g} Gbps"
