"""`tag-tf emulate --cluster FILE [--timeout S] [--json FILE] [--keep-going] [--restart-after S] -- COMMAND...`: an emulated
heterogeneous cluster on this machine (root): every host of FILE a network namespace with its own
address, its own shaped link to a private bridge and its own CPU quota; COMMAND runs unchanged on
every host with that host's TF_CONFIG. Each host's measured speed and every link are printed first.
Everything is removed on exit, Ctrl-C, SIGTERM, timeout or a failed host. With `--keep-going`
(elastic runs) a host whose command fails does not stop the others, and every host's exit codes are
reported at the end; `--restart-after S` also starts a failed host's command again, once, S seconds
after it ended (a machine that comes back, with its TF_CONFIG).

`tag-tf emulate --cleanup`: remove what an emulation killed with SIGKILL left behind."""
from __future__ import annotations

import argparse
import json
import signal
import sys
from typing import Any

DEFAULT_TIMEOUT_S = 3600.0


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "emulate", help="run a command on every host of an emulated heterogeneous cluster (root)",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cluster", metavar="FILE", help="the emulated cluster: hosts (cpu, cpus, nic) and links")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="S",
                   help=f"stop every host after S seconds (default {DEFAULT_TIMEOUT_S:.0f}); exit code 124")
    p.add_argument("--no-measure", action="store_true", help="do not measure the hosts and links first")
    p.add_argument("--json", metavar="FILE", help="also write the cluster and its measurements to FILE")
    p.add_argument("--keep-going", action="store_true",
                   help="a host whose command fails does not stop the others; report every host's exit codes")
    p.add_argument("--restart-after", type=float, default=None, metavar="S",
                   help="start a failed host's command again, once, S seconds after it ended (implies --keep-going)")
    p.add_argument("--cleanup", action="store_true",
                   help="remove namespaces, links and cgroups that emulations no longer running left behind")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND...", help="what every host runs")
    p.set_defaults(func=run)


class _Stopped(BaseException):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise_stopped(signum: int, frame: Any) -> None:
    raise _Stopped(signum)


def run(args: argparse.Namespace) -> int:
    from tag_tf.emulate import system
    from tag_tf.errors import EmulationError

    missing = system.requirements_missing()
    if missing:
        raise EmulationError(missing)
    if args.cleanup:
        netns, groups = system.stale()
        left = system.remove(netns, groups)
        print(f"removed {len(netns)} namespace(s) and {len(groups)} cgroup(s) left by emulations no longer running"
              + (f"; could not remove {', '.join(left)}" if left else ""))
        return 1 if left else 0
    command = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
    if not args.cluster or not command:
        raise EmulationError("give --cluster FILE and -- COMMAND... (or --cleanup)")
    from tag_tf.emulate import load_cluster
    from tag_tf.emulate.cluster import Emulation

    cluster = load_cluster(args.cluster)
    previous = {s: signal.signal(s, _raise_stopped) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        with Emulation(cluster) as emu:
            print(f"[emulate] cluster {cluster.name}: {len(cluster.hosts)} hosts on {cluster.subnet} "
                  f"(namespaces {emu.hosts[0]}...)", flush=True)
            report: dict[str, Any] = {"cluster": cluster.to_dict(), "cpusets": emu.cpusets}
            if not args.no_measure:
                measured = emu.measure()
                print(measured.render(), flush=True)
                report["measured"] = measured.to_dict()
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(report, f, indent=1)
            code = emu.run_everywhere(command, timeout_s=args.timeout, out=lambda line: print(line, flush=True),
                                      keep_going=args.keep_going, restart_after_s=args.restart_after)
    except (KeyboardInterrupt, _Stopped) as e:
        name = signal.Signals(e.signum).name if isinstance(e, _Stopped) else "SIGINT"
        print(f"[emulate] stopped by {name}: every host stopped, everything removed", file=sys.stderr)
        return 128 + (e.signum if isinstance(e, _Stopped) else signal.SIGINT)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
    print(f"[emulate] done (exit code {code}); namespaces, links and cgroups removed", flush=True)
    return code
