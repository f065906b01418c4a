"""The strategy creator's Monte-Carlo tree search (the paper's "Monte-Carlo Tree Search").

A vertex is a prefix of decisions: groups are decided one at a time in descending compute order,
each taking one action (a set of devices x an option). Each iteration walks down by PUCT,

    a* = argmax_a  Q(a) + c * P(a) * sqrt(sum_b N(b)) / (1 + N(a))

expands one new vertex, and scores it by simulating a full plan in which every undecided group
takes the action of the most expensive group (the first decided), so a short prefix already says
what its choice costs. The reward is the speed-up over the best baseline (-1 when the plan runs out
of memory or cannot run). Vertices are kept in a transposition table keyed by their prefix, and
every simulated plan in a cache, so a plan is never simulated twice. P is the prior: the
heterogeneous GNN's (`tag_tf/search/gnn.py`, trained weights shipped in search/weights/), which
sees the partial plan with runtime feedback features refreshed from the simulation of the vertex's
leaf plan, mixed with the uniform prior (`prior_mix`) so that nothing it rules out is never tried;
or uniform (pure MCTS). The root's actions decide the fill of every leaf plan, so each is simulated
once, in the prior's order, before any is revisited (`sweep_root`): a good prior finds a plan that
beats DP in its first iterations, a poor one costs at most one sweep.

After the budget (or earlier, with `patience_s`, once the best plan has stopped improving), the
best plan simulated is polished by the local search's moves, group
refinement (search/refine.py: its dominant groups split again), fusion caps and batch shares
(search/shares.py), and the result is never slower than the best baseline: if it loses, that
baseline is returned and `SearchResult.fell_back` says so.
"""
from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from tag_tf.deadline import Deadline
from tag_tf.search.baselines import device_capacities
from tag_tf.search.moves import (
    Evaluator,
    _progress,
    candidate_device_sets,
    coupled_blocks,
    improve,
    tune_fusion,
)
from tag_tf.search.outcome import BaselineComparison
from tag_tf.search.priors import PRIORS, default_prior
from tag_tf.search.refine import refine
from tag_tf.search.registry import template_baseline
from tag_tf.search.shares import ShareSolver
from tag_tf.search.stages import pipeline_search
from tag_tf.search.starts import baselines_to_beat
from tag_tf.strategy import GroupPlan, Option, SfbCut, Strategy

if TYPE_CHECKING:
    from tag_tf.analysis import Analysis
    from tag_tf.sim.simulator import SimReport, Simulator
    from tag_tf.topology.spec import Topology

C_PUCT = 1.5
OOM_REWARD = -1.0
POLISH_SHARE = 0.25          # of the budget kept for the local polish
HETEROG_SHARE = 0.15         # of the budget for the HeteroG baseline's search ...
HETEROG_MAX_S = 4.0          # ... at most: the tree search, which must beat DP within seconds, waits for it
STALE_ITERATIONS = 2000      # iterations in a row that simulate nothing new end the search


@dataclasses.dataclass(frozen=True)
class MctsOptions:
    budget_s: float = 30.0
    iterations: int | None = None       # stop after this many iterations (None: budget only)
    seed: int = 0
    c_puct: float = C_PUCT
    polish: bool = True
    refine: bool = True                 # polish: split the best plan's dominant groups (search/refine.py)
    heterog: bool = True                # search HeteroG's space as a baseline too (GNN training skips it)
    progress: bool = False
    # End the tree search early once it has converged: the best plan has not improved for
    # max(patience_s, the time the tree took to find it). None: search for the whole budget.
    patience_s: float | None = None
    # The root's actions fix the fill of every leaf plan (whole-model plans): simulate each of them once,
    # in the prior's order, before any is revisited.
    sweep_root: bool = True
    # A learned prior is mixed with the uniform one at this share, so that an action it rules out is
    # still tried within a search (AlphaZero's root noise, deterministic and at every vertex).
    prior_mix: float = 0.5
    # Pipelining (search/stages.py): the pipeline baseline (stages over the machines, micro-batched) is
    # a baseline to beat, and the polish tries the best plan in micro-batches. False: neither.
    pipeline: bool = True


