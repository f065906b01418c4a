"""What a step costs beyond its ops on several processes laid out as TF_CONFIG tasks run tag_tf:
each process of the setup is a task of one cluster with an in-process server. Between-graph, each
runs, through a session on its own server, a step that does no work but is fed like a real one
and meets the other tasks in 4-byte CollectiveReduceV2s (the tasks' sessions are independent: they
meet only in collectives); chief-driven, task 0's session runs that step for every task.

A step with one meeting costs overhead + meeting + c, with two chained ones overhead + meeting +
2c, where c is what the machine's collective fit charges each; so 2 T1 - T2 is the step's own cost
including the first meeting (measured here: 0.4 ms, of which 0.2 ms is the tasks waiting for each
other), which the simulator's collectives do not carry.

The other tasks are helper processes (`python -m tag_tf.localmachine.tasksteps`); between-graph,
every task runs the same graphs in the same order for the same number of steps, so their
collectives pair up."""
from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Sequence
from typing import Any, TypedDict

import numpy as np

from tag_tf.localmachine import helpers
from tag_tf.localmachine.runtime import RUNTIMES, LocalSetup, Runtime, session_config

JOB = "task"
WARMUP = 10
GROUP_KEY = 1 << 29          # far from the compiler's keys and the probes'


class _Task:
    """This process as task `task` of the cluster on `ports`: its server and its part of each step."""

    def __init__(self, ports: Sequence[int], task: int, devices: int, runtime: Runtime):
        import tensorflow as tf

        self.task, self.size = task, len(ports)
        self.leader = f"/job:{JOB}/replica:0/task:0"
        self.device = f"/job:{JOB}/replica:0/task:{task}/device:CPU:0"
        self.config = session_config(devices, leader=self.leader, runtime=runtime)
        server_config = tf.compat.v1.ConfigProto()
        server_config.CopyFrom(self.config)
        if runtime.server_inter_op_threads:          # a server's request handlers need their own threads
            server_config.inter_op_parallelism_threads = runtime.server_inter_op_threads
        cluster = tf.train.ClusterSpec({JOB: [f"127.0.0.1:{p}" for p in ports]})
        self.server = tf.distribute.Server(cluster, job_name=JOB, task_index=task, config=server_config,
                                           start=True)

    def steps(self, nbytes: int, count: int, instance: int, drive_all: bool = False) -> tuple[list[float], list[float]]:
        """`count` steps fed `nbytes` that meet the other tasks once and as many that meet them twice
        (chained), alternating; seconds of each. With `drive_all` this task's session runs every
        task's part (the chief drives the step)."""
        import tensorflow as tf

        tasks = range(self.size) if drive_all else [self.task]
        g = tf.Graph()
        ends: dict[int, list[Any]] = {1: [], 2: []}
        with g.as_default():
            with tf.device(self.device):
                fed = tf.compat.v1.placeholder(tf.float32, [max(1, nbytes // 4)], name="feed")
                mine = tf.cast(tf.shape(fed)[:1], tf.float32)
            for t in tasks:
                with tf.device(f"/job:{JOB}/replica:0/task:{t}/device:CPU:0"):
                    start = mine if t == self.task else tf.constant([1.0])
                    key = instance
                    for meetings in (1, 2):
                        x = start
                        for _ in range(meetings):
                            x = tf.raw_ops.CollectiveReduceV2(
                                input=x, group_size=tf.constant(self.size), group_key=tf.constant(GROUP_KEY),
                                instance_key=tf.constant(key), ordering_token=[], merge_op="Add", final_op="Id")
                            key += 1
                        ends[meetings].append(x.op)
        config = tf.compat.v1.ConfigProto()
        config.CopyFrom(self.config)
        if not drive_all:
            config.device_filters.append(f"/job:{JOB}/replica:0/task:{self.task}")
        feed = {fed: np.zeros(max(1, nbytes // 4), np.float32)}
        times: dict[int, list[float]] = {1: [], 2: []}
        with tf.compat.v1.Session(self.server.target, graph=g, config=config) as sess:
            for _ in range(count):
                for meetings in (1, 2):
                    begin = time.perf_counter()
                    sess.run(ends[meetings], feed)
                    times[meetings].append(time.perf_counter() - begin)
        return times[1], times[2]


def _schedule(feed_sizes: Sequence[int]) -> list[tuple[int, int]]:
    """(fed bytes, first instance key) of every graph, in the order every task runs them."""
    return [(int(nbytes), GROUP_KEY + 3 * k) for k, nbytes in enumerate(feed_sizes)]


def measure_task_steps(setup: LocalSetup, feed_sizes: Sequence[int], repeats: int) -> list[tuple[int, float]]:
    """[(fed bytes, seconds)] of a step's own cost on a multi-process `setup` (see the module
    docstring), as this process (task 0) sees it: between-graph, every task drives its own part;
    else this task's in-process master drives every task's part (the chief under TF_CONFIG with
    between-graph execution off), the others only serve. This process keeps task 0's server until
    it exits (TensorFlow cannot stop an in-process server)."""
    from tag_tf.runtime.cluster import free_ports

    ports = free_ports(setup.processes)
    count = WARMUP + repeats
    me = _Task(ports, 0, setup.devices_per_process, setup.runtime)      # the leader's server first
    spec = {"ports": ports, "devices": setup.devices_per_process, "runtime": setup.runtime.tag,
            "feed_sizes": list(feed_sizes), "count": count, "drive": setup.between_graph}
    others: list[Any] = []
    try:
        for t in range(1, setup.processes):
            others.append(helpers.start("tag_tf.localmachine.tasksteps", dict(spec, task=t), setup.runtime))
        for proc in others:
            helpers.tell(proc, "go")
        out = []
        for nbytes, instance in _schedule(feed_sizes):
            once, twice = me.steps(nbytes, count, instance, drive_all=not setup.between_graph)
            t1, t2 = statistics.median(once[WARMUP:]), statistics.median(twice[WARMUP:])
            out.append((nbytes, max(2 * t1 - t2, 0.0)))
        for proc in others:
            helpers.expect(proc, "done")
    finally:
        for proc in others:
            helpers.stop(proc)
    return out


class _Spec(TypedDict):
    """What `measure_task_steps` tells a helper task (as JSON on its command line)."""

    ports: list[int]
    task: int
    devices: int
    runtime: str
    feed_sizes: list[int]
    count: int
    drive: bool


def _helper(spec: _Spec) -> None:
    task = _Task(spec["ports"], int(spec["task"]), int(spec["devices"]), RUNTIMES[spec["runtime"]])
    helpers.say(helpers.READY)
    if sys.stdin.readline().strip() != "go":
        return
    if spec["drive"]:               # else the main task's session runs our part through our server
        for nbytes, instance in _schedule(spec["feed_sizes"]):
            task.steps(nbytes, int(spec["count"]), instance)
    helpers.say("done")
    sys.stdin.readline()         # until the main task closes our input


if __name__ == "__main__":
    _helper(json.loads(sys.argv[1]))
