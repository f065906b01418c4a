"""Pipelined plans (Strategy.microbatches): stages of consecutive op groups on their own devices, the
batch in micro-batches, gradients summed per device and synchronised once. Each compiles to one TF
graph that computes what the original computes (judged against the noise floor), and its structure
lets micro-batch m + 1 of a stage start before the stages after it have finished micro-batch m."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import analysis_of, batches, flat_costs

from tag_tf.compiler import DeviceMap, compile_strategy
from tag_tf.context import PassContext
from tag_tf.errors import StrategyError
from tag_tf.placement.layout import ColocationSets
from tag_tf.runtime.equivalence import check_equivalence, noise_floor, run_original
from tag_tf.search.stages import op_stages, pipeline_plan, planned_op_weights
from tag_tf.strategy import Option, SfbCut, Strategy

STEPS = 3


def verify(name: str, strategy: Strategy, devices: int, *, target: str = "", config=None, dm=None, **kw):
    model, a = analysis_of(name, **kw)
    feeds = batches(model, STEPS)
    original = run_original(a, feeds, STEPS)
    floor = noise_floor(a, original, feeds)
    compiled = compile_strategy(PassContext(), a, strategy, dm or DeviceMap.local_cpus(devices), check=True)
    result = check_equivalence(a, compiled, feeds, STEPS, original=original, floor=floor, target=target,
                               config=config)
    assert result.ok, (result.max_rel_diff, result.tolerance, sorted(result.per_variable.items(),
                                                                      key=lambda kv: -kv[1])[:3])
    np.testing.assert_allclose(result.losses_compiled, result.losses_original, rtol=1e-4)
    return a, compiled


@pytest.mark.parametrize("name", ["mlp", "transformer", "bert-small"])
def test_two_stages_four_microbatches_train_equivalently(name):
    _, a = analysis_of(name)
    plan = pipeline_plan(a, [(0,), (1,)], 4)
    a, compiled = verify(name, plan, 2)
    # Each variable has one copy per stage device and is updated once per step: micro-batches
    # sum their gradients on the device first.
    assert all(len(copies) == 1 for copies in compiled.variables.values())
    assert compiled.stats["accumulate"] > 0
    devices = {n.device for n in compiled.graph_def.node if n.name.startswith("tag_r3/")}
    assert len(devices) == 2          # micro-batch 3 runs on both stages


def test_data_parallel_stage_with_uneven_shares_beside_a_single_device_stage():
    """Stage 0 data-parallel over devices 0 and 1 (shares 2:1), stage 1 on device 2, 4 micro-batches:
    each micro-batch's pieces are regrouped on their own (no gather of the whole batch), stage 0's
    gradients are summed per device and all-reduced once."""
    _, a = analysis_of("cnn")
    plan = pipeline_plan(a, [(0, 1), (2,)], 4, shares=(2.0, 1.0, 1.0))
    _, compiled = verify("cnn", plan, 3)
    assert compiled.stats["allreduce"] > 0 and compiled.stats["concat"] == 0
    concat = [n.name for n in compiled.graph_def.node if n.op == "ConcatV2" and "/m" in n.name]
    assert concat                     # per micro-batch regrouping
    counts = {lay.counts for lay in compiled.placement.layouts.values() if lay.micro == 4 and lay.size == 8}
    assert counts and all(sum(c[:2]) == sum(c[2:4]) == sum(c[4:6]) == sum(c[6:]) for c in counts)


@pytest.mark.parametrize("option", [Option.PS, Option.MODEL_PARALLEL])
def test_other_options_pipelined(option):
    _, a = analysis_of("mlp")
    verify("mlp", pipeline_plan(a, [(0, 1), (2,)], 4, option=option), 3)


@pytest.mark.parametrize("stages", [[(0,), (1,), (2,)], [(0, 1), (2,)], [(0,), (1, 2)]])
def test_dynamic_batch_pipelines(stages):
    """A batch known only at run time, between stages of one device and of two with uneven shares:
    equivalent, and each micro-batch regrouped on its own (no Concat joins two micro-batches'
    pieces; gathering the whole batch, the emulated link cluster's far stage waited for all 16)."""
    _, a = analysis_of("mlp", dynamic_batch=True)
    _, compiled = verify("mlp", pipeline_plan(a, stages, 4, shares=(2.0, 1.0, 1.0)), 3, dynamic_batch=True)
    micro = _micro_batches(compiled)
    step = _ancestors(compiled, list(compiled.run_ops.values()))        # what the training step runs
    joined = [n.name for n in compiled.graph_def.node if n.op == "ConcatV2" and n.name in step
              and len({micro[i.split(":")[0]] for i in n.input if i.split(":")[0] in micro}) > 1]
    assert not joined, joined[:3]


def test_dynamic_batch_of_thousands_over_many_micro_batches():
    """Run-time row bounds floor(N * W_j / W) are computed in int64: a fed batch of 6000 over 16
    micro-batches of two devices with shares 2 : 1 makes N * W_j 2.9e9, past int32 (the sizes
    then no longer summed to the batch and TensorFlow's SplitV refused them)."""
    model, a = analysis_of("mlp", dynamic_batch=True)
    rng = np.random.default_rng(3)
    data = [model.feed(rng, batch_size=6000) for _ in range(2)]
    plan = pipeline_plan(a, [(0, 1), (2,)], 16, shares=(2.0, 1.0, 1.0))
    compiled = compile_strategy(PassContext(), a, plan, DeviceMap.local_cpus(3), check=True)
    result = check_equivalence(a, compiled, lambda s: data[s], 2)
    assert result.ok, result.max_rel_diff


def _ancestors(compiled, names: list[str]) -> set[str]:
    from tag_tf.compiler.transfers import _ancestors as ancestors

    return ancestors({n.name: n for n in compiled.graph_def.node}, names)


def test_microbatch_m_plus_1_does_not_wait_for_later_stages():
    """The schedule is the dataflow's: in the compiled graph, stage 0's forward ops of micro-batch 1
    depend on nothing that runs on stage 1's device, and stage 1's micro-batch m reads stage 0's
    micro-batch m directly (no op joining all micro-batches in between)."""
    model, a = analysis_of("mlp")
    compiled = compile_strategy(PassContext(), a, pipeline_plan(a, [(0,), (1,)], 4), DeviceMap.local_cpus(2))
    nodes = {n.name: n for n in compiled.graph_def.node}
    dev1 = DeviceMap.local_cpus(2)[1]

    def ancestors(name):
        seen, stack = set(), [name]
        while stack:
            n = stack.pop()
            if n not in seen:
                seen.add(n)
                stack.extend(i.lstrip("^").split(":")[0] for i in nodes[n].input)
        return seen
    dev0 = DeviceMap.local_cpus(2)[0]
    loss_cone = a.graph.ancestors([a.graph.meta.loss.split(":")[0]])       # the forward pass
    forward = [n for n, node in nodes.items() if n.startswith("tag_r1/") and node.device == dev0
               and n[len("tag_r1/"):] in loss_cone]
    assert len(forward) >= 3
    for name in forward:
        assert not [n for n in ancestors(name) if nodes[n].device == dev1], name
    # Every stage-1 instance of micro-batch m reads micro-batch m's values, no other micro-batch's.
    for name, node in nodes.items():
        m = name.split("/")[0]
        if node.device == dev1 and m.startswith("tag_r"):
            others = [i for i in node.input if i.lstrip("^").startswith("tag_r") and
                      i.lstrip("^").split("/")[0] != m]
            assert not others, (name, others)
    assert compiled.stats["concat"] == 0


def test_micro_batch_sums_are_chained_and_grappler_keeps_the_chain():
    """Each device sums its micro-batches' gradients as they come: a chain of additions in
    micro-batch order, which TensorFlow's graph rewrites (on, as users run) leave alone. Folded into
    one AddN, Grappler's memory optimizer would zero a temporary variable every step and sum at the
    end (measured: 0.56 s of a traced 3.1 s step on an emulated quarter-speed host)."""
    import tensorflow as tf

    from tag_tf.compiler.collectives import GRAPPLER_ADD_OPS_DONE
    from tag_tf.runtime.equivalence import _initializers, import_graph
    from tag_tf.runtime.sessions import session_config

    model, a = analysis_of("mlp")
    micro = 4
    compiled = compile_strategy(PassContext(), a, pipeline_plan(a, [(0,), (1,)], micro), DeviceMap.local_cpus(2))
    chain = [n for n in compiled.graph_def.node if n.name.startswith("tag/accumulate/")]
    assert chain and all(n.op == "AddV2" and GRAPPLER_ADD_OPS_DONE in n.attr for n in chain)
    sums = {n.name for n in chain} - {i.split(":")[0] for n in chain for i in n.input}
    assert len(chain) == (micro - 1) * len(sums)       # M - 1 additions per summed gradient
    for last in sums:                                  # micro-batch m's value joins the m-th addition
        node, order = {n.name: n for n in chain}[last], []
        while node is not None:
            order.append(int(node.input[1].split("/")[0][len("tag_r"):]))
            node = {n.name: n for n in chain}.get(node.input[0].split(":")[0])
        assert order == list(range(micro - 1, 0, -1)), (last, order)
    graph = import_graph(compiled.graph_def)
    meta = tf.compat.v1.RunMetadata()
    with tf.compat.v1.Session(graph=graph, config=session_config(2)) as sess:
        sess.run(_initializers(a.graph, compiled.instances))
        sess.run([compiled.run_ops[a.graph.meta.train_op], compiled.fetch_tensors[a.graph.meta.loss]], dict(batches(model, 1)(0)),
                 options=tf.compat.v1.RunOptions(output_partition_graphs=True), run_metadata=meta)
    ran = {n.name: n.op for g in meta.partition_graphs for n in g.node if n.name.startswith("tag/accumulate/")}
    assert {n.name: ran.get(n.name) for n in chain} == {n.name: "AddV2" for n in chain}


@pytest.mark.parametrize("name", ["mlp", "transformer", "bert-small"])
def test_two_server_processes_one_stage_each(name, monkeypatch):
    """Stage 0 on task 0, stage 1 on task 1: micro-batches cross the process boundary, in order
    (the tiny models' transfers are ordered whatever their size)."""
    from tag_tf.compiler import transfers
    from tag_tf.runtime.cluster import cpu_topology, local_cluster

    monkeypatch.setattr(transfers, "ORDERED_MIN_BYTES", 0)

    _, a = analysis_of(name)
    devices = DeviceMap.for_topology(cpu_topology(2, 1))
    plan = pipeline_plan(a, [(0,), (1,)], 4, ordered_links=((0, 1), (1, 0)))
    with local_cluster(2, 1, timeout_ms=60_000) as (spec, _):
        _, compiled = verify(name, plan, 2, target=spec.target, config=spec.session_config(), dm=devices)
    assert compiled.builder.ordered_transfers > 0       # the micro-batches crossed in order
    assert {n.device.split("/device")[0] for n in compiled.graph_def.node if n.name.startswith("tag_r2/")} == \
        {"/job:worker/replica:0/task:0", "/job:worker/replica:0/task:1"}


def test_strategy_files_and_refusals():
    _, a = analysis_of("mlp")
    plan = pipeline_plan(a, [(0,), (1,)], 4)
    d = plan.to_dict()
    assert d["microbatches"] == 4 and Strategy.from_dict(json.loads(json.dumps(d))) == plan
    plain = Strategy.uniform(len(a.grouping.groups), (0, 1), Option.ALLREDUCE)
    assert "microbatches" not in plain.to_dict()            # older files and fingerprints unchanged
    assert Strategy.from_dict(plain.to_dict()).microbatches == 1
    for bad in (0, -1, 2.5, True, "4"):
        with pytest.raises(StrategyError, match="microbatches"):
            Strategy.from_dict({**d, "microbatches": bad})
    with pytest.raises(StrategyError, match="sfb"):
        Strategy.from_dict({**d, "sfb": [SfbCut("g:0", ("op",)).to_dict()]}).validate(len(plan.groups), 2)
    with pytest.raises(StrategyError, match="too small for 64 micro-batches"):
        compile_strategy(PassContext(), a, pipeline_plan(a, [(0,), (1,)], 64), DeviceMap.local_cpus(2))
    with pytest.raises(StrategyError, match="stages but the forward pass has only"):
        pipeline_plan(a, [(0,)] * (len(a.planning.ops) + 1), 2)


def test_stage_cuts_follow_fractions_and_keep_layers_whole():
    """The forward pass is cut in order; a stage with a larger fraction takes more of it; each
    variable, its gradient's producer and its update share a stage."""
    _, a = analysis_of("transformer")
    ops = a.planning.ops
    index = {name: i for i, name in enumerate(ops)}
    loss_cone = {a.planning.host[o] for o in a.graph.ancestors([a.graph.meta.loss.split(":")[0]])
                 if o in a.planning.host}
    forward = [index[o] for o in ops if o in loss_cone]
    coloc = ColocationSets(a)       # a variable's reads may join its earliest stage
    for fractions in ([1, 1], [1, 1, 1], [3, 1], [1, 3]):
        stage = op_stages(a, fractions)
        assert set(stage.tolist()) == set(range(len(fractions)))
        fwd = [int(stage[i]) for i in forward if a.graph.op(ops[i]).inputs and not coloc.with_variable(ops[i])]
        assert fwd == sorted(fwd)
    first = lambda fr: int((op_stages(a, fr)[forward] == 0).sum())
    assert first([3, 1]) > first([1, 1]) > first([1, 3])
    stage = op_stages(a, [1, 1, 1])
    for name, var in a.graph.variables.items():
        if not var.trainable or name not in index:
            continue
        updates = [o for o in ops if a.graph.op(o).type.startswith(("ResourceApply", "Apply"))
                   and any(r.op == name for r in a.graph.op(o).inputs)]
        for u in updates:
            assert stage[index[u]] == stage[index[name]], (name, u)


PLANS = [([(0,), (1,)], 4, Option.ALLREDUCE, None), ([(0, 1), (2,), (3,)], 4, Option.ALLREDUCE, None),
         ([(0, 1), (2, 3)], 2, Option.PS, None), ([(0, 1), (2,)], 4, Option.ALLREDUCE, 2**20),
         ([(0,), (1,), (2,), (3,)], 8, Option.MODEL_PARALLEL, None), ([(0, 1), (2, 3)], 4, Option.PS, 2**20)]


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "bert-small"])
def test_the_simulator_inserts_what_the_compiler_does(name):
    """kernels/expand.h mirrors the compiler for pipelined plans too: the same regrouping splits,
    per-device micro-batch sums, all-reduces (fused or not), sums on servers and zeros."""
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.load import load_topology

    _, a = analysis_of(name)
    sim = Simulator(a, load_topology("local:4"))
    keys = ("split", "concat", "addn", "allreduce", "allreduce_tensors", "zeros", "accumulate")
    for stages, micro, option, fusion in PLANS:
        plan = pipeline_plan(a, stages, micro, option=option, shares=(2.0, 1.0, 1.0, 1.0), fusion_bytes=fusion)
        report = sim.simulate(plan)
        compiled = compile_strategy(PassContext(), a, plan, DeviceMap.local_cpus(4))
        assert {k: report.conversions[k] for k in keys} == {k: compiled.stats[k] for k in keys}, (stages, micro)
        assert report.conversions["accumulate"] > 0