def candidate_actions(topology: Topology) -> list[GroupPlan]:
    """Device sets (all devices, the k fastest GPU types, each device group) x options; one device
    takes only AllReduce (options coincide there)."""
    actions = []
    for devices in candidate_device_sets(topology):
        if len(devices) == 1:
            actions.append(GroupPlan(devices, Option.ALLREDUCE))
            continue
        actions.extend(GroupPlan(devices, o) for o in (Option.ALLREDUCE, Option.PS, Option.DUPLICATE,
                                                         Option.MODEL_PARALLEL))
    fastest = int(np.argmax(device_capacities(topology)))
    single = GroupPlan((fastest,), Option.ALLREDUCE)
    if single not in actions:
        actions.append(single)
    return actions


def puct_scores(q: np.ndarray, n: np.ndarray, prior: np.ndarray, c: float) -> np.ndarray:
    """Q + c * P * sqrt(sum N) / (1 + N), per action (the paper's selection rule). With no visit
    yet, sqrt(sum N) is taken as 1 so the prior alone orders the first choice."""
    total = max(float(n.sum()), 1.0)
    return q + c * prior * math.sqrt(total) / (1.0 + n)


class _Vertex:
    __slots__ = ("prior", "n", "w")

    def __init__(self, prior: np.ndarray):
        self.prior = prior
        self.n = np.zeros(len(prior))
        self.w = np.zeros(len(prior))


@dataclasses.dataclass(frozen=True)
class MctsResult(BaselineComparison):
    strategy: Strategy
    iteration_time_s: float
    baselines: dict[str, float]
    simulations: int
    iterations: int
    seconds: float
    iterations_to_beat_dp: int | None       # first iteration whose simulated plan beat DP
    time_to_beat_dp_s: float | None
    fell_back: bool                          # the best baseline won: it is the result
    prior: str
    converged: bool = False                  # the tree search ended early: nothing new or better found


PriorFn = Callable[[tuple[int, ...], int, "SimReport | None"], np.ndarray]
MIN_RECORD_VISITS = 8        # a vertex's visit counts are a training target once it has this many


@dataclasses.dataclass(frozen=True)
class VisitRecord:
    """One well-visited vertex of a finished search: what the GNN is trained to predict there
    (search/gnn_training.py). `visits[a]` counts the iterations that took action a after `prefix`;
    the paper's target softmax(ln N) is visits / visits.sum()."""
    prefix: tuple[int, ...]
    group: int                    # the group decided next
    report: SimReport | None      # of the prefix's leaf plan (None at the root)
    visits: np.ndarray


def decision_order(analysis: Analysis) -> list[int]:
    """The order MCTS decides groups in: descending compute (the first decided fills the rest)."""
    return analysis.grouping.by_compute()




@dataclasses.dataclass
class _TreeOutcome:
    best_plan: Strategy
    best_time: float
    iterations: int = 0
    beat_dp_at: int | None = None         # first iteration whose simulated plan beat DP ...
    beat_dp_s: float | None = None        # ... and when, from the search's start
    converged: bool = False


