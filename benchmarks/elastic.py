"""Elastic runs on emulated heterogeneous clusters, MEASURED: lose a host mid-run and train on (root; CPU).

Each cluster is built with `tag_tf.emulate` (every host a network namespace behind a shaped link,
with its own CPU quota); every host runs the README example (examples/mnist_mlp_session.py, the MLP
at full size) unchanged with its TF_CONFIG, side by side in one run per cluster:

  elastic      TAG_TF_ELASTIC=1; the last host's command is SIGKILLed once the chief has printed step
               KILL_AT: the recovery (kill to the next step the chief completes), each phase as the
               chief logged it, steps lost (a step printed twice or never), the step time before the
               loss and after it (medians of the chief's step intervals), to step K; `--repeats`
               runs of it give the recovery's median. In the first, the killed host's command starts
               again (its TF_CONFIG) once the others go on: the step it came back at, and the step
               time after its return
  fresh        a fresh run of the same strategy on the surviving hosts alone (their own TF_CONFIG):
               its step time, and its time from launch to its first step (what a relaunch costs)
  restart-N    today's path without elastic: checkpoints every N steps (N = 50, 200), the same
               kill; every task stops, naming the lost host; the survivors are relaunched from the
               last checkpoint and run to step K: the total time to reach step K with one loss
  cost         elastic against not elastic on all hosts, no loss, interleaved: what atomic steps
               (every variable write after every collective) cost per step

The total time to reach step K is wall-clock from the first launch to the chief's step K line,
for elastic and for each restart-N.

Usage (root): python benchmarks/elastic.py [--clusters three,four] [--strategy auto] [--repeats 5]
                  [--steps 600] [--kill-at 125] [--batch 4096] [--quick]

At batch 4096 the MLP's step is long enough that `auto` spreads it over the hosts (at 512 and below it
keeps it on the fastest host, and a lost host would not matter).
Writes benchmarks/results/elastic.json (--quick: elastic_quick.json) and the RESULTS.md section.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from benchmarks.markdown import measured_when, replace_section, stamp  # noqa: E402

SCRIPT = os.path.join(ROOT, "examples", "mnist_mlp_session.py")
CLUSTERS = {
    # unequal speeds (quotas leave this 2-core machine room for the kernel's links and the launcher)
    "three": {"hosts": [{"name": "a", "cpu": 0.6, "nic": "1Gbps"}, {"name": "b", "cpu": 0.4, "nic": "1Gbps"},
                        {"name": "c", "cpu": 0.4, "nic": "1Gbps"}]},
    # ... and links: the last host behind a slower one
    "four": {"hosts": [{"name": "a", "cpu": 0.5, "nic": "1Gbps"}, {"name": "b", "cpu": 0.35, "nic": "1Gbps"},
                       {"name": "c", "cpu": 0.35, "nic": "1Gbps"}, {"name": "d", "cpu": 0.3, "nic": "500Mbps"}]},
}
CHECKPOINT_EVERY = (50, 200)
TIMEOUT_S = 600
BEGIN, END = "<!-- elastic:begin -->", "<!-- elastic:end -->"
STEP = re.compile(r"^step (\d+) loss ")
PHASES = re.compile(r"tag_tf: elastic: lost task\(s\) .*; (detect .*)$")
JOINED = re.compile(r"tag_tf: elastic: task\(s\) \S+ came back; generation \d+ goes on with \d+ task\(s\) from step (\d+)")


class Host:
    """One host's command on the emulated cluster, its output lines timestamped as they arrive."""

    def __init__(self, emu, i: int, argv: list[str], env: dict, tf_config: str | None):
        environment = dict(env)
        if tf_config is not None:
            environment["TF_CONFIG"] = tf_config
        self.start = time.monotonic()
        self.proc = emu.spawn(i, argv, env=environment, tf_config=False)
        self.lines: list[tuple[float, str]] = []
        self.thread = threading.Thread(target=self._pump, daemon=True)
        self.thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip()))

    def step_times(self) -> dict[int, float]:
        """Step number -> when the host printed it (the first time)."""
        out: dict[int, float] = {}
        for t, line in list(self.lines):
            m = STEP.match(line)
            if m:
                out.setdefault(int(m.group(1)), t)
        return out

    def steps_printed(self) -> list[int]:
        return [int(m.group(1)) for _, line in list(self.lines) if (m := STEP.match(line))]

    def wait(self, timeout_s: float = TIMEOUT_S) -> int:
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait()
        self.thread.join(timeout=5)
        return code

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)

    def tail(self, n: int = 5) -> list[str]:
        return [line for _, line in self.lines[-n:]]


