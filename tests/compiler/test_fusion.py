"""Gradient fusion (Horovod-style buckets): the bucket rule, and exact training with it."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import analysis_of
from test_equivalence import verify

from tag_tf.compiler import DeviceMap, compile_strategy
from tag_tf.context import PassContext
from tag_tf.placement.fusion import HOROVOD_FUSION_BYTES, Request, assign_buckets, sync_levels
from tag_tf.search.baselines import random_strategy
from tag_tf.search.registry import baseline
from tag_tf.strategy import Option, Strategy
from tag_tf.topology.load import load_topology


def _req(rank: int, nbytes: int = 100, devices=(0, 1), dtype="float32", level=1, fusable=True) -> Request:
    return Request(tuple(devices), dtype, level, (rank, rank, 0), nbytes, fusable)


def test_bucket_rule_caps_separates_and_orders():
    reqs = [_req(0), _req(1), _req(2), _req(3, nbytes=1000), _req(4, dtype="float16"),
            _req(5, devices=(0, 1, 2)), _req(6, fusable=False), _req(7, level=2), _req(8)]
    # No cap: one collective per tensor, in production order.
    assert assign_buckets(reqs, None) == [[i] for i in range(9)][:7] + [[8], [7]]
    buckets = assign_buckets(reqs, 250)
    # 0+1 fit in 250 bytes, 2 opens the next, 3 (over the cap) closes it and stands alone, 8 then
    # opens another; other dtypes, device sets and dynamic shapes stay apart; the level-2 tensor
    # comes after every level-1 bucket.
    assert buckets == [[0, 1], [2], [3], [4], [5], [6], [8], [7]]
    buckets = assign_buckets(reqs, 2000)
    assert buckets == [[4], [5], [6], [0, 1, 2, 3, 8], [7]]    # issued when their last member is ready


def test_sync_levels_rise_after_every_possible_reduction():
    from tag_tf.placement.layout import ColocationSets

    _, a = analysis_of("transformer")
    levels = sync_levels(a)
    coloc = ColocationSets(a)
    partial = {op for op in a.graph.order if any(s.kind.value == "partial" for s in a.annotations[op].outputs)}
    assert partial and min(levels[op] for op in partial) == 0     # the first weight gradients
    rises = 0
    for op in a.graph.order:
        requires = a.annotations[op].requires
        for i, ref in enumerate(a.graph.op(op).inputs):
            if ref.op not in partial:
                continue
            kept = (requires[i].kind.value == "partial" and a.grouping.group_of.get(op) == a.grouping.group_of.get(ref.op)
                    and not coloc.with_variable(op))
            assert levels[op] >= levels[ref.op] + (0 if kept else 1), (ref.op, op)
            rises += not kept
    assert rises > 0 and levels[a.graph.meta.train_op] >= 1


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "bert-small"])
@pytest.mark.parametrize("which", ["horovod", "horovod-p"])
def test_horovod_baselines_train_equivalently(name, which):
    _, a = analysis_of(name)
    topo = load_topology("local:4")
    strategy = baseline(which, len(a.grouping.groups), topo)
    if which == "horovod-p":       # local CPUs are equal: give the replicas uneven shares anyway
        strategy = dataclasses.replace(strategy, shares=(1.0, 2.0, 1.5, 0.5))
    compiled, _ = verify(name, strategy, 4)
    assert compiled.stats["allreduce_tensors"] > compiled.stats["allreduce"] >= 1


@pytest.mark.parametrize("name, seed", [("transformer", 3), ("bert-small", 5), ("cnn", 2)])
def test_random_plans_with_small_buckets_train_equivalently(name, seed):
    """Small caps make many multi-tensor buckets over mixed device sets and options."""
    _, a = analysis_of(name)
    strategy = dataclasses.replace(random_strategy(len(a.grouping.groups), 4, np.random.default_rng(seed)),
                                   fusion_bytes=8192)
    compiled, _ = verify(name, strategy, 4)
    assert compiled.stats["allreduce_tensors"] >= compiled.stats["allreduce"]


def test_fused_collectives_are_one_per_bucket_and_chained():
    _, a = analysis_of("transformer")
    strategy = Strategy.uniform(len(a.grouping.groups), (0, 1, 2, 3), Option.ALLREDUCE,
                                fusion_bytes=HOROVOD_FUSION_BYTES)
    compiled = compile_strategy(PassContext(), a, strategy, DeviceMap.local_cpus(4), check=True)
    reduces = [n for n in compiled.graph_def.node if n.op == "CollectiveReduceV2"]
    assert len(reduces) == 4 * compiled.stats["allreduce"]
    # Every device issues its collectives in one chain (control edges), the same order everywhere.
    by_device: dict[str, list] = {}
    for n in reduces:
        by_device.setdefault(n.device, []).append(n)
    for chain in by_device.values():
        for prev, node in zip(chain, chain[1:]):
            assert f"^{prev.name}" in node.input


@pytest.mark.parametrize("name", ["transformer", "bert-small"])
def test_parameter_servers_receive_one_packed_tensor_per_bucket(name):
    """PS: each replica packs its gradients per server; the simulator packs the same sums."""
    from tag_tf.sim.simulator import Simulator

    _, a = analysis_of(name)
    n = len(a.grouping.groups)
    per_tensor = Strategy.uniform(n, (0, 1, 2, 3), Option.PS, shares=(1.0, 2.0, 1.0, 1.0))
    fused = dataclasses.replace(per_tensor, fusion_bytes=HOROVOD_FUSION_BYTES)
    compiled, _ = verify(name, fused, 4)
    plain = compile_strategy(PassContext(), a, per_tensor, DeviceMap.local_cpus(4))
    assert compiled.stats["addn_tensors"] == plain.stats["addn_tensors"] == plain.stats["addn"]
    assert 4 * compiled.stats["addn"] < plain.stats["addn"]      # a few per server, not one per gradient
    sim = Simulator(a, load_topology("local:4"))
    for strategy, stats in ((fused, compiled.stats), (per_tensor, plain.stats)):
        conv = sim.simulate(strategy).conversions
        assert {k: conv[k] for k in ("addn", "addn_tensors", "concat", "split")} == \
               {k: stats[k] for k in ("addn", "addn_tensors", "concat", "split")}


def test_sparse_gradients_are_gathered_not_fused():
    """Embedding gradients (IndexedSlices: indices + values rows) are split along the lookups, so
    they are gathered (Concat) where the sparse update runs; buckets only ever hold dense partial
    sums, so nothing is densified."""
    _, a = analysis_of("bert-small", sparse_grads=True)
    n = len(a.grouping.groups)
    strategy = Strategy.uniform(n, (0, 1, 2), Option.ALLREDUCE, fusion_bytes=HOROVOD_FUSION_BYTES)
    compiled, _ = verify("bert-small", strategy, 3, sparse_grads=True)
    assert compiled.stats["concat"] > 0
    fused_inputs = {i.split(":")[0] for node in compiled.graph_def.node if node.name.endswith("/flat")
                    for i in node.input}
    scatter_inputs = {i.split(":")[0] for node in compiled.graph_def.node if node.op == "ResourceScatterAdd"
                      for i in node.input}
    assert fused_inputs and not fused_inputs & scatter_inputs


def _same_level_pairs_waiting(graph_def, levels) -> tuple[int, int]:
    """Pairs (C1, C2) of per-tensor collectives on one device at the same sync level, and how many
    have C2's input upstream of C1: with the barrier, all of them."""
    import re

    inputs = {n.name: [i.lstrip("^").split(":")[0] for i in n.input] for n in graph_def.node}

    def closure(start: str) -> set[str]:
        seen, stack = set(), [start]
        while stack:
            for i in inputs[stack.pop()]:
                if i not in seen:
                    seen.add(i)
                    stack.append(i)
        return seen

    reduces = [n for n in graph_def.node if n.op == "CollectiveReduceV2"]
    level = {n.name: levels[re.fullmatch(r"tag/allreduce/(.+)/r\d+", n.name).group(1)] for n in reduces}
    upstream = {n.name: closure(n.name) for n in reduces}
    pairs = waiting = 0
    for c1 in reduces:
        for c2 in reduces:
            if c1 is not c2 and c1.device == c2.device and level[c1.name] == level[c2.name]:
                pairs += 1
                waiting += inputs[c2.name][0] in upstream[c1.name]
    return pairs, waiting


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_dp_all_reduces_start_after_the_backward_pass(name):
    """DP-NCCL (`sync_after_backward`): trains equivalently, and on every device the first all-reduce
    waits for every gradient it will reduce, so none overlaps the backward pass; Horovod's do."""
    _, a = analysis_of(name)
    topo = load_topology("local:4")
    dp = baseline("dp", len(a.grouping.groups), topo)
    assert dp.sync_after_backward and not baseline("horovod", len(a.grouping.groups), topo).sync_after_backward
    compiled, _ = verify(name, dp, 4)
    assert compiled.stats["allreduce"] > 1
    pairs, waiting = _same_level_pairs_waiting(compiled.graph_def, sync_levels(a))
    assert pairs > 0 and waiting == pairs
    overlapped = compile_strategy(PassContext(), a, dataclasses.replace(dp, sync_after_backward=False),
                                  DeviceMap.local_cpus(4), check=True)
    pairs, waiting = _same_level_pairs_waiting(overlapped.graph_def, sync_levels(a))
    assert waiting < pairs


def test_strategy_files_keep_the_barrier_and_old_files_load():
    s = Strategy.uniform(3, (0, 1), Option.ALLREDUCE, sync_after_backward=True)
    assert Strategy.from_dict(s.to_dict()) == s
    old = s.to_dict()
    del old["sync_after_backward"]
    assert not Strategy.from_dict(old).sync_after_backward
    from tag_tf.errors import StrategyError

    with pytest.raises(StrategyError, match="sync_after_backward"):
        Strategy.from_dict({**s.to_dict(), "sync_after_backward": "yes"})
