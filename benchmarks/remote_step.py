"""What a client-driven step costs once a second process takes part, MEASURED (the floor under every
two-process TF1 step, tag_tf's included).

Two local `tf.distribute.Server`s (task 0 in this process, task 1 in a child); a session on task 0
runs a trivial step (a reduce over one fed 16x28x28 batch) three ways:

  local          every op on task 0
  remote-fed     the placeholder and the reduce on task 1, the sum back to task 0: the fed value
                 travels inside the RunGraph request to task 1
  remote-pulled  the placeholder on task 0, the reduce on task 1: task 1 pulls the value (RecvTensor)

The difference local -> remote is what one RunGraph round trip to another process costs per step;
remote-fed vs remote-pulled tells whether shipping a worker's input shard inside RunGraph (instead
of the worker pulling it) would save anything. MultiWorkerMirroredStrategy and Horovod pay neither:
each process drives its own step and only the collectives cross.

Usage: python benchmarks/remote_step.py [--steps 300] [--rounds 3]   (prints JSON; benchmarks/results/remote_step.json)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.machine import cpu_name  # noqa: E402

SHAPE = (16, 28, 28, 1)


def serve(cluster: dict, index: int) -> None:
    import tensorflow as tf

    tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="worker", task_index=index).join()


def steps(target: str, where: str, feed, count: int) -> float:
    """Median seconds of `count` session.run calls of the step laid out as `where`."""
    import tensorflow as tf

    here, there = "/job:worker/task:0/cpu:0", "/job:worker/task:1/cpu:0"
    graph = tf.Graph()
    with graph.as_default():
        with tf.device(there if where == "remote-fed" else here):
            x = tf.compat.v1.placeholder(tf.float32, [None, *SHAPE[1:]])
        with tf.device(here if where == "local" else there):
            partial = tf.reduce_sum(x * 2.0)
        with tf.device(here):
            out = partial + 1.0
    config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=60_000)
    with tf.compat.v1.Session(target, graph=graph, config=config) as sess:
        for _ in range(20):
            sess.run(out, {x: feed})
        times = []
        for _ in range(count):
            start = time.perf_counter()
            sess.run(out, {x: feed})
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "remote_step.json"))
    ap.add_argument("--serve", help=argparse.SUPPRESS)      # internal: the child's task 1
    args = ap.parse_args()
    if args.serve:
        serve(json.loads(args.serve), 1)
        return
    import numpy as np
    import tensorflow as tf

    from tag_tf.runtime.cluster import free_ports

    cluster = {"worker": [f"127.0.0.1:{p}" for p in free_ports(2)]}
    child = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--serve", json.dumps(cluster)])
    try:
        server = tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="worker", task_index=0)
        feed = np.random.default_rng(0).random(SHAPE, dtype=np.float32)
        ways = ("local", "remote-fed", "remote-pulled")
        rounds = [{w: steps(server.target, w, feed, args.steps) * 1e3 for w in ways} for _ in range(args.rounds)]
    finally:
        child.kill()
        child.wait()
    medians = {w: statistics.median(r[w] for r in rounds) for w in ways}
    out = {"measured": True, "cpu": cpu_name(), "cores": os.cpu_count(), "steps": args.steps, "shape": list(SHAPE),
           "rounds_ms": rounds, "median_ms": medians,
           "remote_over_local_ms": medians["remote-fed"] - medians["local"],
           "pulled_over_fed_ms": medians["remote-pulled"] - medians["remote-fed"]}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    print(json.dumps({k: out[k] for k in ("median_ms", "remote_over_local_ms", "pulled_over_fed_ms")}, indent=1))


if __name__ == "__main__":
    main()
