"""The topology file format: YAML/JSON files and dicts -> Topology (`load_file`,
`topology_from_dict`). Names -- presets, files, dicts -- are resolved by `tag_tf.topology.load`.

File format (YAML shown; JSON is the same structure)::

    name: my-cluster                 # optional; default: the file name without extension
    units:                           # optional: unit of *plain numbers* (these are the defaults)
      bandwidth: Gbps                #   B/s | Gbps | Mbps | GB/s | MB/s
      memory: GiB                    #   B | GB | GiB | MB | MiB
      latency: us                    #   s | ms | us
    machines:
      - name: dgx                    # unique; default m<index>
        gpus: 4x V100-32GB           # "<count>x <type>", "<type>", or a list (below)
        intra: nvlink 50GB/s         # "<link> [bandwidth]" or {link, bandwidth, latency}
      - name: worker
        replicas: 2                  # optional: 2 identical machines named worker-0, worker-1
        gpus:
          - {type: GTX1080Ti, count: 2}
          - {type: P100, memory: 12GiB}   # memory: optional, default the type's memory
        intra: {link: pcie, bandwidth: 15.75GB/s, latency: 5us}
        nic: 25Gbps                  # optional: this machine's switch port (switch only)
        speed: 0.5                   # optional: compute speed against its type's numbers (default 1)
        message: 250us               # optional: CPU time a cross-process message takes from it (default 0)
        copy: 400MB/s                # optional: what its CPU moves of an all-reduce beyond the link (default: free)
        collective: 1ms              # optional: how long each all-reduce step waits for it while it computes (default 0)
    inter:
      switch: 100Gbps                # every machine's port bandwidth (unless its nic says otherwise)
      latency: 25us                  # optional, default 25 us
      collectives: hierarchical      # optional: GPU all-reduces inside each machine, then a ring over the
                                     # machines (NCCL's two-level form); default ring: one flat ring
      fabric: 1.7Gbps                # optional: what the network carries at once, every machine sending
                                     # (a ring's steps); default: non-blocking (each link its own)
    # or a full matrix, matrix[i][j] = bandwidth from machine i to machine j, rows/columns in machine
    # order after replicas are expanded (diagonal ignored):
    #   inter: {matrix: [[0, 10Gbps], [10Gbps, 0]]}
    # or keyed by machine name (pairs given once apply both ways):
    #   inter: {matrix: {dgx: {worker-0: 10Gbps, worker-1: 10Gbps}, worker-0: {worker-1: 40Gbps}}}
    input: local                     # optional: every machine reads its own part of each batch (between-graph
                                     # runs, multi-worker input pipelines); default client: one program feeds
    gpu_types:                       # optional: GPU types beyond the built-in ones
      - {name: RTX2080Ti, peak_tflops: 13.4, mem_bandwidth: 616GB/s, memory: 11GiB}
        # (or peak_flops in FLOP/s; launch_overhead optional, default 5us; optional dense tensor-core
        # rates tf32_tflops and half_tflops, sm_count and CUDA capability, e.g. 7.5: the kernel
        # model's math modes and waves -- without a capability the card keeps the plain roofline)

Bandwidth strings: "100Gbps", "100 Gb/s", "25 GB/s", "25GBps" (lower-case b = bits, upper-case B =
bytes); sizes: "16GiB", "16GB" (decimal); latencies: "5us", "0.1ms". Link kinds: nvlink, pcie, local;
the bandwidth may be left out: nvlink 50 GB/s (two NVLink 2.0 bricks per pair, per direction), pcie
15.75 GB/s (PCIe 3.0 x16, per direction), local 100 GB/s. `intra` may be left out entirely (pcie).
The network may be left out only with one machine or when every machine names its nic.
GPU types are case-insensitive and accept aliases (see `tag_tf.topology.gpus`).

Every error is a TopologyError naming the file (if any) and the field, e.g.
``topology file c.yaml: machines[1] (worker).gpus[0].type: unknown GPU type 'V200'; known ...``.
"""
from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import NoReturn, cast

import yaml  # type: ignore[import-untyped]  # PyYAML ships no stubs

