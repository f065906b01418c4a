"""The Linux plumbing of an emulated cluster: network namespaces, veth pairs, a bridge, traffic
shaping (tc htb: a class per link, small packets first) and cgroup v1 CPU quotas and cpusets;
what a cluster needs checked first, and everything it made found again and removed (also what a
SIGKILLed launcher left).

Everything an emulation makes is named `tagtf-<tag>-...`, where <tag> starts with the launcher's
pid: `stale()` finds what belongs to launchers that are gone.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence

from tag_tf.errors import EmulationError

PREFIX = "tagtf-"
CGROUP_ROOT = "/sys/fs/cgroup"
CONTROLLERS = ("cpu", "cpuset")
CFS_PERIOD_US = 10_000        # a short period: a quota-limited task waits at most ~10 ms at a time
_NAME = re.compile(rf"^{PREFIX}(\d+)([a-z]*)-")


def requirements_missing() -> str | None:
    """One line saying what this machine lacks for an emulated cluster, or None."""
    if os.geteuid() != 0:
        return "emulated clusters need root (network namespaces, tc and cgroups); run as root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"emulated clusters need the `{tool}` command (iproute2), which is not on PATH"
    for controller in CONTROLLERS:
        path = os.path.join(CGROUP_ROOT, controller)
        if not os.path.isdir(path) or not os.access(path, os.W_OK):
            return f"emulated clusters need the cgroup v1 {controller} controller mounted writable at {path}"
    if not os.path.isdir("/proc/self/ns") or not os.path.exists("/proc/self/ns/net"):
        return "emulated clusters need network namespaces, which this kernel does not offer"
    return None


def run(argv: Sequence[str], what: str, check: bool = True) -> subprocess.CompletedProcess:
    """Run a plumbing command; an EmulationError naming `what` and the command's own message on failure."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=30)
    except subprocess.TimeoutExpired:
        raise EmulationError(f"{what}: `{' '.join(argv)}` did not finish in 30 s") from None
    if check and done.returncode != 0:
        message = (done.stderr or done.stdout).strip().splitlines()
        raise EmulationError(f"{what}: `{' '.join(argv)}` failed: {message[-1] if message else done.returncode}")
    return done


# ---------------------------------------------------------------------------------------------
# Namespaces and links
# ---------------------------------------------------------------------------------------------
def namespaces() -> list[str]:
    out = run(["ip", "netns", "list"], "listing network namespaces").stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def add_namespace(name: str) -> None:
    run(["ip", "netns", "add", name], f"creating network namespace {name}")
    run(["ip", "-n", name, "link", "set", "lo", "up"], f"namespace {name}: loopback up")


def add_bridge(ns: str, bridge: str = "br0") -> None:
    run(["ip", "-n", ns, "link", "add", bridge, "type", "bridge"], f"namespace {ns}: bridge {bridge}")
    run(["ip", "-n", ns, "link", "set", bridge, "up"], f"namespace {ns}: bridge {bridge} up")


def add_port(switch_ns: str, port: str, host_ns: str, address: str, bridge: str = "br0") -> None:
    """A veth pair made inside the two namespaces (never in the caller's): `port` on the switch's
    bridge, `eth0` in the host with `address` (a /24)."""
    run(["ip", "link", "add", port, "netns", switch_ns, "type", "veth", "peer", "name", "eth0", "netns", host_ns],
        f"veth {port} between {switch_ns} and {host_ns}")
    run(["ip", "-n", switch_ns, "link", "set", port, "master", bridge, "up"], f"namespace {switch_ns}: {port} up")
    run(["ip", "-n", host_ns, "addr", "add", address, "dev", "eth0"], f"namespace {host_ns}: address {address}")
    run(["ip", "-n", host_ns, "link", "set", "eth0", "up"], f"namespace {host_ns}: eth0 up")


def _rate(bytes_per_s: float) -> str:
    return f"{max(int(bytes_per_s * 8), 8000)}bit"


def _burst(bytes_per_s: float) -> int:
    """A small bucket (a large one lets a short transfer through at several times the rate), yet one
    that holds a GSO segment and the bytes of one 4 ms timer tick at the rate."""
    return int(max(64 << 10, bytes_per_s * 0.004))


SMALL_PACKET = 256                # bytes (IP total length): below this a packet is an ACK or a bare control packet
SMALL_SHARE = 0.05                # of a shaped link's rate, assured to its small packets (they may borrow it all)
QUEUE_S = 0.1                     # a shaped link queues at most this many seconds of its rate (3 buckets at least)


