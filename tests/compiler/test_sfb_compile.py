"""Sufficient factor broadcasting in the compiler and the simulator: duplicated gradient subgraphs
train exactly like the original, and the native expander inserts the same conversions."""
from __future__ import annotations

import functools
import json
import re
from collections import Counter

import numpy as np
import pytest
from conftest import analysis_of, batches

from tag_tf.compiler import DeviceMap, compile_strategy
from tag_tf.context import PassContext
from tag_tf.errors import StrategyError
from tag_tf.placement.layout import validated_duplicates
from tag_tf.runtime.equivalence import check_equivalence, noise_floor, run_original
from tag_tf.search.baselines import random_strategy
from tag_tf.search.sfb import SfbSolver, duplicated_op_types
from tag_tf.sim.simulator import Simulator
from tag_tf.strategy import Option, SfbCut, Strategy
from tag_tf.topology.load import load_topology

STEPS = 3
KEYS = ("split", "concat", "addn", "allreduce", "allreduce_tensors", "zeros")


def whole_cones(a, strategy: Strategy, devices: int) -> list[SfbCut]:
    """Every gradient's whole candidate subgraph duplicated (more than the MILP would pick: the
    compiler must be exact for any cut)."""
    solver = SfbSolver(Simulator(a, load_topology(f"local:{devices}")))
    cuts = []
    for p in solver.problems(strategy):
        cut = SfbCut(p.gradient, tuple(a.planning.ops[i] for i in p.cone))
        try:        # a cone reading a partial sum of another layout is not a cut the MILP may make
            validated_duplicates(a, strategy.with_sfb_cuts([cut]))
        except StrategyError:
            continue
        cuts.append(cut)
    return cuts


def duplicated_types(a, strategy: Strategy) -> Counter:
    return Counter(duplicated_op_types(a, strategy))


def check(a, model_feeds, strategy: Strategy, devices: int):
    original = run_original(a, model_feeds, STEPS)
    compiled = compile_strategy(PassContext(), a, strategy, DeviceMap.local_cpus(devices), check=True)
    result = check_equivalence(a, compiled, model_feeds, STEPS, original=original,
                               floor=noise_floor(a, original, model_feeds))
    assert result.ok, (result.max_rel_diff, sorted(result.per_variable.items(), key=lambda kv: -kv[1])[:3])
    assert result.copies_max_diff < 1e-6
    report = Simulator(a, load_topology(f"local:{devices}")).simulate(strategy)
    assert {k: report.conversions[k] for k in KEYS} == {k: compiled.stats[k] for k in KEYS}
    return compiled


@pytest.mark.parametrize("name, option, kind", [
    ("mlp", Option.ALLREDUCE, "MatMul"),                  # dense weight gradient: x^T dy
    ("mlp", Option.PS, "MatMul"),                         # the update on a parameter server
    ("cnn", Option.ALLREDUCE, "Conv2DBackpropFilter"),
    ("transformer", Option.ALLREDUCE, "Reshape"),         # 3-D dense layers: reshape chains
])
def test_duplicated_gradients_are_exact(name, option, kind):
    model, a = analysis_of(name)
    dp = Strategy.uniform(len(a.grouping.groups), (0, 1, 2), option, shares=(1.0, 2.0, 1.0))
    sfb = dp.with_sfb_cuts(whole_cones(a, dp, 3))
    assert duplicated_types(a, sfb)[kind] >= 1
    compiled = check(a, batches(model, STEPS), sfb, 3)
    plain = compile_strategy(PassContext(), a, dp, DeviceMap.local_cpus(3))
    # Gathered factors instead of synchronised gradients.
    assert compiled.stats["concat"] > plain.stats["concat"]
    assert compiled.stats["allreduce_tensors"] + compiled.stats["addn_tensors"] < \
        plain.stats["allreduce_tensors"] + plain.stats["addn_tensors"]


