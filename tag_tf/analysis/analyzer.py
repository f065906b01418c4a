"""The analysis pass: IR -> batch dimensions, replication semantics, planning graph, op groups.

Requires: a training graph (train op found), batch inputs with the batch on axis 0.
Ensures: every op is annotated; every training op has a group; colocated ops share a group;
at most `options.num_groups` groups.
"""
from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypedDict

import numpy as np

from tag_tf.analysis import annotate as ann_mod
from tag_tf.analysis.batch_dims import SUBSTITUTIONS, BatchDims, compare, substitute_batch
from tag_tf.analysis.grouping import Grouping, colocation_pairs, group_ops
from tag_tf.analysis.simplify import PlanningGraph, simplify, training_ops
from tag_tf.analysis.states import Kind, OpAnnotation
from tag_tf.context import PassContext
from tag_tf.errors import GraphError
from tag_tf.ir import Graph, TensorInfo, TensorRef, from_graph_def, opsets
from tag_tf.ir.importer import measure_shapes

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

log = logging.getLogger("tag_tf.analysis")

DEFAULT_DYNAMIC_BATCH = 32


class PlansGroups(Protocol):
    """A plan that may carry refined op groups (`tag_tf.strategy.Strategy`)."""

    @property
    def op_groups(self) -> tuple[int, ...] | None: ...


class _Roles(TypedDict):
    """What `from_graph_def` is told about a graph it re-imports at another batch size."""

    train_op: str | None
    loss: str | None
    inputs: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Analysis:
    graph: Graph                  # the graph as given (dynamic dims stay dynamic): the compiler's input
    graph_b1: Graph               # the same ops with static shapes at the planning batch size
    graph_b2: Graph               # ... and at a second batch size
    batch: BatchDims
    annotations: Mapping[str, OpAnnotation]
    planning: PlanningGraph
    grouping: Grouping
    weights: np.ndarray           # grouping weight of each planned op (the weight_fn's, e.g. seconds)

    @property
    def batch_size(self) -> int:
        return self.batch.b1

    @property
    def dynamic_batch(self) -> bool:
        return self.graph.meta.batch_size is None

    def with_grouping(self, op_groups: Sequence[int] | np.ndarray) -> Analysis:
        """The same analysis with other op groups: `op_groups[i]` is the group of planned op i.
        Raises StrategyError unless every planned op has a group and colocated ops share one (what
        the compiler and the simulator rely on)."""
        from tag_tf.errors import StrategyError

        op_group = np.asarray(op_groups, dtype=np.int64)
        if op_group.shape != (len(self.planning.ops),):
            raise StrategyError(f"op_groups has {op_group.size} entries but the graph has "
                                f"{len(self.planning.ops)} planned ops (was the plan made for this graph?)")
        if op_group.size and (op_group.min() < 0 or set(op_group.tolist()) != set(range(int(op_group.max()) + 1))):
            raise StrategyError("op_groups must number the groups 0..G-1, each with at least one op")
        index = {name: i for i, name in enumerate(self.planning.ops)}
        host = self.planning.host
        for a, b in colocation_pairs(self.graph_b1, list(host)):
            if op_group[index[host[a]]] != op_group[index[host[b]]]:
                raise StrategyError(f"op_groups separates {a!r} from {b!r}, which must share a device")
        from tag_tf.analysis.grouping import build_grouping

        return dataclasses.replace(self, grouping=build_grouping(self.graph_b1, self.planning, op_group, self.weights))

    @property
    def op_groups(self) -> tuple[int, ...]:
        """The group of each planned op, in planning order (what `Strategy.op_groups` stores)."""
        group_of = self.grouping.group_of
        return tuple(group_of[op] for op in self.planning.ops)

    def check_groups(self, strategy: PlansGroups) -> None:
        """Raise StrategyError when `strategy` plans other groups than this analysis has (a plan
        with refined groups must go through `for_strategy` first)."""
        from tag_tf.errors import StrategyError

        op_groups = getattr(strategy, "op_groups", None)
        if op_groups is not None and tuple(op_groups) != self.op_groups:
            raise StrategyError("the strategy plans refined op groups: use analysis.for_strategy(strategy)")

    def for_strategy(self, strategy: PlansGroups) -> Analysis:
        """The analysis whose groups `strategy` plans: its own refined groups when it carries them."""
        op_groups = getattr(strategy, "op_groups", None)
        if op_groups is None:
            return self
        cache = self.__dict__.setdefault("_regrouped", {})     # frozen dataclass: a private memo
        key = tuple(op_groups)
        if key not in cache:
            cache[key] = self.with_grouping(key)
        return cache[key]

    def unclassified(self) -> list[str]:
        return ann_mod.unclassified_types(self.annotations, self.graph, training_ops(self.graph))

    def report(self) -> dict[str, Any]:
        train = training_ops(self.graph)
        return {
            "ops": len(self.graph),
            "training_ops": len(train),
            "simplified_ops": len(self.planning.ops),
            "groups": len(self.grouping.groups),
            "categories": ann_mod.category_counts(self.annotations, train),
            "unclassified": self.unclassified(),
            "group_balance": round(self.grouping.balance, 3),
            "batch_size": self.batch_size,
            "dynamic_batch": self.dynamic_batch,
            "variables": len(self.graph.variables),
            "param_bytes": int(sum(v.nbytes for v in self.graph.variables.values() if v.trainable)),
            "folded": dict(self.planning.folded),
        }


