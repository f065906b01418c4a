"""Every compiler feature trains K steps both ways and compares parameters (max_rel_diff <= 1e-4)."""
from __future__ import annotations

import functools

import numpy as np
import pytest
from conftest import analysis_of, batches

from tag_tf.compiler import DeviceMap, compile_strategy
from tag_tf.context import PassContext
from tag_tf.runtime.equivalence import check_equivalence, noise_floor, run_original
from tag_tf.search.baselines import random_strategy
from tag_tf.strategy import Option, Strategy

STEPS = 3


@functools.cache
def reference(name: str, **kw):
    model, a = analysis_of(name, **kw)
    feeds = batches(model, STEPS)
    original = run_original(a, feeds, STEPS)
    return model, a, feeds, original, noise_floor(a, original, feeds)


def verify(name: str, strategy: Strategy, devices: int, tolerance: float = 1e-4, **kw):
    _, a, feeds, original, floor = reference(name, **kw)
    compiled = compile_strategy(PassContext(), a, strategy, DeviceMap.local_cpus(devices), check=True)
    result = check_equivalence(a, compiled, feeds, STEPS, tolerance=tolerance, original=original, floor=floor)
    assert result.ok, (result.max_rel_diff, sorted(result.per_variable.items(), key=lambda kv: -kv[1])[:3])
    assert result.copies_max_diff == 0.0 or result.copies_max_diff < 1e-6
    np.testing.assert_allclose(result.losses_compiled, result.losses_original, rtol=max(tolerance, 1e-4))
    return compiled, result


def test_noise_floor_is_small_and_a_real_difference_still_fails():
    """The floor is what permuting the batch rows gives the original run: rounding, far below a
    real error. A compiled run fed other data (a stand-in for a wrong rewrite) fails against it."""
    _, a, feeds, original, floor = reference("mlp")
    assert 0.0 <= floor < 1e-5
    compiled = compile_strategy(PassContext(), a, Strategy.uniform(len(a.grouping.groups), (0, 1), Option.ALLREDUCE),
                                DeviceMap.local_cpus(2))
    wrong = check_equivalence(a, compiled, lambda step: feeds((step + 1) % STEPS), STEPS, original=original, floor=floor)
    assert not wrong.ok and wrong.max_rel_diff > 1e-3 and wrong.tolerance == 1e-4
    assert wrong.to_dict()["noise_floor"] == floor


@pytest.mark.parametrize("option", list(Option))
def test_each_option_alone_with_uneven_shares(option):
    _, a = analysis_of("mlp")
    strategy = Strategy.uniform(len(a.grouping.groups), (0, 1, 2), option, shares=(1.0, 2.0, 3.0))
    compiled, _ = verify("mlp", strategy, 3)
    if option is Option.ALLREDUCE:
        assert compiled.stats["allreduce"] > 0 and compiled.stats["split"] > 0
    if option is Option.PS:
        assert compiled.stats["allreduce"] == 0 and compiled.stats["addn"] > 0


# >= 20 seeded random mixed strategies across four models, on 2-4 virtual devices.
RANDOM_CASES = [("mlp", s, 4) for s in range(6)] + [("cnn", s, 3) for s in range(6)] + \
               [("transformer", s, 4) for s in range(4)] + [("bert-small", s, 2 + s % 3) for s in range(4)]


@pytest.mark.parametrize("name, seed, devices", RANDOM_CASES)
def test_random_mixed_strategies(name, seed, devices):
    _, a = analysis_of(name)
    strategy = random_strategy(len(a.grouping.groups), devices, np.random.default_rng(seed))
    verify(name, strategy, devices)


def test_dynamic_batch_with_uneven_shares():
    _, a = analysis_of("mlp", dynamic_batch=True)
    assert a.dynamic_batch
    strategy = random_strategy(len(a.grouping.groups), 3, np.random.default_rng(7))
    verify("mlp", strategy, 3, dynamic_batch=True)
    dp = Strategy.uniform(len(a.grouping.groups), (0, 1, 2), Option.ALLREDUCE, shares=(3.0, 1.0, 1.0))
    verify("mlp", dp, 3, dynamic_batch=True)


