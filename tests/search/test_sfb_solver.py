"""The SFB solver: SCIP's cuts are the MILP's optimum, follow the batch size the way the paper says,
and `apply_sfb` never makes a plan slower in simulation."""
from __future__ import annotations

import dataclasses
import itertools
import json

import numpy as np
import pytest
from conftest import analysis_of

from tag_tf.compiler import DeviceMap, compile_strategy
from tag_tf.context import PassContext
from tag_tf.search.baselines import random_strategy
from tag_tf.search.registry import baseline
from tag_tf.search.sfb import SfbSolver, apply_sfb, duplicated_op_types
from tag_tf.sim.simulator import Simulator
from tag_tf.strategy import Option, Strategy
from tag_tf.topology.load import load_topology

TWO_MACHINES = {"name": "2x1", "machines": [{"name": "a", "gpus": "1x V100-32GB"},
                                             {"name": "b", "gpus": "1x V100-32GB"}], "inter": {"switch": "10Gbps"}}


def brute_force(S: SfbSolver, problem, strategy: Strategy, gathered=frozenset()) -> float:
    """The MILP's optimum by enumerating every feasible duplication set of a small cone."""
    cone = problem.cone
    counts = S._counts(strategy, problem.devices)
    plan = strategy.groups[problem.group]
    fused = bool(strategy.fusion_bytes)
    saving = (S.all_reduce(problem.nbytes, problem.devices, fused) if problem.option is Option.ALLREDUCE
              else S.ps_sync(problem.nbytes, problem.devices))
    best = 0.0
    for bits in itertools.product((0, 1), repeat=len(cone)):
        dup = {op for op, b in zip(cone, bits) if b}
        if any(k in dup and not (S.consumers[k] & dup) for k in cone[1:]):
            continue                                  # feeds no duplicated op: not part of the cut
        value = sum(S.extra_compute(i, problem.devices, counts) for i in dup)
        paid = set()
        for i in dup:
            for e in S.in_edges[i]:
                p, t = int(S.e_src[e]), int(S.e_tensor[e])
                if p in dup or t in paid:
                    continue
                paid.add(t)
                cost = S.tensor_cost(e, strategy, p in set(cone) or S._same_layout(p, strategy, plan),
                                     problem.devices, counts)
                value += 0.0 if (t, problem.devices) in gathered and np.isfinite(cost) else cost
        if cone[0] in dup:
            value -= saving
        best = min(best, value)
    return best


@pytest.mark.parametrize("name", ["mlp", "transformer"])
def test_scip_finds_the_milp_optimum(name):
    _, a = analysis_of(name, batch_size=4)
    sim = Simulator(a, load_topology(TWO_MACHINES))
    for strategy in (baseline("dp", sim.num_groups, sim.topology),
                     Strategy.uniform(sim.num_groups, (0, 1), Option.PS, fusion_bytes=2**20)):
        S = SfbSolver(sim)
        problems = [p for p in S.problems(strategy) if len(p.cone) <= 10]
        assert len(problems) >= 6
        solved = [S.solve(p, strategy) for p in problems]
        for p, solution in zip(problems, solved):
            assert solution.status == "optimal"
            assert solution.objective_s == pytest.approx(brute_force(S, p, strategy), abs=1e-9), p.gradient
            assert not solution.ops or p.producer in solution.ops
        # The second round: factors other cuts gather (to the same devices) are free. Priced here
        # as if every cone were duplicated whole, so many factors are.
        gathered = frozenset((t, p.devices) for p in S.problems(strategy) for t in S._gathers(p.cone))
        assert gathered, name
        for p in problems:
            again = S.solve(p, strategy, gathered)
            assert again.objective_s == pytest.approx(brute_force(S, p, strategy, gathered), abs=1e-9), p.gradient
            assert again.objective_s <= S.solve(p, strategy).objective_s + 1e-12


def test_sufficient_factors_win_at_small_batch_and_lose_at_large():
    """A 256x256 dense layer over 10 Gbps: at batch 4 its factors (4x256 each) are far smaller than
    its gradient (256x256), at batch 512 far larger: the paper's "SFB is not always beneficial"."""
    chosen = {}
    for batch in (4, 512):
        _, a = analysis_of("mlp", batch_size=batch, hidden=(256, 256), input_size=256)
        sim = Simulator(a, load_topology(TWO_MACHINES))
        dp = baseline("dp", sim.num_groups, sim.topology)
        S = SfbSolver(sim)
        by_grad = {s.problem.gradient: s for s in S.solve_all(dp)}
        grad = next(g for g in by_grad if "dense_1/MatMul_grad" in g)
        chosen[batch] = by_grad[grad]
    small, large = chosen[4], chosen[512]
    assert small.ops and not large.ops
    p = small.problem
    assert p.nbytes == 256 * 256 * 4
    # Predicted saving at batch 4: the ring all-reduce of 256 KB minus gathering two 2 KB halves
    # (x and dy of the other replica) and a little compute.
    bw = 10e9 / 8
    assert -small.objective_s == pytest.approx(2 * 1 * p.nbytes / 2 / bw, rel=0.05)


