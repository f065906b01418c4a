"""Sufficient factor broadcasting (paper: "Sufficient Factor Broadcasting"): which gradients of a
replicated plan to rebuild on every device from their factors instead of synchronising them.

A gradient g of a group replicated on D devices is normally a partial sum per replica, summed by an
AllReduce or on a parameter server. It can instead be computed whole on every device: the ops that
produce it run duplicated (the whole batch each) and their inputs from the replicated part -- the
sufficient factors, e.g. a dense layer's activations x and errors dy for dW = x^T dy -- are gathered
to every device. Whether that pays depends on sizes (factors grow with the batch, the gradient does
not), D, the links and the extra compute; which ops to duplicate is a cut. Per gradient we solve
the paper's MILP over its candidate subgraph V with SCIP:

    min  sum_i a_i X_i  +  sum_t b_t C_t  -  a_g S
    s.t. a_k <= sum_{i in V consuming k} a_i     (k in V, k != g: only what feeds the gradient)
         b_t >= a_i - a_p(t)                      (tensor t of producer p consumed by duplicated i)
         a, b binary

X_i: extra compute of running op i on the whole batch rather than its shard (the slowest device
of the group); C_t: gathering tensor t to every device (a split value: each device receives the
other shards; a value every replica already holds: free; a partial sum is cut only when a
gradient is synchronised in pieces -- see `tensor_cost` and `split_problems`); S: the
synchronisation of g the duplication removes (ring AllReduce, or the partial sums sent to a PS).
Times come from the simulator's own (calibrated) op costs and links. The paper counts D(D-1)
transfers per factor and (D-1) T_i; we use the per-device receive volume and the measured per-
sample costs -- the same quantities, per device rather than summed.

V is the gradient's private backward cone: ancestors of g in the same replicated layout whose every
consumer is in V (an op whose value is also needed elsewhere stays replicated: duplicating it would
make its other consumers split a whole value again), never an input or an op beside a variable.

`apply_sfb` then checks the solver's cuts in the simulator, which also sees fusion buckets, link
contention and overlap the MILP cannot: cuts are kept only when the plan simulates faster, so
applying SFB never makes a plan slower in simulation.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np

from tag_tf.analysis.states import Kind
from tag_tf.deadline import Deadline
from tag_tf.errors import StrategyError
from tag_tf.sim.prepare import STATE_CODE
from tag_tf.strategy import GroupPlan, Option, SfbCut, Strategy, split_counts

if TYPE_CHECKING:
    from tag_tf.analysis import Analysis
    from tag_tf.search.local_search import SearchResult
    from tag_tf.search.mcts import MctsResult
    from tag_tf.sim.simulator import SimReport, Simulator
    from tag_tf.topology.spec import Topology

    R = TypeVar("R", bound="MctsResult | SearchResult")    # a search result: given back as the same kind

FULL, SPLIT, PARTIAL = STATE_CODE[Kind.FULL], STATE_CODE[Kind.SPLIT], STATE_CODE[Kind.PARTIAL]
MAX_CONE = 200            # candidate ops per gradient (the cone is cut off beyond, nearest first)


@dataclasses.dataclass(frozen=True)
class SfbProblem:
    """One gradient of a replicated group and the ops that could be duplicated to rebuild it."""
    gradient: str                  # tensor name
    producer: int                  # planned op index of g
    cone: tuple[int, ...]          # candidate planned ops (g first)
    group: int
    devices: tuple[int, ...]
    option: Option
    nbytes: int                    # the gradient's size


@dataclasses.dataclass(frozen=True)
class SfbSolution:
    problem: SfbProblem
    ops: tuple[int, ...]           # planned ops to duplicate (empty: keep the synchronisation)
    objective_s: float             # MILP objective (negative: a predicted saving)
    solve_s: float                 # wall time of building and solving the MILP
    status: str                    # SCIP's status ("optimal", "timelimit", ...)
    gathers: frozenset[int] = frozenset()   # tensor ids the cut gathers to every device
    allreduced: tuple[int, ...] = ()        # tensor ids of partial sums the cut all-reduces on their own


@dataclasses.dataclass(frozen=True)
class SfbOutcome:
    """`apply_sfb`'s answer: the plan with the cuts that simulate faster, and how it got there."""
    strategy: Strategy
    before_s: float                # simulated iteration time without SFB
    after_s: float                 # with the kept cuts (== before_s when none is kept)
    solutions: tuple[SfbSolution, ...]
    proposed: int                  # cuts with a predicted saving, and gradients simulated in pieces
    kept: int
    simulations: int
    solve_s: float                 # all MILPs
    total_s: float                 # MILPs + simulations
    pieces_tried: int = 0          # gradients simulated synchronised in pieces (`split_problems`)

    def to_dict(self) -> dict[str, Any]:
        times = [s.solve_s for s in self.solutions]
        finite = lambda t: t if math.isfinite(t) else None  # noqa: E731 (None: out of memory)
        return {"before_s": finite(self.before_s), "after_s": finite(self.after_s),
                "saving_s": finite(self.before_s - self.after_s) if math.isfinite(self.after_s) else None,
                "gradients": len(self.solutions),
                "proposed": self.proposed, "kept": self.kept, "simulations": self.simulations,
                "solver": "SCIP", "solve_s": round(self.solve_s, 4), "total_s": round(self.total_s, 4),
                "solve_ms_per_gradient": {"mean": round(1e3 * float(np.mean(times)), 3) if times else 0.0,
                                          "max": round(1e3 * float(np.max(times)), 3) if times else 0.0},
                "in_pieces_tried": self.pieces_tried,
                "in_pieces": sum(bool(c.allreduced) for c in self.strategy.sfb),
                "cuts": [c.to_dict() for c in self.strategy.sfb]}


