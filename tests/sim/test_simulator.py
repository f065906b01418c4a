"""The strategy simulator: exact cases with hand-set costs, memory, heterogeneity, contention, and
agreement with the compiler on what gets inserted."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import analysis_of, flat_costs

from tag_tf.compiler import DeviceMap, compile_strategy
from tag_tf.context import PassContext
from tag_tf.profile.costs import OpCosts
from tag_tf.search.baselines import data_parallel, random_strategy
from tag_tf.search.registry import baseline
from tag_tf.search.stages import pipeline_plan, stage_blocks, stage_capacities
from tag_tf.sim.prepare import device_types
from tag_tf.sim.simulator import TASK_KINDS, Simulator, training_costs
from tag_tf.strategy import GroupPlan, Option, Strategy
from tag_tf.topology.load import load_topology


def topology(spec_machines, switch="10Gbps"):
    spec = {"name": "t", "machines": spec_machines}
    if len(spec_machines) > 1:
        spec["inter"] = {"switch": switch}
    return load_topology(spec)


def test_single_device_time_is_the_sum_of_op_times():
    _, a = analysis_of("mlp")
    topo = topology([{"name": "m", "gpus": "2x V100-32GB", "intra": "nvlink"}])
    costs = flat_costs(a, device_types(topo), fixed=1e-3)
    sim = Simulator(a, topo, costs=costs)
    report = sim.simulate(Strategy.uniform(sim.num_groups, (0,), Option.ALLREDUCE))
    planned = len(a.planning.ops)
    members = sum(1 for _ in a.planning.host)
    # Planned ops carry their members' costs: one FIFO queue, no transfers.
    assert report.iteration_time_s == pytest.approx(members * 1e-3)
    assert report.num_tasks == planned
    assert report.device_idle[1] == 1.0


def test_data_parallel_halves_batch_work_and_adds_collectives():
    _, a = analysis_of("mlp")
    topo = topology([{"name": "m", "gpus": "2x V100-32GB", "intra": "nvlink"}])
    costs = flat_costs(a, device_types(topo), per_sample=1e-4)
    sim = Simulator(a, topo, costs=costs)
    one = sim.simulate(Strategy.uniform(sim.num_groups, (0,), Option.ALLREDUCE))
    two = sim.simulate(data_parallel(sim.num_groups, 2))
    trainable = sum(1 for v in a.graph.variables.values() if v.trainable)
    assert two.conversions["allreduce"] == trainable
    assert two.iteration_time_s < one.iteration_time_s
    assert two.iteration_time_s > one.iteration_time_s / 2      # plus the all-reduces


def test_memory_persistent_copies_and_oom():
    _, a = analysis_of("mlp")
    big = topology([{"name": "m", "gpus": "2x V100-32GB", "intra": "nvlink"}])
    sim = Simulator(a, big)
    var_bytes = sum(v.nbytes for v in a.graph.variables.values() if v.name in a.planning.host)
    ar = sim.simulate(data_parallel(sim.num_groups, 2))
    assert ar.persistent_bytes == (var_bytes, var_bytes)          # every replica holds a copy
    ps = sim.simulate(Strategy.uniform(sim.num_groups, (0, 1), Option.PS))
    assert sum(ps.persistent_bytes) == var_bytes                  # parameter servers share them
    assert all(p > 0 for p in ar.peak_memory_bytes) and not ar.oom
    tiny = load_topology({"name": "tiny", "machines": [{"name": "m", "gpus": [{"type": "V100-32GB", "count": 2,
                                                                                "memory": "1KiB"}]}]})
    assert Simulator(a, tiny).simulate(data_parallel(sim.num_groups, 2)).oom_devices == (0, 1)


def test_proportional_shares_help_on_mixed_gpus():
    _, a = analysis_of("cnn", batch_size=64)
    topo = topology([{"name": "fast", "gpus": "V100-32GB"}, {"name": "slow", "gpus": "T4"}], switch="100Gbps")
    types = device_types(topo)
    base = training_costs(a, types)
    costs = OpCosts(base.op_names, types, np.zeros_like(base.fixed),
                    np.array([[1e-5] * len(base.op_names), [4e-5] * len(base.op_names)]), {})
    sim = Simulator(a, topo, costs=costs)
    dp = sim.simulate(baseline("dp", sim.num_groups, topo))
    skew = sim.simulate(Strategy.uniform(sim.num_groups, (0, 1), Option.ALLREDUCE, shares=(4.0, 1.0)))
    assert skew.iteration_time_s < dp.iteration_time_s


def test_slow_network_makes_cross_machine_model_parallelism_slower():
    _, a = analysis_of("mlp")
    fast = topology([{"name": "m", "gpus": "2x V100-32GB", "intra": "nvlink"}])
    slow = topology([{"name": "a", "gpus": "V100-32GB"}, {"name": "b", "gpus": "V100-32GB"}], switch="1Gbps")
    strategy = lambda sim: Strategy.uniform(sim.num_groups, (0, 1), Option.MODEL_PARALLEL)
    s1, s2 = Simulator(a, fast), Simulator(a, slow)
    assert s2.simulate(strategy(s2)).iteration_time_s > s1.simulate(strategy(s1)).iteration_time_s


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "bert-small"])
def test_conversions_match_the_compiler(name):
    """The native expander inserts exactly the Split/Concat/AddN/AllReduce/zeros the compiler does."""
    _, a = analysis_of(name)
    sim = Simulator(a, load_topology("local:4"))
    keys = ("split", "concat", "addn", "allreduce", "allreduce_tensors", "zeros")
    for seed in range(6):      # random strategies draw random fusion caps too
        strategy = random_strategy(sim.num_groups, 4, np.random.default_rng(seed))
        report = sim.simulate(strategy)
        compiled = compile_strategy(PassContext(), a, strategy, DeviceMap.local_cpus(4))
        assert {k: report.conversions[k] for k in keys} == {k: compiled.stats[k] for k in keys}, seed


@pytest.mark.parametrize("name", ["transformer", "bert-small"])
def test_fused_buckets_match_the_compiler_and_cut_collectives(name):
    """Horovod-style fusion: the expander packs the same buckets as the compiler, far fewer
    collectives than per-tensor DP, and every tensor still reduced once."""
    _, a = analysis_of(name)
    topo = load_topology("local:4")
    sim = Simulator(a, topo)
    for cap in (None, 2**14, 2**20, 64 * 2**20):
        strategy = Strategy.uniform(sim.num_groups, range(4), Option.ALLREDUCE, fusion_bytes=cap)
        report = sim.simulate(strategy)
        compiled = compile_strategy(PassContext(), a, strategy, DeviceMap.local_cpus(4))
        assert report.conversions["allreduce"] == compiled.stats["allreduce"], cap
        assert report.conversions["allreduce_tensors"] == compiled.stats["allreduce_tensors"], cap
    per_tensor = sim.simulate(baseline("dp", sim.num_groups, topo)).conversions
    fused = sim.simulate(baseline("horovod", sim.num_groups, topo)).conversions
    assert fused["allreduce_tensors"] == per_tensor["allreduce_tensors"] == per_tensor["allreduce"] > 10
    assert 5 * fused["allreduce"] < per_tensor["allreduce"]


def test_horovod_beats_per_tensor_dp_on_latency_bound_models():
    """ResNet-101 on the datasheet testbed: ~300 per-tensor collectives across 7 machines are
    latency-bound; fused buckets are at least 2x faster (simulated), and nothing beats the compute
    lower bound. (On the calibrated testbed the real transport makes it bandwidth- and compute-
    bound, and Horovod gains little, as the paper measured.)"""
    _, a = analysis_of("resnet101", tiny=False)
    topo = load_topology("testbed-nominal")
    sim = Simulator(a, topo)
    dp = sim.simulate(baseline("dp", sim.num_groups, topo)).iteration_time_s
    hvd = sim.simulate(baseline("horovod", sim.num_groups, topo)).iteration_time_s
    assert hvd * 2 < dp
    assert sim.lower_bound_s() < hvd


def test_feedback_features_trace_and_strategy_errors(tmp_path):
    from tag_tf.errors import StrategyError
    from tag_tf.sim.trace import write_chrome_trace

    _, a = analysis_of("cnn")
    sim = Simulator(a, load_topology("testbed"))
    report = sim.simulate(Strategy.uniform(sim.num_groups, (0, 4, 12), Option.ALLREDUCE), detail=True)
    assert report.group_makespan.shape == (sim.num_groups,) and np.all(report.group_makespan >= 0)
    assert report.group_out_wait.shape == (sim.num_groups,) and len(report.device_idle) == 16
    graph, result = sim.task_graph(report)
    assert result.makespan == pytest.approx(report.iteration_time_s)
    path = tmp_path / "trace.json"
    write_chrome_trace(str(path), graph, result)
    events = json.loads(path.read_text())["traceEvents"]
    assert sum(1 for e in events if e.get("ph") == "X" and e.get("cat") != "held") == report.num_tasks
    with pytest.raises(StrategyError, match="group 0"):
        sim.simulate(Strategy((GroupPlan((0, 99), Option.PS),) + (GroupPlan((0,), Option.PS),) * (sim.num_groups - 1)))
    with pytest.raises(StrategyError, match="smaller than"):
        sim.simulate(data_parallel(sim.num_groups, 16))          # batch 8 over 16 replicas


def test_simulate_cli(capsys):
    from tag_tf.frontend.cli import main

    assert main(["simulate", "--model", "mlp", "--tiny", "--batch", "16", "--topology", "testbed",
                 "--strategy", "dp-p", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["simulated"] is True and out["iteration_time_s"] > 0 and out["oom"] is False
    assert len(out["peak_memory_bytes"]) == 16 and out["sim_ms"] > 0


def test_cross_process_message_cost_holds_both_executors():
    """Between CPU devices of two processes, host_message_s of every transfer's latency moves from
    waiting (overlaps anything) into a task that holds both processes' executors; the bytes hold
    only the link."""
    from tag_tf.profile.comm import CommModel
    from tag_tf.runtime.cluster import cpu_topology

    _, a = analysis_of("mlp")
    topo = cpu_topology(2, 1)
    costs = flat_costs(a, device_types(topo), fixed=1e-4)
    strategy = Strategy.uniform(len(a.grouping.groups), (0, 1), Option.MODEL_PARALLEL)
    latency = topo.latency(0, 1)
    msg = latency / 4

    def run(message_s):
        sim = Simulator(a, topo, costs=costs, comm=CommModel(topo, host_message_s=message_s))
        report = sim.simulate(strategy, detail=True)
        t = report.tasks
        hosts = {t["num_resources"] - 2, t["num_resources"] - 1}      # the two executors come last
        held = [set(t["res"][t["res_ptr"][i]:t["res_ptr"][i + 1]].tolist()) for i in range(len(t["kind"]))]
        return report, t, np.array([h == hosts for h in held]), np.array([bool(h) and not h & hosts for h in held])

    r0, t0, both0, link0 = run(0.0)
    r1, t1, both1, link1 = run(msg)
    assert (t0["kind"] == t1["kind"]).all() and r0.conversions == r1.conversions
    xfer = t1["kind"] == 1
    handled = xfer & both1                     # request handling: both executors, nothing else
    moved = xfer & link1                       # the bytes: the link only
    waiting = xfer & ~both1 & ~link1
    n = int(moved.sum())
    assert n > 0 and int(handled.sum()) == n == int(waiting.sum()) and (both0 == both1).all()
    np.testing.assert_allclose(t1["duration"][handled], msg)
    np.testing.assert_allclose(t0["duration"][handled], 0.0)
    np.testing.assert_allclose(t0["duration"][waiting] - t1["duration"][waiting], msg)
    np.testing.assert_allclose(t0["duration"][moved], t1["duration"][moved])
    # No compute task runs on an executor while a request holds it.
    comp = np.flatnonzero(t1["kind"] == 0)
    for h in np.flatnonzero(handled & (t1["duration"] > 0)):
        s, e = t1["start"][h], t1["end"][h]
        assert not np.any((t1["start"][comp] < e - 1e-15) & (t1["end"][comp] > s + 1e-15))
    # Transfers now steal executor time from the ops: slower here.
    assert r1.iteration_time_s > r0.iteration_time_s
    with pytest.raises(Exception, match="host_message_s"):
        CommModel(topo, host_message_s=-1.0)


def test_each_machine_pays_its_own_measured_message_cost():
    """Discovery measures what a cross-process message costs each CPU task while it computes
    (Machine.message_s: 60 us on a full core, 250-400 us on a quarter, measured on an emulated
    cluster). Every transfer between the machines then holds the sender's executor for the sender's
    cost and the receiver's for the receiver's, each alone; the wait before them is that much shorter."""
    _, a = analysis_of("mlp")
    fast_s, slow_s = 60e-6, 400e-6
    plain = topology([{"name": "fast", "gpus": "cpu"}, {"name": "slow", "gpus": "cpu", "speed": 0.25}])
    topo = topology([{"name": "fast", "gpus": "cpu", "message": "60us"},
                     {"name": "slow", "gpus": "cpu", "speed": 0.25, "message": "400us"}])
    assert load_topology(topo.to_dict()) == topo and "400 us CPU per message" in topo.describe().replace("µ", "u")
    assert topo.fingerprint != plain.fingerprint and load_topology(plain.to_dict()).machines[1].message_s == 0
    costs = flat_costs(a, device_types(topo), fixed=1e-4)
    strategy = Strategy.uniform(len(a.grouping.groups), (0, 1), Option.MODEL_PARALLEL)

    def run(t):
        report = Simulator(a, t, costs=costs).simulate(strategy, detail=True)
        tasks = report.tasks
        fast, slow = tasks["num_resources"] - 2, tasks["num_resources"] - 1      # the executors come last
        held = [tuple(tasks["res"][tasks["res_ptr"][i]:tasks["res_ptr"][i + 1]].tolist()) for i in range(len(tasks["kind"]))]
        xfer = tasks["kind"] == 1
        alone = {h: xfer & np.array([r == (h,) for r in held]) for h in (fast, slow)}
        return report, tasks, alone[fast], alone[slow]

    r0, t0, fast0, slow0 = run(plain)
    r1, t1, fast1, slow1 = run(topo)
    assert not fast0.any() and not slow0.any()
    n = int(fast1.sum())
    assert n > 0 and int(slow1.sum()) == n                    # both ends of every transfer
    np.testing.assert_allclose(t1["duration"][fast1], fast_s)
    np.testing.assert_allclose(t1["duration"][slow1], slow_s)
    assert len(t1["kind"]) == len(t0["kind"]) + 2 * n
    assert r1.iteration_time_s > r0.iteration_time_s + n * slow_s * 0.5
    with pytest.raises(Exception, match="message"):
        topology([{"name": "m", "gpus": "cpu", "message": "-1us"}])


def test_an_all_reduce_between_cpu_processes_pays_its_slowest_members_copies():
    """Between CPU processes an all-reduce's bytes also cost every member's CPU (gRPC copies,
    serialisation, the sums: Machine.copy_bandwidth, measured by discovery; a 51 MB all-reduce of two
    emulated hosts took 580 ms on full cores, 710 ms on half cores, where the link alone takes about
    440 ms). The slowest member's rate adds to the ring's link time."""
    from tag_tf.sim.simulator import TASK_KINDS

    _, a = analysis_of("mlp")
    plain = topology([{"name": "a", "gpus": "cpu"}, {"name": "b", "gpus": "cpu"}])
    topo = topology([{"name": "a", "gpus": "cpu", "copy": "400MB/s"}, {"name": "b", "gpus": "cpu", "copy": "200MB/s"}])
    assert load_topology(topo.to_dict()) == topo and "collectives' CPU" in topo.describe()
    costs = flat_costs(a, device_types(topo), fixed=1e-4)
    dp = baseline("dp", len(a.grouping.groups), topo)

    def collectives(t):
        report = Simulator(a, t, costs=costs).simulate(dp, detail=True)
        kinds = report.tasks["kind"]
        mask = np.array([TASK_KINDS[k] == "allreduce" for k in kinds])
        return report, (report.tasks["end"] - report.tasks["start"])[mask]

    r0, d0 = collectives(plain)
    r1, d1 = collectives(topo)
    assert len(d0) == len(d1) > 0
    bw, lat = plain.bandwidth(0, 1), plain.latency(0, 1)
    nbytes = (d0 - 2 * lat) * bw                       # 2(n-1)/n of each all-reduce's bytes, n = 2
    np.testing.assert_allclose(d1 - d0, nbytes / 200e6, rtol=1e-6)
    assert r1.iteration_time_s > r0.iteration_time_s
    with pytest.raises(Exception, match="copy"):
        topology([{"name": "m", "gpus": "cpu", "copy": "0MB/s"}])


def test_dp_nccl_waits_for_the_backward_pass_and_horovod_overlaps():
    """The paper measured Horovod 16% faster than DP-NCCL on VGG19 (548 MB of gradients, 38
    tensors: fusion changes little there, overlap does): DP-NCCL's all-reduces start after the
    backward pass, Horovod's overlap it. Simulated, calibrated testbed."""
    _, a = analysis_of("vgg19", tiny=False)
    topo = load_topology("testbed")
    sim = Simulator(a, topo)
    dp = baseline("dp", sim.num_groups, topo)
    t_dp = sim.simulate(dp).iteration_time_s
    t_overlapped = sim.simulate(dataclasses.replace(dp, sync_after_backward=False)).iteration_time_s
    t_hvd = sim.simulate(baseline("horovod", sim.num_groups, topo)).iteration_time_s
    assert t_overlapped < t_dp and t_hvd < 0.95 * t_dp


