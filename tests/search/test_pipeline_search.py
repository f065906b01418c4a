"""The search's pipelining phase (search/stages.py): where gradients are expensive to synchronise
and activations cheap to pass on, stages with micro-batches beat both one device and data
parallelism, and the search finds them; where they do not pay, it keeps what it had."""
from __future__ import annotations

import math

from conftest import analysis_of, flat_costs

from tag_tf.deadline import Deadline
from tag_tf.search.baselines import device_capacities
from tag_tf.search.mcts import MctsOptions, mcts_search
from tag_tf.search.moves import Evaluator
from tag_tf.search.registry import baseline
from tag_tf.search.stages import pipeline_plan, pipeline_search, planned_op_weights, stage_blocks, stage_capacities
from tag_tf.sim.prepare import device_types
from tag_tf.sim.simulator import Simulator
from tag_tf.strategy import Option, Strategy
from tag_tf.topology.load import load_topology


def slow_link_sim(switch="1Gbps", machines=4):
    """Six 2048-wide dense layers (100 MB of gradients, 8 KB of activations per sample) on four
    one-GPU machines, every op 2 ms per sample."""
    _, a = analysis_of("mlp", hidden=(2048,) * 6)
    topo = load_topology({"name": "slow", "machines": [{"name": f"m{i}", "gpus": "V100-32GB"} for i in range(machines)],
                          "inter": {"switch": switch}})
    return a, topo, Simulator(a, topo, costs=flat_costs(a, device_types(topo), per_sample=2e-3))


def test_stage_blocks_cut_machines_by_capacity():
    topo = load_topology("testbed")
    blocks = stage_blocks(topo, device_capacities(topo))
    assert blocks and all(2 <= len(b) <= 8 for b in blocks)
    for b in blocks:         # every device once, whole machines together
        assert sorted(d for s in b for d in s) == list(range(topo.num_devices))
        machines = [{topo.devices[d].machine for d in s} for s in b]
        assert all(not (x & y) for i, x in enumerate(machines) for y in machines[i + 1:])


def test_stages_take_work_by_the_speeds_the_simulator_costs_them_at():
    """The shipped testbed fit runs a P100 at a tenth of a V100 where the datasheets say 0.6: stages cut
    by the datasheets gave the P100 machine work it takes far longer over (bert-large's 7-stage
    pipeline simulated at 959 ms, cut by the simulator's own speeds 492 ms)."""
    _, a = analysis_of("transformer")
    topo = load_topology("testbed")
    sim = Simulator(a, topo)
    caps, sheet = stage_capacities(sim, topo), device_capacities(topo)
    assert caps == list(sim.device_rates())
    assert caps[12] / caps[0] < 0.5 * sheet[12] / sheet[0]
    weights = planned_op_weights(sim, int(sim.device_type_index[4]))
    assert weights.sum() > 0 and weights.tolist() == planned_op_weights(sim, "GTX1080Ti").tolist()
    blocks = [(4, 5), (12, 13)]                 # a GTX1080Ti machine, then a P100 machine

    def simulated(c):
        plan = pipeline_plan(a, blocks, 1, fractions=[sum(c[d] for d in b) for b in blocks], shares=c, weights=weights)
        return sim.simulate(plan).iteration_time_s

    assert simulated(caps) < 0.85 * simulated(sheet)


def test_pipelining_beats_one_device_and_data_parallelism_behind_a_slow_link():
    a, topo, sim = slow_link_sim()
    cost = Evaluator(sim)
    one = Strategy.uniform(sim.num_groups, (0,), Option.ALLREDUCE)
    t_one, t_dp = cost(one), cost(baseline("horovod", sim.num_groups, topo))
    plan, t = pipeline_search(cost, a, topo, one, t_one, Deadline.after(60))
    assert plan.microbatches > 1 and len({d for g in plan.groups for d in g.devices}) >= 2
    assert t < 0.5 * t_one and t < 0.95 * t_dp, (t, t_one, t_dp)


def test_mcts_keeps_a_pipeline_only_where_it_wins():
    a, topo, sim = slow_link_sim()
    with_pipes = mcts_search(sim, topo, MctsOptions(budget_s=4, seed=0))
    without = mcts_search(sim, topo, MctsOptions(budget_s=4, seed=0, pipeline=False))
    assert with_pipes.strategy.microbatches > 1 and without.strategy.microbatches == 1
    assert with_pipes.iteration_time_s < 0.95 * without.iteration_time_s
    # A fast network: data parallelism wins and no pipeline is kept.
    a, topo, sim = slow_link_sim(switch="10Gbps")
    fast = mcts_search(sim, topo, MctsOptions(budget_s=4, seed=0))
    assert math.isfinite(fast.iteration_time_s) and fast.strategy.microbatches == 1