def _link_classes(k: int) -> tuple[str, str, str]:
    """The htb classids of shaped link k on a device: the link, its small packets', its bulk's."""
    return f"1:{0x100 + k:x}", f"1:{0x200 + k:x}", f"1:{0x300 + k:x}"


def _shaped_link(ns: str, dev: str, k: int, rate: float, parent: str, what: str) -> tuple[str, str]:
    """One shaped link under htb `parent`: an htb class at `rate` with two leaves, small packets first
    (SMALL_PACKET) and the rest behind a byte-limited queue (QUEUE_S). Returns the leaves' classids
    (small, bulk).

    The small packets' own leaf is what makes the link full duplex: a flow's ACKs and gRPC's
    flow-control frames travel against the traffic of the other direction, and behind one queue of
    it they wait as long as that queue is (100 ms here). TensorFlow moving 4 MB each way at once
    between two hosts over 50 Mbit/s took 816-907 ms where one way took 670 ms (plain TCP flows:
    670-1057 ms, varying); with small packets first both ways took 672 ms."""
    link, small, bulk = _link_classes(k)
    burst = str(_burst(rate))
    run(["tc", "-n", ns, "class", "add", "dev", dev, "parent", parent, "classid", link, "htb",
         "rate", _rate(rate), "ceil", _rate(rate), "burst", burst], what)
    run(["tc", "-n", ns, "class", "add", "dev", dev, "parent", link, "classid", small, "htb",
         "rate", _rate(rate * SMALL_SHARE), "ceil", _rate(rate), "burst", burst, "prio", "0"], what)
    run(["tc", "-n", ns, "class", "add", "dev", dev, "parent", link, "classid", bulk, "htb",
         "rate", _rate(rate * (1 - SMALL_SHARE)), "ceil", _rate(rate), "burst", burst, "prio", "1"], what)
    limit = int(max(3 * _burst(rate), rate * QUEUE_S))
    run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", bulk, "bfifo", "limit", str(limit)], what)
    return small, bulk


def _small_match() -> list[str]:
    """u32 match: the IP total length below SMALL_PACKET (its high bits zero)."""
    return ["match", "u16", "0x0000", f"0x{0xffff & ~(SMALL_PACKET - 1):04x}", "at", "2"]


def shape_egress(ns: str, dev: str, default: float | None, per_destination: dict[str, float]) -> None:
    """Shape what leaves `dev`: a shaped link (`_shaped_link`) per destination address with its own
    rate, the rest at `default` (None: unshaped, 100 Gbit/s). Nothing is added when nothing is shaped."""
    if default is None and not per_destination:
        return
    what = f"namespace {ns}: shaping {dev}"
    tc = ["tc", "-n", ns]
    default_bulk = _link_classes(0)[2]           # what no filter matches: link 0's bulk leaf
    run(tc + ["qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", default_bulk.split(":")[1]], what)
    small, _ = _shaped_link(ns, dev, 0, default if default is not None else 100e9 / 8, "1:", what)
    for k, (address, rate) in enumerate(sorted(per_destination.items()), start=1):
        small_k, bulk_k = _shaped_link(ns, dev, k, rate, "1:", what)
        to = ["match", "ip", "dst", f"{address}/32"]
        run(tc + ["filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "1", "u32", *to,
                  *_small_match(), "flowid", small_k], what)
        run(tc + ["filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "2", "u32", *to,
                  "flowid", bulk_k], what)
    run(tc + ["filter", "add", "dev", dev, "parent", "1:", "protocol", "ip", "prio", "3", "u32", *_small_match(),
              "flowid", small], what)


def shape_ingress(ns: str, dev: str, rate: float) -> None:
    """Shape what leaves `dev` on the switch's side (a host's download): one shaped link."""
    shape_egress(ns, dev, rate, {})


def namespace_pids(ns: str) -> list[int]:
    done = run(["ip", "netns", "pids", ns], f"listing processes of {ns}", check=False)
    return [int(p) for p in done.stdout.split() if p.isdigit()]


def delete_namespace(ns: str) -> None:
    run(["ip", "netns", "del", ns], f"deleting network namespace {ns}", check=False)


# ---------------------------------------------------------------------------------------------
# cgroups
# ---------------------------------------------------------------------------------------------
def cgroup_path(controller: str, name: str) -> str:
    return os.path.join(CGROUP_ROOT, controller, name)