def test_apply_sfb_never_slows_a_plan_down():
    for name in ("mlp", "transformer", "cnn"):
        _, a = analysis_of(name, batch_size=4)
        sim = Simulator(a, load_topology(TWO_MACHINES))
        plans = [baseline(b, sim.num_groups, sim.topology) for b in ("dp", "horovod", "dp-p")]
        plans += [random_strategy(sim.num_groups, 2, np.random.default_rng(s)) for s in range(3)]
        kept = 0
        for plan in plans:
            out = apply_sfb(sim, plan)
            assert out.before_s == pytest.approx(sim.simulate(plan).iteration_time_s)
            assert out.after_s == pytest.approx(sim.simulate(out.strategy).iteration_time_s)
            assert out.after_s <= out.before_s
            if out.kept:
                kept += 1
                compile_strategy(PassContext(), a, out.strategy, DeviceMap.local_cpus(2), check=True)
                # A plan that already carries cuts: solved afresh, never returned slower than given.
                again = apply_sfb(sim, out.strategy)
                assert again.before_s == pytest.approx(out.after_s) and again.after_s <= again.before_s
                worse = plan.with_sfb_cuts(out.strategy.sfb[:1])
                assert apply_sfb(sim, worse).after_s <= sim.simulate(worse).iteration_time_s
            assert json.loads(json.dumps(out.to_dict()))["kept"] == out.kept
        if name != "cnn":
            assert kept >= 2, name
    _, a = analysis_of("transformer", batch_size=4)
    sim = Simulator(a, load_topology(TWO_MACHINES))
    out = apply_sfb(sim, baseline("dp", sim.num_groups, sim.topology))
    types = duplicated_op_types(a, out.strategy)
    assert types.get("MatMul", 0) >= 4 and out.after_s < 0.95 * out.before_s


def test_single_device_and_duplicate_plans_have_nothing_to_do():
    _, a = analysis_of("mlp")
    sim = Simulator(a, load_topology(TWO_MACHINES))
    for plan in (Strategy.uniform(sim.num_groups, (0,), Option.ALLREDUCE),
                 Strategy.uniform(sim.num_groups, (0, 1), Option.DUPLICATE),
                 Strategy.uniform(sim.num_groups, (0, 1), Option.MODEL_PARALLEL)):
        out = apply_sfb(sim, plan)
        assert out.solutions == () and out.strategy.sfb == () and out.after_s == out.before_s


def test_the_planning_budget_bounds_sfb_too():
    """A deadline already past: no MILP starts and the plan comes back as given; `planning.search`
    with no budget left returns the best baseline without SFB work (nothing "+sfb" evaluated)."""
    from tag_tf.deadline import Deadline
    from tag_tf.frontend.planning import search
    from tag_tf.search.mcts import MctsOptions

    _, a = analysis_of("mlp", batch_size=4, hidden=(256, 256), input_size=256)
    sim = Simulator(a, load_topology(TWO_MACHINES))
    dp = baseline("dp", sim.num_groups, sim.topology)
    assert apply_sfb(sim, dp).kept > 0                        # with time, SFB has cuts to keep here
    late = apply_sfb(sim, dp, deadline=Deadline.after(0.0))
    assert late.solutions == () and late.kept == 0 and late.strategy == dp
    found = search(sim, sim.topology, options=MctsOptions(budget_s=0.0), sfb=True)
    assert found.found and found.sfb is not None and found.sfb.solutions == ()
    assert not any(name.endswith("+sfb") for name in found.result.baselines)