def _forward_ops(a):
    from tag_tf.search import stages

    index, preds, _ = stages._planned_edges(a)
    forward = stages._forward_pass(a, index, preds)
    computing = [i for i in range(len(index)) if forward[i] and any(forward[p] for p in preds[i])]
    return forward, computing, preds


def test_stage_cuts_move_to_where_few_activation_bytes_cross():
    """A cut at exactly a stage's share of the work can land inside a feed-forward block or an
    attention (several wide tensors cross); each cut moves, within its window, to where the fewest
    bytes cross. bert-small's even two-stage cut (the test graph, at its planning batch): 24.8 KB
    crossed before, 8.4 KB now."""
    import numpy as np

    from tag_tf.search import stages

    for name in ("bert-small", "transformer"):
        _, a = analysis_of(name)
        forward, computing, _ = _forward_ops(a)
        crossing = stages._crossing_bytes(a, computing, forward)
        w = np.maximum(np.asarray(a.weights, dtype=float)[computing], 1e-12)
        fewer = 0
        for fractions in ([1, 1], [1, 1, 1], [3, 1]):
            plain, moved = stages._cuts(w, fractions), stages._cuts(w, fractions, crossing)
            assert moved[0] == 0 and moved[-1] == len(w) and moved == sorted(set(moved))
            for before, after in zip(plain[1:-1], moved[1:-1], strict=True):
                assert crossing[after] <= crossing[before], (name, fractions)
                fewer += crossing[after] < crossing[before]
            # op_stages uses the moved cuts: the forward ops before the first cut are stage 0
            stage = stages.op_stages(a, fractions)
            assert all(stage[i] == 0 for i in computing[:moved[1]]), (name, fractions)
        assert fewer >= 2, name
    _, a = analysis_of("bert-small")
    forward, computing, _ = _forward_ops(a)
    crossing = stages._crossing_bytes(a, computing, forward)
    w = np.maximum(np.asarray(a.weights, dtype=float)[computing], 1e-12)
    assert crossing[stages._cuts(w, [1, 1], crossing)[1]] * 2 < crossing[stages._cuts(w, [1, 1])[1]]


def test_a_sum_of_gradients_goes_with_its_largest_input():
    """Backward ops reading no forward value take the stage of their largest input: a sum of a
    layer's gradients stays with them, not with a small shape computed in an earlier stage (which
    sent a layer norm's backward pass back and forth between two machines)."""
    from tag_tf.search import stages

    checked = 0
    for name in ("bert-small", "transformer"):
        _, a = analysis_of(name)
        forward, _, preds = _forward_ops(a)
        sizes = stages._edge_bytes(a)
        for fractions in ([1, 1], [1, 1, 1]):
            stage = stages.op_stages(a, fractions)
            for i, ops in enumerate(preds):
                if forward[i] or any(forward[p] for p in ops) or len({int(stage[p]) for p in ops}) < 2:
                    continue
                largest = max(sizes.get((p, i), 0) for p in ops)
                assert stage[i] in {stage[p] for p in ops if sizes.get((p, i), 0) == largest}, a.planning.ops[i]
                checked += 1
    assert checked > 0


def test_a_stage_cut_moves_by_at_most_a_third_of_its_smaller_stage():
    """A small stage beside a large one keeps most of its share: the fewest bytes cross just
    after the first op, but the cut of a stage of a twentieth of the work (100 equal ops: 5 ops)
    moves from op 5 by at most a third of them, not to op 1 (CUT_WINDOW_MIN alone: 5 ops of all)."""
    import numpy as np

    from tag_tf.search import stages

    w = np.ones(100)
    crossing = np.full(101, 1000.0)
    crossing[1] = 1.0
    assert stages._cuts(w, [1, 19]) == [0, 5, 100]
    cut = stages._cuts(w, [1, 19], crossing)[1]
    assert 4 <= cut <= 5
    crossing[4] = 1.0                                   # within a third of the small stage: taken
    assert stages._cuts(w, [1, 19], crossing)[1] == 4
    crossing = np.full(101, 1000.0)
    crossing[45] = 1.0                                  # even stages: the window is the larger share's quarter
    assert stages._cuts(w, [1, 1], crossing)[1] == 45
