"""The compile pass: (analysis, strategy, devices) -> distributed GraphDef + name maps.

Requires: the strategy fits the analysis (one plan per group, existing devices).
Ensures (checked when `check=True`): the GraphDef imports into TensorFlow, it is a DAG, and every
mapped fetch has the original tensor's static shape and dtype.
"""
from __future__ import annotations

import dataclasses
import hashlib
import types
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from tag_tf.analysis import Analysis
from tag_tf.compiler.builder import GraphBuilder
from tag_tf.compiler.devices import DeviceMap
from tag_tf.context import PassContext
from tag_tf.errors import CompileError, GraphError, tf_reason
from tag_tf.ir import Graph, TensorRef
from tag_tf.placement.layout import Placement, resolve
from tag_tf.strategy import Strategy

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.framework.node_def_pb2 import NodeDef


@dataclasses.dataclass(frozen=True)
class Compiled:
    graph_def: GraphDef
    fetch_tensors: Mapping[str, str]          # original tensor name -> tensor with its whole value
    run_ops: Mapping[str, str]                # original op name -> op running all its instances
    variables: Mapping[str, tuple[str, ...]]  # original variable op -> its copies (op names)
    placement: Placement
    devices: DeviceMap
    stats: Mapping[str, int]
    builder: GraphBuilder = dataclasses.field(repr=False, compare=False)

    @property
    def instances(self) -> Mapping[str, Sequence[str]]:
        """Original op -> the compiled ops running it (one per replica or device), read-only; it
        grows as `extend` adds adapters."""
        return types.MappingProxyType(self.builder.instances)

    def extend(self, tensors: Iterable[str] = (), ops: Iterable[str] = ()) -> tuple[list[NodeDef], dict[str, str]]:
        """Adapters for more fetches after compilation: (new NodeDefs to add to the live graph,
        original name -> new name). Adapters already built are reused."""
        before = len(self.builder.f.nodes)
        names = {t: self.builder.fetch_tensor(t) for t in tensors}
        names.update({o: self.builder.fetch_op(o) for o in ops})
        return list(self.builder.f.nodes[before:]), names


def check_compilable(graph: Graph) -> None:
    """CompileError, naming the op, for graphs no strategy can compile. Cheap: callers run it before
    planning, so a refusal costs no search and leaves no cached plan behind. (TF1 v1 control flow is
    compiled: its ops run whole on every copy, each copy of a loop in its own frame.)"""


def compile_strategy(ctx: PassContext, analysis: Analysis, strategy: Strategy, devices: DeviceMap, *,
                     fetches: Iterable[str] = (), run_ops: Iterable[str] = (), check: bool = False) -> Compiled:
    from tensorflow.core.framework import graph_pb2

    analysis = analysis.for_strategy(strategy)    # a plan with refined groups compiles on those
    graph = analysis.graph
    check_compilable(graph)
    with ctx.timer("compile/placement"):
        placement = resolve(analysis, strategy, len(devices))
    with ctx.timer("compile/build"):
        builder = GraphBuilder(analysis, placement, devices, strategy.fusion_bytes,
                               instance_key_base(analysis, strategy, devices),
                               sync_after_backward=strategy.sync_after_backward, ordered_links=strategy.ordered_links)
        builder.emit_all()
        graph_counts = dict(builder.counts)     # conversions of the graph itself, before fetch adapters
        wanted_tensors = list(dict.fromkeys([*(t for t in [graph.meta.loss] if t), *fetches]))
        wanted_ops = list(dict.fromkeys([*(o for o in [graph.meta.train_op] if o), *run_ops]))
        fetch_map = {TensorRef.parse(t).name: builder.fetch_tensor(t) for t in wanted_tensors}
        op_map = {o: builder.fetch_op(o) for o in wanted_ops}
    gd = graph_pb2.GraphDef()
    gd.node.extend(builder.f.nodes)
    if graph.versions is not None:
        gd.versions.CopyFrom(graph.versions)
    if graph.library is not None:
        gd.library.CopyFrom(graph.library)
    variables = {v: tuple(builder.instances[v]) for v in graph.variables}
    stats = dict(graph_counts, ops=len(gd.node), original_ops=len(graph),
                 fetch_adapters=builder.counts["other_conversions"] - graph_counts["other_conversions"])
    result = Compiled(gd, types.MappingProxyType(fetch_map), types.MappingProxyType(op_map),
                      types.MappingProxyType(variables), placement, devices, types.MappingProxyType(stats),
                      builder)
    if check:
        with ctx.timer("compile/check"):
            check_compiled(analysis, result)
    ctx.after_pass("compile", result)
    return result


def instance_key_base(analysis: Analysis, strategy: Strategy, devices: DeviceMap) -> int:
    """Where this graph's collective instance keys start. A long-running server keeps each instance
    key's shape: two graphs run on the same servers (another plan, another model) must use disjoint
    keys, or the second fails with a shape mismatch. 2^16 slots of 2^14 keys each, by content hash."""
    text = f"{analysis.graph.fingerprint}|{strategy.fingerprint}|{'|'.join(devices.names)}"
    return (int(hashlib.sha256(text.encode()).hexdigest(), 16) % 2**16) * 2**14


def check_compiled(analysis: Analysis, compiled: Compiled) -> None:
    """Postconditions: imports, is a DAG, fetches keep their static shape and dtype."""
    import tensorflow as tf

    from tag_tf.ir.importer import topological_order

    gd = compiled.graph_def
    try:
        topological_order(gd, {n.name: n for n in gd.node})
    except GraphError as e:
        raise CompileError(f"compiled graph is not a DAG: {e}") from None
    g = tf.Graph()
    try:
        with g.as_default():
            tf.graph_util.import_graph_def(gd, name="")
    except (ValueError, tf.errors.InvalidArgumentError) as e:
        raise CompileError(f"compiled graph does not import into TensorFlow: {tf_reason(e)}") from None
    for orig, new in compiled.fetch_tensors.items():
        want = analysis.graph.tensor(orig)
        got = g.get_tensor_by_name(new)
        got_shape = None if got.shape.rank is None else tuple(-1 if d is None else d for d in got.shape.as_list())
        if got.dtype.base_dtype.name != want.base_dtype:
            raise CompileError(f"fetch {orig}: dtype changed from {want.base_dtype} to {got.dtype.name}")
        if want.shape is not None and got_shape is not None and want.shape != got_shape:
            raise CompileError(f"fetch {orig}: static shape changed from {want.shape} to {got_shape}")
