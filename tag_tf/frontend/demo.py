"""`make demo`: the main job end to end on a built-in model and a built-in heterogeneous topology.

1. Analyze the model (IR, batch dimensions, op groups).
2. Plan it for the `testbed` cluster (4x V100 + 8x GTX 1080Ti + 4x P100 over 100 Gbps) and compare
   with data parallelism. This part is SIMULATED: there are no GPUs here, so op times come from the
   analytical GPU cost model and transfers from the topology's bandwidths, with the physics the
   preset is calibrated with (fitted to the TAG paper's measured testbed times).
3. Train the same model for a few steps on this machine's virtual CPU devices through
   `tag_tf.distribute`, next to a plain single-device run, and compare the losses (real execution).
4. Write a report folder: report.md, the plans (JSON), simulated timelines (PNG) and a trace.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from tag_tf.runtime.sessions import session_config

if TYPE_CHECKING:
    from tag_tf.analysis import Analysis
    from tag_tf.frontend.distribute import Distribution
    from tag_tf.frontend.program import Program
    from tag_tf.search.local_search import GroupRow
    from tag_tf.search.mcts import MctsResult
    from tag_tf.sim.simulator import Simulator
    from tag_tf.strategy import Strategy
    from tag_tf.topology.spec import Topology

MODEL = "cnn"
PLAN_BATCH = 96          # the paper's batch size for its CNNs
CLUSTER = "testbed"
LOCAL_DEVICES = 4
TRAIN_STEPS = 5


@dataclasses.dataclass
class DemoResult:
    plan_times_ms: dict[str, float]
    speedup_over_dp: float | None             # None where DP does not fit the cluster
    losses_plain: list[float]
    losses_tag: list[float]
    max_rel_loss_diff: float
    out_dir: str
    noise_floor: float = 0.0                 # the plain run against itself on row-permuted batches
    local_plan: str = ""                     # how the local plan was made (mapped from the testbed plan, or dp)
    ops_per_device: dict[str, int] = dataclasses.field(default_factory=dict)   # compiled ops on each device
    collectives: int = 0                     # all-reduces per step in the compiled graph
    max_rel_weight_diff: float = 0.0         # trained variables, tag_tf against plain
    weight_noise_floor: float = 0.0          # trained variables, plain against permuted rows


def run_demo(out_dir: str, *, model: str = MODEL, cluster: str = CLUSTER, budget_s: float = 40.0,
             steps: int = TRAIN_STEPS, say: Callable[[str], None] = print) -> DemoResult:
    from tag_tf.topology.load import load_topology

    os.makedirs(out_dir, exist_ok=True)
    start = time.perf_counter()
    topology = load_topology(cluster)
    say(f"tag_tf demo: built-in model '{model}' (batch {PLAN_BATCH}) on the built-in heterogeneous "
        f"cluster '{cluster}': {topology.num_devices} GPUs in {topology.num_machines} machines")
    say("  " + _cluster_line(topology))
    analysis, rep = _analyze(model, say)
    result, times, rows = _plan(analysis, topology, model, cluster, budget_s, out_dir, say)
    plan_local, how = _local_plan(result.strategy, topology, model)
    trained = _train_step(model, steps, plan_local, how, out_dir, say)
    demo = DemoResult(times, result.speedup_over_dp, trained.plain, trained.tagged, trained.diff, out_dir,
                      trained.noise, how, trained.where, trained.collectives, trained.diff_w, trained.noise_w)
    _write_report(out_dir, demo, model, topology, rep, rows, result, time.perf_counter() - start)
    say(f"4. report: {os.path.join(out_dir, 'report.md')} (plan.json, plan_local.json, timeline.png, "
        f"timeline_dp.png, trace.json) - {time.perf_counter() - start:.0f} s in all")
    return demo


def _analyze(model: str, say: Callable[[str], None]) -> tuple[Analysis, dict[str, Any]]:
    """1. The model's IR, batch dimensions and op groups."""
    from tag_tf.analysis import analyze
    from tag_tf.context import PassContext
    from tag_tf.frontend.loading import model_ir
    from tag_tf.models import build_model
    from tag_tf.profile.weights import reference_weights

    analysis = analyze(PassContext(), model_ir(build_model(model, batch_size=PLAN_BATCH, dropout=0.0)),
                       rebuild=lambda b: model_ir(build_model(model, batch_size=b, dropout=0.0)),
                       weight_fn=reference_weights)
    rep = analysis.report()
    say(f"1. analyze: {rep['ops']} ops, {rep['training_ops']} in the training step -> "
        f"{rep['simplified_ops']} planned ops in {rep['groups']} groups; "
        f"categories concat {rep['categories']['concat']} / sum {rep['categories']['sum']} / "
        f"other {rep['categories']['other']}; unclassified: {len(rep['unclassified'])}")
    return analysis, rep