class _Tree:
    """The search tree: vertices by prefix, the prior, and every plan simulated (by its groups)."""

    def __init__(self, cost: Evaluator, actions: list[GroupPlan], order: list[int], template: Strategy,
                 prior_fn: PriorFn | None, prior_mix: float, keep_reports: bool):
        self.cost, self.actions, self.order, self.template = cost, actions, order, template
        self.n_groups = len(order)
        self.prior_fn, self.prior_mix, self.keep_reports = prior_fn, prior_mix, keep_reports
        self.uniform = np.full(len(actions), 1.0 / len(actions))
        self.simulated: dict[tuple[GroupPlan, ...], float] = {}
        self.reports: dict[tuple[GroupPlan, ...], SimReport] = {}     # the prior's feedback features
        self.table: dict[tuple[int, ...], _Vertex] = {(): _Vertex(self.prior_of((), None))}

    def prior_of(self, prefix: tuple[int, ...], leaf: SimReport | None) -> np.ndarray:
        if self.prior_fn is None or len(prefix) >= self.n_groups:
            return self.uniform
        p = np.asarray(self.prior_fn(prefix, self.order[len(prefix)], leaf), dtype=np.float64)
        if p.shape != self.uniform.shape or not np.all(np.isfinite(p)) or np.any(p < 0) or p.sum() <= 0:
            raise ValueError(f"MCTS prior: expected {len(self.actions)} finite non-negative scores, got shape {p.shape}")
        return mix_prior(p, self.prior_mix)

    def plan_of(self, prefix: tuple[int, ...]) -> Strategy:
        """The leaf plan of `prefix`: its decisions, every undecided group taking the first's action."""
        groups = [self.actions[prefix[0]]] * self.n_groups
        for depth, a in enumerate(prefix):
            groups[self.order[depth]] = self.actions[a]
        return dataclasses.replace(self.template, groups=tuple(groups))

    def evaluate(self, prefix: tuple[int, ...]) -> tuple[float, Strategy, SimReport | None, bool]:
        """Simulated time, plan, the report of prefix's leaf plan (None when it does not run) and
        whether it was simulated now."""
        plan = self.plan_of(prefix)
        key = plan.groups
        new = key not in self.simulated
        if new:
            report = self.cost.report(plan)
            self.simulated[key] = math.inf if report is None or report.oom else report.iteration_time_s
            if self.keep_reports and report is not None:
                self.reports[key] = report
        return self.simulated[key], plan, self.reports.get(key), new

    def select(self, rng: np.random.Generator, options: MctsOptions) -> tuple[tuple[int, ...], list[tuple[_Vertex, int]]]:
        """Walk down by PUCT (the root's unvisited actions first, with `sweep_root`) to a new vertex
        or a full plan."""
        prefix: tuple[int, ...] = ()
        path: list[tuple[_Vertex, int]] = []
        while True:
            vertex = self.table[prefix]
            if not prefix and options.sweep_root and not vertex.n.all():
                scores = np.where(vertex.n == 0, vertex.prior, -np.inf)      # the root's sweep
            else:
                q = np.where(vertex.n > 0, vertex.w / np.maximum(vertex.n, 1), _first_play(vertex))
                scores = puct_scores(q, vertex.n, vertex.prior, options.c_puct)
            top = np.flatnonzero(scores >= scores.max() - 1e-12)
            a = int(top[rng.integers(len(top))]) if len(top) > 1 else int(top[0])
            path.append((vertex, a))
            prefix = prefix + (a,)
            if prefix not in self.table or len(prefix) == self.n_groups:
                return prefix, path

    def expand_and_back_up(self, prefix: tuple[int, ...], path: list[tuple[_Vertex, int]], report: SimReport | None,
                           reward: float) -> None:
        if prefix not in self.table:
            self.table[prefix] = _Vertex(self.prior_of(prefix, report))
        for vertex, a in path:
            vertex.n[a] += 1
            vertex.w[a] += reward

    def records(self) -> list[VisitRecord]:
        """A VisitRecord per vertex visited at least MIN_RECORD_VISITS times."""
        return [VisitRecord(prefix, self.order[len(prefix)],
                            self.reports.get(self.plan_of(prefix).groups) if prefix else None, vertex.n.copy())
                for prefix, vertex in self.table.items()
                if vertex.n.sum() >= MIN_RECORD_VISITS and len(prefix) < self.n_groups]


def _prior(prior: str | PriorFn | None, weights: str | None, sim: Simulator, topology: Topology,
           actions: list[GroupPlan], order: list[int], seed: int) -> tuple[str, PriorFn | None]:
    """The prior's name and function (None: uniform)."""
    if prior is None:
        prior = default_prior(d.type for d in topology.devices)
    name = prior if isinstance(prior, str) else getattr(prior, "name", "custom")
    if prior == "uniform":
        return name, None
    if prior == "gnn":
        from tag_tf.search.gnn import GnnPrior, GraphFeatures, default_network

        return name, GnnPrior(default_network(weights, seed), GraphFeatures(sim, topology, actions, order))
    if isinstance(prior, str):
        raise ValueError(f"unknown MCTS prior {prior!r} (expected one of {', '.join(PRIORS)})")
    return name, prior


def _grow(tree: _Tree, options: MctsOptions, until: Deadline, reference: float, dp_time: float,
          found: _TreeOutcome, start_time: float) -> None:
    """Iterate the tree search into `found` until `until`, `options.iterations`, convergence
    (`options.patience_s`) or STALE_ITERATIONS iterations in a row that simulate nothing new."""
    rng = np.random.default_rng(options.seed)
    bar = _progress(options.progress, options.iterations or 0, "MCTS")
    stale = 0
    tree_start = improved_at = time.perf_counter()
    try:
        while not until.expired() and (options.iterations is None or found.iterations < options.iterations):
            if options.patience_s is not None and found.iterations % 64 == 0:
                found.converged = time.perf_counter() - improved_at > max(options.patience_s, improved_at - tree_start)
                if found.converged:
                    return
            found.iterations += 1
            bar.update(1)
            prefix, path = tree.select(rng, options)
            t, plan, report, new = tree.evaluate(prefix)
            # Speed-up over the best baseline; when none runs, over the best plan found so far.
            scale = reference if np.isfinite(reference) else (found.best_time if np.isfinite(found.best_time) else t)
            reward = OOM_REWARD if not np.isfinite(t) else scale / t
            stale = 0 if new else stale + 1
            if stale > STALE_ITERATIONS:        # the tree keeps revisiting known plans: done early
                found.converged = True
                return
            tree.expand_and_back_up(prefix, path, report, reward)
            if t < found.best_time:
                found.best_plan, found.best_time = plan, t
                improved_at = time.perf_counter()
            if found.beat_dp_at is None and np.isfinite(dp_time) and t < dp_time:
                found.beat_dp_at, found.beat_dp_s = found.iterations, time.perf_counter() - start_time
    finally:
        bar.close()