def test_simulated_micro_batches_fill_the_pipeline():
    """With every op's time proportional to its samples (no fixed costs), four stages on four GPUs
    run the batch in sequence without micro-batches; with 8 micro-batches the stages overlap and
    only the fill and drain remain idle."""
    from tag_tf.sim.prepare import device_types
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.load import load_topology

    _, a = analysis_of("transformer")
    topo = load_topology({"name": "t", "machines": [{"name": "m", "gpus": "4x V100-32GB", "intra": "nvlink"}]})
    sim = Simulator(a, topo, costs=flat_costs(a, device_types(topo), per_sample=1e-4))
    one = sim.simulate(Strategy.uniform(sim.num_groups, (0,), Option.ALLREDUCE)).iteration_time_s
    weights = planned_op_weights(sim, "V100-32GB")        # cut where the simulated work is balanced
    times = [sim.simulate(pipeline_plan(a, [(0,), (1,), (2,), (3,)], m, weights=weights)).iteration_time_s / one
             for m in (1, 2, 4, 8)]
    assert times == sorted(times, reverse=True) and times[-1] < 0.8 * times[0] and times[-1] < 0.55, times


def test_sfb_leaves_a_pipelined_plan_as_it_is():
    """`pipeline+sfb` (or SFB after a search that kept micro-batches): SFB is not micro-batched,
    so the plan comes back unchanged, with its simulated time."""
    from tag_tf.search.sfb import apply_sfb
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.load import load_topology

    _, a = analysis_of("mlp")
    sim = Simulator(a, load_topology("local:2"))
    plan = pipeline_plan(a, [(0,), (1,)], 4)
    outcome = apply_sfb(sim, plan)
    assert outcome.strategy == plan and outcome.kept == 0
    assert outcome.before_s == outcome.after_s == sim.simulate(plan).iteration_time_s


