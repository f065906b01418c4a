"""A running emulated cluster: `Emulation(cluster)` builds it on entry (namespaces, bridge, shaped
links, cgroups), starts commands on its hosts, measures what each host really gets, and removes
everything on exit, whatever ended it (an error while building included).

    with Emulation(load_cluster("hetero.yaml")) as emu:
        print(emu.measure().render())
        code = emu.run_everywhere(["python", "train.py"], timeout_s=600)
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import IO

from tag_tf.context import EMULATED_HOST_ENV
from tag_tf.emulate import system
from tag_tf.emulate.spec import EmulatedCluster
from tag_tf.errors import EmulationError

_COUNTER = itertools.count()
PROBE_PORT = 5201
CPU_PROBE_ITERATIONS = 3_000_000


@dataclasses.dataclass(frozen=True)
class Measured:
    """What the hosts of an emulated cluster really get, measured at the operating-system level."""

    cpu_speed: tuple[float, ...]                  # one host alone, against the launcher (1.0 = unlimited)
    bandwidth: dict[tuple[int, int], float]       # (i, j) -> bytes/s from i to j
    rtt: dict[tuple[int, int], float]             # (i, j) -> seconds
    names: tuple[str, ...]
    configured: dict[tuple[int, int], float | None]
    duplex: dict[tuple[int, int], float] = dataclasses.field(default_factory=dict)   # i -> j while j -> i runs too

    def to_dict(self) -> dict[str, object]:
        def bps(x: float | None) -> float | None:
            return None if x is None else x * 8

        return {"hosts": [{"name": n, "cpu_speed": s} for n, s in zip(self.names, self.cpu_speed)],
                "links": [{"from": self.names[i], "to": self.names[j], "bandwidth_bps": b * 8,
                           "configured_bps": bps(self.configured[(i, j)]), "rtt_s": self.rtt[(i, j)],
                           **({"both_ways_bps": self.duplex[(i, j)] * 8} if (i, j) in self.duplex else {})}
                          for (i, j), b in sorted(self.bandwidth.items())]}

    def render(self) -> str:
        from tag_tf.topology.units import format_bandwidth

        lines = ["host          cpu speed (1.0 = this machine's launcher)"]
        lines += [f"{n:<13} {s:6.2f}x" for n, s in zip(self.names, self.cpu_speed)]
        lines.append("link                       measured      both ways at once  configured    round trip")
        for (i, j), b in sorted(self.bandwidth.items()):
            conf = self.configured[(i, j)]
            both = format_bandwidth(self.duplex[(i, j)]) if (i, j) in self.duplex else "-"
            lines.append(f"{self.names[i] + ' -> ' + self.names[j]:<26} {format_bandwidth(b):<13} {both:<18} "
                         f"{'unshaped' if conf is None else format_bandwidth(conf):<13} {self.rtt[(i, j)] * 1e6:.0f} us")
        return "\n".join(lines)


class Emulation:
    """An emulated cluster on this machine (root), built on `__enter__`, removed on `__exit__`."""

    def __init__(self, cluster: EmulatedCluster, tag: str | None = None):
        self.cluster = cluster
        self.tag = tag or f"{os.getpid()}{_letters(next(_COUNTER))}"
        self.switch = f"{system.PREFIX}{self.tag}-sw"
        self.hosts = [f"{system.PREFIX}{self.tag}-{i}" for i in range(len(cluster.hosts))]
        self.built_ns: list[str] = []
        self.built_cgroups: list[str] = []
        self.processes: list[subprocess.Popen] = []
        self.cpusets: list[str | None] = []

    # -- building and removing ----------------------------------------------------------------
    def __enter__(self) -> Emulation:
        missing = system.requirements_missing()
        if missing:
            raise EmulationError(missing)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        c = self.cluster
        taken = [ns for ns in system.namespaces() if ns.startswith(f"{system.PREFIX}{self.tag}-")]
        if taken:
            raise EmulationError(f"namespace {taken[0]} exists already: run `tag-tf emulate --cleanup`")
        system.add_namespace(self.switch)
        self.built_ns.append(self.switch)
        system.add_bridge(self.switch)
        cores = _cores()
        self.cpusets = c.cpusets(cores)
        for i, host in enumerate(c.hosts):
            ns = self.hosts[i]
            system.add_namespace(ns)
            self.built_ns.append(ns)
            system.add_port(self.switch, f"h{i}", ns, f"{c.address(i)}/24")
            others = {c.address(j): c.bandwidth(i, j) for j in range(len(c.hosts)) if j != i}
            per_destination = {a: bw for a, bw in others.items() if bw is not None and bw != host.nic}
            system.shape_egress(ns, "eth0", host.nic, per_destination)    # what host i sends
            if host.nic is not None:
                system.shape_ingress(self.switch, f"h{i}", host.nic)         # what host i receives
            self.built_cgroups.append(ns)
            system.add_cgroups(ns, host.cpu, self.cpusets[i])

    def close(self) -> None:
        """Stop every process started here and remove every namespace and cgroup made here."""
        for p in self.processes:
            if p.poll() is None:
                _kill_group(p)
        left = system.remove(self.built_ns, self.built_cgroups)
        self.built_ns, self.built_cgroups = [], []
        if left:
            raise EmulationError(f"could not remove {', '.join(left)}; run `tag-tf emulate --cleanup`")

    # -- running ------------------------------------------------------------------------------
    def command(self, i: int, argv: Sequence[str]) -> list[str]:
        """`argv` as host i runs it: joins the host's cgroups, then its namespace (`ip netns exec`
        remounts /sys, so the cgroups are joined first)."""
        joins = " && ".join(f"echo $$ > {system.cgroup_path(ctl, self.hosts[i])}/cgroup.procs"
                            for ctl in system.CONTROLLERS)
        return ["sh", "-c", f'{joins} && exec ip netns exec {self.hosts[i]} "$@"', "sh", *argv]

    def environment(self, i: int, env: dict[str, str] | None = None) -> dict[str, str]:
        out = dict(os.environ if env is None else env)
        out["TF_CONFIG"] = self.cluster.tf_config(i)
        out[EMULATED_HOST_ENV] = self.cluster.hosts[i].name
        return out

    def spawn(self, i: int, argv: Sequence[str], *, env: dict[str, str] | None = None, tf_config: bool = True,
              stdout: int | IO | None = subprocess.PIPE, stderr: int | IO | None = subprocess.STDOUT
              ) -> subprocess.Popen:
        """Start `argv` on host i (its own process group), with its TF_CONFIG unless `tf_config` is False."""
        environment = self.environment(i, env) if tf_config else dict(os.environ if env is None else env)
        p = subprocess.Popen(self.command(i, argv), env=environment, stdout=stdout, stderr=stderr,
                             stdin=subprocess.DEVNULL, start_new_session=True, text=True)
        self.processes.append(p)
        return p

    def run_everywhere(self, argv: Sequence[str], *, timeout_s: float, env: dict[str, str] | None = None,
                       out: Callable[[str], None] = print, keep_going: bool = False,
                       restart_after_s: float | None = None) -> int:
        """`argv` on every host at once, each line of output prefixed with its host's name. Returns
        0 when every host's command succeeded; the first failure's exit code otherwise; 124 when
        `timeout_s` passed first. By default a failed host stops the others (they would wait for it
        until their own deadlines). With `keep_going` (elastic runs) the others run on, and every
        host's exit code is reported at the end; `restart_after_s` (implies `keep_going`) starts a
        failed host's command again, once, that many seconds after it ended (a machine that comes
        back, with its TF_CONFIG)."""
        keep_going = keep_going or restart_after_s is not None
        names = [h.name for h in self.cluster.hosts]
        width = max(len(n) for n in names)
        lock = threading.Lock()
        threads: list[threading.Thread] = []

        def start(k: int) -> subprocess.Popen:
            p = self.spawn(k, argv, env=env)
            stream = p.stdout
            assert stream is not None

            def pump() -> None:
                for line in stream:
                    with lock:
                        out(f"[{names[k]:<{width}}] {line.rstrip()}")
            threads.append(threading.Thread(target=pump, daemon=True))
            threads[-1].start()
            return p

        procs = [start(i) for i in range(len(names))]
        history: list[list[int]] = [[] for _ in names]      # exit codes of commands that ended, per host
        restart_at: dict[int, float] = {}
        deadline = time.monotonic() + timeout_s
        code = 0
        try:
            code = self._supervise(procs, names, history, restart_at, (deadline, timeout_s), keep_going,
                                   restart_after_s, start, out)
        finally:
            for p in procs:
                if p.poll() is None:
                    _kill_group(p)
            for t in threads:
                t.join(timeout=2.0)
        if keep_going:
            codes = ", ".join(f"{n} {'->'.join(map(str, history[k])) or 'killed'}" for k, n in enumerate(names))
            out(f"[emulate] exit codes: {codes}")
        return code

    @staticmethod
    def _supervise(procs: list[subprocess.Popen], names: list[str], history: list[list[int]],
                   restart_at: dict[int, float], deadline: tuple[float, float], keep_going: bool,
                   restart_after_s: float | None,
                   start: Callable[[int], subprocess.Popen], out: Callable[[str], None]) -> int:
        """Wait for the hosts' commands, restarting failed ones where asked (see `run_everywhere`);
        returns its exit code. `procs[k]` is host k's current command, `history[k]` its ended ones'."""
        done = [False] * len(procs)
        while True:
            now = time.monotonic()
            for k, p in enumerate(procs):
                c = None if done[k] else p.poll()
                if c is None:
                    continue
                done[k] = True
                history[k].append(c)
                if c == 0:
                    continue
                if not keep_going:
                    out(f"[emulate] host {names[k]} exited with code {c}: stopping the others")
                    return c
                if restart_after_s is not None and len(history[k]) == 1:
                    restart_at[k] = now + restart_after_s
                    out(f"[emulate] host {names[k]} exited with code {c}: starting it again in {restart_after_s:g} s")
                else:
                    out(f"[emulate] host {names[k]} exited with code {c}; the others run on")
            for k, at in list(restart_at.items()):
                if now >= at:
                    del restart_at[k]
                    procs[k], done[k] = start(k), False
                    out(f"[emulate] host {names[k]} started again")
            if all(done) and not restart_at:
                return next((h[-1] for h in history if h[-1] != 0), 0)
            if now > deadline[0]:
                out(f"[emulate] the command ran past its {deadline[1]:.0f} s: stopping every host")
                return 124
            time.sleep(0.05)

    # -- measuring ----------------------------------------------------------------------------
    def measure(self, seconds_per_link: float = 0.5) -> Measured:
        """Each host's CPU speed (alone, against the launcher's own) and every ordered pair's
        bandwidth and round trip, measured at the operating-system level."""
        py = [sys.executable, "-m", "tag_tf.emulate.probe"]
        n = len(self.cluster.hosts)

        def cpu_seconds(i: int | None) -> float:
            argv = [*py, "cpu", str(CPU_PROBE_ITERATIONS)]
            cmd = argv if i is None else self.command(i, argv)
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
            if done.returncode != 0:
                raise EmulationError(f"cpu probe on {'the launcher' if i is None else self.cluster.hosts[i].name} "
                                     f"failed: {done.stderr.strip().splitlines()[-1:]}")
            return float(json.loads(done.stdout)["seconds"])

        reference = statistics.median(cpu_seconds(None) for _ in range(3))
        speed = tuple(reference / statistics.median(cpu_seconds(i) for _ in range(3)) for i in range(n))
        bandwidth: dict[tuple[int, int], float] = {}
        rtt: dict[tuple[int, int], float] = {}
        duplex: dict[tuple[int, int], float] = {}
        servers = [self.spawn(j, [*py, "serve", self.cluster.address(j), str(PROBE_PORT)], tf_config=False)
                   for j in range(n)]
        try:
            for p in servers:
                assert p.stdout is not None
                line = p.stdout.readline()
                if "listening" not in line:
                    raise EmulationError(f"link probe server did not start: {line.strip() or p.poll()}")
            for i in range(n):
                for j in range(n):
                    if i != j:
                        r = self._send(i, j, self._probe_bytes(i, j, seconds_per_link)).result()
                        rtt[(i, j)] = r["rtt_s"]
                        bandwidth[(i, j)] = r["bytes"] / max(r["seconds"] - r["rtt_s"], 1e-9)
            for i in range(n):           # both ways at once: what a collective or a pipeline asks of a link
                for j in range(i + 1, n):
                    nbytes = self._probe_bytes(i, j, seconds_per_link)
                    there, back = self._send(i, j, nbytes), self._send(j, i, nbytes)
                    for key, probe in (((i, j), there), ((j, i), back)):
                        r = probe.result()
                        duplex[key] = r["bytes"] / max(r["seconds"] - r["rtt_s"], 1e-9)
        finally:
            for p in servers:
                _kill_group(p)
        configured = {k: self.cluster.bandwidth(*k) for k in bandwidth}
        return Measured(speed, bandwidth, rtt, tuple(h.name for h in self.cluster.hosts), configured, duplex)

    def _probe_bytes(self, i: int, j: int, seconds: float) -> int:
        conf = self.cluster.bandwidth(i, j)
        return int(min(max((conf or 1e9) * seconds, 256 << 10), 256 << 20))

    def _send(self, i: int, j: int, nbytes: int) -> _Probe:
        """Start the link probe from host i to host j's probe server (`probe.py send`)."""
        argv = [sys.executable, "-m", "tag_tf.emulate.probe", "send", self.cluster.address(j), str(PROBE_PORT), str(nbytes)]
        what = f"link probe {self.cluster.hosts[i].name} -> {self.cluster.hosts[j].name}"
        return _Probe(subprocess.Popen(self.command(i, argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                       start_new_session=True),
                      what)


class _Probe:
    """A running `probe.py send`: its JSON result, or an EmulationError naming the link."""

    def __init__(self, proc: subprocess.Popen, what: str):
        self.proc, self.what = proc, what

    def result(self, timeout_s: float = 120.0) -> dict:
        try:
            out, err = self.proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(self.proc)
            raise EmulationError(f"{self.what} did not finish in {timeout_s:.0f} s") from None
        if self.proc.returncode != 0:
            raise EmulationError(f"{self.what} failed: {err.strip().splitlines()[-1:]}")
        return json.loads(out)


def _kill_group(p: subprocess.Popen) -> None:
    """SIGTERM to the process group, SIGKILL after a grace period (a `timeout` or `sh` wrapper
    killed alone would leave its child running)."""
    import signal

    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(p.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            p.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


def _cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def _letters(k: int) -> str:
    out = ""
    while True:
        out = chr(ord("a") + k % 26) + out
        k = k // 26 - 1
        if k < 0:
            return out
