"""What `tag_tf.distribute` adds to every `session.run` beyond the compiled graph's own run: the
patched session maps the user's fetches and feeds to the compiled program's (TensorFlow's own
fetch handling of the user's call runs first, then ours, then the compiled session's run).
Measured on a trivial training step (one fed input, one variable, a train op and a loss fetched),
the same one-device graph run plainly and under `distribute` on local:1, which compiles it to
itself: tens of microseconds here, which matter beside a tiny model's sub-millisecond steps (the
local machine model's predictions of real steps add it)."""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Any

import numpy as np


def _steps(scope: Any, repeats: int) -> float:
    import tensorflow as tf

    from tag_tf.runtime.sessions import session_config

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 8], name="x")
        w = tf.compat.v1.get_variable("w", [8, 1], initializer=tf.compat.v1.zeros_initializer())
        loss = tf.reduce_mean(tf.matmul(x, w), name="loss")
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, name="train_op")
        init = tf.compat.v1.global_variables_initializer()
    feed = {x: np.ones([4, 8], np.float32)}
    times = []
    with scope:
        with tf.compat.v1.Session(graph=graph, config=session_config(1)) as sess:     # with a deadline
            sess.run(init)
            for i in range(repeats + 50):           # the first runs compile and warm up
                start = time.perf_counter()
                sess.run([train, loss], feed)
                if i >= 50:
                    times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure_run_cost(repeats: int = 300, rounds: int = 2) -> float:
    """Seconds `distribute` adds to a training run (>= 0): the smallest of `rounds` differences of
    medians, plain and distributed interleaved (a load burst then hits one round, not the figure)."""
    from tag_tf.frontend.distribute import distribute

    diffs = []
    for _ in range(rounds):
        plain = _steps(contextlib.nullcontext(), repeats)
        ours = _steps(distribute(strategy="dp", topology="local:1"), repeats)
        diffs.append(ours - plain)
    return max(min(diffs), 0.0)