from tag_tf.errors import TopologyError
from tag_tf.topology.gpus import GPU_TYPES, GpuType, gpu_type
from tag_tf.topology.spec import (
    COLLECTIVES,
    DEFAULT_INTER_LATENCY,
    INPUTS,
    LINK_KINDS,
    GpuSpec,
    InterBandwidth,
    Machine,
    Topology,
)
from tag_tf.topology.units import (
    BANDWIDTH_UNITS,
    SIZE_UNITS,
    TIME_UNITS,
    UnitError,
    parse_bandwidth,
    parse_size,
    parse_time,
)

DEFAULT_LINK_BANDWIDTH = {"nvlink": 50e9, "pcie": 15.75e9, "local": 100e9}   # bytes/s

_TOP_KEYS = ("name", "description", "units", "machines", "inter", "gpu_types", "input")
_MACHINE_KEYS = ("name", "gpus", "intra", "nic", "replicas", "speed", "message", "copy", "collective")
_GPU_KEYS = ("type", "count", "memory")
_INTRA_KEYS = ("link", "bandwidth", "latency")
_INTER_KEYS = ("switch", "matrix", "latency", "fabric", "collectives")
_TYPE_KEYS = ("name", "peak_tflops", "peak_flops", "mem_bandwidth", "memory", "launch_overhead", "tf32_tflops",
              "half_tflops", "sm_count", "capability")


def load_file(path: str) -> Topology:
    """A Topology from a YAML or JSON file; errors name the file."""
    from tag_tf.datafiles import TOPOLOGY_FILE_LIMIT, read_text

    text = read_text(path, "topology file", TOPOLOGY_FILE_LIMIT, TopologyError)
    try:
        data = json.loads(text) if path.lower().endswith(".json") else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:   # json.JSONDecodeError is a ValueError
        kind = "JSON" if path.lower().endswith(".json") else "YAML"
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TopologyError(f"topology file {path}: invalid {kind}: {first}") from None
    stem = os.path.splitext(os.path.basename(path))[0]
    return topology_from_dict(data, source=path, default_name=stem)


def topology_from_dict(d: object, source: str | None = None, default_name: str = "topology") -> Topology:
    """A Topology from a dict in the file format (see the module docstring)."""
    try:
        return _Reader().topology(d, default_name)
    except TopologyError as e:
        if source is None:
            raise
        raise TopologyError(f"topology file {source}: {e}") from None