def test_a_loss_normalised_over_the_batch_leaves_its_stage_ungated_not_cyclic():
    """The transformer divides its summed loss by the batch's token count: on a data-parallel last
    stage that count is all-reduced over every micro-batch, so micro-batch 0's loss waits for all of
    them. Gating that stage would close a cycle; the compiler and the simulator see the all-reduce
    (they gate after emitting collectives) and leave it ungated."""
    from tag_tf.sim.simulator import Simulator
    from tag_tf.topology.load import load_topology

    _, a = analysis_of("transformer")
    plan = pipeline_plan(a, [(0,), (1, 2)], 4)
    _, compiled = verify("transformer", plan, 3)          # check=True: the compiled graph is a DAG
    assert any(n.name.startswith("tag/gate/") for n in compiled.graph_def.node)     # stage 0 is gated
    report = Simulator(a, load_topology("local:3")).simulate(plan)
    assert report.iteration_time_s > 0 and not report.oom


def _tensors_crossing_tasks(compiled) -> dict[tuple[str, str], set[str]]:
    """(tensor, receiving task) -> the devices of that task that read it, for tensors read on another task."""
    nodes = {n.name: n for n in compiled.graph_def.node}
    task = lambda device: device.split("/device")[0]
    out: dict[tuple[str, str], set[str]] = {}
    for n in compiled.graph_def.node:
        for i in n.input:
            if not i.startswith("^") and task(nodes[i.split(":")[0]].device) != task(n.device):
                out.setdefault((i if ":" in i else f"{i}:0", task(n.device)), set()).add(n.device)
    return out


