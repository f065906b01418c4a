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
of the worker pulling it) would save anything.

Then the same reduce split over both tasks (each half of the batch), its partial sums added across
the processes, every task getting the total — a data-parallel step's gradient exchange:

  exchange-client    one session drives both tasks; task 1's sum goes to task 0, the total back
                     (plain Send/Recv inside the step)
  collective-client  one session drives both tasks; the sums meet in a CollectiveReduceV2
                     (how tag_tf's compiled graphs run under TF_CONFIG today: the chief drives)
  collective-each    each process runs its own session of its own half, the sums meet in the
                     same collective (between-graph, how MultiWorkerMirroredStrategy and Horovod
                     run): no RunGraph crosses, only the collective

collective-client - collective-each is what driving each task's partition from its own process
(between-graph execution) would save per step.

Usage: python benchmarks/remote_step.py [--steps 300] [--rounds 3]   (prints JSON; benchmarks/results/remote_step.json)
"""
from __future__ import annotations

import argparse
import contextlib
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


LEADER = "/job:worker/replica:0/task:0"


def server(cluster: dict, index: int):
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto()
    config.experimental.collective_group_leader = LEADER     # cross-process collectives need it
    return tf.distribute.Server(tf.train.ClusterSpec(cluster), job_name="worker", task_index=index, config=config)


def session_config():
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=60_000)
    config.experimental.collective_group_leader = LEADER
    return config


def serve(cluster: dict, index: int, each: str | None) -> None:
    """A child's task: serve; with `each` ("count,rounds"), run its own half of collective-each
    instead (task 0 prints its medians, in ms, as JSON)."""
    import numpy as np

    srv = server(cluster, index)
    if each is None:
        srv.join()
        return
    count, rounds = (int(x) for x in each.split(","))
    half = np.random.default_rng(index).random((SHAPE[0] // 2, *SHAPE[1:]), dtype=np.float32)
    medians = [own_step(srv.target, index, half, count, r) * 1e3 for r in range(rounds)]
    if index == 0:
        print(json.dumps(medians), flush=True)


def timed(run, count: int) -> float:
    """Median seconds of `count` calls of `run` after 20 untimed ones."""
    for _ in range(20):
        run()
    times = []
    for _ in range(count):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def own_step(target: str, task: int, half, count: int, instance: int) -> float:
    """collective-each, this process's half: its sum meets the other task's in a collective."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default(), tf.device(f"/job:worker/task:{task}/cpu:0"):
        x = tf.compat.v1.placeholder(tf.float32, [None, *SHAPE[1:]])
        total = tf.raw_ops.CollectiveReduceV2(input=tf.reduce_sum(x * 2.0), group_size=2, group_key=1,
                                              instance_key=100 + instance, ordering_token=[], merge_op="Add",
                                              final_op="Id")
        out = total + 1.0
    with tf.compat.v1.Session(target, graph=graph, config=session_config()) as sess:
        return timed(lambda: sess.run(out, {x: half}), count)


def both_tasks(target: str, how: str, feed, count: int, instance: int) -> float:
    """exchange-client / collective-client: one session, both halves, the total on both tasks."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        xs, sums = [], []
        for task in (0, 1):
            with tf.device(f"/job:worker/task:{task}/cpu:0"):
                xs.append(tf.compat.v1.placeholder(tf.float32, [None, *SHAPE[1:]]))
                sums.append(tf.reduce_sum(xs[-1] * 2.0))
        outs = []
        for task in (0, 1):
            with tf.device(f"/job:worker/task:{task}/cpu:0"):
                if how == "collective-client":
                    total = tf.raw_ops.CollectiveReduceV2(input=sums[task], group_size=2, group_key=2,
                                                          instance_key=200 + instance, ordering_token=[],
                                                          merge_op="Add", final_op="Id")
                elif task == 0:
                    total = sums[0] + sums[1]          # task 1's sum crosses to task 0 ...
                else:
                    total = tf.identity(outs[0] - 1.0)   # ... and the total back
                outs.append(total + 1.0)
    half = SHAPE[0] // 2
    fed = {xs[0]: feed[:half], xs[1]: feed[half:]}
    with tf.compat.v1.Session(target, graph=graph, config=session_config()) as sess:
        return timed(lambda: sess.run(outs, fed), count)


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
    with tf.compat.v1.Session(target, graph=graph, config=session_config()) as sess:
        return timed(lambda: sess.run(out, {x: feed}), count)


@contextlib.contextmanager
def child_task(cluster: dict, index: int, each: str | None = None):
    """Task `index` in a child process (killed on the way out)."""
    argv = [sys.executable, os.path.abspath(__file__), "--serve", json.dumps(cluster), "--task", str(index)]
    child = subprocess.Popen(argv + (["--each", each] if each else []), stdout=subprocess.PIPE, text=True)
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()


def cluster_of(ports: list[int]) -> dict:
    return {"worker": [f"127.0.0.1:{p}" for p in ports]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(ROOT, "benchmarks", "results", "remote_step.json"))
    ap.add_argument("--serve", help=argparse.SUPPRESS)      # internal: a child task (--task, default 1)
    ap.add_argument("--task", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--each", help=argparse.SUPPRESS)       # internal: the child runs collective-each
    args = ap.parse_args()
    if args.serve:
        serve(json.loads(args.serve), args.task, args.each)
        return
    import numpy as np

    from tag_tf.runtime.cluster import free_ports

    ways = ("local", "remote-fed", "remote-pulled", "exchange-client", "collective-client", "collective-each")
    feed = np.random.default_rng(0).random(SHAPE, dtype=np.float32)
    rounds: list[dict[str, float]] = [{} for _ in range(args.rounds)]
    # Client-driven ways: task 1 only serves.
    cluster = cluster_of(free_ports(2))
    with child_task(cluster, 1):
        srv = server(cluster, 0)
        for r in range(args.rounds):
            for w in ways[:3]:
                rounds[r][w] = steps(srv.target, w, feed, args.steps) * 1e3
            for w in ways[3:5]:
                rounds[r][w] = both_tasks(srv.target, w, feed, args.steps, r) * 1e3
    # Between-graph: both tasks in fresh processes, each driving its own half.
    cluster = cluster_of(free_ports(2))
    each = f"{args.steps},{args.rounds}"
    with child_task(cluster, 1, each), child_task(cluster, 0, each) as chief:
        out_text, _ = chief.communicate(timeout=600)
        if chief.returncode != 0:
            raise SystemExit(f"collective-each: task 0 failed (exit {chief.returncode})")
    for r, ms in enumerate(json.loads(out_text.strip().splitlines()[-1])):
        rounds[r]["collective-each"] = ms
    medians = {w: statistics.median(r[w] for r in rounds) for w in ways}
    out = {"measured": True, "cpu": cpu_name(), "cores": os.cpu_count(), "steps": args.steps, "shape": list(SHAPE),
           "rounds_ms": rounds, "median_ms": medians,
           "remote_over_local_ms": medians["remote-fed"] - medians["local"],
           "pulled_over_fed_ms": medians["remote-pulled"] - medians["remote-fed"],
           "between_graph_saves_ms": medians["collective-client"] - medians["collective-each"],
           "exchange_under_collective_ms": medians["collective-client"] - medians["exchange-client"]}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1, sort_keys=True)
    print(json.dumps({k: out[k] for k in ("median_ms", "remote_over_local_ms", "pulled_over_fed_ms",
                                          "between_graph_saves_ms", "exchange_under_collective_ms")}, indent=1))


if __name__ == "__main__":
    main()
