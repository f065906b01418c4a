"""TensorFlow's own ways to train a zoo model, for step_time.py: the peers tag_tf is MEASURED against.

  tf2-single       a tf.function training step on one CPU device
  mirrored-local2  tf.distribute.MirroredStrategy over 2 logical CPU devices, one process
  mwms-2proc       MultiWorkerMirroredStrategy, one process per task started with its own TF_CONFIG
  horovod-2proc    Horovod (Gloo) on the TF1 graph: hvd.DistributedOptimizer with its default Tensor
                   Fusion, one rank per process under horovodrun

Every peer runs the zoo model's own forward pass (`model_forward`, the definition build_model wraps),
starts from the values the TF1 graph's seeded initialisers give, and trains with SGD + momentum 0.9 at
the TF1 rows' learning rate. Keras SGD's momentum update equals TF1 MomentumOptimizer's for a constant
learning rate, so losses match the TF1 rows step for step up to float reassociation.

Each process reports the mean loss of the samples it saw; a multi-process peer's loss is the mean of
its processes' (equal shards), so no extra collective enters the timed steps.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np


class TensorInputs:
    """Stands in for the zoo's placeholder-making `Inputs`: add(name, ...) returns the given tensor."""

    def __init__(self, tensors: dict[str, Any]):
        self.tensors = tensors

    def add(self, name: str, dtype: str, shape, low: float = 0.0, high: float = 1.0):
        return self.tensors[name]


def initial_values(model) -> dict[str, np.ndarray]:
    """Trainable variable name ("conv_0/kernel") -> its value after the TF1 graph's own initialiser."""
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(model.meta_graph_def)
        variables = tf.compat.v1.trainable_variables()
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(model.init_op)
            values = sess.run(variables)
    return {v.name.split(":")[0]: value for v, value in zip(variables, values)}


def loopback_bytes() -> int:
    """Bytes sent over the loopback interface so far, by every process on this machine (Linux)."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                name, _, counters = line.partition(":")
                if name.strip() == "lo":
                    return int(counters.split()[8])       # transmit bytes
    except OSError:
        pass
    return 0


def summarize(times: list[float], losses: list[float], warmup: int, loopback: int = 0) -> dict:
    """Timings of the steps after `warmup` (mean_ms: their total over their count, the time a run of
    them takes per step); loopback = bytes sent over lo during those steps."""
    timed = times[warmup:]
    return {"first_step_s": times[0], "median_ms": statistics.median(timed) * 1e3,
            "mean_ms": statistics.fmean(timed) * 1e3, "min_ms": min(timed) * 1e3,
            "max_ms": max(timed) * 1e3, "first_loss": losses[0], "last_loss": losses[-1], "steps": len(timed),
            "loopback_bytes_per_step": loopback / len(timed)}


_TRANSFERS = ("_Recv", "_Send", "_HostRecv", "_HostSend", "RecvTensor")


def traced_step(run_once: Callable[[], None]) -> dict:
    """Run one step under TensorFlow's profiler and break this process's part of it down: ms busy
    with compute, collectives (waiting for peers included) and transfers (send/recv), each the union
    of its ops' intervals over every executor thread, and ms idle (wall - busy)."""
    import glob
    import tempfile

    import tensorflow as tf
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    run_once()                              # the profiler's first step pays for its own set-up
    logdir = tempfile.mkdtemp(prefix="tag_tf_trace_")
    tf.profiler.experimental.start(logdir)
    start = time.perf_counter()
    run_once()
    wall = time.perf_counter() - start
    tf.profiler.experimental.stop()
    space = xplane_pb2.XSpace()
    with open(sorted(glob.glob(f"{logdir}/**/*.xplane.pb", recursive=True))[-1], "rb") as f:
        space.ParseFromString(f.read())
    spans: dict[str, list[tuple[float, float]]] = {"compute": [], "collectives": [], "transfers": []}
    for plane in space.planes:
        if plane.name != "/host:CPU":
            continue
        for line in plane.lines:
            for event in line.events:
                name = plane.event_metadata[event.metadata_id].name
                if ":" not in name or "::" in name:        # op events are "node:OpType"
                    continue
                op = name.rsplit(":", 1)[1]
                kind = ("collectives" if op.startswith("Collective") else
                        "transfers" if op.startswith(_TRANSFERS) else "compute")
                lo = line.timestamp_ns * 1e3 + event.offset_ps
                spans[kind].append((lo, lo + event.duration_ps))
    row = {kind: _union_ps(v) / 1e9 for kind, v in spans.items()}       # ps -> ms
    busy = _union_ps([iv for v in spans.values() for iv in v]) / 1e9
    row.update(wall_ms=wall * 1e3, idle=max(wall * 1e3 - busy, 0.0), ops=sum(len(v) for v in spans.values()))
    return row