def second_batch_size(b1: int) -> int:
    return b1 + 3 if b1 > 1 else 5


def _unequal_batches(graph: Graph, error: GraphError) -> GraphError:
    """The error for a dynamic-batch graph that does not type-check once all its batch inputs get
    one batch size: its feeds have batch sizes in some other relation (a GAN's discriminator reads
    real and generated samples concatenated, labelled by one feed of twice the size)."""
    import re

    feeds = list(graph.meta.feeds)
    found = re.search(r"\{\{node ([^}]+)\}\}", str(error))
    if found and found.group(1) in graph:
        upstream = graph.ancestors([found.group(1)])
        feeds = [f for f in feeds if TensorRef.parse(f).op in upstream] or feeds
    where = f" at op {found.group(1)!r}" if found else ""
    if len(feeds) < 2:
        return error
    names = ", ".join(repr(f) for f in feeds)
    return GraphError(f"batch inputs {names} do not share one batch size: given the same batch size, the graph "
                      f"does not type-check{where} ({str(error).removeprefix('shape inference failed: ')}); "
                      f"tag_tf splits every batch input of a step into the same shares, so feeds whose batch sizes "
                      f"differ (labels for real and generated samples concatenated, 64 images with 32 labels) "
                      f"cannot be split consistently: feed them with one batch size (concatenate before feeding), "
                      f"or train this graph undistributed (fallback='single')")


