"""Shared fixtures: zoo models (tiny), their IR and analyses, built once per test session."""
from __future__ import annotations

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Plans and profiles the tests make go to a scratch cache, and the user's own cached plans and
# measured profiles (which planning now reads) never reach a test.
import atexit
import shutil
import tempfile

os.environ["TAG_TF_CACHE_DIR"] = tempfile.mkdtemp(prefix="tag_tf_test_cache_")
atexit.register(shutil.rmtree, os.environ["TAG_TF_CACHE_DIR"], ignore_errors=True)

import functools

import numpy as np
import pytest


@functools.cache
def zoo(name: str, **kw):
    """(ModelGraph, IR graph, rebuild fn) for a tiny zoo model without dropout."""
    from tag_tf.frontend.loading import model_ir
    from tag_tf.models import build_model

    args = {"tiny": True, "dropout": 0.0, **kw}
    model = build_model(name, **args)

    def rebuild(batch: int):
        return model_ir(build_model(name, **{**args, "batch_size": batch}))
    return model, model_ir(model), rebuild


@functools.cache
def analysis_of(name: str, num_groups: int = 60, exact_batch_stats: bool = False, **kw):
    from tag_tf.analysis import analyze
    from tag_tf.context import Options, PassContext
    from tag_tf.profile.weights import reference_weights

    model, graph, rebuild = zoo(name, **kw)
    ctx = PassContext(Options(num_groups=num_groups, exact_batch_stats=exact_batch_stats))
    return model, analyze(ctx, graph, rebuild=rebuild, batch_size=model.batch_size, weight_fn=reference_weights)


def flat_costs(analysis, types, fixed=0.0, per_sample=0.0):
    """Simulator costs where every training op costs `fixed + per_sample * samples` seconds on every
    device type."""
    from tag_tf.profile.costs import OpCosts
    from tag_tf.sim.simulator import training_costs

    base = training_costs(analysis, types)
    n = len(base.op_names)
    return OpCosts(base.op_names, tuple(types), np.full((len(types), n), fixed), np.full((len(types), n), per_sample),
                   {t: "test" for t in types})


def batches(model, steps: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    data = [model.feed(rng) for _ in range(steps)]
    return lambda step: data[step]


@pytest.fixture(scope="session")
def small_graph():
    """A hand-built logistic regression (Adam, resource variables) at batch 8."""
    return hand_built(8)


def hand_built(batch, *, resource=True, dtype="float32", optimizer="adam"):
    import tensorflow as tf

    from tag_tf.ir import from_graph_def

    g = tf.Graph()
    with g.as_default():
        with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(), use_resource=resource):
            x = tf.compat.v1.placeholder(dtype, [batch, 4], name="x")
            y = tf.compat.v1.placeholder(tf.int32, [batch], name="y")
            w = tf.compat.v1.get_variable("w", [4, 3], dtype=dtype)
            b = tf.compat.v1.get_variable("b", [3], dtype=dtype, initializer=tf.zeros_initializer())
            logits = tf.matmul(x, w) + b
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits),
                                  name="loss")
            step = tf.compat.v1.train.get_or_create_global_step()
            opt = {"adam": tf.compat.v1.train.AdamOptimizer(0.1),
                   "sgd": tf.compat.v1.train.GradientDescentOptimizer(0.1)}[optimizer]
            opt.minimize(loss, global_step=step, name="train_op")
            tf.compat.v1.global_variables_initializer()
    return from_graph_def(g.as_graph_def())