def _polish(cost: Evaluator, tree: _Tree, topology: Topology, options: MctsOptions, plan: Strategy, seconds: float,
            deadline: Deadline) -> tuple[Strategy, float, int]:
    """The local search's moves on the best plan, group refinement, fusion caps, batch shares and
    (with pipelining) micro-batches, until `deadline`. Returns the plan, its time and refinement's
    simulations."""
    sim = cost.sim
    moves = [(g,) for g in tree.order] + coupled_blocks(sim.group_traffic())
    # With refinement, the moves get half of the polish; refinement (splitting dominant groups) the rest.
    plan, seconds, _ = improve(cost, plan, seconds, tree.actions, moves,
                               deadline.share(0.5) if options.refine else deadline, max_passes=1,
                               progress=options.progress, label="MCTS polish")
    runs = 0
    if options.refine:       # refinement gets 3/4 of what is left; fusion and shares the rest
        plan, seconds, runs = refine(sim, plan, seconds, tree.actions, deadline.share(0.75), progress=options.progress)
    plan, seconds = tune_fusion(cost, plan, seconds, deadline)
    plan, seconds = balance_shares(cost, plan, seconds, deadline, ShareSolver(sim.for_strategy(plan)))
    if options.pipeline:        # the plan found, in micro-batches
        micro, seconds = pipeline_search(cost, sim.analysis, topology, plan, seconds, deadline, stages=False)
        plan = micro or plan
    return plan, seconds, runs


def mcts_search(sim: Simulator, topology: Topology, options: MctsOptions = MctsOptions(), *,  # noqa: B008 (frozen: one shared default is safe)
                prior: str | PriorFn | None = None, weights: str | None = None,
                record: list[VisitRecord] | None = None, deadline: Deadline | None = None,
                sfb_cuts: Sequence[SfbCut] = ()) -> MctsResult:
    """Plan `sim`'s graph on `topology` by MCTS (see the module doc). `prior` is "gnn" (the
    heterogeneous GNN, mixed with the uniform prior at `options.prior_mix`), "uniform" (pure MCTS),
    None (priors.default_prior: pure MCTS unless DEFAULT_PRIOR says otherwise) or a
    callable `prior(prefix, group, leaf)` giving the probabilities of the actions for `group` after
    the decisions `prefix`; `leaf` is the SimReport of the vertex's leaf plan (runtime feedback),
    None at the root or when it did not run. `weights`: the GNN's weights file (default: the
    shipped weights, search/weights/gnn.pt). `record`: receives a VisitRecord per vertex
    visited at least MIN_RECORD_VISITS times (GNN training data). `deadline`: when the search
    ends (default: `options.budget_s` from now; the earlier of the two when both are given).
    `sfb_cuts`: every plan past the baselines is judged with those of them it replicates as well
    (moves.Evaluator.with_sfb); the baselines are judged as they run."""
    start_time = time.perf_counter()
    deadline = (deadline or Deadline.never()).within(options.budget_s)
    budget = max(0.0, deadline.left())
    cost = Evaluator(sim)
    if sim.num_groups == 0:
        raise ValueError("MCTS: the graph has no op groups to place")
    starts = baselines_to_beat(cost, topology, deadline, heterog_share=HETEROG_SHARE, heterog_max_s=HETEROG_MAX_S,
                               heterog=options.heterog, pipeline=options.pipeline, singles=sim.client is not None)
    best_name = starts.best()
    reference = starts.times[best_name]
    if sfb_cuts:
        cost.with_sfb(sfb_cuts)
    actions = candidate_actions(topology)
    order = decision_order(sim.analysis)
    # Fused buckets; batch shares from the simulator's own (calibrated) device speeds.
    rates = np.asarray(sim.device_rates(), dtype=np.float64)
    shares = tuple(float(x) for x in rates / rates.sum()) if rates.sum() > 0 and np.all(rates > 0) else None
    template = dataclasses.replace(starts.plans[template_baseline()], name="mcts", shares=shares)
    prior_name, prior_fn = _prior(prior, weights, sim, topology, actions, order, options.seed)
    tree = _Tree(cost, actions, order, template, prior_fn, options.prior_mix,
                 keep_reports=prior_fn is not None or record is not None)
    found = _TreeOutcome(starts.plans[best_name], reference)
    if sfb_cuts:            # a baseline SFB makes faster is where the tree (and the polish) start from
        for plan in starts.plans.values():
            if (t := cost(plan)) < found.best_time:
                found.best_plan, found.best_time = plan, t
    tree_until = Deadline(start_time + budget * (1 - POLISH_SHARE if options.polish else 1.0))   # <= deadline
    _grow(tree, options, tree_until, reference, starts.times["dp"], found, start_time)
    if record is not None:
        record.extend(tree.records())
    best_plan, best_time, refine_runs = found.best_plan, found.best_time, 0
    if found.converged and options.patience_s is not None:     # the polish keeps its share of the budget, no more
        deadline = deadline.within(POLISH_SHARE * budget)
    if options.polish and np.isfinite(best_time):
        best_plan, best_time, refine_runs = _polish(cost, tree, topology, options, best_plan, best_time, deadline)
    if np.isfinite(best_time):
        best_time = cost.confirmed(best_plan, best_time)
    fell_back = not best_time < reference
    if fell_back and best_name in starts.plans:
        best_plan, best_time = starts.plans[best_name], reference
    strategy = dataclasses.replace(best_plan, name="auto", graph=sim.analysis.graph.fingerprint,
                                   topology=topology.fingerprint)
    return MctsResult(strategy, best_time, starts.times, cost.evaluations + refine_runs, found.iterations,
                      time.perf_counter() - start_time, found.beat_dp_at, found.beat_dp_s, fell_back, prior_name,
                      found.converged)