def test_dynamic_batch_smaller_than_replica_count():
    """A fed batch of 2 over 3 replicas: one replica gets no rows and must contribute nothing."""
    model, a = analysis_of("mlp", dynamic_batch=True)
    rng = np.random.default_rng(5)
    data = [model.feed(rng, batch_size=2) for _ in range(STEPS)]
    strategy = Strategy.uniform(len(a.grouping.groups), (0, 1, 2), Option.ALLREDUCE)
    compiled = compile_strategy(PassContext(), a, strategy, DeviceMap.local_cpus(3), check=True)
    result = check_equivalence(a, compiled, lambda s: data[s], STEPS)
    assert result.ok and np.all(np.isfinite(result.losses_compiled)), result.max_rel_diff


def test_whole_batch_shapes_come_from_a_shard_not_from_gathered_activations():
    """Layer-norm and mean gradients read Shape(x) of the whole batch; with a dynamic batch the
    compiler rebuilds it from a shard's shape and the global row count instead of concatenating
    every replica's activation just to read its shape (one activation per layer over the network)."""
    model, a = analysis_of("transformer", dynamic_batch=True)
    strategy = Strategy.uniform(len(a.grouping.groups), (0, 1, 2), Option.ALLREDUCE, shares=(2.0, 1.0, 1.0))
    compiled, _ = verify("transformer", strategy, 3, dynamic_batch=True)
    nodes = {n.name: n for n in compiled.graph_def.node}
    step, stack = set(), [compiled.run_ops[model.train_op]]     # what one training step runs
    while stack:
        name = stack.pop()
        if name not in step:
            step.add(name)
            stack.extend(i.lstrip("^").split(":")[0] for i in nodes[name].input)
    gathered_for_shape = [name for name in step if nodes[name].op in ("Shape", "ShapeN", "Size")
                          and any(nodes[i.lstrip("^").split(":")[0]].op == "ConcatV2" for i in nodes[name].input)]
    assert not gathered_for_shape, gathered_for_shape[:3]
    assert any(n.op == "TensorScatterUpdate" for n in compiled.graph_def.node)
    rng = np.random.default_rng(5)          # a batch of 2 over 3 replicas: one shard has no rows
    data = [model.feed(rng, batch_size=2) for _ in range(STEPS)]
    result = check_equivalence(a, compiled, lambda s: data[s], STEPS)
    assert result.ok and np.all(np.isfinite(result.losses_compiled)), result.max_rel_diff


def test_ref_variables():
    _, a = analysis_of("mlp", resource_variables=False)
    assert all(v.kind == "ref" for v in a.graph.variables.values())
    for seed in range(2):
        verify("mlp", random_strategy(len(a.grouping.groups), 3, np.random.default_rng(seed)), 3,
               resource_variables=False)


@pytest.mark.parametrize("optimizer", ["sgd", "momentum", "adagrad", "rmsprop", "adadelta", "ftrl"])
def test_tf1_optimizers(optimizer):
    _, a = analysis_of("mlp", optimizer=optimizer)
    verify("mlp", random_strategy(len(a.grouping.groups), 3, np.random.default_rng(1)), 3, optimizer=optimizer)


@pytest.mark.parametrize("dtype, tolerance", [("float64", 1e-9), ("float16", 2e-2)])
def test_other_dtypes(dtype, tolerance):
    _, a = analysis_of("mlp", dtype=dtype)
    verify("mlp", random_strategy(len(a.grouping.groups), 3, np.random.default_rng(2)), 3, tolerance=tolerance,
           dtype=dtype)


def test_sparse_embedding_updates():
    """TF1 Adam's sparse path (Unique + UnsortedSegmentSum + ResourceScatterAdd) on embeddings."""
    _, a = analysis_of("bert-small", sparse_grads=True)
    assert any(op.type == "ResourceScatterAdd" for op in a.graph)
    for seed in range(2):
        verify("bert-small", random_strategy(len(a.grouping.groups), 3, np.random.default_rng(seed)), 3,
               sparse_grads=True)