def test_partial_cones_duplicate_some_ops_and_gather_from_the_others():
    """The MILP may keep part of a cone replicated: a duplicated op then gathers the output of a
    replicated op of the same cone. Every prefix of a cone is such a cut."""
    model, a = analysis_of("transformer")
    dp = Strategy.uniform(len(a.grouping.groups), (0, 1), Option.ALLREDUCE, fusion_bytes=2**20)
    solver = SfbSolver(Simulator(a, load_topology("local:2")))
    cuts = []
    for p in solver.problems(dp):
        for k in range(max(1, len(p.cone) // 2), len(p.cone) + 1):    # the shortest legal half-cone
            cut = SfbCut(p.gradient, tuple(a.planning.ops[i] for i in p.cone[:k]))
            try:
                validated_duplicates(a, dp.with_sfb_cuts([*cuts, cut]))
            except StrategyError:       # reads a partial sum that stays replicated: grow the cut
                continue
            if k < len(p.cone):
                cuts.append(cut)
            break
    assert len(cuts) >= 3
    check(a, batches(model, STEPS), dp.with_sfb_cuts(cuts), 2)


def test_embedding_gradients_dense_and_sparse():
    for kw in ({}, {"sparse_grads": True}):
        model, a = analysis_of("bert-small", **kw)
        dp = Strategy.uniform(len(a.grouping.groups), (0, 1), Option.ALLREDUCE)
        sfb = dp.with_sfb_cuts(whole_cones(a, dp, 2))
        assert duplicated_types(a, sfb)["UnsortedSegmentSum"] >= 1, kw
        check(a, batches(model, STEPS), sfb, 2)


def transpose_net(batch: int):
    """A tensordot with a weight stored flat (its gradient: MatMul then Reshape) and a matmul with a
    transposed weight (MatMul then Transpose)."""
    import tensorflow as tf

    from tag_tf.ir import from_graph_def

    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [batch, 5, 6], name="x")
        y = tf.compat.v1.placeholder(tf.int32, [batch, 5], name="y")
        init = tf.compat.v1.glorot_uniform_initializer(seed=4)
        w1 = tf.compat.v1.get_variable("w1", [48], initializer=tf.compat.v1.random_normal_initializer(seed=4),
                                       use_resource=True)
        w2 = tf.compat.v1.get_variable("w2", [3, 8], initializer=init, use_resource=True)
        h = tf.nn.tanh(tf.tensordot(x, tf.reshape(w1, [6, 8]), [[2], [0]]))
        logits = tf.matmul(tf.reshape(h, [batch * 5, 8]), tf.transpose(w2))
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=tf.reshape(y, [-1]),
                                                                             logits=logits), name="loss")
        tf.compat.v1.train.GradientDescentOptimizer(0.5).minimize(loss, name="train_op")
    return from_graph_def(g.as_graph_def())


@functools.cache
def transpose_analysis():
    from tag_tf.analysis import analyze
    from tag_tf.profile.weights import reference_weights

    return analyze(PassContext(), transpose_net(8), rebuild=transpose_net, weight_fn=reference_weights)


def test_reshape_transpose_chain():
    a = transpose_analysis()
    rng = np.random.default_rng(0)
    data = [{"x:0": rng.normal(size=(8, 5, 6)).astype(np.float32),
             "y:0": rng.integers(0, 3, size=(8, 5)).astype(np.int32)} for _ in range(STEPS)]
    dp = Strategy.uniform(len(a.grouping.groups), (0, 1), Option.ALLREDUCE, fusion_bytes=2**20)
    sfb = dp.with_sfb_cuts(whole_cones(a, dp, 2))
    types = duplicated_types(a, sfb)
    assert types["Transpose"] >= 1 and types["MatMul"] >= 2 and types["Reshape"] >= 1, types
    check(a, lambda s: data[s], sfb, 2)


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer"])
def test_sfb_on_mixed_plans_matches_the_simulator(name):
    """Random mixed plans (partial replication, PS, duplicate, model-parallel, fusion) with SFB on
    whatever they replicate: compiler and expander agree; one of them also trains exactly."""
    model, a = analysis_of(name)
    sim = Simulator(a, load_topology("local:4"))
    tried = []
    for seed in range(4):
        strategy = random_strategy(sim.num_groups, 4, np.random.default_rng(seed))
        cuts = whole_cones(a, strategy, 4)
        if not cuts:
            continue
        sfb = strategy.with_sfb_cuts(cuts)
        report = sim.simulate(sfb)
        compiled = compile_strategy(PassContext(), a, sfb, DeviceMap.local_cpus(4), check=True)   # a DAG
        assert {k: report.conversions[k] for k in KEYS} == {k: compiled.stats[k] for k in KEYS}, seed
        tried.append(sfb)
    assert len(tried) >= 2
    check(a, batches(model, STEPS), tried[-1], 4)


def test_strategy_json_round_trip_and_old_files():
    _, a = analysis_of("mlp")
    dp = Strategy.uniform(len(a.grouping.groups), (0, 1), Option.ALLREDUCE)
    sfb = dp.with_sfb_cuts(whole_cones(a, dp, 2))
    again = Strategy.from_dict(json.loads(sfb.to_json()))
    assert again == sfb and again.duplicated_ops == sfb.duplicated_ops
    assert "sfb" not in dp.to_dict()              # plans without SFB keep their old JSON and fingerprint
    old = {k: v for k, v in sfb.to_dict().items() if k != "sfb"}
    assert Strategy.from_dict(old).sfb == ()
    bad = sfb.to_dict()
    bad["sfb"][0]["ops"] = []
    with pytest.raises(StrategyError, match=r"sfb\[0\].*'ops'"):
        Strategy.from_dict(bad)
    bad["sfb"] = [{"gradient": "g:0", "ops": ["a"]}, {"gradient": "h:0", "ops": ["a"]}]
    with pytest.raises(StrategyError, match="'a' is duplicated for two gradients"):
        Strategy.from_dict(bad)