def batch_variants(graph: Graph, batch_size: int | None = None,
                   rebuild: Callable[[int], Graph] | None = None) -> tuple[Graph, Graph, int, int]:
    """The graph with static shapes at the planning batch size b1 and at a second size b2.

    A static-batch graph is its own b1 variant; its b2 variant comes from `rebuild(b2)` (for zoo
    models) or, failing that, from substituting batch-valued constants. A dynamic-batch graph is
    re-imported with its inputs' batch dims set."""
    if not graph.meta.feeds:
        raise GraphError("no batch inputs found (Placeholder or iterator outputs feeding the train op)")
    static_b = graph.meta.batch_size
    b1 = static_b if static_b is not None else (batch_size or DEFAULT_DYNAMIC_BATCH)
    b2 = second_batch_size(b1)

    def input_shapes(b: int) -> dict[str, tuple[int, ...]]:
        shapes = {}
        for name in graph.meta.feeds:
            shape = graph.tensor(name).shape
            if shape is None or not shape:
                raise GraphError(f"batch input {name!r} has unknown rank; give it a static rank")
            shapes[name] = (b,) + tuple(shape[1:])
        return shapes

    kwargs: _Roles = {"train_op": graph.meta.train_op, "loss": graph.meta.loss, "inputs": graph.meta.feeds}
    if static_b is None:
        gd = graph.to_graph_def()
        try:
            g1 = from_graph_def(gd, input_shapes=input_shapes(b1), **kwargs)
            g2 = from_graph_def(gd, input_shapes=input_shapes(b2), **kwargs)
        except GraphError as e:
            raise _unequal_batches(graph, e) from None
        unknown = sorted(_unknown_shapes(g1) | _unknown_shapes(g2))
        # TF1 control flow cannot be fetched inside its frames or on a cond's branches (they run whole:
        # annotate.v1_control_flow); what comes out of a loop's Exit or a cond's Merge can.
        if any(op.type in opsets.CONTROL_FLOW_OPS for op in g1):
            hidden = ann_mod.unfetchable(g1)
            unknown = [t for t in unknown if TensorRef.parse(t).op not in hidden]
        if unknown:
            # Shape inference stops at functional control flow (dynamic_rnn's While): without the
            # batch dims of its outputs, a whole-batch value would reach split consumers unsplit.
            try:
                m1, m2 = (_batch_sized(g, input_shapes(b), unknown) for g, b in ((g1, b1), (g2, b2)))
            except GraphError as e:
                log.warning("tag_tf: batch dimensions are inferred from static shapes only: %s", e)
            else:
                g1, g2 = _with_shapes(gd, g1, m1, kwargs), _with_shapes(gd, g2, m2, kwargs)
        return g1, g2, b1, b2
    if rebuild is not None:
        return graph, rebuild(b2), b1, b2
    # Rescale the constants that hold the batch size, most conservative reading first (a channel
    # count that happens to equal the batch, or a multiple of it, must stay), keeping the first
    # reading under which the graph type-checks at the second batch size.
    within = frozenset(training_ops(graph))
    error = None
    for mode in SUBSTITUTIONS:
        gd2 = substitute_batch(graph.to_graph_def(), input_shapes(b2), b1, b2, within, mode=mode)
        try:
            return graph, from_graph_def(gd2, **kwargs), b1, b2
        except GraphError as e:
            error = e
    raise GraphError(f"cannot infer batch dimensions: the graph has its batch size ({b1}) baked in "
                     f"where tag_tf cannot rescale it ({error}); export it with a dynamic batch "
                     "dimension (None) in its placeholders")


def _batch_sized(graph: Graph, inputs: Mapping[str, tuple[int, ...]], tensors: list[str]
                 ) -> dict[str, tuple[int, ...]]:
    """Measured shapes that do not depend on the batch's values: the same under two fills."""
    zeros = measure_shapes(graph, inputs, tensors)
    other = measure_shapes(graph, inputs, tensors, alternate=True)
    return {t: dims for t, dims in zeros.items() if other.get(t) == dims}


# Ops whose output size depends on the values they read: nothing computed from them takes a measured
# shape (two fills can happen to agree on them, and where they do not agree the rest is guesswork).
_VALUE_SIZED = frozenset({"Unique", "UniqueV2", "UniqueWithCounts", "DynamicPartition", "Where", "ListDiff",
                          "SetDiff1D", "NonMaxSuppressionV3", "NonMaxSuppressionV4", "NonMaxSuppressionV5",
                          "SparseReshape", "SparseSlice", "SparseFillEmptyRows", "SparseSegmentSum",
                          "StringSplit", "StringSplitV2", "RaggedTensorToTensor", "DenseToSparseSetOperation"})


def _value_sized(graph: Graph) -> set[str]:
    """Ops computed from a _VALUE_SIZED op (data edges)."""
    value_sized: set[str] = set()
    stack = [op.name for op in graph if op.type in _VALUE_SIZED]
    while stack:
        name = stack.pop()
        if name not in value_sized:
            value_sized.add(name)
            stack.extend(graph.op_consumers(name))
    return value_sized


def unsized_batch_meetings(a: Analysis) -> list[tuple[str, str, str]]:
    """Where a value computed from sparse or value-sized ops (a feature column's weighted sum, a
    partitioned lookup), whose size along the batch axis tag_tf cannot infer (it is computed whole),
    meets a batch tensor in a broadcasting op whose gradient compares the two inputs' shapes
    (BroadcastGradientArgs): each replica would compare the whole value's shape with its shard's
    and fail at run time. Returns (op, the unsized input, the batch input) per such op."""
    g = a.graph_b1
    value_sized = _value_sized(g)
    out = []
    for op in g:
        if op.type != "BroadcastGradientArgs" or op.name not in a.annotations or len(op.inputs) != 2:
            continue
        shapes = [g.op(r.op) for r in op.inputs]
        if any(s.type != "Shape" or s.name not in a.annotations for s in shapes):
            continue
        kinds = [a.annotations[s.name].outputs[0].kind for s in shapes]
        sources = [s.inputs[0] for s in shapes]
        for whole, local in ((0, 1), (1, 0)):
            src = sources[whole]
            if (kinds[whole] is Kind.FULL and kinds[local] is Kind.LOCAL and src.op in value_sized
                    and (shape := g.tensor(src).shape) and shape[0] < 0):
                users = [c for c, _ in g.consumers(src) if not opsets.is_gradient_op(c, g.op(c).type)]
                meets = [c for c in users if any(r == sources[local] for r in g.op(c).inputs)]
                out.append((meets[0] if meets else op.name, src.name, sources[local].name))
                break
    return out