@pytest.mark.parametrize("name,fusion", [("mlp", None), ("bert-small", None), ("bert-small", 2**20)])
def test_a_value_crosses_to_another_machine_once(name, fusion):
    """Two machines of two devices, a stage each: a whole value another machine needs (a tied
    embedding, an optimizer's scalars) crosses once and is copied there; micro-batched partial sums
    bound for another machine are added up on their own machine first (with fusion: a bucket of
    one; larger buckets send each device's pack). Compiled: every tensor read on another task is
    read there by one device. Simulated: no task sends one machine two copies, and the simulator
    inserts the conversions the compiler does."""
    from tag_tf.runtime.cluster import cpu_topology
    from tag_tf.sim.simulator import TASK_KINDS, Simulator

    _, a = analysis_of(name)
    topo = cpu_topology(2, 2)
    plan = pipeline_plan(a, [(0, 1), (2, 3)], 4, fusion_bytes=fusion)
    compiled = compile_strategy(PassContext(), a, plan, DeviceMap.for_topology(topo))
    crossing = _tensors_crossing_tasks(compiled)
    assert len(crossing) > 20 and all(len(devices) == 1 for devices in crossing.values()), \
        sorted(k for k, v in crossing.items() if len(v) > 1)[:5]
    assert any(n.name.startswith("tag/relay/") for n in compiled.graph_def.node)
    assert any(n.name.startswith("tag/presum/") for n in compiled.graph_def.node)
    report = Simulator(a, topo).simulate(plan, detail=True)
    keys = ("split", "concat", "addn", "allreduce", "allreduce_tensors", "zeros", "accumulate")
    assert {k: report.conversions[k] for k in keys} == {k: compiled.stats[k] for k in keys}
    t, D, machine = report.tasks, topo.num_devices, [d.machine for d in topo.devices]
    links = range(2 * D, 2 * D + (report.tasks["num_resources"] - 2 * D - topo.num_machines))
    sent: dict[tuple[int, int], int] = {}
    for i in range(len(t["duration"])):
        src = int(t["src"][i])
        # a split's or a fused bucket's unpack task stands for several tensors, each sent on its own
        if (TASK_KINDS[int(t["kind"][i])] != "transfer" or src < 0 or TASK_KINDS[int(t["kind"][src])] in ("split", "unpack")
                or machine[int(t["device"][src])] == machine[int(t["device"][i])]
                or not any(int(r) in links for r in t["res"][t["res_ptr"][i]:t["res_ptr"][i + 1]])):
            continue
        key = (src, machine[int(t["device"][i])])
        sent[key] = sent.get(key, 0) + 1
    assert len(sent) > 20 and max(sent.values()) == 1