class _Reader:
    """Turns the file format into a Topology; every error names the field it comes from."""

    def __init__(self) -> None:
        self.bw_unit = BANDWIDTH_UNITS["Gbps"]
        self.mem_unit = SIZE_UNITS["GiB"]
        self.time_unit = TIME_UNITS["us"]
        self.custom: dict[str, GpuType] = {}

    # ---- helpers ------------------------------------------------------------------------------
    @staticmethod
    def fail(field: str, msg: str) -> NoReturn:
        raise TopologyError(f"{field}: {msg}")

    def mapping(self, value: object, field: str, keys: tuple[str, ...]) -> Mapping[str, object]:
        if not isinstance(value, Mapping):
            self.fail(field, f"expected a mapping, got {_kind(value)}")
        for k in value:
            if k not in keys:
                self.fail(field, f"unknown key {k!r} (expected one of: {', '.join(keys)})")
        return value

    def bandwidth(self, value: object, field: str) -> float:
        try:
            bw = parse_bandwidth(value, self.bw_unit)
        except UnitError as e:
            self.fail(field, str(e))
        if not bw > 0 or bw == float("inf"):
            self.fail(field, f"bandwidth must be positive, got {value!r}")
        return bw

    def size(self, value: object, field: str) -> int:
        try:
            n = parse_size(value, self.mem_unit)
        except UnitError as e:
            self.fail(field, str(e))
        if not n >= 1 or n == float("inf"):
            self.fail(field, f"must be positive, got {value!r}")
        return int(n)

    def time(self, value: object, field: str) -> float:
        try:
            t = parse_time(value, self.time_unit)
        except UnitError as e:
            self.fail(field, str(e))
        if not t >= 0 or t == float("inf"):
            self.fail(field, f"must be non-negative, got {value!r}")
        return t

    def positive_int(self, value: object, field: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            self.fail(field, f"expected a positive integer, got {value!r}")
        return value

    def type_name(self, value: object, field: str) -> str:
        if not isinstance(value, str):
            self.fail(field, f"expected a GPU type name, got {_kind(value)}")
        if value in self.custom:
            return value
        try:
            return gpu_type(value).name
        except TopologyError:
            known = list(GPU_TYPES) + list(self.custom)
            self.fail(field, f"unknown GPU type {value!r}; known types: {', '.join(known)}")

    # ---- sections -----------------------------------------------------------------------------
    def topology(self, d: object, default_name: str) -> Topology:
        d = self.mapping(d, "topology", _TOP_KEYS)
        name = d.get("name", default_name)
        if not isinstance(name, str) or not name:
            self.fail("name", f"expected a non-empty string, got {name!r}")
        if "units" in d:
            self.units(d["units"])
        for i, t in enumerate(_list(d.get("gpu_types", []), "gpu_types", self)):
            gt = self.custom_type(t, f"gpu_types[{i}]")
            self.custom[gt.name] = gt
        if "machines" not in d:
            self.fail("machines", "missing (a topology needs a list of machines)")
        machines: list[Machine] = []
        for i, m in enumerate(_list(d["machines"], "machines", self)):
            machines.extend(self.machine(m, i))
        if not machines:
            self.fail("machines", "a topology needs at least one machine")
        seen: set[str] = set()
        for i, m in enumerate(machines):
            if m.name in seen:
                self.fail(f"machines[{i}].name", f"duplicate machine name {m.name!r}")
            seen.add(m.name)
        inter, latency = self.inter(d.get("inter"), machines)
        raw = d.get("inter")
        fabric = (self.bandwidth(raw["fabric"], "inter.fabric")
                  if isinstance(raw, Mapping) and raw.get("fabric") is not None else None)
        collectives = raw.get("collectives", "ring") if isinstance(raw, Mapping) else "ring"
        if collectives not in COLLECTIVES:
            self.fail("inter.collectives", f"must be one of {', '.join(COLLECTIVES)}, got {collectives!r}")
        source = d.get("input", "client")
        if not isinstance(source, str) or source not in INPUTS:
            self.fail("input", f"must be one of {', '.join(INPUTS)}, got {source!r}")
        return Topology(name, tuple(machines), inter, latency, tuple(self.custom.values()), fabric, collectives,
                        source)

    def units(self, value: object) -> None:
        u = self.mapping(value, "units", ("bandwidth", "memory", "latency"))
        for key, table, attr in (("bandwidth", BANDWIDTH_UNITS, "bw_unit"),
                                 ("memory", SIZE_UNITS, "mem_unit"),
                                 ("latency", TIME_UNITS, "time_unit")):
            if key in u:
                if u[key] not in table:
                    self.fail(f"units.{key}", f"unknown unit {u[key]!r}; use one of "
                                              f"{', '.join(table)}")
                setattr(self, attr, table[cast(str, u[key])])   # a key of table, checked above

    def custom_type(self, value: object, field: str) -> GpuType:
        t = self.mapping(value, field, _TYPE_KEYS)
        for key in ("name", "mem_bandwidth", "memory"):
            if key not in t:
                self.fail(f"{field}.{key}", "missing")
        name = t["name"]
        if not isinstance(name, str) or not name:
            self.fail(f"{field}.name", f"expected a non-empty string, got {name!r}")
        if name in GPU_TYPES:
            self.fail(f"{field}.name", f"GPU type {name!r} is already defined (built in: drop it from gpu_types, "
                                       f"or give your own card another name)")
        if name in self.custom:
            self.fail(f"{field}.name", f"GPU type {name!r} is already defined")
        if ("peak_tflops" in t) == ("peak_flops" in t):
            self.fail(f"{field}.peak_tflops", "give exactly one of peak_tflops and peak_flops")
        key, scale = ("peak_tflops", 1e12) if "peak_tflops" in t else ("peak_flops", 1.0)
        flops = t[key]
        if isinstance(flops, bool) or not isinstance(flops, (int, float)) or not flops > 0:
            self.fail(f"{field}.{key}", f"expected a positive number, got {flops!r}")
        overhead = self.time(t.get("launch_overhead", "5us"), f"{field}.launch_overhead")
        rates = {}
        for key in ("tf32_tflops", "half_tflops", "sm_count", "capability"):
            v = t.get(key, 0)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0 or (key == "sm_count" and v != int(v)):
                self.fail(f"{field}.{key}", f"expected a non-negative {'integer' if key == 'sm_count' else 'number'}, "
                                            f"got {v!r}")
            rates[key] = v
        return GpuType(name, float(flops) * scale, self.bandwidth(t["mem_bandwidth"],
                       f"{field}.mem_bandwidth"), self.size(t["memory"], f"{field}.memory"),
                       overhead, tf32_flops=float(rates["tf32_tflops"]) * 1e12,
                       half_flops=float(rates["half_tflops"]) * 1e12, sm_count=int(rates["sm_count"]),
                       capability=float(rates["capability"]), source="topology file")

    def machine(self, value: object, i: int) -> list[Machine]:
        field = f"machines[{i}]"
        m = self.mapping(value, field, _MACHINE_KEYS)
        name = m.get("name", f"m{i}")
        if not isinstance(name, str) or not name:
            self.fail(f"{field}.name", f"expected a non-empty string, got {name!r}")
        field = f"{field} ({name})"
        if "gpus" not in m:
            self.fail(f"{field}.gpus", "missing (a machine needs at least one GPU)")
        gpus = self.gpus(m["gpus"], f"{field}.gpus")
        link, bw, latency = self.intra(m.get("intra", "pcie"), f"{field}.intra")
        nic = self.bandwidth(m["nic"], f"{field}.nic") if m.get("nic") is not None else None
        replicas = self.positive_int(m.get("replicas", 1), f"{field}.replicas")
        speed = m.get("speed", 1.0)
        if isinstance(speed, bool) or not isinstance(speed, (int, float)) or not speed > 0:
            self.fail(f"{field}.speed", f"expected a positive number, got {speed!r}")
        message = self.time(m.get("message", 0.0), f"{field}.message")
        if message >= 1.0:
            self.fail(f"{field}.message", f"expected less than a second per message, got {message!r} s")
        names = [name] if "replicas" not in m else [f"{name}-{k}" for k in range(replicas)]
        copy = self.bandwidth(m["copy"], f"{field}.copy") if m.get("copy") is not None else None
        step = self.time(m.get("collective", 0.0), f"{field}.collective")
        if step >= 1.0:
            self.fail(f"{field}.collective", f"expected less than a second per all-reduce step, got {step!r} s")
        return [Machine(n, gpus, bw, link, nic, latency, float(speed), message, copy, step) for n in names]

    def gpus(self, value: object, field: str) -> tuple[GpuSpec, ...]:
        items = value if isinstance(value, list) else [value]
        out: list[GpuSpec] = []
        for k, item in enumerate(items):
            f = f"{field}[{k}]" if isinstance(value, list) else field
            if isinstance(item, str):
                count, type_text = 1, item.strip()
                head, sep, rest = type_text.partition("x")
                if sep and head.strip().isdigit() and rest.strip():
                    count, type_text = int(head), rest.strip()
                    if count < 1:
                        self.fail(f"{f}.count", f"expected a positive integer, got {count}")
                t = self.type_name(type_text, f"{f}.type")
                memory = None
            else:
                g = self.mapping(item, f, _GPU_KEYS)
                if "type" not in g:
                    self.fail(f"{f}.type", "missing")
                t = self.type_name(g["type"], f"{f}.type")
                count = self.positive_int(g.get("count", 1), f"{f}.count")
                memory = self.size(g["memory"], f"{f}.memory") if g.get("memory") is not None \
                    else None
            if memory is None:
                memory = self.custom[t].memory_bytes if t in self.custom \
                    else GPU_TYPES[t].memory_bytes
            out.extend([GpuSpec(t, memory)] * count)
        if not out:
            self.fail(field, "a machine needs at least one GPU")
        return tuple(out)

    def intra(self, value: object, field: str) -> tuple[str, float, float | None]:
        if isinstance(value, str):
            parts = value.split(None, 1)
            spec: dict = {"link": parts[0].lower()} if parts else {}
            if len(parts) == 2:
                spec["bandwidth"] = parts[1]
        else:
            spec = dict(self.mapping(value, field, _INTRA_KEYS))
        link = spec.get("link", "pcie")
        if link not in LINK_KINDS:
            self.fail(f"{field}.link", f"must be one of {', '.join(LINK_KINDS)}, got {link!r}")
        bw = self.bandwidth(spec["bandwidth"], f"{field}.bandwidth") \
            if spec.get("bandwidth") is not None else DEFAULT_LINK_BANDWIDTH[link]
        latency = self.time(spec["latency"], f"{field}.latency") \
            if spec.get("latency") is not None else None
        return link, bw, latency

    def inter(self, value: object, machines: list[Machine]) -> tuple[InterBandwidth, float]:
        if value is None:
            return None, DEFAULT_INTER_LATENCY
        if not isinstance(value, Mapping):   # a bare bandwidth means a switch
            return self.bandwidth(value, "inter.switch"), DEFAULT_INTER_LATENCY
        v = self.mapping(value, "inter", _INTER_KEYS)
        latency = self.time(v["latency"], "inter.latency") if v.get("latency") is not None \
            else DEFAULT_INTER_LATENCY
        if "switch" in v and "matrix" in v:
            self.fail("inter", "give either switch or matrix, not both")
        if v.get("switch") is not None:
            return self.bandwidth(v["switch"], "inter.switch"), latency
        if v.get("matrix") is not None:
            return self.matrix(v["matrix"], machines), latency
        return None, latency

    def matrix(self, value: object, machines: list[Machine]) -> tuple[tuple[float, ...], ...]:
        n, names = len(machines), [m.name for m in machines]
        if isinstance(value, Mapping):
            index = {name: i for i, name in enumerate(names)}
            rows = [[0.0] * n for _ in range(n)]
            given = [[False] * n for _ in range(n)]
            for a, row in value.items():
                if a not in index:
                    self.fail("inter.matrix", f"unknown machine {a!r} (machines: {', '.join(names)})")
                if not isinstance(row, Mapping):
                    self.fail(f"inter.matrix.{a}", f"expected a mapping of machine name to "
                                                   f"bandwidth, got {_kind(row)}")
                for b, bw in row.items():
                    if b not in index:
                        self.fail(f"inter.matrix.{a}", f"unknown machine {b!r} "
                                                       f"(machines: {', '.join(names)})")
                    i, j = index[a], index[b]
                    if i == j:
                        continue
                    rows[i][j] = self.bandwidth(bw, f"inter.matrix.{a}.{b}")
                    given[i][j] = True
                    if not given[j][i]:
                        rows[j][i] = rows[i][j]
            for i in range(n):
                for j in range(n):
                    if i != j and not (given[i][j] or given[j][i]):
                        self.fail("inter.matrix", f"no bandwidth between machines {names[i]!r} "
                                                  f"and {names[j]!r}")
            return tuple(tuple(r) for r in rows)
        if not isinstance(value, list) or not all(isinstance(r, list) for r in value):
            self.fail("inter.matrix", f"expected a list of rows or a mapping by machine name, "
                                      f"got {_kind(value)}")
        if len(value) != n or any(len(r) != n for r in value):
            shape = f"{len(value)} rows of lengths {[len(r) for r in value]}"
            self.fail("inter.matrix", f"must be square, {n}x{n} (one row and column per machine: "
                                      f"{', '.join(names)}), got {shape}")
        return tuple(tuple(0.0 if i == j else self.bandwidth(bw, f"inter.matrix[{i}][{j}]")
                           for j, bw in enumerate(r)) for i, r in enumerate(value))


def _list(value: object, field: str, reader: _Reader) -> list[object]:
    if not isinstance(value, list):
        reader.fail(field, f"expected a list, got {_kind(value)}")
    return value


def _kind(value: object) -> str:
    return "nothing" if value is None else f"{type(value).__name__} {value!r}"