def test_a_machine_of_measured_speed_runs_its_ops_that_much_slower():
    """Two CPU machines, one at a third of the other's measured speed (an emulated quota): its ops
    take three times as long, dp-p gives it a third of the fast one's share, and that beats dp."""
    _, a = analysis_of("mlp")
    topo = topology([{"name": "fast", "gpus": "cpu"}, {"name": "slow", "gpus": "cpu", "speed": 1 / 3}])
    assert load_topology(topo.to_dict()) == topo and "speed 0.333x" in topo.describe()
    costs = flat_costs(a, device_types(topo), fixed=1e-4, per_sample=1e-5)
    sim = Simulator(a, topo, costs=costs)
    on_fast = sim.simulate(Strategy.uniform(sim.num_groups, (0,), Option.ALLREDUCE)).iteration_time_s
    on_slow = sim.simulate(Strategy.uniform(sim.num_groups, (1,), Option.ALLREDUCE)).iteration_time_s
    assert on_slow == pytest.approx(3 * on_fast, rel=1e-6)
    dp_p = baseline("dp-p", sim.num_groups, topo)
    assert dp_p.shares[0] == pytest.approx(3 * dp_p.shares[1])
    assert sim.simulate(dp_p).iteration_time_s < sim.simulate(baseline("dp", sim.num_groups, topo)).iteration_time_s
    with pytest.raises(Exception, match="speed"):
        topology([{"name": "m", "gpus": "cpu", "speed": 0}])


