"""Between-graph execution: cutting a compiled graph into the part each task runs on its own.

The equivalence of the parts, run by one process per task on real servers against the plain
single-process run, is tests/runtime/test_roles.py (TF_CONFIG, 3 tasks, a batch that does not divide
evenly); these tests check the cut itself."""
from __future__ import annotations

import pytest
from conftest import analysis_of

from tag_tf.compiler import DeviceMap, compile_strategy
from tag_tf.compiler.compile import instance_key_base
from tag_tf.compiler.localize import NotLocal, localize, task_of
from tag_tf.context import PassContext
from tag_tf.runtime.cluster import cpu_topology
from tag_tf.search.baselines import data_parallel, horovod
from tag_tf.strategy import Option, Strategy


def _compiled(strategy_of, fetches=("loss:0",), tasks=2):
    model, analysis = analysis_of("mlp")
    topology = cpu_topology(tasks, 1)
    devices = DeviceMap.for_topology(topology)
    strategy = strategy_of(len(analysis.grouping.groups), tasks)
    compiled = compile_strategy(PassContext(), analysis, strategy, devices, fetches=list(fetches),
                                run_ops=["train_op"], check=True)
    return analysis, strategy, compiled


def _cut(analysis, strategy, compiled):
    return localize(compiled.graph_def, list(compiled.fetch_tensors.values()), list(compiled.run_ops.values()),
                    compiled.instances, instance_key_base(analysis, strategy, compiled.devices))


def _collectives(part):
    out = {}
    for n in part.graph_def.node:
        if n.op.startswith("Collective"):
            keys = {}
            for i, what in zip(n.input[1:4], ("group_size", "group_key", "instance_key")):
                const = next(m for m in part.graph_def.node if m.name == i.split(":")[0])
                keys[what] = const.attr["value"].tensor.int_val[0]
            out[n.name] = (n.op, keys["group_size"], keys["group_key"], keys["instance_key"])
    return out


def test_each_task_keeps_its_own_devices_and_meets_the_others_in_the_same_collectives():
    analysis, strategy, compiled = _compiled(lambda g, d: data_parallel(g, d), fetches=("loss:0", "logits/BiasAdd:0"))
    parts = _cut(analysis, strategy, compiled)
    assert sorted(parts) == [0, 1]
    for t, part in parts.items():
        assert {task_of(n.device) for n in part.graph_def.node} == {t}
        names = {n.name for n in part.graph_def.node}
        for node in part.graph_def.node:         # every input is in the task's own graph
            assert all(i.lstrip("^").split(":")[0] in names for i in node.input), node.name
    # The whole-batch loss is a sum over the tasks, the logits a gather of their shards: the same
    # collectives, with the same keys, on both tasks, run every step.
    joins = [sorted(_collectives(p).values()) for p in parts.values()]
    assert joins[0] == joins[1]
    kinds = [op for op, *_ in joins[0]]
    assert kinds.count("CollectiveReduceV2") >= 2       # the gradients' and the loss's
    assert kinds.count("CollectiveGatherV2") == 2       # the logits' row counts, then the rows
    assert parts[0].always == parts[1].always and parts[0].always
    loss = compiled.fetch_tensors["loss:0"].split(":")[0]
    assert loss in {n.name for n in parts[1].graph_def.node}


def test_a_node_reading_one_tensor_twice_keeps_both_inputs():
    """A dynamic batch split by shares (run-time row bounds: a StridedSlice whose begin and stride
    are one Const) cut per task: each input stays where it was. Deduplicated, every task's graph
    failed to import (StridedSlice with 3 inputs), on the emulated link cluster's auto plan."""
    import tensorflow as tf

    model, analysis = analysis_of("mlp", dynamic_batch=True)
    devices = DeviceMap.for_topology(cpu_topology(2, 1))
    strategy = data_parallel(len(analysis.grouping.groups), 2, shares=(2.0, 1.0))
    compiled = compile_strategy(PassContext(), analysis, strategy, devices, fetches=["loss:0"], run_ops=["train_op"],
                                check=True)
    twice = [n.name for n in compiled.graph_def.node if len(set(n.input)) < len(n.input)]
    assert twice                               # the run-time bounds read their Const twice
    parts = _cut(analysis, strategy, compiled)
    for part in parts.values():
        nodes = {n.name: n for n in part.graph_def.node}
        assert all(len(nodes[t].input) == len(next(n for n in compiled.graph_def.node if n.name == t).input)
                   for t in twice if t in nodes)
        with tf.Graph().as_default():
            tf.compat.v1.import_graph_def(part.graph_def, name="")


def test_a_parameter_server_plan_needs_one_driver():
    def ps_on_task_0(groups, devices):
        return Strategy.uniform(groups, tuple(range(devices)), Option.PS)

    analysis, strategy, compiled = _compiled(ps_on_task_0)
    with pytest.raises(NotLocal, match=r"runs on task \d and holds state or talks to another task"):
        _cut(analysis, strategy, compiled)


def test_a_graph_on_one_task_is_not_cut():
    analysis, strategy, compiled = _compiled(lambda g, d: data_parallel(g, d), tasks=1)
    with pytest.raises(NotLocal, match="runs on one task"):
        _cut(analysis, strategy, compiled)


def test_the_loss_rides_the_fused_gradient_all_reduce():
    """With fused buckets (Horovod's Tensor Fusion), the whole-batch loss summed over the tasks
    travels in the gradient bucket's all-reduce: one collective per step, the same on both tasks.
    Run on real servers against the plain run: tests/runtime/test_roles.py."""
    analysis, strategy, compiled = _compiled(lambda g, d: horovod(g, d))
    parts = _cut(analysis, strategy, compiled)
    loss = compiled.fetch_tensors["loss:0"].split(":")[0]
    for part in parts.values():
        assert part.riding == (loss,)
        assert [op for op, *_ in _collectives(part).values()] == ["CollectiveReduceV2"]
        assert loss in part.always
    assert sorted(_collectives(parts[0]).values()) == sorted(_collectives(parts[1]).values())


def test_without_a_fused_bucket_the_loss_has_a_collective_of_its_own():
    analysis, strategy, compiled = _compiled(lambda g, d: data_parallel(g, d))
    for part in _cut(analysis, strategy, compiled).values():
        assert part.riding == ()