def _plan(analysis: Analysis, topology: Topology, model: str, cluster: str, budget_s: float, out_dir: str,
          say: Callable[[str], None]) -> tuple[MctsResult, dict[str, float], list[GroupRow]]:
    """2. The plan `distribute(strategy="auto")` makes for the cluster (simulated), beside every baseline."""
    from tag_tf.frontend.planning import PlanRequest, plan_for, simulator
    from tag_tf.search.local_search import describe
    from tag_tf.search.registry import label

    sim = simulator(analysis, topology)
    planned = plan_for(analysis, topology, PlanRequest(budget_s=budget_s), sim=sim)
    assert planned.search is not None, "auto plans a GPU cluster by its search"
    result = cast("MctsResult", planned.search.result)
    times = plan_times_ms(result)
    physics = ("datasheet constants" if sim.calibration is None
               else f"calibration {sim.calibration_name!r}, fitted to the TAG paper's measured testbed times")
    say(f"2. plan for {cluster} - SIMULATED (no GPUs here: op times from the analytical GPU cost model and "
        f"transfers from the topology's bandwidths, {physics}):")
    for name, ms in times.items():
        say(f"     {name:<22} {ms:9.2f} ms per iteration")
    say(f"     compute lower bound: {sim.lower_bound_s() * 1e3:.2f} ms")
    say(f"     predicted speed-up over DP: {result.speedup_over_dp:.2f}x, over the best baseline "
        f"({result.best_baseline}): {result.speedup_over_best_baseline:.2f}x  "
        f"({planned.search.simulations} strategies simulated in {planned.search.seconds:.1f} s, MCTS"
        f"{' and SFB' if planned.search.sfb is not None else ''})")
    rows = describe(result.strategy, topology, analysis.for_strategy(result.strategy).grouping.groups)
    say("     plan: " + _plan_summary(rows))
    result.strategy.save(os.path.join(out_dir, "plan.json"))
    _timeline(sim, result.strategy, os.path.join(out_dir, "timeline.png"),
              f"{model} on {cluster}: tag_tf plan, {times['tag_tf (auto)']:.1f} ms (simulated)",
              os.path.join(out_dir, "trace.json"))
    _timeline(sim, _baseline(sim, "dp", topology), os.path.join(out_dir, "timeline_dp.png"),
              f"{model} on {cluster}: data parallelism, {times[label('dp')]:.1f} ms (simulated)")
    return result, times, rows


@dataclasses.dataclass
class _Trained:
    plain: list[float]
    tagged: list[float]
    diff: float
    diff_w: float
    noise: float
    noise_w: float
    where: dict[str, int]
    collectives: int