def tf_config(cluster, hosts: list[int]) -> list[str]:
    """TF_CONFIG of each of `hosts` (chief first) as a cluster of those hosts alone."""
    addresses = [f"{cluster.address(i)}:{cluster.port}" for i in hosts]
    spec = {"chief": addresses[:1], "worker": addresses[1:]}
    return [json.dumps({"cluster": spec, "task": {"type": "chief" if k == 0 else "worker", "index": max(0, k - 1)}})
            for k in range(len(hosts))]


def launch(emu, hosts: list[int], args: argparse.Namespace, cache: str, model_dir: str, *, elastic: bool,
           extra: tuple[str, ...] = (), configs: list[str] | None = None) -> list[Host]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TAG_TF_CACHE_DIR=cache, TAG_TF_ELASTIC="1" if elastic else "0",
               PYTHONUNBUFFERED="1")
    argv = [sys.executable, SCRIPT, "--batch", str(args.batch), "--strategy", args.strategy, "--model-dir", model_dir,
            "--until-step", str(args.steps), *extra]
    return [Host(emu, i, argv, env, cfg) for i, cfg in zip(hosts, configs or tf_config(emu.cluster, hosts))]


def wait_for_step(host: Host, step: int, deadline_s: float = TIMEOUT_S) -> float:
    deadline = time.monotonic() + deadline_s
    while True:
        found = host.step_times().get(step)
        if found is not None:
            return found
        if host.proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the chief never printed step {step}: {host.tail()}")
        time.sleep(0.002)


def intervals_ms(times: dict[int, float], first: int, last: int) -> float | None:
    gaps = [(times[s] - times[s - 1]) * 1e3 for s in range(first + 1, last + 1) if s in times and s - 1 in times]
    return statistics.median(gaps) if gaps else None


def _line_after(host: Host, pattern: re.Pattern, after: float, deadline_s: float = TIMEOUT_S) -> tuple[float, str]:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and host.proc.poll() is None:
        for t, line in list(host.lines):
            if t > after and pattern.search(line):
                return t, line
        time.sleep(0.01)
    raise RuntimeError(f"no {pattern.pattern!r} from the chief: {host.tail()}")


def run_elastic(emu, args: argparse.Namespace, cache: str, come_back: bool) -> dict:
    """One elastic run on every host, the last one SIGKILLed after the chief's step KILL_AT and, with
    `come_back`, its command started again (its TF_CONFIG) once the others go on."""
    n = len(emu.cluster.hosts)
    with tempfile.TemporaryDirectory() as model_dir:
        hosts = launch(emu, list(range(n)), args, cache, model_dir, elastic=True)
        chief = hosts[0]
        wait_for_step(chief, args.kill_at)
        killed = time.monotonic()
        hosts[-1].kill()
        back = None
        if come_back:
            _line_after(chief, PHASES, killed)
            back = launch(emu, [n - 1], args, cache, model_dir, elastic=True, configs=[tf_config(emu.cluster,
                                                                                           list(range(n)))[-1]])[0]
        codes = [h.wait() for h in [*hosts, *([back] if back else [])]]
    times = chief.step_times()
    after = [s for s, t in times.items() if t > killed]
    first_after = min(after) if after else None
    phases = next((m.group(1) for _, line in chief.lines if (m := PHASES.search(line))), None)
    joined = next((int(m.group(1)) for _, line in chief.lines if (m := JOINED.search(line))), None)
    printed = chief.steps_printed()
    k = args.kill_at
    end = joined - 1 if joined else args.steps
    return {
        "codes": codes, "recovery_s": None if first_after is None else times[first_after] - killed,
        "phases": _phases(phases), "steps_lost": len(set(range(1, args.steps + 1)) - set(printed)),
        "steps_twice": len(printed) - len(set(printed)),
        "before_ms": intervals_ms(times, max(2, k - 50), k),
        "after_ms": intervals_ms(times, min(end, (first_after or k) + 20), end),
        "came_back_at": joined,
        "returned_ms": intervals_ms(times, joined + 20, args.steps) if joined else None,
        "back_steps": None if back is None else len(back.steps_printed()),
        "total_s": (times[args.steps] - chief.start) if args.steps in times else None,
        "log": [line for _, line in chief.lines if "tag_tf:" in line][-8:],
        "plans": [line for _, line in chief.lines if "tag_tf:" in line and " with plan " in line],
    }


