"""Several machines: server processes on 127.0.0.1, cross-process collectives, dead workers."""
from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest
from conftest import analysis_of, batches

from tag_tf.compiler import DeviceMap, compile_strategy
from tag_tf.context import PassContext
from tag_tf.errors import ClusterError
from tag_tf.runtime.cluster import ClusterSpec, cpu_topology, local_cluster
from tag_tf.runtime.equivalence import check_equivalence
from tag_tf.search.baselines import random_strategy
from tag_tf.strategy import Option, Strategy


def test_two_server_processes_train_equivalently_then_a_dead_worker_is_named():
    import tensorflow as tf

    model, a = analysis_of("mlp")
    devices = DeviceMap.for_topology(cpu_topology(2, 2))
    n = len(a.grouping.groups)
    strategies = [Strategy.uniform(n, (0, 1, 2, 3), Option.ALLREDUCE, shares=(1, 2, 1, 1)),
                  # Horovod-style fused buckets across the two processes
                  Strategy.uniform(n, (0, 1, 2, 3), Option.ALLREDUCE, shares=(1, 2, 1, 1), fusion_bytes=2**26),
                  dataclasses.replace(random_strategy(n, 4, np.random.default_rng(11)), fusion_bytes=4096)]
    feeds = batches(model, 2)
    with local_cluster(2, 2, timeout_ms=20_000) as (spec, procs):
        for strategy in strategies:
            compiled = compile_strategy(PassContext(), a, strategy, devices, check=True)
            result = check_equivalence(a, compiled, feeds, 2, target=spec.target, config=spec.session_config())
            assert result.ok, result.max_rel_diff
        assert compiled.graph_def.node and any("task:1" in n.device for n in compiled.graph_def.node)
        procs[1].kill()
        procs[1].wait()
        with pytest.raises(ClusterError, match="task 1"):
            spec.check()
        with pytest.raises(tf.errors.OpError) as info:
            check_equivalence(a, compiled, feeds, 1, target=spec.target, config=spec.session_config())
        assert "task 1" in str(spec.explain(info.value))