class SfbSolver:
    """The SFB MILPs of one simulator's graph, costs and cluster (any plan)."""

    def __init__(self, sim: Simulator, time_limit_s: float = 1.0, max_cone: int = MAX_CONE,
                 deadline: Deadline | None = None):
        self.time_limit_s = time_limit_s
        self.deadline = deadline or Deadline.never()      # after it no MILP starts
        self.max_cone = max_cone
        self.n = int(sim.num_ops)
        self.D = int(sim.num_devices)
        self.batch = int(sim.batch_size)
        self.names = sim.op_names
        self.source = sim.source_ops()
        self.group = np.asarray(sim.op_group)
        self.per_sample = sim.op_per_sample_s()
        self.dev_type = np.asarray(sim.device_type_index)
        self.bw, self.lat = sim.link_times()
        edges = sim.op_edges()
        src, dst = edges.src, edges.dst
        self.e_src, self.e_tensor = src, edges.tensor
        self.e_bytes = edges.nbytes
        self.e_state, self.e_need = edges.state, edges.need
        self.tensor_names = sim.tensor_names
        self.t_bytes = np.asarray(sim.tensor_bytes, dtype=np.int64)
        self.eligible = sim.duplicable_ops()      # planned ops that may run duplicated
        self.in_edges: list[list[int]] = [[] for _ in range(self.n)]
        self.out_edges: list[list[int]] = [[] for _ in range(self.n)]
        self.consumers: list[set[int]] = [set() for _ in range(self.n)]
        for e in range(len(src)):
            self.in_edges[int(dst[e])].append(e)
            self.out_edges[int(src[e])].append(e)
            self.consumers[int(src[e])].add(int(dst[e]))

    # -- the problems -----------------------------------------------------------------------
    def problems(self, strategy: Strategy) -> list[SfbProblem]:
        """One per op of a replicated group (AllReduce or PS) whose output is a partial sum that
        is synchronised (AllReduce, or summed on one device) because every consumer needs it whole:
        a weight gradient fed to its update, or to the AddN that adds weight decay first. Ops
        whose other outputs stay split (FusedBatchNormGrad: the input gradient) are left alone:
        duplicated, they would have to split a whole value again."""
        out: list[SfbProblem] = []
        for g in range(self.n):
            edges = self.out_edges[g]
            partial = [e for e in edges if self.e_state[e] == PARTIAL]
            if not partial or not self.eligible[g]:
                continue
            plan = strategy.groups[int(self.group[g])]
            if not self._replicated(plan) or any(self.e_need[e] != FULL for e in edges):
                continue
            tensors = dict.fromkeys(int(self.e_tensor[e]) for e in partial)
            nbytes = sum(int(self.t_bytes[t]) for t in tensors)
            out.append(SfbProblem(self.tensor_names[next(iter(tensors))], g, self._cone(g, strategy, plan),
                                  int(self.group[g]), plan.devices, plan.option, nbytes))
        return out

    @staticmethod
    def _replicated(plan: GroupPlan) -> bool:
        return len(plan.devices) > 1 and plan.option in (Option.ALLREDUCE, Option.PS)

    def _replicated_partial(self, e: int, strategy: Strategy) -> bool:
        """Edge e carries a per-replica partial sum of a replicated op (placement.layout's
        `_replicated_partial`, on the planned graph): synchronised wherever it is made whole."""
        producer = int(self.e_src[e])
        return (self.e_state[e] == PARTIAL and not self.source[producer]
                and self._replicated(strategy.groups[int(self.group[producer])]))

    def _same_layout(self, op: int, strategy: Strategy, plan: GroupPlan) -> bool:
        other = strategy.groups[int(self.group[op])]
        return other.devices == plan.devices and other.option is plan.option

    def _cone(self, g: int, strategy: Strategy, plan: GroupPlan) -> tuple[int, ...]:
        """g and its ancestors in the same layout, nearest first (at most max_cone), kept only while
        private to g. Any prefix of the result is a valid cut: each op's consumer comes before it."""
        order, seen, head = [g], {g}, 0
        while head < len(order) and len(order) < self.max_cone:
            op = order[head]
            head += 1
            for e in self.in_edges[op]:
                p = int(self.e_src[e])
                if p in seen or not self.eligible[p] or not self._same_layout(p, strategy, plan):
                    continue
                seen.add(p)
                order.append(p)
                if len(order) >= self.max_cone:
                    break
        cone = set(order)
        changed = True
        while changed:          # private: every consumer inside (g's consumers are its updates)
            changed = False
            for op in list(cone):
                if op != g and not self.consumers[op] <= cone:
                    cone.discard(op)
                    changed = True
        return tuple(op for op in order if op in cone)

    # -- costs (seconds) ----------------------------------------------------------------------
    def _counts(self, strategy: Strategy, devices: Sequence[int]) -> tuple[int, ...]:
        return split_counts(self.batch, strategy.share_weights(devices))

    def extra_compute(self, op: int, devices: Sequence[int], counts: Sequence[int]) -> float:
        return max(self.per_sample[self.dev_type[d], op] * (self.batch - c) for d, c in zip(devices, counts))

    def gather(self, nbytes: float, devices: Sequence[int], counts: Sequence[int]) -> float:
        """Every device receives the other replicas' shards of a split tensor (one after another)."""
        worst = 0.0
        for d in devices:
            t = sum(self.lat[k, d] + nbytes * c / self.batch / self.bw[k, d]
                    for k, c in zip(devices, counts) if k != d)
            worst = max(worst, t)
        return worst

    def all_reduce(self, nbytes: float, devices: Sequence[int], fused: bool) -> float:
        """Ring AllReduce: 2(D-1) steps of nbytes/D over the slowest link of the ring."""
        D = len(devices)
        devs = np.asarray(devices)
        sub_bw = self.bw[np.ix_(devs, devs)][~np.eye(D, dtype=bool)]
        sub_lat = self.lat[np.ix_(devs, devs)][~np.eye(D, dtype=bool)]
        latency = 0.0 if fused else 2 * (D - 1) * float(sub_lat.max())
        return 2 * (D - 1) * nbytes / D / float(sub_bw.min()) + latency

    def ps_sync(self, nbytes: float, devices: Sequence[int]) -> float:
        """Partial sums sent to the parameter server (mean over which replica hosts it)."""
        return float(np.mean([sum(self.lat[k, ps] + nbytes / self.bw[k, ps] for k in devices if k != ps)
                              for ps in devices]))

    def tensor_cost(self, e: int, strategy: Strategy, producer_in_layout: bool, devices: Sequence[int],
                    counts: Sequence[int], split: bool = False) -> float:
        """Making edge e's tensor whole on every device of the group (inf: not a cut we make).
        `split`: a partial sum of the group's own layout may be cut, all-reduced on its own."""
        nbytes = float(self.e_bytes[e])
        producer = int(self.e_src[e])
        if self._replicated_partial(e, strategy):
            # A partial sum would be synchronised where it is cut: the same traffic as the gradient,
            # but mid-way through the backward pass, which then waits for it (TF's gradient tuples
            # make the rest of the backward pass depend on every gradient of a layer). Only a
            # gradient synchronised in pieces (`split_problems`) cuts one, each summand apart.
            if split and producer_in_layout and strategy.groups[int(self.group[producer])].option is Option.ALLREDUCE:
                return self.all_reduce(nbytes, devices, bool(strategy.fusion_bytes))
            return math.inf
        state = int(self.e_state[e]) if producer_in_layout else SPLIT
        if state == SPLIT:
            return self.gather(nbytes, devices, counts)
        return 0.0          # FULL on every replica already, or LOCAL (recomputed, free)

    # -- the MILP -------------------------------------------------------------------------------
    def solve(self, problem: SfbProblem, strategy: Strategy,
              gathered: frozenset[tuple[int, tuple[int, ...]]] = frozenset(), split: bool = False) -> SfbSolution:
        """`gathered`: (tensor id, devices) pairs other cuts already gather to those devices (free
        here: the compiler gathers a tensor once per device, whoever consumes it). `split`: the
        producer is duplicated whatever it costs, each partial sum read all-reduced apart or rebuilt
        from its factors, as the MILP prices them (`split_problems`): a candidate for the simulator."""
        from pyscipopt import Model, quicksum

        start = time.perf_counter()
        devices = problem.devices
        counts = self._counts(strategy, devices)
        fused = bool(strategy.fusion_bytes)
        plan = strategy.groups[problem.group]
        cone = problem.cone
        inside = set(cone)
        model = Model(f"sfb:{problem.gradient}")
        model.hideOutput()
        model.setParam("limits/time", self._time_limit())
        # split: the producer is duplicated whatever it costs
        alpha = {i: model.addVar(f"a{i}", vtype="B", lb=float(split and i == problem.producer)) for i in cone}
        cut: dict[int, Any] = {}         # per tensor id entering a cone op
        cut_cost: dict[int, float] = {}
        objective = []
        for i in cone:
            objective.append(self.extra_compute(i, devices, counts) * alpha[i])
            for e in self.in_edges[i]:
                p, t = int(self.e_src[e]), int(self.e_tensor[e])
                if t not in cut:
                    in_layout = p in inside or self._same_layout(p, strategy, plan)
                    cost = self.tensor_cost(e, strategy, in_layout, devices, counts, split)
                    if (t, devices) in gathered and not math.isinf(cost):
                        cost = 0.0
                    cut[t] = model.addVar(f"b{t}", vtype="B", ub=0.0 if math.isinf(cost) else 1.0)
                    cut_cost[t] = 0.0 if math.isinf(cost) else cost
                    objective.append(cut_cost[t] * cut[t])
                if p in inside:
                    model.addCons(cut[t] >= alpha[i] - alpha[p])
                else:
                    model.addCons(cut[t] >= alpha[i])
        for k in cone[1:]:
            model.addCons(alpha[k] <= quicksum(alpha[i] for i in self.consumers[k] if i in inside))
        g = problem.producer
        saving = (self.all_reduce(problem.nbytes, devices, fused) if problem.option is Option.ALLREDUCE
                  else self.ps_sync(problem.nbytes, devices))
        objective.append(-saving * alpha[g])
        model.setObjective(quicksum(objective), "minimize")
        model.optimize()
        status = model.getStatus()
        chosen: tuple[int, ...] = ()
        value = 0.0
        if model.getNSols() > 0:
            sol = model.getBestSol()
            value = float(model.getSolObjVal(sol))
            if value < -1e-12 or split:
                chosen = tuple(i for i in cone if model.getSolVal(sol, alpha[i]) > 0.5)
        solution = SfbSolution(problem, chosen, value if chosen else 0.0, time.perf_counter() - start, status,
                               self._gathers(chosen), self._allreduced(chosen, strategy) if split else ())
        model.freeProb()
        return solution

    def split_problems(self, strategy: Strategy, solutions: Sequence[SfbSolution],
                       kept: Sequence[SfbCut] = ()) -> list[SfbProblem]:
        """The gradients no cut of `kept` rebuilds whose producer sums two or more partial sums of its own
        layout (a variable used twice: a tied embedding's lookup and output layer) in a group
        replicated with allreduce. Synchronised in pieces, the summand the backward pass produces
        first (the output layer's dense gradient) is all-reduced while the rest of the backward pass
        runs, and a lookup's can be rebuilt from its rows; whether that pays (the summands together
        can cost more traffic than their sum) is the simulator's to say (`apply_sfb`)."""
        out = []
        rebuilt = {c.gradient for c in kept}
        for s in solutions:
            p = s.problem
            if p.gradient in rebuilt or p.option is not Option.ALLREDUCE:
                continue
            plan = strategy.groups[p.group]
            partial = {int(self.e_tensor[e]) for e in self.in_edges[p.producer]
                       if self._replicated_partial(e, strategy) and self._same_layout(int(self.e_src[e]), strategy, plan)}
            if len(partial) >= 2:
                out.append(p)
        return out

    def _allreduced(self, chosen: Sequence[int], strategy: Strategy) -> tuple[int, ...]:
        """Partial sums of replicated ops a cut reads from ops it does not duplicate (each all-reduced
        on its own: `tensor_cost` prices no other partial sum); placement.layout checks the same."""
        dup = set(chosen)
        return tuple(dict.fromkeys(int(self.e_tensor[e]) for i in chosen for e in self.in_edges[i]
                                   if int(self.e_src[e]) not in dup and self._replicated_partial(e, strategy)))

    def _gathers(self, chosen: Sequence[int]) -> frozenset[int]:
        """Tensors a cut makes whole on every device: inputs of duplicated ops from ops that are not."""
        dup = set(chosen)
        return frozenset(int(self.e_tensor[e]) for i in chosen for e in self.in_edges[i]
                         if int(self.e_src[e]) not in dup)

    def solve_all(self, strategy: Strategy, rounds: int = 3) -> list[SfbSolution]:
        """Every gradient's MILP; then, while that changes anything, again for the gradients left
        synchronised, with the factors the chosen cuts already gather counted as free (a dense
        layer's bias gradient is cheap to rebuild once its weight gradient gathers the errors)."""
        problems = self.problems(strategy)
        solutions = []
        for p in problems:
            if self.out_of_time():       # the gradients left stay synchronised
                break
            solutions.append(self.solve(p, strategy))
        for _ in range(rounds - 1):
            gathered = frozenset((t, s.problem.devices) for s in solutions if s.ops for t in s.gathers)
            changed = False
            for k, s in enumerate(solutions):
                if s.ops or self.out_of_time():
                    continue
                again = self.solve(s.problem, strategy, gathered)
                again = dataclasses.replace(again, solve_s=again.solve_s + s.solve_s)
                solutions[k] = again
                changed |= bool(again.ops)
            if not changed:
                break
        return solutions

    def out_of_time(self) -> bool:
        return self.deadline.expired()

    def _time_limit(self) -> float:
        """One MILP's time limit: its own, or what is left before the deadline if less."""
        return max(0.01, min(self.time_limit_s, self.deadline.left()))

    def cut_of(self, solution: SfbSolution) -> SfbCut:
        return SfbCut(solution.problem.gradient, tuple(self.names[i] for i in solution.ops),
                      round(-solution.objective_s, 9), tuple(self.tensor_names[t] for t in solution.allreduced))