def _phases(text: str | None) -> dict[str, float]:
    if not text:
        return {}
    return {name.strip(): float(sec) for name, sec in re.findall(r"([a-z+]+) ([0-9.]+) s", text)}


def run_fresh(emu, args: argparse.Namespace, cache: str, hosts: list[int], elastic: bool = False) -> dict:
    """A run on `hosts` alone, to step K: its step time and its launch-to-first-step time."""
    with tempfile.TemporaryDirectory() as model_dir:
        started = launch(emu, hosts, args, cache, model_dir, elastic=elastic)
        codes = [h.wait() for h in started]
    times = started[0].step_times()
    return {"codes": codes, "step_ms": intervals_ms(times, 20, args.steps),
            "startup_s": (times[1] - started[0].start) if 1 in times else None,
            "total_s": (times[args.steps] - started[0].start) if args.steps in times else None}


def run_restart(emu, args: argparse.Namespace, cache: str, every: int) -> dict:
    """Today's path: checkpoints every `every` steps, the last host lost after step KILL_AT; every task
    stops; the survivors are relaunched from the last checkpoint and run to step K."""
    n = len(emu.cluster.hosts)
    with tempfile.TemporaryDirectory() as model_dir:
        extra = ("--save-every", str(every))
        hosts = launch(emu, list(range(n)), args, cache, model_dir, elastic=False, extra=extra)
        start = hosts[0].start
        wait_for_step(hosts[0], args.kill_at)
        hosts[-1].kill()
        codes = [h.wait() for h in hosts]
        stopped = time.monotonic()
        again = launch(emu, list(range(n - 1)), args, cache, model_dir, elastic=False, extra=extra)
        resumed = [h.wait() for h in again]
        times = again[0].step_times()
        restored = next((int(m.group(1)) for _, line in again[0].lines
                         if (m := re.match(r"starting at global step (\d+)", line))), None)
    return {"codes": codes + resumed, "stopped_after_s": stopped - start, "resumed_from": restored,
            "steps_redone": None if restored is None else args.kill_at - restored,
            "total_s": (times[args.steps] - start) if args.steps in times else None}


def measure_cluster(name: str, args: argparse.Namespace) -> dict:
    from tag_tf.emulate import load_cluster
    from tag_tf.emulate.cluster import Emulation

    cluster = load_cluster(dict(CLUSTERS[name], name=f"elastic-{name}"))
    out: dict = {"hosts": CLUSTERS[name]["hosts"]}
    with tempfile.TemporaryDirectory() as cache, Emulation(cluster) as emu:
        n = len(cluster.hosts)
        print(f"[{name}] warming the plan caches", flush=True)
        run_fresh(emu, args, cache, list(range(n)), elastic=True)
        out["elastic"] = []
        for r in range(args.repeats):
            row = run_elastic(emu, args, cache, come_back=r == 0)
            print(f"[{name}] elastic {r + 1}/{args.repeats}: recovery {row['recovery_s']}, phases {row['phases']}, "
                  f"before {row['before_ms']} ms, after {row['after_ms']} ms, came back at {row['came_back_at']}: "
                  f"{row['returned_ms']} ms", flush=True)
            out["elastic"].append(row)
        out["fresh"] = run_fresh(emu, args, cache, list(range(n - 1)))
        print(f"[{name}] fresh on the survivors: {out['fresh']}", flush=True)
        out["restart"] = {}
        for every in CHECKPOINT_EVERY:
            out["restart"][str(every)] = run_restart(emu, args, cache, every)
            print(f"[{name}] restart-{every}: {out['restart'][str(every)]}", flush=True)
        cost: dict[str, list] = {"elastic": [], "plain": []}
        for _ in range(args.cost_rounds):
            for kind in ("elastic", "plain"):
                cost[kind].append(run_fresh(emu, args, cache, list(range(n)), elastic=kind == "elastic")["step_ms"])
        out["cost"] = cost
        print(f"[{name}] cost: {cost}", flush=True)
    return out


