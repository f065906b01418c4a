"""`tag-tf topology show PRESET|FILE [--json]`: print a topology's devices, groups and links."""
from __future__ import annotations

import argparse
import json

from tag_tf.topology.load import PRESETS, load_topology
from tag_tf.topology.spec import Topology
from tag_tf.topology.units import format_bandwidth, format_bytes


def register(subparsers) -> None:
    parser = subparsers.add_parser("topology", help="inspect cluster topologies",
                                   description="Inspect cluster topologies.")
    sub = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    show = sub.add_parser("show", help="print devices, groups and bandwidths of a topology")
    show.add_argument("spec", metavar="PRESET|FILE",
                      help=f"a preset ({', '.join(PRESETS)}) or a .yaml/.json topology file")
    show.add_argument("--json", action="store_true", help="print one JSON object instead")
    show.set_defaults(func=_show)


def _show(args: argparse.Namespace) -> int:
    topo = load_topology(args.spec)
    if args.json:
        print(json.dumps(summary(topo), indent=2))
    else:
        print(render(topo))
    return 0


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