def test_the_search_judges_plans_with_the_cuts_sfb_finds_on_data_parallelism():
    """SFB used to meet only the plan a search ended with; a plan that replicates a large dense
    gradient is slow without SFB, so the tree never reached the plans SFB makes fastest. Seeded
    with data parallelism's cuts, the evaluator judges a plan as the faster of itself and itself
    with the cuts whose ops it replicates (and nothing else: the baselines keep their own times)."""
    from tag_tf.search.moves import Evaluator

    _, a = analysis_of("mlp", batch_size=4, hidden=(256, 256), input_size=256)
    sim = Simulator(a, load_topology(TWO_MACHINES))
    dp = baseline("dp", sim.num_groups, sim.topology)
    seed = apply_sfb(sim, dp).strategy.sfb
    assert seed
    cost = Evaluator(sim).with_sfb(seed)
    with_cuts = sim.simulate(dp.with_sfb_cuts(seed)).iteration_time_s
    assert cost(dp) == pytest.approx(with_cuts) and with_cuts < sim.simulate(dp).iteration_time_s
    alone = Strategy.uniform(sim.num_groups, (0,), Option.ALLREDUCE)
    assert cost(alone) == pytest.approx(sim.simulate(alone).iteration_time_s)
    # the cut's group on one device: the cut does not apply, the plan is judged as it is
    cut_groups = {a.grouping.group_of[op] for c in seed for op in c.ops}
    groups = list(dp.groups)
    for g in cut_groups:
        groups[g] = alone.groups[g]
    partly = dataclasses.replace(dp, groups=tuple(groups))
    assert cost(partly) == pytest.approx(sim.simulate(partly).iteration_time_s)
    # apply_sfb seeded with them keeps them where its own solver proposes nothing
    assert apply_sfb(sim, dp, seed=seed).after_s <= with_cuts + 1e-12


def test_a_tied_embedding_gradient_is_tried_in_pieces_and_kept_where_it_simulates_faster():
    """bert's word embedding is read twice (the lookup, the tied output layer): its gradient sums two
    partial sums. The only such gradient is offered in pieces: the output layer's dense summand
    all-reduced as soon as it is computed, the lookup's rebuilt from its gathered rows (a 4,000-row
    table, 32 x 128 tokens a step), the sum taken on every device; on two machines over 10 Gbit/s
    horovod-p simulates faster with it, and the split cut is what apply_sfb keeps."""
    _, a = analysis_of("bert-small", batch_size=32, vocab_size=4000)
    sim = Simulator(a, load_topology(TWO_MACHINES))
    plan = baseline("horovod-p", sim.num_groups, sim.topology)
    solver = SfbSolver(sim)
    solutions = solver.solve_all(plan)
    pieces = solver.split_problems(plan, solutions)
    tied = next(o for o in a.graph if o.type == "ResourceApplyAdam" and "word_embeddings" in o.name).inputs[-1]
    assert [p.gradient for p in pieces] == [tied.name]
    split = solver.solve(pieces[0], plan, split=True)
    cut = solver.cut_of(split)
    addn = a.graph.op(tied.op)
    kinds = {a.graph.op(r.op).type: r.name for r in addn.inputs}
    assert cut.ops[0] == tied.op and a.planning.host[kinds["UnsortedSegmentSum"].split(":")[0]] in cut.ops
    assert cut.allreduced == (kinds["Identity"],)          # the output layer's MatMul gradient, via its tuple
    assert split.objective_s >= 0          # the MILP prices the pieces without their overlap: never a saving
    outcome = apply_sfb(sim, plan)
    kept = [c for c in outcome.strategy.sfb if c.allreduced]
    assert [(c.ops, c.allreduced) for c in kept] == [(cut.ops, cut.allreduced)]
    assert outcome.pieces_tried == 1 and outcome.to_dict()["in_pieces"] == 1
    assert outcome.after_s < outcome.before_s
    others = sim.simulate(outcome.strategy.with_sfb_cuts([c for c in outcome.strategy.sfb if not c.allreduced]))
    assert outcome.after_s < others.iteration_time_s
    assert kept[0].saving_s == pytest.approx(others.iteration_time_s - outcome.after_s, abs=1e-9)   # the simulator's
    # The search judges plans with the cut where the summands' producers share its allreduce layout.
    from tag_tf.search.moves import Evaluator

    judge = Evaluator(sim).with_sfb(outcome.strategy.sfb)
    assert judge(plan) == pytest.approx(outcome.after_s)
    ps = dataclasses.replace(plan, groups=tuple(dataclasses.replace(g, option=Option.PS) for g in plan.groups))
    assert judge._applicable(plan) == list(outcome.strategy.sfb)
    assert [c for c in judge._applicable(ps) if c.allreduced] == [] and np.isfinite(judge(ps))
    # This small model (batch 32, a 4,000-row table) on the 16-GPU testbed: the rows gathered to 16
    # devices cost more than the overlap gives: simulated, not kept.
    testbed = Simulator(a, load_topology("testbed"))
    plan = baseline("horovod-p", testbed.num_groups, testbed.topology)
    outcome = apply_sfb(testbed, plan)
    assert outcome.pieces_tried == 1 and not any(c.allreduced for c in outcome.strategy.sfb)
    assert apply_sfb(testbed, plan, pieces=False).simulations == outcome.simulations - 1