def test_decomposed_batch_norm_is_exact_with_control_dependencies():
    """tf.nn.moments BatchNorm: its statistics are Means over the batch, which the compiler keeps
    exact (partial sums), and its moving averages run through UPDATE_OPS control dependencies."""
    _, a = analysis_of("cnn", batch_norm=True)
    strategy = Strategy.uniform(len(a.grouping.groups), (0, 1, 2), Option.ALLREDUCE, shares=(1.0, 1.0, 2.0))
    verify("cnn", strategy, 3, batch_norm=True)
    verify("cnn", random_strategy(len(a.grouping.groups), 3, np.random.default_rng(3)), 3, batch_norm=True)


def fused_bn_net(batch: int):
    """A conv net with FusedBatchNormV3 in training mode (what tf-slim nets use)."""
    import tensorflow as tf

    from tag_tf.ir import from_graph_def

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [batch, 6, 6, 2], name="x")
        y = tf.compat.v1.placeholder(tf.int32, [batch], name="y")
        k = tf.compat.v1.get_variable("k", [3, 3, 2, 4], use_resource=True)
        gamma = tf.compat.v1.get_variable("gamma", [4], initializer=tf.ones_initializer(), use_resource=True)
        beta = tf.compat.v1.get_variable("beta", [4], initializer=tf.zeros_initializer(), use_resource=True)
        h, _, _ = tf.compat.v1.nn.fused_batch_norm(tf.nn.conv2d(x, k, 1, "SAME"), gamma, beta, is_training=True)
        w = tf.compat.v1.get_variable("w", [6 * 6 * 4, 3], use_resource=True)
        logits = tf.matmul(tf.reshape(tf.nn.relu(h), [batch, -1]), w)
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
        tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, name="train_op")
    return from_graph_def(g.as_graph_def())


@pytest.mark.parametrize("exact", [True, False])
def test_fused_batch_norm_statistics(exact):
    from tag_tf.analysis import analyze
    from tag_tf.context import Options
    from tag_tf.profile.weights import reference_weights

    a = analyze(PassContext(Options(exact_batch_stats=exact)), fused_bn_net(8), rebuild=fused_bn_net,
                weight_fn=reference_weights)
    rng = np.random.default_rng(0)
    data = [{"x:0": rng.normal(size=(8, 6, 6, 2)).astype(np.float32),
             "y:0": rng.integers(0, 3, size=8).astype(np.int32)} for _ in range(STEPS)]
    strategy = Strategy.uniform(len(a.grouping.groups), (0, 1), Option.ALLREDUCE)
    compiled = compile_strategy(PassContext(), a, strategy, DeviceMap.local_cpus(2), check=True)
    result = check_equivalence(a, compiled, lambda s: data[s], STEPS)
    assert np.all(np.isfinite(result.losses_compiled))
    if exact:       # synchronised statistics: the same numbers as one device
        assert result.ok, result.max_rel_diff
    else:           # per-replica statistics (MirroredStrategy/Horovod convention): close, not equal
        assert result.max_rel_diff > 1e-6
        assert result.copies_max_diff < 1e-5      # replicas still apply the same averaged gradient


def control_flow_net(batch: int, v2: bool = True):
    """tf.cond and tf.while_loop in the training step."""
    import tensorflow as tf
    from tensorflow.python.ops import control_flow_util

    from tag_tf.ir import from_graph_def

    saved = control_flow_util.ENABLE_CONTROL_FLOW_V2
    control_flow_util.ENABLE_CONTROL_FLOW_V2 = v2
    try:
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [batch, 2], name="x")
            w = tf.compat.v1.get_variable("w", [2, 3], initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
            step = tf.compat.v1.train.get_or_create_global_step()
            h = tf.cond(step > 1, lambda: tf.matmul(x, w), lambda: tf.matmul(x, w) * 2.0)
            scaled = tf.while_loop(lambda i, acc: i < 3, lambda i, acc: (i + 1, acc * 1.1), [0, h])[1]
            loss = tf.reduce_mean(tf.square(scaled), name="loss")
            tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, global_step=step, name="train_op")
        return from_graph_def(g.as_graph_def())
    finally:
        control_flow_util.ENABLE_CONTROL_FLOW_V2 = saved