def apply_sfb(sim: Simulator, strategy: Strategy, *, time_limit_s: float = 1.0, max_simulations: int = 64,
              deadline: Deadline | None = None, seed: Sequence[SfbCut] = (), pieces: bool = True) -> SfbOutcome:
    """`strategy` with the SFB cuts that make it simulate faster. Cuts it already carries are
    solved afresh; when nothing beats the plan as given, it comes back unchanged. `deadline`
    bounds the solving and the trials: past it, what was found stands. `seed`: cuts solved on
    another plan (the search judged plans with them, moves.Evaluator.with_sfb), tried as well for
    gradients the solver proposed nothing for, where the plan replicates their ops. `pieces`:
    gradients summed from several partial sums are also tried synchronised in pieces (`split_problems`)."""
    start = time.perf_counter()
    if strategy.microbatches > 1:            # SFB is not micro-batched (Strategy.validate): as given
        t = _seconds(sim.simulate(strategy))
        return SfbOutcome(strategy, t, t, (), 0, 0, 1, 0.0, time.perf_counter() - start)
    base = strategy.with_sfb_cuts(())
    sim = sim.for_strategy(base)
    solver = SfbSolver(sim, time_limit_s, deadline=deadline)
    solutions = tuple(solver.solve_all(base))
    solve_s = sum(s.solve_s for s in solutions)
    proposed = sorted((s for s in solutions if s.ops), key=lambda s: s.objective_s)
    cuts = [solver.cut_of(s) for s in proposed]
    if seed:
        from tag_tf.search.moves import cut_applies, cut_groups, replicated_groups

        group_of, replicated = sim.analysis.grouping.group_of, replicated_groups(base)
        solved = {c.gradient for c in cuts}
        cuts += [c for c in seed if c.gradient not in solved and (groups := cut_groups(c, group_of)) is not None
                 and cut_applies(base, replicated, c, groups)]

    def seconds(plan: Strategy) -> float:
        try:
            return _seconds(sim.simulate(plan))
        except StrategyError:        # a seed cut this plan's layouts refuse (validated_duplicates)
            return math.inf
    before = seconds(strategy)
    sims = 1
    best, kept = (before, list(strategy.sfb)) if not strategy.sfb else (seconds(base), [])
    sims += bool(strategy.sfb)
    if cuts:
        everything = seconds(base.with_sfb_cuts(cuts))
        sims += 1
        if everything < best:
            best, kept = everything, cuts
        else:                        # one by one, largest predicted saving first, kept when faster
            for cut in cuts:
                if sims >= max_simulations or solver.out_of_time():
                    break
                trial = seconds(base.with_sfb_cuts([*kept, cut]))
                sims += 1
                if trial < best:
                    best, kept = trial, [*kept, cut]
    tried = 0
    if pieces:
        best, kept, sims, split_s, tried = _try_in_pieces(solver, base, solutions, best, kept, seconds, sims,
                                                          max_simulations)
        solve_s += split_s
    result = base.with_sfb_cuts(kept)
    if not best < before:           # nothing beats the plan as given
        result, best = strategy, before
    return SfbOutcome(result, before, best, solutions, len(cuts) + tried, len(result.sfb), sims, solve_s,
                      time.perf_counter() - start, tried)


