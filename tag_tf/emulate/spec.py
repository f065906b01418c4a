"""The emulated cluster file (YAML or JSON)::

    name: compute-hetero          # optional
    subnet: 10.77.0.0/24          # optional: the private /24 inside the cluster's own namespaces
    port: 2222                    # optional: every task's server port (each host has its own address)
    hosts:
      - name: fast
        cpu: 1.0                  # CPU time in cores (cgroup v1 CFS quota; 0.25 = a quarter of a core)
        cpus: "0"                 # optional: the cores it may run on (cpuset); default: packed by quota
        nic: 1Gbps                # optional: its link to the switch, both directions; default unshaped
      - {name: slow, cpu: 0.25, nic: 50Mbps}
    links:                        # optional: bandwidth of a pair (both directions), below the NICs
      - {between: [fast, slow], bandwidth: 20Mbps}

Every error is an EmulationError naming the file and the field.
"""
from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import NoReturn, cast

from tag_tf.errors import EmulationError
from tag_tf.topology.units import BANDWIDTH_UNITS, UnitError, parse_bandwidth

DEFAULT_SUBNET = "10.77.0.0/24"
DEFAULT_PORT = 2222
CORE_HEADROOM = 0.1        # of a core several hosts share, what their quotas leave free (`cpusets`)
_TOP_KEYS = ("name", "subnet", "port", "hosts", "links")
_HOST_KEYS = ("name", "cpu", "cpus", "nic")
_LINK_KEYS = ("between", "bandwidth")


@dataclasses.dataclass(frozen=True)
class Host:
    name: str
    cpu: float | None            # cores of CPU time (None: unlimited)
    cpus: str | None             # cpuset (None: chosen by `EmulatedCluster.cpusets`)
    nic: float | None            # bytes/s (None: unshaped)


@dataclasses.dataclass(frozen=True)
class EmulatedCluster:
    name: str
    hosts: tuple[Host, ...]
    links: Mapping[tuple[int, int], float]     # (i, j), i < j -> bytes/s
    subnet: str = DEFAULT_SUBNET
    port: int = DEFAULT_PORT

    def address(self, i: int) -> str:
        """Host i's address: the subnet's (i + 1)-th; the last usable address is left to nobody."""
        return str(ipaddress.ip_network(self.subnet)[i + 1])

    def bandwidth(self, i: int, j: int) -> float | None:
        """The configured bandwidth from host i to host j (bytes/s), None where nothing shapes it."""
        limits = [b for b in (self.hosts[i].nic, self.hosts[j].nic, self.links.get((min(i, j), max(i, j))))
                  if b is not None]
        return min(limits) if limits else None

    def tf_config(self, i: int) -> str:
        """Host i's TF_CONFIG: one `worker` job, task 0 the chief (MultiWorkerMirroredStrategy's convention)."""
        workers = [f"{self.address(k)}:{self.port}" for k in range(len(self.hosts))]
        return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": i}})

    def cpusets(self, cores: Sequence[int]) -> list[str | None]:
        """Each host's cpuset: as given, else packed first-fit by quota onto `cores` (the machine's),
        so that hosts whose quotas fit beside each other do not also compete for one core; None
        where the quotas do not fit (every core, the quota alone limits it). A core shared by
        several hosts keeps CORE_HEADROOM of it free: the kernel moves every emulated link's packets
        (veth, bridge, shaping) on the sending core, outside any host's quota, and on a core the
        quotas fill that time comes out of the hosts' own."""
        load = {c: 0.0 for c in cores}
        out: list[str | None] = []
        for h in self.hosts:
            if h.cpus is not None:
                out.append(h.cpus)
                continue
            need = h.cpu if h.cpu is not None else float(len(cores))
            if need <= 1.0:
                core = next((c for c in cores if load[c] == 0.0 or load[c] + need <= 1.0 - CORE_HEADROOM + 1e-9),
                            None)
                if core is not None:
                    load[core] += need
                    out.append(str(core))
                    continue
            out.append(None)
        return out

    def to_dict(self) -> dict[str, object]:
        names = [h.name for h in self.hosts]
        return {"name": self.name, "subnet": self.subnet, "port": self.port,
                "hosts": [{"name": h.name, "cpu": h.cpu, "cpus": h.cpus,
                           "nic_bps": None if h.nic is None else h.nic * 8} for h in self.hosts],
                "links": [{"between": [names[i], names[j]], "bandwidth_bps": b * 8}
                          for (i, j), b in sorted(self.links.items())]}