def test_cuts_that_cannot_run_are_refused_with_the_op_named():
    _, a = analysis_of("mlp")
    G = len(a.grouping.groups)
    dp = Strategy.uniform(G, (0, 1), Option.ALLREDUCE)
    cut = whole_cones(a, dp, 2)[0]
    op = cut.ops[0]
    sim = Simulator(a, load_topology("local:2"))
    cases = {
        "not a planned op": dp.with_sfb_cuts([SfbCut(cut.gradient, ("no/such/op",))]),
        "runs allreduce on 1 device": Strategy.uniform(G, (0,), Option.ALLREDUCE).with_sfb_cuts([cut]),
        "runs duplicate on 2": Strategy.uniform(G, (0, 1), Option.DUPLICATE).with_sfb_cuts([cut]),
        "input of the step": dp.with_sfb_cuts([SfbCut("x", (a.graph.meta.feeds[0].split(":")[0],))]),
        "colocated with a variable": dp.with_sfb_cuts([SfbCut("v", (next(iter(a.graph.variables)),))]),
    }
    for message, strategy in cases.items():
        with pytest.raises(StrategyError, match=message):
            compile_strategy(PassContext(), a, strategy, DeviceMap.local_cpus(2))
        with pytest.raises(StrategyError, match=message):
            sim.simulate(strategy)
    assert op in dp.with_sfb_cuts([cut]).duplicated_ops


def test_a_cut_through_a_partial_sum_is_refused_by_compiler_and_simulator():
    """Duplicating a layer-norm gradient's Reshape but not the Sum before it would synchronise the
    partial Sum mid-way through the backward pass (which TF's gradient tuples then wait for)."""
    _, a = analysis_of("transformer")
    dp = Strategy.uniform(len(a.grouping.groups), (0, 1), Option.ALLREDUCE, fusion_bytes=2**20)
    sim = Simulator(a, load_topology("local:2"))
    solver = SfbSolver(sim)
    ops = a.planning.ops
    bad = [SfbCut(p.gradient, (ops[p.cone[0]],)) for p in solver.problems(dp)
           if len(p.cone) >= 2 and a.graph.op(ops[p.cone[0]]).type == "Reshape"
           and a.graph.op(ops[p.cone[1]]).type == "Sum"]
    assert bad
    strategy = dp.with_sfb_cuts(bad[:1])
    with pytest.raises(StrategyError, match="reads the partial sum .*duplicate its producer too"):
        compile_strategy(PassContext(), a, strategy, DeviceMap.local_cpus(2))
    with pytest.raises(StrategyError, match="reads the partial sum"):
        sim.simulate(strategy)


def tied_embedding(a):
    """bert-small's tied word embedding: the AddN summing its output layer's dense gradient and its
    lookup's (UnsortedSegmentSum), the dense summand and the lookup's op."""
    g = a.graph
    update = next(o for o in g if o.type == "ResourceApplyAdam" and "word_embeddings" in o.name)
    addn = update.inputs[-1].op
    assert g.op(addn).type == "AddN"
    lookup = next(r for r in g.op(addn).inputs if g.op(r.op).type == "UnsortedSegmentSum")
    dense = next(r for r in g.op(addn).inputs if r != lookup)
    return addn, dense, lookup


def split_cuts(a, addn, dense, lookup):
    host = a.planning.host
    return {"dense": SfbCut(f"{addn}:0", (host[addn],), 0.0, (dense.name, lookup.name)),
            "rows": SfbCut(f"{addn}:0", (host[addn], host[lookup.op]), 0.0, (dense.name,))}