def _try_in_pieces(solver: SfbSolver, base: Strategy, solutions: Sequence[SfbSolution], best: float,
                   kept: list[SfbCut], seconds: Callable[[Strategy], float], sims: int,
                   max_simulations: int) -> tuple[float, list[SfbCut], int, float, int]:
    """Gradients summed from several partial sums (`split_problems`), each tried synchronised in
    pieces on top of the cuts kept so far, kept where the plan simulates faster. Returns the best
    time, the cuts, the simulations run, the solving time and how many were simulated."""
    solve_s, tried = 0.0, 0
    for problem in solver.split_problems(base, solutions, kept):
        if sims >= max_simulations or solver.out_of_time():
            break
        split = solver.solve(problem, base, split=True)
        solve_s += split.solve_s
        if not split.ops:
            continue
        # The MILP cannot see the overlap these cuts are for (its price is never a saving): the
        # cut's saving is the simulator's.
        cut = solver.cut_of(split)
        trial = seconds(base.with_sfb_cuts([*kept, cut]))
        sims, tried = sims + 1, tried + 1
        if trial < best:
            saving = round(best - trial, 9) if math.isfinite(best) else 0.0     # the plan as given ran out of memory
            best, kept = trial, [*kept, dataclasses.replace(cut, saving_s=saving)]
    return best, kept, sims, solve_s, tried