def _train_step(model: str, steps: int, plan_local: Strategy | str, how: str, out_dir: str,
                say: Callable[[str], None]) -> _Trained:
    """3. Real training on this machine's virtual devices, beside a plain single-device run."""
    say(f"3. train {steps} steps for real on this machine: {LOCAL_DEVICES} virtual CPU devices through "
        f"tag_tf.distribute with {how}, next to a plain single-device run")
    plain, plain_w = _train(model, steps)
    permuted, permuted_w = _train(model, steps, permute=True)
    noise, noise_w = _rel_diff(plain, permuted), _weights_diff(plain_w, permuted_w)
    with _distributed(out_dir, plan_local) as dist:
        tagged, tagged_w = _train(model, steps)
    program = dist.programs[0]
    program.plan.strategy.save(os.path.join(out_dir, "plan_local.json"))
    where = _ops_per_device(program)
    collectives = int(program.compiled.stats.get("allreduce", 0))
    say("     ran: " + ", ".join(f"{n} ops on {d}" for d, n in where.items()) + f"; {collectives} all-reduces a step")
    say(f"     {'step':>4}  {'single device':>14}  {'tag_tf, ' + str(len(where)) + ' devices':>18}")
    for i, (a, b) in enumerate(zip(plain, tagged)):
        say(f"     {i + 1:>4}  {a:>14.6f}  {b:>18.6f}")
    diff, diff_w = _rel_diff(plain, tagged), _weights_diff(plain_w, tagged_w)
    say(f"     largest relative difference: losses {diff:.2e}, trained variables {diff_w:.2e}; noise floor (the plain "
        f"run on the same batches, each batch's rows permuted): {noise:.2e}, {noise_w:.2e}")
    return _Trained(plain, tagged, diff, diff_w, noise, noise_w, where, collectives)


def plan_times_ms(result: MctsResult) -> dict[str, float]:
    """The demo's plan table: every baseline the search timed, by its label (search.registry.REGISTRY),
    then tag_tf's plan; ms per iteration (simulated)."""
    from tag_tf.search.registry import label

    times = {label(k): v * 1e3 for k, v in result.baselines.items()}
    times["tag_tf (auto)"] = result.iteration_time_s * 1e3
    return times


def _cluster_line(topology: Topology) -> str:
    """E.g. "1 machine with 4x V100-32GB (nvlink); 4 machines with 2x GTX1080Ti (pcie); ..."."""
    kinds: dict[str, int] = {}
    for m in topology.machines:
        types: dict[str, int] = {}
        for g in m.gpus:
            types[g.type] = types.get(g.type, 0) + 1
        kind = " + ".join(f"{n}x {t}" for t, n in types.items()) + f" ({m.intra_link})"
        kinds[kind] = kinds.get(kind, 0) + 1
    inter = topology.inter_bandwidth
    net = f"{inter * 8 / 1e9:.0f} Gbps switch" if isinstance(inter, (int, float)) else "network matrix"
    return "; ".join(f"{n} machine{'s' if n > 1 else ''} with {k}" for k, n in kinds.items()) + f"; {net}"


def _plan_summary(rows: list[GroupRow]) -> str:
    counts: dict[tuple[str, str], int] = {}
    for r in rows:
        where = ", ".join(f"{n}x {t}" for t, n in sorted(r["by_type"].items()))
        counts[(r["option"], where)] = counts.get((r["option"], where), 0) + 1
    return "; ".join(f"{n} group{'s' if n > 1 else ''} {opt} on [{where}]"
                     for (opt, where), n in sorted(counts.items(), key=lambda kv: -kv[1]))


def _baseline(sim: Simulator, name: str, topology: Topology) -> Strategy:
    from tag_tf.search.registry import baseline

    return baseline(name, sim.num_groups, topology)


def _timeline(sim: Simulator, strategy: Strategy, png: str, title: str, trace: str | None = None) -> None:
    from tag_tf.sim.gantt import plot_gantt
    from tag_tf.sim.trace import write_chrome_trace

    report = sim.simulate(strategy, detail=True)
    graph, result = sim.task_graph(report)
    plot_gantt(graph, result, png, title=title, hide_idle=True)
    if trace:
        write_chrome_trace(trace, graph, result)