def test_two_server_processes_of_two_devices_one_stage_each():
    """bert-small (its embedding tied to the output layer) pipelined over two processes of two
    devices: relayed values and per-machine sums train what the original trains."""
    from tag_tf.runtime.cluster import cpu_topology, local_cluster

    devices = DeviceMap.for_topology(cpu_topology(2, 2))
    _, a = analysis_of("bert-small")
    plan = pipeline_plan(a, [(0, 1), (2, 3)], 4)
    with local_cluster(2, 2, timeout_ms=60_000) as (spec, _):
        verify("bert-small", plan, 4, target=spec.target, config=spec.session_config(), dm=devices)


@pytest.mark.parametrize("name", ["transformer", "bert-small"])
def test_no_micro_batch_waits_for_another_micro_batchs_ops(name):
    """A control edge between two stages' micro-batched ops pairs micro-batch m with micro-batch m.
    Each gradient's `tf.tuple` (an Identity waiting for a NoOp that joins the gradient's ops) whose
    ops two stages share waited for every micro-batch's NoOp: each micro-batch's backward pass then
    joined all the others at every such layer, and on an emulated 3-host cluster the transformer's
    pipelined step ran 234 ms where 151 ms was predicted (190 ms with this pairing)."""
    _, a = analysis_of(name)
    for stages in ([(0,), (1,), (2,)], [(0, 1), (2,)]):      # stages of one width, and of two
        compiled = compile_strategy(PassContext(), a, pipeline_plan(a, stages, 4), DeviceMap.local_cpus(3))
        micro = _micro_batches(compiled)
        crossing = [(node.name, i) for node in compiled.graph_def.node if node.name in micro
                    for i in node.input if i.startswith("^") and micro.get(i[1:], micro[node.name]) != micro[node.name]]
        assert not crossing, (stages, len(crossing), crossing[:3])
        devices = {n.device for n in compiled.graph_def.node if micro.get(n.name) == 1 and "/gradients/" in n.name}
        assert len(devices) == 3           # micro-batch 1's backward pass runs on every stage