def _seconds(report: SimReport) -> float:
    """A simulated iteration time, inf when the plan runs out of memory."""
    return math.inf if report.oom else report.iteration_time_s


def duplicated_op_types(analysis: Analysis, strategy: Strategy) -> dict[str, int]:
    """How many ops of each type the plan's SFB cuts duplicate (members of planned ops included)."""
    members = analysis.planning.members()
    counts: dict[str, int] = {}
    for op in strategy.duplicated_ops:
        for m in members.get(op, [op]):
            t = analysis.graph.op(m).type
            if t in ("Const", "Identity", "NoOp"):
                continue
            counts[t] = counts.get(t, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def best_with_sfb(sim: Simulator, topology: Topology, result: R, *, time_limit_s: float = 1.0,
                  deadline: Deadline | None = None, seed: Sequence[SfbCut] = ()) -> tuple[R, SfbOutcome]:
    """A search result (MCTS or local) with SFB applied to its plan, and each fixed baseline with
    SFB among its baselines ("dp+sfb", ...). The search did not know SFB: where a baseline with
    SFB simulates faster than the plan with SFB (typically DP whose large gradients SFB rebuilds
    from small factors, where the search had avoided replicating them), that is the plan, and an
    MCTS result says it fell back. The outcome returned is the winner's, with `simulations` and
    `total_s` counting every run made here."""
    from tag_tf.search.registry import baseline, fixed_baselines

    outcome = apply_sfb(sim, result.strategy, time_limit_s=time_limit_s, deadline=deadline, seed=seed)
    baselines = dict(result.baselines)
    best, best_name = outcome, None
    simulations, seconds = outcome.simulations, outcome.total_s
    for name in fixed_baselines():
        if not np.isfinite(result.baselines.get(name, np.inf)):
            baselines[name + "+sfb"] = np.inf
            continue
        if deadline is not None and deadline.expired():
            break                    # out of budget: the baselines left keep no "+sfb" entry
        other = apply_sfb(sim, baseline(name, sim.num_groups, topology), time_limit_s=time_limit_s,
                          deadline=deadline)
        simulations, seconds = simulations + other.simulations, seconds + other.total_s
        baselines[name + "+sfb"] = other.after_s
        if other.after_s < best.after_s:
            best, best_name = other, name + "+sfb"
    changes: dict[str, Any] = {}
    strategy = best.strategy
    if best_name is not None:
        strategy = dataclasses.replace(strategy, name=best_name, graph=result.strategy.graph,
                                       topology=result.strategy.topology)
        if hasattr(result, "fell_back"):
            changes["fell_back"] = True
    best = dataclasses.replace(best, simulations=simulations, total_s=seconds)
    return dataclasses.replace(result, strategy=strategy, iteration_time_s=best.after_s, baselines=baselines,
                               **changes), best
