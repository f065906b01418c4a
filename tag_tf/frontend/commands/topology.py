"""`tag-tf topology show PRESET|FILE [--json]`: print a topology's devices, groups and links.

`tag-tf topology show --cluster FILE|tf_config`: the topology of a running cluster, as its servers
report their devices, with the links measured between them (cached per cluster)."""
from __future__ import annotations

import argparse
import json
from typing import Any

from tag_tf.errors import TopologyError
from tag_tf.topology.load import PRESETS, load_topology
from tag_tf.topology.spec import Topology
from tag_tf.topology.units import format_bandwidth, format_bytes


def register(subparsers) -> None:
    parser = subparsers.add_parser("topology", help="inspect cluster topologies",
                                   description="Inspect cluster topologies.")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = sub.add_parser("show", help="print devices, groups and bandwidths of a topology")
    show.add_argument("spec", metavar="PRESET|FILE", nargs="?",
                      help=f"a preset ({', '.join(PRESETS)}) or a .yaml/.json topology file")
    show.add_argument("--cluster", metavar="FILE|tf_config",
                      help="instead: ask the running servers of this cluster file (or of $TF_CONFIG)")
    show.add_argument("--trusted-network", action="store_true",
                      help="the cluster's public addresses are on a network that is yours alone")
    show.add_argument("--json", action="store_true", help="print one JSON object instead")
    show.set_defaults(func=_show)


def _show(args: argparse.Namespace) -> int:
    if (args.spec is None) == (args.cluster is None):
        raise TopologyError("topology show: give a preset or topology file, or --cluster (one of the two)")
    report = None
    if args.cluster:
        topo, report = _discover(args.cluster, args.trusted_network)
    else:
        topo = load_topology(args.spec)
    if args.json:
        out = summary(topo)
        if report is not None:
            out["discovery"] = report
        print(json.dumps(out, indent=2))
    else:
        print(render(topo))
        if report is not None:
            print(render_discovery(topo, report))
    return 0


def _discover(cluster: str, trusted_network: bool) -> tuple[Topology, dict]:
    from tag_tf.context import default_cache_dir
    from tag_tf.errors import ClusterError
    from tag_tf.measure.links import discover
    from tag_tf.runtime import roles
    from tag_tf.runtime.cluster import ClusterSpec, check_trusted

    if cluster.lower() == "tf_config":
        role = roles.from_tf_config()
        if role is None:
            raise ClusterError("--cluster tf_config: TF_CONFIG is not set, or names a cluster of one task")
        spec = role.spec
    else:
        spec = ClusterSpec.load(cluster)
    check_trusted(spec, trusted_network)
    spec.check()
    return discover(spec, cache_dir=default_cache_dir())


def summary(topo: Topology) -> dict:
    """A JSON-able summary: devices, groups, links (bytes/s and human units) and the file form."""
    machines = []
    for i, m in enumerate(topo.machines):
        machines.append({
            "id": i, "name": m.name, "num_gpus": m.num_gpus, "intra_link": m.intra_link,
            "intra_bandwidth": m.intra_bandwidth, "intra_bandwidth_human":
                format_bandwidth(m.intra_bandwidth),
            "intra_latency_s": m.latency,
            "port_bandwidth": topo.port_bandwidth(i) if topo.is_switch and
                (m.nic_bandwidth or topo.inter_bandwidth) else None,
        })
    inter: dict[str, Any]
    if isinstance(topo.inter_bandwidth, tuple):
        inter = {"kind": "matrix", "matrix": [list(r) for r in topo.inter_bandwidth]}
    else:
        inter = {"kind": "switch", "bandwidth": topo.inter_bandwidth, "bandwidth_human":
                 None if topo.inter_bandwidth is None else format_bandwidth(topo.inter_bandwidth)}
    inter["latency_s"] = topo.inter_latency
    return {
        "name": topo.name, "fingerprint": topo.fingerprint, "num_devices": topo.num_devices,
        "num_machines": topo.num_machines,
        "devices": [{"id": d.id, "machine": d.machine, "machine_name": topo.machines[d.machine].name,
                     "index": d.index, "type": d.type, "memory_bytes": d.memory_bytes}
                    for d in topo.devices],
        "groups": [{"id": g.id, "machine": g.machine, "type": g.type, "devices": list(g.devices)}
                   for g in topo.groups],
        "machines": machines,
        "inter": inter,
        "topology": topo.to_dict(),
    }


def render(topo: Topology) -> str:
    lines = [topo.describe(), "", f"{'device':>6}  {'machine':<14} {'index':>5}  {'type':<12} memory"]
    for d in topo.devices:
        lines.append(f"{d.id:>6}  {topo.machines[d.machine].name:<14} {d.index:>5}  {d.type:<12} "
                     f"{format_bytes(d.memory_bytes)}")
    return "\n".join(lines)


def render_discovery(topo: Topology, report: dict) -> str:
    """Each task's measured compute speed and every measured link of a discovered cluster."""
    lines = []
    speeds = report.get("speeds")
    if speeds:
        lines += ["", "task  machine        GFLOP/s  speed (measured now, on the task)"]
        for i, (flops, rel) in enumerate(zip(speeds["flops"], speeds["relative"])):
            lines.append(f"{i:>4}  {topo.machines[i].name:<14} {flops / 1e9:7.1f}  {rel:.2f}x")
    links = report.get("links")
    if links:
        how = "from the cache " + report["cache"] if report["cached"] else "measured now"
        lines += ["", f"links ({how}):"]
        for p in links["pairs"]:
            a, b = p["tasks"]
            lines.append(f"  {topo.machines[a].name} <-> {topo.machines[b].name}: {format_bandwidth(p['bandwidth'])}, "
                         f"{p['latency'] * 1e6:.0f} us latency")
        shape = "a bandwidth matrix" if isinstance(topo.inter_bandwidth, tuple) else \
            f"one switch at {format_bandwidth(links['bandwidth'])}"
        lines.append(f"  planned as {shape}")
    return "\n".join(lines)