def _write(path: str, value: str) -> None:
    try:
        with open(path, "w") as f:
            f.write(value)
    except OSError as e:
        raise EmulationError(f"writing {value!r} to {path}: {e.strerror}") from None


def _read(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def add_cgroups(name: str, cpu: float | None, cpus: str | None) -> None:
    """The cpu cgroup `name` with a CFS quota of `cpu` cores (None: none), and the cpuset cgroup
    `name` on `cpus` (None: the parent's)."""
    for controller in CONTROLLERS:
        try:
            os.makedirs(cgroup_path(controller, name), exist_ok=True)
        except OSError as e:
            raise EmulationError(f"creating cgroup {controller}/{name}: {e.strerror}") from None
    cpu_dir = cgroup_path("cpu", name)
    _write(os.path.join(cpu_dir, "cpu.cfs_period_us"), str(CFS_PERIOD_US))
    _write(os.path.join(cpu_dir, "cpu.cfs_quota_us"), str(-1 if cpu is None else max(1000, int(cpu * CFS_PERIOD_US))))
    cpuset_dir = cgroup_path("cpuset", name)
    parent = os.path.join(CGROUP_ROOT, "cpuset")
    _write(os.path.join(cpuset_dir, "cpuset.cpus"), cpus if cpus is not None else _read(os.path.join(parent, "cpuset.cpus")))
    _write(os.path.join(cpuset_dir, "cpuset.mems"), _read(os.path.join(parent, "cpuset.mems")))


def cgroup_pids(name: str) -> list[int]:
    pids: set[int] = set()
    for controller in CONTROLLERS:
        with contextlib.suppress(OSError):
            pids.update(int(p) for p in _read(os.path.join(cgroup_path(controller, name), "cgroup.procs")).split())
    return sorted(pids)


def delete_cgroup(name: str) -> bool:
    """Remove the cgroup from both controllers; False where one still holds processes."""
    ok = True
    for controller in CONTROLLERS:
        path = cgroup_path(controller, name)
        if os.path.isdir(path):
            try:
                os.rmdir(path)
            except OSError:
                ok = False
    return ok


def cgroups() -> list[str]:
    found: set[str] = set()
    for controller in CONTROLLERS:
        with contextlib.suppress(OSError):
            found.update(n for n in os.listdir(os.path.join(CGROUP_ROOT, controller)) if n.startswith(PREFIX))
    return sorted(found)


# ---------------------------------------------------------------------------------------------
# Processes and removal
# ---------------------------------------------------------------------------------------------
def kill_all(pids: Iterable[int], grace_s: float = 3.0) -> None:
    """SIGTERM, then SIGKILL for what is still there after `grace_s`."""
    pids = [p for p in set(pids) if p != os.getpid()]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        deadline = time.monotonic() + (grace_s if sig == signal.SIGTERM else 5.0)
        while time.monotonic() < deadline:
            pids = [p for p in pids if _alive(p)]
            if not pids:
                return
            time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:            # a zombie child of ours counts as gone once reaped
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().split(")")[-1].split()[0] != "Z"
        except OSError:
            return False


def owner_alive(name: str) -> bool:
    """Whether the launcher that made `name` (a tagtf- name) is still running."""
    m = _NAME.match(name)
    return m is not None and _alive(int(m.group(1)))


def remove(netns: Iterable[str], groups: Iterable[str]) -> list[str]:
    """Kill every process in these namespaces and cgroups, then remove them; what could not be removed."""
    netns, groups = list(netns), list(groups)
    pids = [p for ns in netns for p in namespace_pids(ns)] + [p for g in groups for p in cgroup_pids(g)]
    kill_all(pids)
    for ns in netns:
        delete_namespace(ns)
    left = [ns for ns in netns if ns in set(namespaces())]
    for g in groups:
        for _ in range(50):
            if delete_cgroup(g):
                break
            kill_all(cgroup_pids(g), grace_s=0.2)
            time.sleep(0.1)
        else:
            left.append(f"cgroup {g}")
    return left


def stale(everything: bool = False) -> tuple[list[str], list[str]]:
    """(namespaces, cgroups) made by emulations whose launcher is gone (all of them: `everything`)."""
    ns = [n for n in namespaces() if n.startswith(PREFIX) and (everything or not owner_alive(n))]
    groups = [g for g in cgroups() if everything or not owner_alive(g)]
    return ns, groups
