"""Train a corpus program K steps plain and under `tag_tf.distribute(...)` and compare the results.

The plain and distributed runs start from the same values (the plain run's initial values are loaded
into every global variable of the distributed run: Keras and tf.layers initialisers do not give the
same values in two graphs even with the same graph seed) and see the same batches. The noise floor is
what float32 reassociation alone gives: the plain program trained on batches whose rows are permuted
(the same math, summed in another order)."""
from __future__ import annotations

import functools
import os
import random
from types import ModuleType
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import tensorflow as tf

import tag_tf

# Relative difference of the distributed run allowed over the noise floor, and its absolute floor.
NOISE_FACTOR = 10.0
MIN_TOLERANCE = 1e-5


def _permutation(step: int, n: int) -> np.ndarray:
    return np.random.default_rng(10_000 + step).permutation(n)


def _permuted(feed: dict, step: int) -> dict:
    out = {}
    for key, value in feed.items():
        value = np.asarray(value)
        out[key] = value[_permutation(step, value.shape[0])] if value.ndim else value
    return out


def train(program: ModuleType, steps: int, distribute_kwargs: dict | None = None,
          init_values: list[np.ndarray] | None = None, permute: bool = False
          ) -> tuple[list[float], dict[str, np.ndarray], list[np.ndarray]]:
    """(losses, trainable variable values by name, initial values of the global variables)."""

    def run() -> tuple[list[float], dict[str, np.ndarray], list[np.ndarray]]:
        # Keras initialisers draw their seeds from Python's and NumPy's generators: seeding them makes a
        # program's initial values (and so its noise floor) the same in every process.
        random.seed(3)
        np.random.seed(3)
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.set_random_seed(3)
            inputs, train_op, loss = program.build()
            gvars = tf.compat.v1.global_variables()
            tvars = tf.compat.v1.trainable_variables()
            init = [tf.compat.v1.global_variables_initializer()]
            if tf.compat.v1.local_variables():
                init.append(tf.compat.v1.local_variables_initializer())
            if tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS):
                init.append(tf.compat.v1.tables_initializer())
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(init)
            if init_values is None:
                start = sess.run(gvars)
            else:
                # Variable.load for every variable at once: one run of all initialisers, their
                # initial-value inputs fed (a run per variable is slow on graphs with many variables).
                start = init_values
                sess.run([v.initializer for v in gvars],
                         {v.initializer.inputs[1]: x for v, x in zip(gvars, init_values, strict=True)})
            losses = []
            for step in range(steps):
                feed = program.feed(inputs, step)
                if permute:
                    feed = _permuted(feed, step)
                _, value = sess.run([train_op, loss], feed_dict=feed)
                losses.append(float(value))
            values = sess.run(tvars)
        return losses, {v.name: x for v, x in zip(tvars, values, strict=True)}, start

    if distribute_kwargs is None:
        return run()
    with tag_tf.distribute(**distribute_kwargs):
        return run()


def max_rel_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """max over variables of max|a-b| / (max|a| + 1e-6)."""
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    return max(float(np.max(np.abs(a[k] - b[k])) / (np.max(np.abs(a[k])) + 1e-6)) for k in a)


@functools.lru_cache(maxsize=None)
def reference(program: ModuleType, steps: int) -> tuple[list[float], dict[str, np.ndarray], list[np.ndarray], float]:
    """The plain run (losses, variables, initial values) and its noise floor; cached per program."""
    losses, values, start = train(program, steps)
    _, permuted, _ = train(program, steps, init_values=start, permute=True)
    return losses, values, start, max_rel_diff(values, permuted)


def compare(program: ModuleType, steps: int | None = None, **distribute_kwargs: Any) -> tuple[float, float]:
    """(max relative difference of the distributed run from the plain one, the noise floor)."""
    steps = getattr(program, "STEPS", 3) if steps is None else steps
    _, values, start, noise = reference(program, steps)
    _, dist, _ = train(program, steps, distribute_kwargs, init_values=start)
    return max_rel_diff(values, dist), noise


def tolerance(noise: float) -> float:
    return max(NOISE_FACTOR * noise, MIN_TOLERANCE)


def ok(diff: float, noise: float) -> bool:
    return bool(np.isfinite(diff)) and diff <= tolerance(noise)
