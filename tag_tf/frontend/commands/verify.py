"""`tag-tf verify`: train K steps with the original graph and with the compiled one, compare."""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from typing import TYPE_CHECKING

import numpy as np

from tag_tf.errors import TagError
from tag_tf.frontend.loading import (
    FUSION_HELP,
    add_model_args,
    analysis_for,
    load,
    strategy_from_spec,
    strategy_help,
    with_fusion,
)

if TYPE_CHECKING:
    from tag_tf.analysis import Analysis
    from tag_tf.compiler import Compiled
    from tag_tf.context import PassContext
    from tag_tf.runtime.equivalence import EquivalenceResult
    from tag_tf.strategy import Strategy


def register(sub) -> None:
    p = sub.add_parser("verify", help="check that a compiled strategy trains exactly like the original graph")
    add_model_args(p, graph=False)
    p.add_argument("--devices", type=int, required=True, help="number of devices (virtual CPU devices here)")
    p.add_argument("--processes", type=int, default=1,
                   help="server processes on 127.0.0.1 (devices are spread evenly over them)")
    p.add_argument("--strategy", default="dp", help=strategy_help())
    p.add_argument("--fusion", help=FUSION_HELP)
    p.add_argument("--shares", help="per-device batch shares, e.g. 1,2,3 (uneven split)")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--groups", type=int, default=60)
    p.add_argument("--tolerance", type=float, default=1e-4)
    p.add_argument("--exact-batch-stats", action="store_true",
                   help="synchronized BatchNorm statistics (default: per-replica, like MirroredStrategy)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def parse_shares(text: str | None, n: int):
    if not text:
        return None
    try:
        shares = [float(x) for x in text.split(",")]
    except ValueError:
        raise TagError(f"--shares: expected numbers separated by commas, got {text!r}") from None
    if len(shares) != n:
        raise TagError(f"--shares has {len(shares)} values for {n} devices")
    return shares


# TF's CPU allocator, the graphs themselves and Python sit on top of the tensors the simulator counts.
MEMORY_OVERHEAD = 1.5


def available_memory_bytes() -> int | None:
    """MemAvailable of this machine (Linux), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_memory(analysis, topology, strategy, source: str) -> None:
    """Refuse, with the estimate, a check that cannot fit in this machine's memory (instead of the
    kernel's OOM killer ending it without a word). The original and compiled runs are sequential:
    the larger of the two counts. Peaks come from the simulator's memory model."""
    from tag_tf.sim.simulator import Simulator
    from tag_tf.strategy import Option, Strategy

    available = available_memory_bytes()
    if available is None:
        return
    sim = Simulator(analysis, topology)
    compiled = sum(sim.simulate(strategy).peak_memory_bytes)
    original = sim.simulate(Strategy.uniform(len(analysis.grouping.groups), (0,), Option.ALLREDUCE)).peak_memory_bytes[0]
    need = MEMORY_OVERHEAD * max(compiled, original)
    if need > available:
        gib = 1 << 30
        raise TagError(f"verify {source}: needs about {need / gib:.1f} GiB (compiled run {compiled / gib:.1f} GiB over "
                       f"{topology.num_devices} devices, original {original / gib:.1f} GiB, x{MEMORY_OVERHEAD} for "
                       f"the runtime) but {available / gib:.1f} GiB are available; use --tiny, a smaller --batch "
                       f"or fewer --devices")


def run(args: argparse.Namespace) -> int:
    from tag_tf.context import Options, PassContext

    if args.devices < 1 or args.processes < 1 or args.devices % args.processes:
        raise TagError(f"--devices {args.devices} must be a positive multiple of --processes {args.processes}")
    if args.steps < 1:
        raise TagError("--steps must be at least 1")
    ctx = PassContext(Options(num_groups=args.groups, seed=args.seed, exact_batch_stats=args.exact_batch_stats))
    loaded = load(args, dropout=0.0)   # no random ops: both runs must see the same computation
    analysis = analysis_for(loaded, args, ctx)
    strategy = _strategy(args, analysis, loaded.source)
    rng = np.random.default_rng(args.seed)
    model = loaded.model
    assert model is not None           # --model only: add_model_args(graph=False)
    batches = [model.feed(rng) for _ in range(args.steps)]
    start = time.perf_counter()
    result, compiled = _check(args, ctx, analysis, strategy, batches)
    out = {"model": loaded.source, **result.to_dict(), "processes": args.processes,
           "strategy": args.strategy, "fusion_bytes": strategy.fusion_bytes, "seed": args.seed,
           "groups": len(analysis.grouping.groups),
           "compile": dict(compiled.stats), "seconds": round(time.perf_counter() - start, 2),
           "timers": ctx.timing_report()}
    if args.json:
        json.dump(out, sys.stdout)
        print()
    else:
        verdict = "equivalent" if result.ok else "NOT equivalent"
        print(f"{loaded.source}: {verdict} after {args.steps} steps on {args.devices} devices "
              f"({args.processes} process{'es' if args.processes > 1 else ''}): max_rel_diff "
              f"{result.max_rel_diff:.3g} (tolerance {args.tolerance:g})")
        if result.noise_variables:
            print(f"  left out (gradient is rounding noise): {', '.join(result.noise_variables)}")
    return 0 if result.ok else 1


def _strategy(args: argparse.Namespace, analysis: Analysis, source: str) -> Strategy:
    """--strategy, --fusion and --shares on this machine's devices, checked to fit its memory."""
    from tag_tf.runtime.cluster import cpu_topology

    topology = cpu_topology(args.processes, args.devices // args.processes)
    # A plan file made for `local:N` (tag-tf plan, tag_tf.distribute) runs on these devices too.
    strategy = strategy_from_spec(args.strategy, analysis, topology, seed=args.seed, check_topology=False)
    strategy = with_fusion(strategy, args.fusion, analysis, topology)
    shares = parse_shares(args.shares, args.devices)
    if shares is not None:
        strategy = dataclasses.replace(strategy, shares=tuple(shares))
    strategy.validate(len(analysis.grouping.groups), args.devices)
    check_memory(analysis, topology, strategy, source)
    return strategy


def _check(args: argparse.Namespace, ctx: PassContext, analysis: Analysis, strategy: Strategy,
           batches: list[dict[str, np.ndarray]]) -> tuple[EquivalenceResult, Compiled]:
    """The original and the compiled graph trained side by side: in this process, or on
    --processes local servers."""
    from tag_tf.compiler import DeviceMap, compile_strategy
    from tag_tf.runtime.cluster import cpu_topology, local_cluster
    from tag_tf.runtime.equivalence import check_equivalence

    per = args.devices // args.processes
    if args.processes == 1:
        compiled = compile_strategy(ctx, analysis, strategy, DeviceMap.local_cpus(args.devices), check=True)
        return check_equivalence(analysis, compiled, lambda s: batches[s], args.steps,
                                 tolerance=args.tolerance), compiled
    compiled = compile_strategy(ctx, analysis, strategy, DeviceMap.for_topology(cpu_topology(args.processes, per)),
                                check=True)
    with local_cluster(args.processes, per) as (spec, _):
        try:
            return check_equivalence(analysis, compiled, lambda s: batches[s], args.steps, target=spec.target,
                                     config=spec.session_config(), tolerance=args.tolerance), compiled
        except Exception as e:  # a dead server shows up as a TF error: name the task
            import tensorflow as tf
            if isinstance(e, tf.errors.OpError):
                raise spec.explain(e) from None
            raise