def summary(c: dict) -> dict:
    rec = [r["recovery_s"] for r in c["elastic"] if r["recovery_s"] is not None]
    totals = [r["total_s"] for r in c["elastic"] if r["total_s"] is not None]
    after = [r["after_ms"] for r in c["elastic"] if r["after_ms"] is not None]
    before = [r["before_ms"] for r in c["elastic"] if r["before_ms"] is not None]
    phases = {}
    for r in c["elastic"]:
        for k, v in r["phases"].items():
            phases.setdefault(k, []).append(v)
    cost_e = [x for x in c["cost"]["elastic"] if x is not None]
    cost_p = [x for x in c["cost"]["plain"] if x is not None]
    return {
        "recovery_median_s": statistics.median(rec) if rec else None, "recoveries": len(rec),
        "phases_median_s": {k: statistics.median(v) for k, v in phases.items()},
        "steps_lost": sum(r["steps_lost"] for r in c["elastic"]), "steps_twice": sum(r["steps_twice"] for r in c["elastic"]),
        "before_ms": statistics.median(before) if before else None,
        "came_back_at": next((r["came_back_at"] for r in c["elastic"] if r.get("came_back_at")), None),
        "returned_ms": next((r["returned_ms"] for r in c["elastic"] if r.get("returned_ms")), None),
        "after_ms": statistics.median(after) if after else None, "fresh_ms": c["fresh"]["step_ms"],
        "elastic_total_s": statistics.median(totals) if totals else None,
        "restart_total_s": {k: v["total_s"] for k, v in c["restart"].items()},
        "cost_elastic_ms": statistics.median(cost_e) if cost_e else None,
        "cost_plain_ms": statistics.median(cost_p) if cost_p else None,
    }


def _f(x: float | None, fmt: str = "{:.1f}") -> str:
    return "n/a" if x is None else fmt.format(x)


def verdict(name: str, c: dict, steps: int) -> str:
    """One sentence per cluster, from its summary: what a loss cost, and against what."""
    s = c["summary"]
    ratio = (s["after_ms"] / s["fresh_ms"]) if s["after_ms"] and s["fresh_ms"] else None
    back = (s["returned_ms"] / s["before_ms"]) if s.get("returned_ms") and s["before_ms"] else None
    cost = (s["cost_elastic_ms"] / s["cost_plain_ms"]) if s["cost_elastic_ms"] and s["cost_plain_ms"] else None
    spread = [x for x in c["cost"]["plain"] + c["cost"]["elastic"] if x]
    noise = (max(spread) / min(spread) - 1) if len(spread) > 1 else None
    return (f"**{name}** ({len(c['hosts'])} hosts): a host lost mid-run cost {_f(s['recovery_median_s'], '{:.1f}')} s "
            f"(median of {s['recoveries']}) and {s['steps_lost']} steps; the survivors then ran at "
            f"{_f(ratio, '{:.2f}x')} a fresh run on them alone, and the host that came back brought the step to "
            f"{_f(back, '{:.2f}x')} its time before the loss; step {steps} came after {_f(s['elastic_total_s'])} s, "
            f"against {_f(s['restart_total_s'].get('50'))} s and {_f(s['restart_total_s'].get('200'))} s restarting "
            f"from checkpoints every 50 and 200 steps. Elastic steps cost {_f(cost, '{:.3f}x')} per step, inside the "
            f"{_f(noise, '{:.0%}')} spread of the rounds themselves: elastic stays off by default (README).")


CHANGE_PLAN = re.compile(r"tag_tf: elastic: (lost task|task\(s\) \S+ came back).* goes on with (\d+) task\(s\) .*"
                         r"with plan (.+?)(, predicted [0-9.]+ ms/step)?; detect")


def plans(c: dict) -> str:
    """The plans the chief ran after the loss and after the return (first run), as it logged them
    (a plan on one device says so: `Plan.describe`)."""
    r = c["elastic"][0]
    found = [m for line in (r.get("plans") or r["log"]) if (m := CHANGE_PLAN.search(line))]
    return "; ".join(f"{'after the loss' if m.group(1) == 'lost task' else 'after the return'}, on {m.group(2)} "
                     f"hosts: {m.group(3)}" for m in found) or "not recorded"


