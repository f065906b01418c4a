"""Speed of the native simulator engine on a synthetic ~100k-task layered graph.

Shape (roughly ResNet-scale data parallelism on 16 GPUs in 4 servers): every layer has one compute
task per GPU (chained per GPU), and one cross-server transfer per server that holds two link
resources (the sender's NIC-out and the receiver's NIC-in) and feeds the next layer on the receiving
server; every 50 layers an all-reduce-like collective holds all 8 NIC resources and gates the next
layer. Every task owns a buffer in its GPU's pool, so memory accounting is exercised too.

Prints a summary and writes benchmarks/results/engine_speed.json.
Usage: python benchmarks/engine_speed.py [--tasks 100000] [--repeats 30]
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np
from machine import cpu_name  # noqa: E402  (benchmarks/machine.py)

from tag_tf import _simcore
from tag_tf.sim.engine import Engine, make_task_graph

GPUS, SERVERS, COLLECTIVE_EVERY = 16, 4, 50


def layered_graph(num_tasks: int, seed: int = 0, replicated: bool = False):
    """replicated=False: every task draws its own duration, so almost every event happens at a
    distinct time (the engine's worst case). replicated=True: all GPUs run the same op with the same
    profiled duration in a layer and all transfers of a layer take equally long (data-parallel
    replicas), so events come in batches at equal times, as in real replicated graphs."""
    rng = np.random.default_rng(seed)
    per_layer = GPUS + SERVERS
    layers = max(1, num_tasks // per_layer)
    n_coll = (layers - 1) // COLLECTIVE_EVERY
    # ids: compute c[l, d] = l*per_layer + d, transfer x[l, s] = l*per_layer + GPUS + s, collectives after.
    n = layers * per_layer + n_coll
    L = np.arange(layers)
    comp = L[:, None] * per_layer + np.arange(GPUS)[None, :]
    xfer = L[:, None] * per_layer + GPUS + np.arange(SERVERS)[None, :]
    coll = layers * per_layer + np.arange(n_coll)
    gpus_per_server = GPUS // SERVERS
    nic_out = GPUS + np.arange(SERVERS)
    nic_in = GPUS + SERVERS + np.arange(SERVERS)
    num_resources = GPUS + 2 * SERVERS

    duration = np.empty(n)
    if replicated:
        duration[comp.ravel()] = np.repeat(rng.uniform(50e-6, 500e-6, layers), GPUS)
        duration[xfer.ravel()] = np.repeat(rng.uniform(20e-6, 300e-6, layers), SERVERS)
    else:
        duration[comp.ravel()] = rng.uniform(50e-6, 500e-6, comp.size)
        duration[xfer.ravel()] = rng.uniform(20e-6, 300e-6, xfer.size)
    duration[coll] = rng.uniform(1e-3, 3e-3, n_coll)

    # Resources (CSR): compute -> its GPU; transfer -> (NIC-out of s, NIC-in of s+1); collective -> all NICs.
    nres = np.zeros(n, np.int64)
    nres[comp.ravel()] = 1
    nres[xfer.ravel()] = 2
    nres[coll] = 2 * SERVERS
    res_ptr = np.zeros(n + 1, np.int64)
    res_ptr[1:] = np.cumsum(nres)
    res = np.empty(res_ptr[-1], np.int64)
    res[res_ptr[comp.ravel()]] = np.tile(np.arange(GPUS), layers)
    s = np.tile(np.arange(SERVERS), layers)
    res[res_ptr[xfer.ravel()]] = nic_out[s]
    res[res_ptr[xfer.ravel()] + 1] = nic_in[(s + 1) % SERVERS]
    for k, r in enumerate(np.concatenate([nic_out, nic_in])):
        res[res_ptr[coll] + k] = r

    src, dst, data = [], [], []
    def edges(a, b, d):
        src.append(np.ravel(a)); dst.append(np.ravel(b)); data.append(np.full(np.size(a), d, np.uint8))
    edges(comp[:-1], comp[1:], 1)                                    # per-GPU chain
    recv_gpu = ((np.arange(SERVERS) + 1) % SERVERS) * gpus_per_server
    edges(xfer[:-1], comp[1:, recv_gpu], 1)                          # transfer feeds the receiver's next op
    edges(comp[:, np.arange(SERVERS) * gpus_per_server], xfer, 1)    # sender's op feeds the transfer
    for k, c in enumerate(coll):                                     # collective gates the next layer
        l = (k + 1) * COLLECTIVE_EVERY
        edges(comp[l], np.full(GPUS, c), 1)
        edges(np.full(GPUS, c), comp[l + 1], 0)
    src, dst, data = np.concatenate(src), np.concatenate(dst), np.concatenate(data)
    order = np.argsort(src, kind="stable")
    succ_ptr = np.zeros(n + 1, np.int64)
    succ_ptr[1:] = np.cumsum(np.bincount(src, minlength=n))

    mem_device = np.empty(n, np.int64)
    mem_device[comp.ravel()] = np.tile(np.arange(GPUS), layers)
    mem_device[xfer.ravel()] = np.tile(recv_gpu, layers)
    mem_device[coll] = 0
    mem_bytes = rng.integers(1 << 20, 64 << 20, n)
    return make_task_graph(duration, res_ptr, res, succ_ptr, dst[order], data[order], mem_device, mem_bytes,
                           persistent_bytes=np.full(GPUS, 4 << 30), capacity_bytes=np.full(GPUS, 16 << 30),
                           num_resources=num_resources)


def timed(fn, repeats):
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return {"min_ms": round(min(times), 3), "median_ms": round(statistics.median(times), 3)}


def measure(num_tasks: int, replicated: bool, repeats: int) -> dict:
    t0 = time.perf_counter()
    g = layered_graph(num_tasks, replicated=replicated)
    build_ms = (time.perf_counter() - t0) * 1e3
    eng = Engine()
    result = eng.run(g)  # warm-up: sizes the engine's buffers
    native, nargs = eng._native, g.native_args()
    return {
        "durations": "replicated" if replicated else "random",
        "num_tasks": g.num_tasks,
        "num_edges": g.num_edges,
        "num_resources": g.num_resources,
        "num_pools": g.num_pools,
        "distinct_end_times": int(np.unique(result.end).size),
        "makespan_s": result.makespan,
        # The simulation alone, as a C++ caller of engine.h pays it (via the binding: no
        # validation, no result arrays).
        "native_run_ms": timed(lambda: native.run(*nargs, check=False), repeats),
        # Engine.run_summary: simulation + makespan/busy/peaks/oom (the search's hot path).
        "engine_run_summary_ms": timed(lambda: eng.run_summary(g), repeats),
        # Engine.run: also copies start/end/ready/free_time into fresh numpy arrays.
        "engine_run_ms": timed(lambda: eng.run(g), repeats),
        # O(n + E) validation done once when a TaskGraph is constructed.
        "validate_ms": timed(lambda: _simcore.validate(*nargs), repeats),
        "graph_build_numpy_ms": round(build_ms, 1),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                  "results", "engine_speed.json"))
    args = ap.parse_args()
    out = {
        "benchmark": "engine_speed",
        "note": "min/median ms over repeats of one run (single thread); see the docstring for the graph",
        "cases": [measure(args.tasks, replicated, args.repeats) for replicated in (False, True)],
        "cpu": cpu_name(),
        # Other jobs share this machine: medians suffer from it, minima much less.
        "load_average_1min_at_end": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=2)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