def load_cluster(source: str | Mapping[str, object]) -> EmulatedCluster:
    """An EmulatedCluster from a YAML/JSON file path or a dict of the same structure."""
    if isinstance(source, Mapping):
        return _Reader("emulated cluster").cluster(source, "cluster")
    try:
        with open(source) as f:
            text = f.read()
    except OSError as e:
        raise EmulationError(f"emulated cluster file {source}: {e.strerror}") from None
    import yaml  # type: ignore[import-untyped]

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise EmulationError(f"emulated cluster file {source}: not YAML/JSON ({e})") from None
    default = os.path.splitext(os.path.basename(source))[0]
    return _Reader(f"emulated cluster file {source}").cluster(data, default)


class _Reader:
    def __init__(self, where: str):
        self.where = where

    def fail(self, field: str, msg: str) -> NoReturn:
        raise EmulationError(f"{self.where}: {field}: {msg}")

    def mapping(self, value: object, field: str, keys: tuple[str, ...]) -> Mapping[str, object]:
        if not isinstance(value, Mapping):
            self.fail(field, f"expected a mapping, got {type(value).__name__}")
        unknown = sorted(set(value) - set(keys))
        if unknown:
            self.fail(field, f"unknown key {unknown[0]!r} (known: {', '.join(keys)})")
        return value

    def bandwidth(self, value: object, field: str) -> float:
        try:
            bw = parse_bandwidth(value, BANDWIDTH_UNITS["Mbps"])
        except UnitError as e:
            self.fail(field, str(e))
        if not bw > 0:
            self.fail(field, f"expected a positive bandwidth, got {value!r}")
        return bw

    def cluster(self, data: object, default_name: str) -> EmulatedCluster:
        d = self.mapping(data, "cluster", _TOP_KEYS)
        hosts_in = d.get("hosts")
        if not isinstance(hosts_in, list) or not hosts_in:
            self.fail("hosts", "expected a non-empty list of hosts")
        hosts = [self.host(h, k) for k, h in enumerate(hosts_in)]
        names = [h.name for h in hosts]
        if len(set(names)) != len(names):
            self.fail("hosts", f"host names must be unique: {names}")
        subnet = str(d.get("subnet", DEFAULT_SUBNET))
        try:
            net = ipaddress.ip_network(subnet)
        except ValueError as e:
            self.fail("subnet", str(e))
        if net.version != 4 or net.prefixlen != 24 or not net.is_private:
            self.fail("subnet", f"expected a private IPv4 /24 such as {DEFAULT_SUBNET}, got {subnet}")
        port = d.get("port", DEFAULT_PORT)
        if isinstance(port, bool) or not isinstance(port, int) or not 1024 <= port < 65536:
            self.fail("port", f"expected a port number in 1024..65535, got {port!r}")
        links: dict[tuple[int, int], float] = {}
        # `links` is a list as the format says (not checked here: mapping() checks each entry)
        for k, link in enumerate(cast("Iterable[object]", d.get("links") or [])):
            field = f"links[{k}]"
            m = self.mapping(link, field, _LINK_KEYS)
            pair = m.get("between")
            if not isinstance(pair, list) or len(pair) != 2 or pair[0] == pair[1] or \
                    any(p not in names for p in pair):
                self.fail(f"{field}.between", f"expected two different host names of {names}, got {pair!r}")
            i, j = sorted(names.index(p) for p in pair)
            if "bandwidth" not in m:
                self.fail(f"{field}.bandwidth", "missing")
            links[(i, j)] = self.bandwidth(m["bandwidth"], f"{field}.bandwidth")
        return EmulatedCluster(str(d.get("name") or default_name), tuple(hosts), links, subnet, int(port))

    def host(self, value: object, k: int) -> Host:
        field = f"hosts[{k}]"
        h = self.mapping(value, field, _HOST_KEYS)
        name = h.get("name", f"h{k}")
        if not isinstance(name, str) or not name.replace("-", "").replace("_", "").isalnum():
            self.fail(f"{field}.name", f"expected a name of letters, digits, - and _, got {name!r}")
        cpu = h.get("cpu")
        if cpu is not None and (isinstance(cpu, bool) or not isinstance(cpu, (int, float)) or not 0.01 <= cpu <= 1024):
            self.fail(f"{field} ({name}).cpu", f"expected cores of CPU time between 0.01 and 1024, got {cpu!r}")
        cpus = h.get("cpus")
        if cpus is not None:
            cpus = str(cpus)
            if not all(part.replace("-", "").isdigit() for part in cpus.split(",")):
                self.fail(f"{field} ({name}).cpus", f"expected a cpuset list such as 0 or 0-1 or 0,2, got {cpus!r}")
        nic = self.bandwidth(h["nic"], f"{field} ({name}).nic") if h.get("nic") is not None else None
        return Host(name, None if cpu is None else float(cpu), cpus, nic)