def test_messages_between_machines_overlap_their_latencies():
    """A transfer between machines waits its latency without holding the link: messages in flight
    overlap their latencies and queue only for their bytes. With 2 ms of latency and next to no
    bytes or compute, a pipelined plan's and a parameter server's step is a few latencies long,
    not one per message on the busiest port (each queued behind the last, as the links held them)."""
    from tag_tf.search.stages import pipeline_plan

    _, a = analysis_of("mlp")
    topo = load_topology({"name": "t", "machines": [{"name": "a", "gpus": "V100-32GB"}, {"name": "b", "gpus": "V100-32GB"}],
                          "inter": {"switch": "100Gbps", "latency": "2ms"}})
    sim = Simulator(a, topo, costs=flat_costs(a, device_types(topo), per_sample=1e-7))
    for plan in (pipeline_plan(a, [(0,), (1,)], 4), Strategy.uniform(sim.num_groups, (0, 1), Option.PS)):
        report = sim.simulate(plan, detail=True)
        t = report.tasks
        moving = [int(t["device"][i]) for i in range(len(t["duration"]))
                  if TASK_KINDS[int(t["kind"][i])] == "transfer" and t["res_ptr"][i + 1] > t["res_ptr"][i]]
        busiest = max(moving.count(0), moving.count(1))
        assert busiest >= 5
        assert 2e-3 < report.iteration_time_s < 0.5 * busiest * 2e-3, (plan.name, report.iteration_time_s, busiest)