def test_functional_control_flow_runs_whole_and_stays_exact():
    from tag_tf.analysis import analyze
    from tag_tf.profile.weights import reference_weights

    a = analyze(PassContext(), control_flow_net(8), rebuild=control_flow_net, weight_fn=reference_weights)
    assert a.unclassified() == []
    rng = np.random.default_rng(0)
    data = [{"x:0": rng.normal(size=(8, 2)).astype(np.float32)} for _ in range(STEPS)]
    for seed in range(2):
        strategy = random_strategy(len(a.grouping.groups), 3, np.random.default_rng(seed))
        compiled = compile_strategy(PassContext(), a, strategy, DeviceMap.local_cpus(3), check=True)
        result = check_equivalence(a, compiled, lambda s: data[s], STEPS)
        assert result.ok, result.max_rel_diff
    # TF1 control flow (Switch/Merge/Enter/Exit frames) runs whole too, each copy of a loop in its own frame.
    v1 = analyze(PassContext(), control_flow_net(8, v2=False), rebuild=lambda b: control_flow_net(b, v2=False),
                 weight_fn=reference_weights)
    assert v1.unclassified() == []
    for seed in range(2):
        strategy = random_strategy(len(v1.grouping.groups), 3, np.random.default_rng(seed))
        compiled = compile_strategy(PassContext(), v1, strategy, DeviceMap.local_cpus(3), check=True)
        result = check_equivalence(v1, compiled, lambda s: data[s], STEPS)
        assert result.ok, result.max_rel_diff


def branchy_net(batch: int):
    """Inception-style block: two conv branches concatenated along channels. Its gradient slices
    the concat's gradient with begins computed by ConcatOffset (not constants)."""
    import tensorflow as tf

    from tag_tf.ir import from_graph_def

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [batch, 6, 6, 2], name="x")
        y = tf.compat.v1.placeholder(tf.int32, [batch], name="y")
        init = tf.compat.v1.glorot_uniform_initializer(seed=3)
        k1 = tf.compat.v1.get_variable("k1", [1, 1, 2, 3], initializer=init)
        k3 = tf.compat.v1.get_variable("k3", [3, 3, 2, 5], initializer=init)
        h = tf.concat([tf.nn.relu(tf.nn.conv2d(x, k1, 1, "SAME")), tf.nn.relu(tf.nn.conv2d(x, k3, 1, "SAME"))], 3)
        w = tf.compat.v1.get_variable("w", [6 * 6 * 8, 3], initializer=init)
        logits = tf.matmul(tf.reshape(h, [batch, -1]), w)
        loss = tf.add(tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits)),
                      1e-3 * tf.nn.l2_loss(w), name="loss")                # weight decay: whole + partial
        tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss, name="train_op")
    return from_graph_def(g.as_graph_def())


def test_concat_gradient_slices_stay_split():
    from tag_tf.analysis import analyze
    from tag_tf.analysis.states import Kind
    from tag_tf.profile.weights import reference_weights

    a = analyze(PassContext(), branchy_net(8), rebuild=branchy_net, weight_fn=reference_weights)
    slices = [n for n in a.annotations if a.graph.op(n).type == "Slice"]
    assert slices and all(a.annotations[n].outputs[0].kind is Kind.SPLIT for n in slices)
    rng = np.random.default_rng(1)
    data = [{"x:0": rng.normal(size=(8, 6, 6, 2)).astype(np.float32),
             "y:0": rng.integers(0, 3, size=8).astype(np.int32)} for _ in range(STEPS)]
    strategies = [Strategy.uniform(len(a.grouping.groups), (0, 1, 2), Option.ALLREDUCE, shares=(1, 2, 1))] + \
                 [random_strategy(len(a.grouping.groups), 3, np.random.default_rng(s)) for s in range(2)]
    for strategy in strategies:
        compiled = compile_strategy(PassContext(), a, strategy, DeviceMap.local_cpus(3), check=True)
        result = check_equivalence(a, compiled, lambda s: data[s], STEPS)
        assert result.ok, result.max_rel_diff
