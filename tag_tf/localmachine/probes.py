"""What the local machine model measures on this machine: TF transfers between two devices,
CollectiveReduceV2 over k devices, the per-step cost of a session.run and the compiler's conversions
on a CPU, plus the line fitted to such samples (`model.measure_machine` runs them per setup).

Each transfer/collective time is (median chained step - median baseline step) / chain length, the
baseline having the same participants without the communication (see `tag_tf.measure.comm`).
"""
from __future__ import annotations

import itertools
import statistics
from collections.abc import Sequence

import numpy as np

from tag_tf.localmachine.runtime import PINNED, Runtime, SetupRunner, session_config
from tag_tf.measure.comm import chain_length, time_pair

_KEYS = itertools.count(1 << 30)   # collective keys of the measurements: far above the ones compiled graphs use


def measure_transfers(runner: SetupRunner, src: int, dst: int, sizes: Sequence[int], repeats: int
                      ) -> list[tuple[int, float]]:
    """[(bytes, seconds)] of one TF transfer src -> dst (device indices of the setup). The timed step
    passes a tensor back and forth through Identity ops placed alternately on dst and src; the
    baseline runs as many Identity ops on src (and a tiny op on dst, so both processes take part
    in both steps). Their difference per hop is the Send/Recv pair (in-process rendezvous or gRPC
    RecvTensor), without the Identity's own cost, which the profile already has."""
    import tensorflow as tf

    out = []
    a, b = runner.devices[src], runner.devices[dst]
    for nbytes in sizes:
        hops = chain_length(nbytes)
        g = tf.Graph()
        with g.as_default():
            with tf.device(a):
                var = tf.Variable(tf.random.uniform([max(1, nbytes // 4)]), name="src")
                x = y = var.read_value()
            with tf.device(b):
                tiny = tf.Variable(tf.zeros([1]), name="tiny").read_value()
            for hop in range(hops):
                with tf.device(b if hop % 2 == 0 else a):
                    x = tf.identity(x)
                with tf.device(a):
                    y = tf.identity(y)
            with tf.device(a):
                end_x, end_y = tf.identity(x[:1]), tf.identity(y[:1])
            init = tf.compat.v1.global_variables_initializer()
        with runner.session(g) as sess:
            sess.run(init)
            step, base = time_pair(lambda: sess.run(end_x.op), lambda: sess.run([end_y.op, tiny.op]), repeats)
        out.append((int(nbytes), max(step - base, 0.0) / hops))
    return out


def measure_message_cost(runner: SetupRunner, src: int, dst: int, repeats: int, messages: int = 32,
                         chain: int = 40) -> float:
    """Seconds of executor time one small transfer src -> dst takes away from the ops of the two
    processes: a chain of `chain` 256x256 matmuls runs on dst, alone (baseline) and beside
    `messages` independent 4-byte transfers from src consumed on dst. The transfers need no compute,
    so on idle cores they would hide behind the chain; what they add per message is CPU work (gRPC
    request handling, serialisation) that competes with the ops. The simulator charges it to both
    processes' executors (`CommModel.host_message_s`); the rest of a transfer's latency is waiting."""
    import tensorflow as tf

    a, b = runner.devices[src], runner.devices[dst]
    g = tf.Graph()
    with g.as_default():
        with tf.device(b):
            m = tf.Variable(tf.random.uniform([256, 256], seed=1) / 256.0, name="m")
            x = m.read_value()
            for _ in range(chain):
                x = tf.matmul(x, m)
            chain_end = tf.identity(x[:1, :1])
        with tf.device(a):
            values = [tf.Variable(tf.zeros([1]), name=f"v{i}").read_value() for i in range(messages)]
        with tf.device(b):
            received = [tf.identity(v).op for v in values]
        init = tf.compat.v1.global_variables_initializer()
    with runner.session(g) as sess:
        sess.run(init)
        step, base = time_pair(lambda: sess.run(received + [chain_end.op]), lambda: sess.run(chain_end.op),
                               repeats)
    return max(step - base, 0.0) / messages


def measure_collectives(runner: SetupRunner, devices: Sequence[int], sizes: Sequence[int], repeats: int
                        ) -> list[tuple[int, float]]:
    """[(bytes, seconds)] of one CollectiveReduceV2 (sum) of `bytes` per device over `devices`, the
    op the compiler emits on CPUs, with its default timeout_seconds=0 (a timeout starts a timer
    thread per op run: it would inflate the measured time and leak threads for the timeout's
    duration; the session's operation timeout still stops a hung step). Rounds are chained (each
    reduces the previous outputs, with its own instance key); the baseline reads the inputs on the
    same devices."""
    import tensorflow as tf

    names = [runner.devices[d] for d in devices]
    out = []
    for nbytes in sizes:
        rounds = chain_length(nbytes, most=8)
        n = max(1, nbytes // 4)
        g = tf.Graph()
        with g.as_default():
            xs, heads = [], []
            for i, dev in enumerate(names):
                with tf.device(dev):
                    xs.append(tf.Variable(tf.random.uniform([n], seed=i), name=f"in{i}").read_value())
                    heads.append(tf.identity(xs[-1][:1]))
            group = next(_KEYS)
            for _ in range(rounds):
                instance = next(_KEYS)
                nxt = []
                for dev, x in zip(names, xs):
                    with tf.device(dev):
                        nxt.append(tf.raw_ops.CollectiveReduceV2(
                            input=x, group_size=tf.constant(len(names)), group_key=tf.constant(group),
                            instance_key=tf.constant(instance), ordering_token=[], merge_op="Add",
                            final_op="Id"))
                xs = nxt
            ends = []
            for dev, x in zip(names, xs):
                with tf.device(dev):
                    ends.append(tf.identity(x[:1]))
            init = tf.compat.v1.global_variables_initializer()
        with runner.session(g) as sess:
            sess.run(init)
            step, base = time_pair(lambda: sess.run([e.op for e in ends]),
                                      lambda: sess.run([h.op for h in heads]), repeats)
        out.append((int(nbytes), max(step - base, 0.0) / rounds))
    return out


def measure_step_overhead(runner: SetupRunner, feed_sizes: Sequence[int], repeats: int) -> list[tuple[int, float]]:
    """[(fed bytes, seconds)] of a session.run that does no work: a float32 placeholder of that size
    fed to a Shape op on device 0, and a no-op on the first device of every other process (a real
    step runs a graph partition in every process). What any step costs beyond its ops."""
    import tensorflow as tf

    per_process = runner.setup.devices_per_process
    out = []
    for nbytes in feed_sizes:
        g = tf.Graph()
        with g.as_default():
            with tf.device(runner.devices[0]):
                ph = tf.compat.v1.placeholder(tf.float32, [max(1, nbytes // 4)], name="feed")
                fetch = [tf.shape(ph).op]
            for p in range(1, runner.setup.processes):
                with tf.device(runner.devices[p * per_process]):
                    fetch.append(tf.constant(0.0).op)
        value = np.zeros(max(1, nbytes // 4), np.float32)
        with runner.session(g) as sess:
            step, _ = time_pair(lambda: sess.run(fetch, {ph: value}), lambda: None, repeats)
        out.append((int(nbytes), step))
    return out


# The compiler's conversions on a CPU device, and the bytes the simulator charges for each
# (kernels/expand.h: split and concat 2x the tensor, AddN (n+1)x, zeros 1x).
def measure_conversions(sizes: Sequence[int] = (1 << 10, 1 << 14, 1 << 18, 1 << 20, 1 << 22),
                        repeats: int = 7, runtime: Runtime = PINNED) -> list[tuple[float, float]]:
    """[(charged bytes, seconds)] of ConcatV2, AddN (2 inputs) and ZerosLike on one CPU device of
    this process, from traced op times (like the profile). SplitV is left out: on the batch axis it
    returns views of its input (about 1 us at any size), which the simulator's one memcpy model
    for all conversions cannot express; it overcharges those splits slightly instead of
    undercharging every copy."""
    import tensorflow as tf

    from tag_tf.profile.op_profile import op_times_from_step_stats

    samples = []
    for nbytes in sizes:
        n = max(4, nbytes // 4) // 4 * 4
        g = tf.Graph()
        with g.as_default(), tf.device("/device:CPU:0"):
            v = tf.Variable(tf.random.uniform([n]), name="v").read_value()
            w = tf.Variable(tf.random.uniform([n]), name="w").read_value()
            cat = tf.concat([v, w], 0, name="concat")
            total = tf.add_n([v, w], name="addn")
            zeros = tf.zeros_like(v, name="zeros")
            fetch = [cat.op, total.op, zeros.op]
            init = tf.compat.v1.global_variables_initializer()
        charged = {"concat": 2.0 * 2 * nbytes, "addn": 3.0 * nbytes, "zeros": 1.0 * nbytes}
        times: dict[str, list[float]] = {k: [] for k in charged}
        opts = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
        with tf.compat.v1.Session(graph=g, config=session_config(1, runtime=runtime)) as sess:
            sess.run(init)
            for r in range(repeats + 2):
                meta = tf.compat.v1.RunMetadata()
                sess.run(fetch, options=opts, run_metadata=meta)
                if r < 2:
                    continue
                got = op_times_from_step_stats(meta.step_stats)
                for k in charged:
                    if k in got:
                        times[k].append(got[k])
        for k, b in charged.items():
            if times[k]:
                samples.append((b, statistics.median(times[k])))
    return samples


def fit_line(samples: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of a least-squares line, both clipped non-negative."""
    x = np.array([s[0] for s in samples], dtype=np.float64)
    y = np.array([s[1] for s in samples], dtype=np.float64)
    if len(x) < 2 or np.ptp(x) == 0:
        return max(float(np.mean(y)), 0.0), 0.0
    slope, intercept = np.polyfit(x, y, 1)
    if intercept < 0:
        return 0.0, float(max(np.sum(x * y) / np.sum(x * x), 0.0))
    return float(intercept), float(max(slope, 0.0))