def render(data: dict) -> str:
    verdicts = [f"{verdict(name, c, data['steps'])} Plans the chief ran (first run): {plans(c)}."
                for name, c in data["clusters"].items()]
    lines = [*verdicts, "", f"Measured on emulated clusters (`tag_tf.emulate`: namespaces, shaped links, CPU quotas) on a "
             f"{data['cores']}-core machine, {measured_when(data)}; `python benchmarks/elastic.py` (strategy "
             f"`{data['strategy']}`, the README example's MLP at batch {data['batch']}, {data['steps']} steps, the last "
             f"host SIGKILLed after step {data['kill_at']}).", ""]
    lines.append("| cluster | recovery (median) | phases (median) | steps lost / twice | step before | after | fresh on "
                 "survivors | after / fresh | back at step: step | back / before | to step K: elastic | restart "
                 "N=50 | N=200 | elastic vs not, per step |")
    lines.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, c in data["clusters"].items():
        s = c["summary"]
        phases = ", ".join(f"{k} {v:.2f}" for k, v in s["phases_median_s"].items() if k != "total")
        ratio = (s["after_ms"] / s["fresh_ms"]) if s["after_ms"] and s["fresh_ms"] else None
        cost = (s["cost_elastic_ms"] / s["cost_plain_ms"]) if s["cost_elastic_ms"] and s["cost_plain_ms"] else None
        back = (s["returned_ms"] / s["before_ms"]) if s.get("returned_ms") and s["before_ms"] else None
        lines.append(
            f"| {name} ({len(c['hosts'])} hosts) | {_f(s['recovery_median_s'], '{:.2f} s')} over {s['recoveries']} | "
            f"{phases} s | {s['steps_lost']} / {s['steps_twice']} | {_f(s['before_ms'])} ms | {_f(s['after_ms'])} ms | "
            f"{_f(s['fresh_ms'])} ms | {_f(ratio, '{:.2f}x')} | {s.get('came_back_at') or 'n/a'}: "
            f"{_f(s.get('returned_ms'))} ms | {_f(back, '{:.2f}x')} | {_f(s['elastic_total_s'])} s | "
            f"{_f(s['restart_total_s'].get('50'))} s | {_f(s['restart_total_s'].get('200'))} s | "
            f"{_f(s['cost_elastic_ms'], '{:.2f}')} / {_f(s['cost_plain_ms'], '{:.2f}')} ms ({_f(cost, '{:.3f}x')}) |")
    lines += ["", "Recovery is from the kill to the chief's next completed step; the phases are those the chief "
              "logged (detect: the failed step to the lost host named; agree: the survivors' reports and the "
              "chief's decision; state: the variables of the step resumed from; servers: the next generation's; "
              "plan+compile; restore: loading every copy and the tasks' parts). After the loss the survivors run "
              "the chief's plan for them; 'fresh on survivors' is a new run of the same strategy on those hosts "
              "alone. 'Back at step': the first run's killed host, started again once the others went on, came "
              "back at that step (its process started under its host's CPU quota), and the step time after. "
              "Restart-N: checkpoints every N steps, every task stops naming the lost host, the survivors "
              "are relaunched and resume from the last checkpoint. The cost column: elastic and not on all hosts, "
              "no loss, interleaved runs (medians of the step intervals).", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clusters", default=",".join(CLUSTERS))
    ap.add_argument("--strategy", default="auto")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--cost-rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--kill-at", type=int, default=125)
    ap.add_argument("--batch", type=int, default=4096)
    ap.add_argument("--quick", action="store_true", help="three hosts, one repeat, 400 steps, kill at 30")
    ap.add_argument("--out")
    ap.add_argument("--markdown", default=os.path.join(ROOT, "benchmarks", "RESULTS.md"))
    args = ap.parse_args()
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, frame: sys.exit(128 + signum))
    if args.quick:
        args.clusters, args.repeats, args.cost_rounds, args.steps, args.kill_at = "three", 1, 1, 400, 30
    data = stamp({"measured": True, "cores": os.cpu_count(), "strategy": args.strategy, "batch": args.batch,
                  "steps": args.steps, "kill_at": args.kill_at, "clusters": {}})
    path = args.out or os.path.join(ROOT, "benchmarks", "results", "elastic_quick.json" if args.quick else "elastic.json")
    for name in args.clusters.split(","):
        c = measure_cluster(name, args)
        c["summary"] = summary(c)
        data["clusters"][name] = c
        print(json.dumps(c["summary"], indent=1), flush=True)
        with open(path, "w") as f:          # after each cluster: what was measured stays if a later one stops
            json.dump(data, f, indent=1, sort_keys=True)
    if not args.quick and args.markdown:
        replace_section(args.markdown, BEGIN, END, render(data))


if __name__ == "__main__":
    main()