def _local_plan(plan: Strategy, topology: Topology, model: str) -> tuple[Strategy | str, str]:
    """The testbed plan's structure on the LOCAL_DEVICES local devices: testbed GPU i becomes local
    device i mod LOCAL_DEVICES, so a group keeps its option and (up to LOCAL_DEVICES) its replica
    count: a group replicated over 4 V100s is replicated over 4 local devices, one spanning two
    machines' GPUs over 2; when that uses at least two devices and fits the local graph's groups.
    Else data parallelism."""
    from tag_tf.analysis import analyze
    from tag_tf.context import PassContext
    from tag_tf.errors import StrategyError
    from tag_tf.frontend.loading import model_ir
    from tag_tf.models import build_model
    from tag_tf.profile.weights import reference_weights
    from tag_tf.strategy import GroupPlan, Strategy

    fallback = f"data parallelism (dp) over all {LOCAL_DEVICES}"
    if plan.op_groups is not None:
        return "dp", fallback + " (the testbed plan refines the op groups: they do not map onto the local graph's)"
    groups = tuple(GroupPlan(tuple(sorted({d % LOCAL_DEVICES for d in g.devices})), g.option) for g in plan.groups)
    used = sorted({d for g in groups for d in g.devices})
    if len(used) < 2:
        return "dp", fallback + " (the testbed plan maps onto one local device)"
    mapped = Strategy(groups, name="testbed plan on local devices", fusion_bytes=plan.fusion_bytes,
                      sync_after_backward=plan.sync_after_backward)
    analysis = analyze(PassContext(), model_ir(build_model(model, dropout=0.0)), weight_fn=reference_weights)
    try:
        mapped.validate(len(analysis.grouping.groups), LOCAL_DEVICES)
        analysis.check_groups(mapped)
    except StrategyError as e:
        return "dp", f"{fallback} ({e})"
    replicated = sum(1 for g in groups if len(g.devices) > 1 and g.option.value in ("allreduce", "ps"))
    return mapped, (f"the testbed plan's structure mapped onto them (testbed GPU i -> local device i mod "
                    f"{LOCAL_DEVICES}: {len(groups)} groups, {replicated} replicated with the batch split, on devices "
                    f"{used})")


@contextlib.contextmanager
def _distributed(out_dir: str, strategy: Strategy | str) -> Iterator[Distribution]:
    import tag_tf

    with tag_tf.distribute(strategy=strategy, topology=f"local:{LOCAL_DEVICES}",
                           cache_dir=os.path.join(out_dir, "cache")) as dist:
        yield dist


def _ops_per_device(program: Program) -> dict[str, int]:
    """Ops of the compiled graph on each device (short device names), in device order."""
    counts: dict[str, int] = {}
    for node in program.compiled.graph_def.node:
        short = node.device.rsplit("/", 1)[-1].replace("device:", "") or "unplaced"
        counts[short] = counts.get(short, 0) + 1
    return dict(sorted(counts.items()))


def _rel_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) / max(abs(x), 1e-12) for x, y in zip(a, b))


def _train(model: str, steps: int, permute: bool = False) -> tuple[list[float], dict[str, np.ndarray]]:
    """Ordinary TF1 training code: import the model's graph, initialise, run the train op
    (`permute`: each batch's rows in another order, the same math summed in another order)."""
    import tensorflow as tf

    from tag_tf.models import build_model

    # Seeded initialisers, so both runs start alike; no dropout, whose masks differ run to run.
    m = build_model(model, dropout=0.0)
    rng = np.random.default_rng(0)
    batches = [m.feed(rng) for _ in range(steps)]
    if permute:
        order = np.random.default_rng(1).permutation(len(next(iter(batches[0].values()))))
        batches = [{k: np.asarray(v)[order] if np.ndim(v) else v for k, v in b.items()} for b in batches]
    from tensorflow.core.framework import variable_pb2

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(m.graph_def, name="")
    reads = {}                  # trainable variable -> the tensor its reads come from
    for raw in m.meta_graph_def.collection_def["trainable_variables"].bytes_list.value:
        vd = variable_pb2.VariableDef()
        vd.ParseFromString(raw)
        reads[vd.variable_name.split(":")[0]] = vd.snapshot_name
    losses = []
    with tf.compat.v1.Session(graph=graph, config=session_config(1)) as sess:
        sess.run(m.init_op)
        for feed in batches:
            _, loss = sess.run([m.train_op, m.loss], feed)
            losses.append(float(loss))
        values = dict(zip(reads, sess.run(list(reads.values()))))
    return losses, values