def _micro_batches(compiled) -> dict[str, int]:
    """Each micro-batched instance's micro-batch (replica j of a layout of k devices: j // k)."""
    out = {}
    for op, names in compiled.instances.items():
        lay = compiled.placement.of(op)
        if lay.micro > 1:
            out.update((name, j // (lay.size // lay.micro)) for j, name in enumerate(names))
    return out


@pytest.mark.parametrize("name", ["mlp", "transformer", "bert-small"])
def test_transfers_over_slow_links_go_in_micro_batch_order(name, monkeypatch):
    """On the links a plan orders, micro-batch m + 1's activations (and gradients) leave once
    micro-batch m's have all arrived: left to TensorFlow, every micro-batch's tensors crossed a link
    at once, interleaved, and each arrived when nearly all had (the emulated link cluster's cnn-wide
    pipeline ran 13.8 s a step where 6.9 s was predicted; 7.1 s ordered). Each `tag/order/send/`
    Identity waits for a `tag/order/arrived` NoOp on the receiving task that joins the
    `tag/order/recv/` Identities of the micro-batch before, in the same direction of the pass.
    Links the plan does not name send when ready, and so do transfers below ORDERED_MIN_BYTES
    (0 here, for the tiny models; the transformer's, at 1 KB, keeps its target ids out: its loss
    divides by the whole batch's token count, and ordered they held every backward pass back)."""
    from tag_tf.compiler import transfers
    from tag_tf.runtime.cluster import cpu_topology

    monkeypatch.setattr(transfers, "ORDERED_MIN_BYTES", 0)
    _, a = analysis_of(name)
    links = ((0, 2), (1, 2), (2, 0))             # a and b into the far host, and back to a
    compiled = compile_strategy(PassContext(), a, pipeline_plan(a, [(0, 1), (2,)], 4, ordered_links=links),
                                DeviceMap.for_topology(cpu_topology(3, 1)), check=True)
    nodes = {n.name: n for n in compiled.graph_def.node}
    micro = _micro_batches(compiled)
    task = lambda name: int(nodes[name].device.split("task:")[1].split("/")[0])
    recv_of = {n.input[0]: n.name for n in compiled.graph_def.node if n.name.startswith("tag/order/recv/")}
    readers: dict[str, list[str]] = {}
    for n in compiled.graph_def.node:
        for i in n.input:
            readers.setdefault(i.split(":")[0], []).append(n.name)

    def micro_of(send: str) -> int:          # its tensor's producer's micro-batch, or its readers' first
        src = nodes[send].input[0].split(":")[0]
        return micro[src] if src in micro else min(micro[r] for r in readers[recv_of[send]] if r in micro)

    waits = [(n.name, i[1:]) for n in compiled.graph_def.node if n.name.startswith("tag/order/send/")
             for i in n.input if i.startswith("^")]
    assert compiled.builder.ordered_transfers == len(waits) >= 6, len(waits)
    pairs = set()
    for send, gate in waits:
        assert gate.startswith("tag/order/arrived") and task(gate) != task(send), (send, gate)
        earlier = [i[1:] for i in nodes[gate].input]
        assert earlier and all(e.startswith("tag/order/recv/") and task(e) == task(gate) for e in earlier)
        assert max(micro_of(nodes[e].input[0]) for e in earlier) < micro_of(send), (send, earlier)
        pairs.add((task(send), task(gate)))
    assert pairs <= set(links) and (2, 0) in pairs and {(0, 2), (1, 2)} & pairs, pairs
    sends = {n.name for n in compiled.graph_def.node if n.name.startswith("tag/order/send/")}
    assert {(task(s), task(recv_of[s])) for s in sends} <= set(links)       # b <-> a, b <- far: when ready
    for n in compiled.graph_def.node:         # a received tensor is read through its recv Identity only
        for i in n.input:
            if not i.startswith("^") and i.split(":")[0] in sends:
                assert n.name.startswith("tag/order/recv/"), n.name
    unordered = compile_strategy(PassContext(), a, pipeline_plan(a, [(0, 1), (2,)], 4),
                                 DeviceMap.for_topology(cpu_topology(3, 1)))
    assert unordered.builder.ordered_transfers == 0
    assert not any(n.name.startswith("tag/order/") for n in unordered.graph_def.node)
    if name == "transformer":
        monkeypatch.setattr(transfers, "ORDERED_MIN_BYTES", 1 << 10)
        small = compile_strategy(PassContext(), a, pipeline_plan(a, [(0, 1), (2,)], 4, ordered_links=links),
                                 DeviceMap.for_topology(cpu_topology(3, 1)))
        sent = {n.input[0].split(":")[0] for n in small.graph_def.node if n.name.startswith("tag/order/send/")}
        assert 0 < small.builder.ordered_transfers < compiled.builder.ordered_transfers
        assert not any("target_ids" in s for s in sent) and any("target_ids" in s for s in
                                                                 {n.input[0] for n in nodes.values()
                                                                  if n.name.startswith("tag/order/send/")})


def test_the_pipeline_search_orders_the_slow_links_only():
    """`ordered_links`: machine pairs slower than ORDERED_BELOW, both directions; a plan keeps them
    through its JSON."""
    from tag_tf.search.stages import ordered_links
    from tag_tf.topology.load import load_topology

    topo = load_topology({"name": "l", "machines": [{"name": n, "gpus": "1x cpu", **({"nic": "50Mbps"} if n == "far" else {})}
                                                     for n in ("a", "b", "far")],
                          "inter": {"switch": "1Gbps"}})
    assert ordered_links(topo) == ((0, 2), (1, 2), (2, 0), (2, 1))
    _, a = analysis_of("mlp")
    plan = pipeline_plan(a, [(0,), (1,)], 4, ordered_links=ordered_links(topo))
    assert Strategy.from_dict(json.loads(plan.to_json())) == plan
    with pytest.raises(StrategyError, match="ordered_links"):
        Strategy.from_dict({**plan.to_dict(), "ordered_links": [[0, "far"]]})
