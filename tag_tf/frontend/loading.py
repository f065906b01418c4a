"""Turning CLI arguments (a zoo model or a graph file) into the IR and an analysis."""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tag_tf.analysis import Analysis, analyze
from tag_tf.context import Options, PassContext
from tag_tf.ir import Graph, from_file
from tag_tf.profile.weights import reference_weights

if TYPE_CHECKING:
    from tag_tf.models.base import ModelGraph
    from tag_tf.profile.stored import StoredCosts
    from tag_tf.sim.simulator import Simulator
    from tag_tf.strategy import Strategy
    from tag_tf.topology.spec import Topology


@dataclasses.dataclass
class Loaded:
    graph: Graph
    rebuild: Callable[[int], Graph] | None
    model: ModelGraph | None = None      # when it came from the zoo
    source: str = ""


def add_model_args(p: argparse.ArgumentParser, *, graph: bool = True) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="a built-in model: mlp, cnn, vgg19, resnet101, inceptionv3, "
                                     "transformer, bert-small, bert-large")
    if graph:
        src.add_argument("--graph", help="your own graph: a GraphDef (.pb/.pbtxt) or MetaGraphDef (.meta)")
        p.add_argument("--train-op", help="name of the train op (when it cannot be found)")
    p.add_argument("--batch", type=int, help="batch size (default: the model's; planning size for dynamic graphs)")
    p.add_argument("--tiny", action="store_true", help="a tiny version of the model (fast)")
    p.add_argument("--input-size", type=int, help="image side / sequence length / features of the model")


def model_kwargs(args: argparse.Namespace, **extra: Any) -> dict[str, Any]:
    kw: dict[str, Any] = {"tiny": bool(getattr(args, "tiny", False))}
    if getattr(args, "batch", None):
        kw["batch_size"] = args.batch
    if getattr(args, "input_size", None):
        kw["input_size"] = args.input_size
    kw.update(extra)
    return kw


def model_ir(model: ModelGraph) -> Graph:
    return model.ir()


def load(args: argparse.Namespace, **model_extra: Any) -> Loaded:
    if getattr(args, "graph", None):
        graph = from_file(args.graph, train_op=getattr(args, "train_op", None))
        return Loaded(graph, None, None, args.graph)
    from tag_tf.models import build_model

    kw = model_kwargs(args, **model_extra)
    model = build_model(args.model, **kw)

    def rebuild(batch: int) -> Graph:
        return model_ir(build_model(args.model, **{**kw, "batch_size": batch}))
    return Loaded(model_ir(model), rebuild, model, args.model)


def add_cost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile-db", help="profile database whose measured op profiles (`tag-tf profile`) and "
                                        "calibrated cost-model constants the simulator uses (default "
                                        "$TAG_TF_CACHE_DIR/profiles, else ~/.cache/tag_tf/profiles)")
    p.add_argument("--no-profiles", action="store_true",
                   help="ignore the profile database: op times from the datasheet cost model only")
    p.add_argument("--no-tf32", action="store_true",
                   help="cost float32 matmuls and convolutions on GPUs in FP32, as TensorFlow runs them for a "
                        "program that calls tf.config.experimental.enable_tensor_float_32_execution(False) "
                        "(default: TF32 from compute capability 8.0, TensorFlow's default)")


def apply_cost_args(args: argparse.Namespace) -> None:
    """Settings of `add_cost_args` that act on this process: `--no-tf32` turns TensorFlow's TF32 off
    here, so every plan and baseline is judged as such a program runs."""
    if getattr(args, "no_tf32", False):
        import tensorflow as tf

        tf.config.experimental.enable_tensor_float_32_execution(False)


def stored_costs(loaded: Loaded, analysis: Analysis, topology: Topology, args: argparse.Namespace
                 ) -> StoredCosts | None:
    """The profile database's costs for this program (None with --no-profiles). A zoo model also
    finds profiles measured at other batch sizes: it is rebuilt at the profile's batch size and
    matched by fingerprint, exactly as `tag-tf profile` keyed it."""
    from tag_tf.frontend.planning import stored_costs_for

    if getattr(args, "no_profiles", False):
        return None
    rebuild: Callable[[int], str] | None = None
    build = loaded.rebuild
    if build is not None:
        def fingerprint_at(batch: int) -> str:
            return build(batch).fingerprint
        rebuild = fingerprint_at
    return stored_costs_for(analysis, topology, getattr(args, "profile_db", None), rebuild)