def _weights_diff(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    """Largest difference of the trained variables, each relative to the larger of its own and a
    typical variable's magnitude (runtime.variables)."""
    from tag_tf.runtime.variables import max_rel_diff, typical_magnitude

    names = sorted(a)
    return max_rel_diff(a, b, names, typical_magnitude(a, names))[0]


def _write_report(out_dir: str, demo: DemoResult, model: str, topology: Topology, analysis: dict[str, Any],
                  rows: list[GroupRow], search: MctsResult, seconds: float) -> None:
    lines = [
        f"# tag_tf demo: {model} on {topology.name}",
        "",
        f"Cluster: {_cluster_line(topology)}.",
        "",
        "## 1. Analysis",
        "",
        f"{analysis['ops']} ops ({analysis['training_ops']} in the training step), {analysis['simplified_ops']} "
        f"after simplification, {analysis['groups']} op groups (balance {analysis['group_balance']}). Categories: "
        f"concat {analysis['categories']['concat']}, sum {analysis['categories']['sum']}, other "
        f"{analysis['categories']['other']}; unclassified op types: {len(analysis['unclassified'])}.",
        "",
        "## 2. Plan (simulated)",
        "",
        "No GPUs were available: these iteration times are predicted by tag_tf's simulator, with op times "
        "from the analytical GPU cost model and transfers from the topology's bandwidths, corrected by the "
        "preset's calibration (fitted to the TAG paper's measured testbed per-iteration times; "
        "`testbed-nominal` keeps datasheet physics). No GPU of ours measured them.",
        "",
        "| strategy | simulated ms / iteration |",
        "|---|---|",
        *[f"| {name} | {ms:.2f} |" for name, ms in demo.plan_times_ms.items()],
        "",
        f"Predicted speed-up over DP: **{demo.speedup_over_dp:.2f}x**, over the best baseline "
        f"({search.best_baseline}): **{search.speedup_over_best_baseline:.2f}x** ({search.simulations} strategies "
        f"simulated in {search.seconds:.1f} s). Timelines: `timeline.png` (this plan), `timeline_dp.png` (DP); "
        "`trace.json` opens in Perfetto / chrome://tracing.",
        "",
        "| group | ops | compute share | option | devices |",
        "|---|---|---|---|---|",
        *[f"| {r['group']} | {r['ops']} | {r['compute_share']:.3f} | {r['option']} | "
          f"{', '.join(f'{n}x {t}' for t, n in sorted(r['by_type'].items()))} |" for r in rows],
        "",
        "## 3. Real training on this machine",
        "",
        f"{len(demo.losses_plain)} steps on {LOCAL_DEVICES} virtual CPU devices through `tag_tf.distribute` with "
        f"{demo.local_plan} (plan in `plan_local.json`), next to a plain single-device run. What ran where: "
        + ", ".join(f"{n} ops on {d}" for d, n in demo.ops_per_device.items())
        + f"; {demo.collectives} all-reduces a step.",
        "",
        "| step | single device | tag_tf |",
        "|---|---|---|",
        *[f"| {i + 1} | {a:.6f} | {b:.6f} |" for i, (a, b) in enumerate(zip(demo.losses_plain, demo.losses_tag))],
        "",
        f"Largest relative difference from the plain run: losses {demo.max_rel_loss_diff:.2e}, trained variables "
        f"{demo.max_rel_weight_diff:.2e}. Noise floor (the plain run on the same batches, each batch's rows "
        f"permuted: float32 summed in another order): losses {demo.noise_floor:.2e}, trained variables "
        f"{demo.weight_noise_floor:.2e}.",
        "",
        f"Demo time: {seconds:.0f} s.",
    ]
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(dataclasses.asdict(demo), f, indent=1)