def _union_ps(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, None
    for lo, hi in sorted(intervals):
        if end is None or lo > end:
            total += hi - lo
            end = hi
        elif hi > end:
            total += hi - end
            end = hi
    return total


def _local_batches(batches: list[dict], part: int, parts: int) -> list[dict]:
    out = []
    for feed in batches:
        size = len(next(iter(feed.values()))) // parts
        out.append({name.split(":")[0]: value[part * size:(part + 1) * size] for name, value in feed.items()})
    return out


def _keras_run(strategy, forward: Callable, values: dict[str, np.ndarray], lr: float, steps: int,
               shard: Callable[[int, int], dict], warmup: int, breakdown: bool = False) -> dict:
    """A tf.function step under `strategy`; shard(step, replica_id) is that replica's slice of a batch."""
    import tensorflow as tf

    class Net(tf.Module):
        @tf.compat.v1.keras.utils.track_tf1_style_variables
        def __call__(self, feeds):
            with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), use_resource=True):
                return forward(TensorInputs(feeds))

    replicas = strategy.num_replicas_in_sync
    first = shard(0, 0)
    with strategy.scope():
        net = Net()
        net({k: tf.constant(v) for k, v in first.items()})        # creates the variables, cross-replica
        by_name = {v.name.split(":")[0]: v for v in net.trainable_variables}
        missing = sorted(set(values) ^ set(by_name))
        if missing:
            raise SystemExit(f"TF2 and TF1 variables differ: {missing[:5]}")
        for name, var in by_name.items():
            var.assign(values[name])
        optimizer = tf.keras.optimizers.SGD(lr, momentum=0.9)
        trainable = [by_name[name] for name in sorted(by_name)]

    @tf.function
    def step(feeds):
        def replica_step(feeds):
            with tf.GradientTape() as tape:
                loss = net(feeds)
                scaled = loss / replicas
            grads = tape.gradient(scaled, trainable)
            optimizer.apply_gradients(zip(grads, trainable))
            return loss
        return strategy.run(replica_step, (feeds,))

    times, losses = [], []
    for i in range(steps):
        if i == warmup:
            lo_start = loopback_bytes()
        start = time.perf_counter()
        local = strategy.experimental_distribute_values_from_function(
            lambda ctx, i=i: shard(i, ctx.replica_id_in_sync_group))
        per_replica = strategy.experimental_local_results(step(local))
        loss = float(np.mean([float(x) for x in per_replica]))     # values already here: no collective
        times.append(time.perf_counter() - start)
        losses.append(loss)
    row = summarize(times, losses, warmup, loopback_bytes() - lo_start)
    if breakdown:       # more steps, traced after the timed ones (so they change none of them)
        def run_once() -> None:
            local = strategy.experimental_distribute_values_from_function(
                lambda ctx: shard(0, ctx.replica_id_in_sync_group))
            strategy.experimental_local_results(step(local))
        row["breakdown"] = traced_step(run_once)
    return row


def run_tf2(config: str, model_name: str, model_kwargs: dict, batches: list[dict], warmup: int,
            breakdown: bool = False) -> dict:
    """tf2-single, mirrored-local2, or this process's task of mwms-2proc (TF_CONFIG set by the caller)."""
    import json
    import os

    import tensorflow as tf

    from tag_tf.models import build_model, model_forward
    from tag_tf.models.training import make_optimizer

    if config == "mirrored-local2":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    if config == "mwms-2proc":      # before any other TensorFlow call, as its documentation asks
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
    elif config == "mirrored-local2":
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    elif config == "tf2-single":
        strategy = tf.distribute.get_strategy()
    else:
        raise SystemExit(f"unknown peer {config!r}")
    model = build_model(model_name, **model_kwargs)
    forward, _, opts = model_forward(model_name, **model_kwargs)
    lr = make_optimizer(opts)._learning_rate
    if config == "mwms-2proc":
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        workers = strategy.cluster_resolver.cluster_spec().num_tasks("worker")
        mine = _local_batches(batches, int(task["index"]), workers)
        return _keras_run(strategy, forward, initial_values(model), lr, len(mine),
                          lambda i, replica: mine[i], warmup, breakdown)  # one replica per task
    parts = strategy.num_replicas_in_sync
    shards = [_local_batches(batches, r, parts) for r in range(parts)]
    return _keras_run(strategy, forward, initial_values(model), lr, len(batches),
                      lambda i, replica: shards[replica][i], warmup, breakdown)


def run_horovod(model_name: str, model_kwargs: dict, batches: list[dict], warmup: int,
                breakdown: bool = False) -> dict:
    """This rank's share of horovod-2proc: the TF1 graph with hvd.DistributedOptimizer (default fusion)."""
    import horovod.tensorflow as hvd
    import tensorflow as tf

    from tag_tf.models import build_model, model_forward
    from tag_tf.models.training import Inputs, make_optimizer

    hvd.init()
    model = build_model(model_name, **model_kwargs)
    values = initial_values(model)
    forward, _, opts = model_forward(model_name, **model_kwargs)
    mine = _local_batches(batches, hvd.rank(), hvd.size())
    graph = tf.Graph()
    with graph.as_default():
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), use_resource=True):
            inputs = Inputs(opts)
            loss = forward(inputs)
            optimizer = hvd.DistributedOptimizer(tf.compat.v1.train.MomentumOptimizer(
                make_optimizer(opts)._learning_rate, momentum=0.9))
            train_op = optimizer.minimize(loss)
            init = tf.compat.v1.global_variables_initializer()
            trainable = {v.name.split(":")[0]: v for v in tf.compat.v1.trainable_variables()}
    config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=120_000)
    times, losses = [], []
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        sess.run(init)
        for name, var in trainable.items():
            var.load(values[name], sess)
        for i, feed in enumerate(mine):
            if i == warmup:
                lo_start = loopback_bytes()
            start = time.perf_counter()
            _, value = sess.run([train_op, loss], {f"{k}:0": v for k, v in feed.items()})
            times.append(time.perf_counter() - start)
            losses.append(float(value))
        lo_end = loopback_bytes()
        row = dict(summarize(times, losses, warmup, lo_end - lo_start), rank=hvd.rank())
        if breakdown:   # more steps, traced after the timed ones (so they change none of them)
            row["breakdown"] = traced_step(lambda: sess.run(train_op, {f"{k}:0": v for k, v in mine[0].items()}))
    return row