@pytest.mark.parametrize("variant", ["dense", "rows"])
def test_a_tied_embedding_gradient_synchronised_in_pieces_is_exact(variant):
    """The tied gradient's summands synchronised apart: its output layer's dense partial sum
    all-reduced on its own, the lookup's either all-reduced too ("dense") or rebuilt on every device
    from its gathered rows and ids ("rows"); the sum then computed on every device. The simulator
    inserts the same conversions (check)."""
    model, a = analysis_of("bert-small")
    addn, dense, lookup = tied_embedding(a)
    dp = Strategy.uniform(len(a.grouping.groups), (0, 1), Option.ALLREDUCE, fusion_bytes=2**20)
    cut = split_cuts(a, addn, dense, lookup)[variant]
    compiled = check(a, batches(model, STEPS), dp.with_sfb_cuts([cut]), 2)
    plain = compile_strategy(PassContext(), a, dp, DeviceMap.local_cpus(2))
    extra = {"dense": (1, 0), "rows": (0, 4)}[variant]     # one all-reduce more / the rows and ids gathered
    assert (compiled.stats["allreduce_tensors"] - plain.stats["allreduce_tensors"],
            compiled.stats["concat"] - plain.stats["concat"]) == extra


def test_a_tied_embedding_gradient_in_pieces_over_two_server_processes():
    from tag_tf.runtime.cluster import cpu_topology, local_cluster

    model, a = analysis_of("bert-small")
    addn, dense, lookup = tied_embedding(a)
    dp = Strategy.uniform(len(a.grouping.groups), (0, 1), Option.ALLREDUCE, fusion_bytes=2**20)
    strategy = dp.with_sfb_cuts([split_cuts(a, addn, dense, lookup)["rows"]])
    feeds = batches(model, STEPS)
    original = run_original(a, feeds, STEPS)
    compiled = compile_strategy(PassContext(), a, strategy, DeviceMap.for_topology(cpu_topology(2, 1)), check=True)
    with local_cluster(2, 1, timeout_ms=60_000) as (spec, _):
        result = check_equivalence(a, compiled, feeds, STEPS, original=original, floor=noise_floor(a, original, feeds),
                                   target=spec.target, config=spec.session_config())
    assert result.ok, (result.max_rel_diff, sorted(result.per_variable.items(), key=lambda kv: -kv[1])[:3])
    np.testing.assert_allclose(result.losses_compiled, result.losses_original, rtol=1e-4)


def test_a_partial_sum_named_allreduced_must_be_one_the_cut_reads_in_an_allreduce_group():
    _, a = analysis_of("bert-small")
    addn, dense, lookup = tied_embedding(a)
    G = len(a.grouping.groups)
    dp = Strategy.uniform(G, (0, 1), Option.ALLREDUCE)
    host = a.planning.host
    cases = {
        # the lookup's partial sum read but not named: refused as before
        "reads the partial sum .*or name it in the cut's 'allreduced'":
            dp.with_sfb_cuts([SfbCut(f"{addn}:0", (host[addn],), 0.0, (dense.name,))]),
        "'allreduced' names 'no/such:0', which none of the cut's duplicated ops reads":
            dp.with_sfb_cuts([SfbCut(f"{addn}:0", (host[addn],), 0.0, (dense.name, lookup.name, "no/such:0"))]),
        # the lookup's op duplicated too: its sum is whole on every device, nothing to all-reduce
        f"names '{re.escape(lookup.name)}', whose producer the plan duplicates too":
            dp.with_sfb_cuts([SfbCut(f"{addn}:0", (host[addn], host[lookup.op]), 0.0, (dense.name, lookup.name))]),
        "only a partial sum of a group replicated with allreduce on the devices of the ops reading it":
            Strategy.uniform(G, (0, 1), Option.PS).with_sfb_cuts([split_cuts(a, addn, dense, lookup)["dense"]]),
    }
    sim = Simulator(a, load_topology("local:2"))
    for message, strategy in cases.items():
        with pytest.raises(StrategyError, match=message):
            compile_strategy(PassContext(), a, strategy, DeviceMap.local_cpus(2))
        with pytest.raises(StrategyError, match=message):
            sim.simulate(strategy)
    cut = split_cuts(a, addn, dense, lookup)["rows"]
    again = Strategy.from_dict(json.loads(dp.with_sfb_cuts([cut]).to_json()))
    assert again.sfb == (cut,) and cut.to_dict()["allreduced"] == [dense.name]
    whole = SfbCut(cut.gradient, cut.ops, 0.5)            # a cut as files before the field hold it
    assert "allreduced" not in whole.to_dict()
    assert Strategy.from_dict(json.loads(dp.with_sfb_cuts([whole]).to_json())).sfb == (whole,)
    with pytest.raises(StrategyError, match="'allreduced' must be a list of tensor names"):
        Strategy.from_dict({**json.loads(dp.to_json()), "sfb": [{**cut.to_dict(), "allreduced": "x:0"}]})
    with pytest.raises(StrategyError, match="a tensor is listed twice in 'allreduced'"):
        Strategy.from_dict({**json.loads(dp.to_json()),
                            "sfb": [{**cut.to_dict(), "allreduced": [dense.name, dense.name]}]})