def _unknown_shapes(graph: Graph) -> set[str]:
    """Data tensors of the training subgraph whose static shape has an unknown dim or rank, except
    what is computed from _VALUE_SIZED ops (sparse feature columns, partitioned lookups: their
    sizes follow the values, and the rules treat their unknown shapes conservatively)."""
    value_sized = _value_sized(graph)
    out = set()
    for name in training_ops(graph) - value_sized:
        for i, t in enumerate(graph.op(name).outputs):
            if t.is_resource or t.base_dtype in ("variant", "string") or t.is_ref:
                continue
            if t.shape is None or -1 in t.shape:
                out.add(f"{name}:{i}")
    return out


def _with_shapes(graph_def: GraphDef, graph: Graph, measured: Mapping[str, tuple[int, ...]],
                 kwargs: _Roles) -> Graph:
    """`graph` re-imported with the measured shapes in place of the unknown ones."""
    shapes = {}
    for op in graph:
        outs = list(op.outputs)
        for i, t in enumerate(outs):
            dims = measured.get(f"{op.name}:{i}")
            if dims is not None:
                outs[i] = TensorInfo(t.dtype, dims)
        shapes[op.name] = tuple(outs)
    return from_graph_def(graph_def, shapes=shapes, **kwargs)


WeightFn = Callable[[Graph, PlanningGraph], np.ndarray]


def uniform_weights(graph_b1: Graph, planning: PlanningGraph) -> np.ndarray:
    return np.ones(len(planning.ops))


def analyze(ctx: PassContext, graph: Graph, *, batch_size: int | None = None,
            rebuild: Callable[[int], Graph] | None = None, weight_fn: WeightFn) -> Analysis:
    """`weight_fn(graph_b1, planning)` gives each planned op's compute weight for grouping: the
    paper's are op compute times (`tag_tf.profile.weights.reference_weights`, estimated statically);
    `uniform_weights` counts ops."""
    opts = ctx.options
    with ctx.timer("analyze/batch_dims"):
        g1, g2, b1, b2 = batch_variants(graph, batch_size, rebuild)
        batch = compare(g1, g2, b1, b2)
    with ctx.timer("analyze/annotate"):
        annotations = ann_mod.annotate_graph(g1, batch, exact_batch_stats=opts.exact_batch_stats)
    with ctx.timer("analyze/simplify"):
        planning = simplify(g1)
    with ctx.timer("analyze/weights"):
        weights = weight_fn(g1, planning)
    with ctx.timer("analyze/grouping"):
        grouping = group_ops(g1, planning, weights, num_groups=opts.num_groups,
                             balance_factor=opts.balance_factor, seed=opts.seed)
    result = Analysis(graph, g1, g2, batch, annotations, planning, grouping, np.asarray(weights))
    _check(result)
    ctx.after_pass("analyze", result)
    return result


def _check(a: Analysis) -> None:
    """Postconditions (cheap): every op annotated, every training op grouped, colocation respected."""
    missing = [op.name for op in a.graph if op.name not in a.annotations]
    if missing:
        raise AssertionError(f"analysis: ops without annotation: {missing[:3]}")
    train = training_ops(a.graph)
    ungrouped = [n for n in train if n not in a.grouping.group_of]
    if ungrouped:
        raise AssertionError(f"analysis: training ops without a group: {ungrouped[:3]}")
    for x, y in colocation_pairs(a.graph, sorted(train)):
        if a.grouping.group_of[x] != a.grouping.group_of[y]:
            raise AssertionError(f"analysis: colocated ops {x!r} and {y!r} are in different groups")


__all__ = ["Analysis", "WeightFn", "analyze", "batch_variants", "uniform_weights", "TensorRef"]