def test_cluster_file_errors(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("tasks: [nohostport]\n")
    with pytest.raises(ClusterError, match=r"tasks\[0\]"):
        ClusterSpec.load(str(bad))
    with pytest.raises(ClusterError, match="cannot read"):
        ClusterSpec.load(str(tmp_path / "missing.yaml"))
    good = tmp_path / "ok.json"
    ClusterSpec(("127.0.0.1:1", "127.0.0.1:2"), cpus_per_task=2).save(str(good))
    spec = ClusterSpec.load(str(good))
    assert spec.leader == "/job:worker/replica:0/task:0"
    assert spec.server_config().experimental.collective_group_leader == spec.leader
    assert spec.server_config().operation_timeout_in_ms > 0



@pytest.mark.parametrize("text, message", [
    ("tasks: ['a:1']\ntimeout_ms: soon\n", "timeout_ms must be a positive integer"),
    ("tasks: ['a:1']\njob: 'w; rm -rf'\n", "job must be a name"),
    ("tasks: ['a:1']\nworkers: 3\n", "unknown field(s) 'workers'"),
    ("!!python/object/apply:os.system ['echo hi']\n", "not valid YAML/JSON"),     # data only, never code
])
def test_malformed_cluster_files_are_named(tmp_path, text, message):
    bad = tmp_path / "c.yaml"
    bad.write_text(text)
    with pytest.raises(ClusterError, match=re.escape(message)):
        ClusterSpec.load(str(bad))


def test_data_files_are_bounded_text(tmp_path):
    from tag_tf.datafiles import CLUSTER_FILE_LIMIT
    from tag_tf.errors import StrategyError, TopologyError
    from tag_tf.strategy import Strategy
    from tag_tf.topology.parse import load_file

    huge = tmp_path / "huge.yaml"
    huge.write_text("tasks: ['a:1']\n" + "#" * CLUSTER_FILE_LIMIT)
    with pytest.raises(ClusterError, match="larger than"):
        ClusterSpec.load(str(huge))
    binary = tmp_path / "plan.json"
    binary.write_bytes(b"\x80\x04\x95pickle")
    with pytest.raises(StrategyError, match="not UTF-8 text"):
        Strategy.load(str(binary))
    with pytest.raises(TopologyError, match="not UTF-8 text"):
        load_file(str(binary))


def test_nccl_all_reduce_among_gpus_of_one_machine():
    """GPU devices of one machine synchronise with NcclAllReduce; across machines with
    CollectiveReduceV2 (structure only: no GPU here to run it)."""
    from tag_tf.topology.load import load_topology

    _, a = analysis_of("mlp")
    one = load_topology({"name": "g", "machines": [{"name": "m", "gpus": "4x V100-32GB", "intra": "nvlink"}]})
    two = load_topology({"name": "g2", "machines": [{"name": "a", "gpus": "2x V100-32GB"},
                                                     {"name": "b", "gpus": "2x V100-32GB"}],
                         "inter": {"switch": "100Gbps"}})
    dp = Strategy.uniform(len(a.grouping.groups), (0, 1, 2, 3), Option.ALLREDUCE)
    nodes = compile_strategy(PassContext(), a, dp, DeviceMap.for_topology(one)).graph_def.node
    nccl = [n for n in nodes if n.op == "NcclAllReduce"]
    assert nccl and not any(n.op == "CollectiveReduceV2" for n in nodes)
    assert {n.attr["num_devices"].i for n in nccl} == {4}
    assert all("GPU" in n.device for n in nccl)
    # Every NcclAllReduce instance of one gradient shares its shared_name; instances are chained.
    by_name: dict[bytes, int] = {}
    for n in nccl:
        by_name[n.attr["shared_name"].s] = by_name.get(n.attr["shared_name"].s, 0) + 1
    assert set(by_name.values()) == {4}
    nodes = compile_strategy(PassContext(), a, dp, DeviceMap.for_topology(two)).graph_def.node
    assert any(n.op == "CollectiveReduceV2" for n in nodes) and not any(n.op == "NcclAllReduce" for n in nodes)
    # Fused: one NcclAllReduce per device over the packed bucket.
    fused = dataclasses.replace(dp, fusion_bytes=2**26)
    nodes = compile_strategy(PassContext(), a, fused, DeviceMap.for_topology(one), check=True).graph_def.node
    assert sum(n.op == "NcclAllReduce" for n in nodes) == 4


def test_a_server_on_one_core_sends_while_its_chain_computes():
    """A task confined to one core (an emulated host's cpuset) still sends each value as soon as
    it is made: its server runs with a second inter-op thread. With TensorFlow's default (one thread
    per usable core) the executor runs the next op of a chain inline and queues the Send behind it,
    so a pipeline stage passed its micro-batches on only after its last forward op."""
    import os

    import tensorflow as tf

    from tag_tf.runtime.cluster import LocalCluster, server_inter_op_threads

    assert server_inter_op_threads() >= 2
    cluster = LocalCluster(2)
    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mask)})          # the servers start confined to one core
    try:
        cluster.start()                           # (stops what it started if it fails)
    finally:
        os.sched_setaffinity(0, mask)
    try:
        spec = cluster.running
        graph = tf.Graph()
        with graph.as_default():
            with tf.device("/job:worker/task:0/device:CPU:0"):
                w = tf.compat.v1.Variable(np.full((600, 600), 1e-3, np.float32))
                x0 = tf.compat.v1.Variable(np.ones((600, 600), np.float32))
                x, outs = x0.read_value(), []
                for k in range(4):
                    for j in range(6):
                        x = tf.tanh(tf.matmul(x, w), name=f"chain{k}_{j}")
                    outs.append(x)
            with tf.device("/job:worker/task:1/device:CPU:0"):
                total = tf.add_n([tf.reduce_sum(o, name=f"got{k}") for k, o in enumerate(outs)])
        meta = tf.compat.v1.RunMetadata()
        with tf.compat.v1.Session(spec.target, graph=graph, config=spec.session_config()) as sess:
            sess.run([w.initializer, x0.initializer])
            sess.run(total)
            sess.run(total, options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE),
                     run_metadata=meta)
        when = {n.node_name: (n.all_start_micros, n.all_start_micros + n.all_end_rel_micros)
                for d in meta.step_stats.dev_stats for n in d.node_stats}
        chain_end = when["chain3_5"][1]
        assert when["got0"][0] < when["chain3_0"][0] < chain_end, \
            (when["got0"][0] - when["chain0_5"][1], chain_end - when["got0"][0])
    finally:
        cluster.stop()