def balance_shares(cost: Evaluator, strategy: Strategy, best: float, deadline: Deadline,
                   solver: ShareSolver | None = None, *, rounds: int = 6) -> tuple[Strategy, float]:
    """Batch shares for this plan: first the shares that level each device's predicted compute
    (`solver`, an LP; kept only if they simulate faster: it knows neither communication nor the
    order in which groups wait for each other), then, by simulation, samples move from the devices
    busiest to the idlest (share_i / busy_i, damped), keeping each change that simulates faster."""
    if strategy.shares is None:
        return strategy, best
    levelled = solver.solve(strategy) if solver is not None else None
    if levelled is not None:
        trial = dataclasses.replace(strategy, shares=levelled)
        t = cost(trial)
        if t < best * (1 - 1e-6):
            strategy, best = trial, t
    step = 0.5                       # exponent of the correction; halved after a failed trial
    report = cost.report(strategy)
    for _ in range(rounds):
        if deadline.expired() or report is None or report.oom:
            break
        busy = np.clip(1.0 - np.asarray(report.device_idle, dtype=np.float64), 0.05, 1.0)
        shares = np.asarray(strategy.shares, dtype=np.float64)
        new = shares / busy ** step
        new = new / new.sum()
        trial = dataclasses.replace(strategy, shares=tuple(float(x) for x in new))
        trial_report = cost.report(trial)
        t = math.inf if trial_report is None or trial_report.oom else trial_report.iteration_time_s
        if t < best * (1 - 1e-6):
            strategy, best, report = trial, t, trial_report
        else:
            step /= 2
    return strategy, best


def mix_prior(p: np.ndarray, share: float) -> np.ndarray:
    """`p` normalised, with the uniform prior mixed in at `share`: every action keeps at least
    share / len(p), so a search tries what a learned prior rules out."""
    p = np.asarray(p, dtype=np.float64)
    return (1.0 - share) * p / p.sum() + share / len(p)


def _first_play(vertex: _Vertex) -> float:
    """An unvisited action's value: the mean reward seen at its vertex (0 before any)."""
    total = vertex.n.sum()
    return float(vertex.w.sum() / total) if total > 0 else 0.0


__all__ = ["C_PUCT", "PRIORS", "MctsOptions", "MctsResult", "VisitRecord", "balance_shares", "candidate_actions",
           "decision_order", "mcts_search", "mix_prior", "puct_scores"]