def test_the_split_floor_pays_every_fixed_cost_on_every_device_and_no_batch_splitting_plan_beats_it():
    """split_floor_s: on equal devices it is one device's fixed costs plus its share of the batch's
    per-sample work; on the calibrated testbed and cloud it lies between the compute lower bound
    (which spreads the fixed costs too) and every baseline that splits the batch, and pipelines
    (which pay fixed costs per micro-batch) do not go below it either."""
    _, a = analysis_of("resnet101", tiny=False)
    for preset in ("testbed", "cloud"):
        topo = load_topology(preset)
        sim = Simulator(a, topo)
        floor = sim.split_floor_s()
        assert sim.lower_bound_s() < floor
        for name in ("dp", "dp-p", "horovod-p"):
            assert floor <= sim.simulate(baseline(name, sim.num_groups, topo)).iteration_time_s, name
        caps = stage_capacities(sim, topo)       # a pipeline pays fixed costs per micro-batch: no lower
        for blocks in stage_blocks(topo, caps)[:2]:
            plan = pipeline_plan(a, blocks, 2, fractions=[sum(caps[d] for d in b) for b in blocks], shares=caps)
            assert floor <= sim.simulate(plan).iteration_time_s, blocks
    one = Simulator(a, load_topology({"name": "one-type", "machines": [{"name": "m", "gpus": "4x V100-32GB",
                                                                     "intra": "nvlink 50GB/s"}]}))
    p = one.prepared
    n, t = p.num_ops, int(p.dev_type[0])
    fixed, per_sample = p.op_fixed.reshape(-1, n)[t].sum(), p.op_per_sample.reshape(-1, n)[t].sum()
    assert one.split_floor_s() == pytest.approx(fixed + per_sample * one.batch_size / 4, rel=1e-6)
    assert one.lower_bound_s() == pytest.approx((fixed + per_sample * one.batch_size) / 4, rel=1e-6)