def strategy_from_spec(spec: str, analysis: Analysis, topology: Topology, *, seed: int = 0,
                       check_topology: bool = True, budget_s: float = 10.0, sim: Simulator | None = None
                       ) -> Strategy:
    """`--strategy`: a registered baseline (search.registry.REGISTRY: "dp", "dp-p", "horovod", "horovod-p";
    "heterog" and "best-subset" searched for `budget_s` seconds), "random" (seeded), any of those with "+sfb" (sufficient factor broadcasting
    applied where it simulates faster) or a strategy JSON file, checked against the graph (and,
    with `check_topology`, the topology it was made for)."""
    import numpy as np

    from tag_tf.frontend.planning import PLANNED, PlanRequest, plan_for
    from tag_tf.search.baselines import random_strategy
    from tag_tf.strategy import Strategy

    n = len(analysis.grouping.groups)
    if spec in PLANNED and spec != "auto":       # a baseline, perhaps with SFB: planned as distribute plans it
        return plan_for(analysis, topology, PlanRequest(spec, budget_s=budget_s), sim=sim).strategy
    if spec.endswith("+sfb") and spec != "+sfb":      # random+sfb
        import dataclasses

        from tag_tf.search.sfb import apply_sfb
        from tag_tf.sim.simulator import Simulator

        sim = sim or Simulator(analysis, topology)
        base = strategy_from_spec(spec[:-4], analysis, topology, seed=seed, check_topology=check_topology,
                                  budget_s=budget_s, sim=sim)
        return dataclasses.replace(apply_sfb(sim, base).strategy, name=spec)
    if spec == "random":
        return random_strategy(n, topology.num_devices, np.random.default_rng(seed))
    strategy = Strategy.load(spec)
    strategy.validate(n, topology.num_devices, graph=analysis.graph.fingerprint,
                      topology=topology.fingerprint if check_topology else None)
    return strategy


def strategy_help() -> str:
    """`--strategy`'s help: every registered baseline (search.registry.REGISTRY), random, files."""
    from tag_tf.search.registry import baseline_names

    return " | ".join((*baseline_names(), "random (each also with +sfb, e.g. dp+sfb)", "a strategy JSON file"))
FUSION_HELP = ("gradient buckets: 'none' (one reduction per tensor), a size such as 64MiB, or 'auto' (the "
               "size that simulates fastest); default: what the strategy says")


def with_fusion(strategy: Strategy, spec: str | None, analysis: Analysis, topology: Topology,
                sim: Simulator | None = None) -> Strategy:
    """`--fusion`: override the strategy's gradient bucket cap (`auto`: judged by `sim`)."""
    import dataclasses

    from tag_tf.errors import TagError

    if spec is None:
        return strategy
    if spec == "none":
        return dataclasses.replace(strategy, fusion_bytes=None)
    if spec == "auto":
        from tag_tf.deadline import Deadline
        from tag_tf.search.moves import Evaluator, tune_fusion
        from tag_tf.sim.simulator import Simulator

        cost = Evaluator(sim or Simulator(analysis, topology))
        return tune_fusion(cost, strategy, cost(strategy), Deadline.after(60.0))[0]
    from tag_tf.topology.units import parse_size

    try:
        size = int(parse_size(spec, 1))
    except (ValueError, TypeError) as e:
        raise TagError(f"--fusion {spec!r}: expected none, auto or a size such as 64MiB ({e})") from None
    if size <= 0:
        raise TagError(f"--fusion {spec!r}: the bucket size must be positive")
    return dataclasses.replace(strategy, fusion_bytes=size)


def analysis_for(loaded: Loaded, args: argparse.Namespace, ctx: PassContext | None = None) -> Analysis:
    ctx = ctx or PassContext(Options(num_groups=getattr(args, "groups", None) or 60))
    if getattr(args, "graph", None):
        return analyze(ctx, loaded.graph, batch_size=getattr(args, "batch", None), weight_fn=reference_weights)
    return analyze(ctx, loaded.graph, rebuild=loaded.rebuild, weight_fn=reference_weights)


__all__ = ["apply_cost_args", "FUSION_HELP", "Loaded", "strategy_help", "with_fusion", "add_model_args", "load", "analysis_for", "model_ir", "strategy_from_spec",
           "add_cost_args", "stored_costs"]
