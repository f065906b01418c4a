"""Annotate every op with its replication semantics (see `states.py`), in topological order."""
from __future__ import annotations

from collections.abc import Mapping

from tag_tf.analysis.batch_dims import BatchDims
from tag_tf.analysis.rules import OpView, annotate, decide, needs_full
from tag_tf.analysis.states import FULL, Category, Flag, OpAnnotation, State, local, split
from tag_tf.ir import Graph, TensorRef, opsets


def annotate_graph(graph: Graph, batch: BatchDims, *, exact_batch_stats: bool = False
                   ) -> dict[str, OpAnnotation]:
    """`graph` must carry static shapes at batch size `batch.b1`."""
    sources = {TensorRef.parse(t).op for t in graph.meta.feeds}
    looped = v1_control_flow(graph)
    result: dict[str, OpAnnotation] = {}
    for op in graph:
        out_batch = tuple(batch.of(TensorRef(op.name, j)) for j in range(len(op.outputs)))
        if op.name in sources:
            # Fed once, whole; consumers that are replicated split it.
            result[op.name] = annotate(Category.CONCAT, [FULL] * len(op.outputs), [FULL] * len(op.inputs),
                                       "batch-input", (Flag.SOURCE,))
            continue
        if op.type == "Const":
            result[op.name] = _const(op.name, out_batch[0] if out_batch else None, batch)
            continue
        ins = tuple(_input_state(result, ref) for ref in op.inputs)
        in_batch = tuple(batch.of(ref) for ref in op.inputs)
        view = OpView(op, graph, ins, in_batch, out_batch, exact_batch_stats)
        if op.name in looped:
            # TF1 control flow runs whole, like a functional While/If (rules.NEEDS_FULL): every copy
            # computes the whole batch, and nothing is split or gathered inside a frame.
            result[op.name] = needs_full(view, "v1-control-flow")
        else:
            result[op.name] = decide(view)
    return result


def _frame_depths(graph: Graph) -> dict[str, int]:
    """Op -> how many TF1 while-loop frames it is inside (0: the root frame). Enter opens a frame,
    Exit leaves one, every other op is in its inputs' frame (a loop's back edge, seen later, adds
    nothing)."""
    depths: dict[str, int] = {}
    for op in graph:
        inputs = [depths.get(r.op, 0) for r in op.inputs] + [depths.get(c, 0) for c in op.control_inputs]
        depth = max(inputs, default=0)
        if op.type in ("Enter", "RefEnter"):
            depth += 1
        elif op.type in ("Exit", "RefExit"):
            depth = max(0, depth - 1)
        depths[op.name] = depth
    return depths


def v1_control_flow(graph: Graph) -> frozenset[str]:
    """The ops of TF1 control flow: Switch/Merge/Enter/Exit/NextIteration/LoopCond and every op inside a
    while loop's frame (between its Enter and Exit ops)."""
    def find() -> frozenset[str]:
        depths = _frame_depths(graph)
        return frozenset(op.name for op in graph if op.type in opsets.CONTROL_FLOW_OPS or depths[op.name] > 0)
    return graph.cached("v1_control_flow", find)


def unfetchable(graph: Graph) -> set[str]:
    """Ops whose outputs a run cannot fetch: inside a TF1 loop frame, or on a tf.cond branch (a Switch
    output until a Merge: the branch not taken is dead)."""
    depths = _frame_depths(graph)
    out = {name for name, depth in depths.items() if depth > 0}
    for op in graph:
        if op.type in ("Switch", "RefSwitch") or (
                op.type not in ("Merge", "RefMerge") and any(r.op in out for r in op.inputs)):
            out.add(op.name)
    return out


def _input_state(result: Mapping[str, OpAnnotation], ref: TensorRef) -> State:
    ann = result.get(ref.op)
    if ann is None:          # a loop back-edge: not yet seen
        return FULL
    return ann.outputs[ref.index] if ref.index < len(ann.outputs) else FULL


def _const(name: str, out_batch, batch: BatchDims) -> OpAnnotation:
    if out_batch is not None and out_batch.batched and not out_batch.irregular:
        return annotate(Category.CONCAT, [split(out_batch.axis, out_batch.mult)], [], "const-batch-rows",
                        (Flag.SLICE_CONST,))
    if name in batch.batch_consts:
        return annotate(Category.CONCAT, [local()], [], "const-batch-size", (Flag.LOCAL_CONST,))
    return annotate(Category.OTHER, [FULL], [], "invariant")


def category_counts(annotations: Mapping[str, OpAnnotation], ops) -> dict[str, int]:
    counts = {c.value: 0 for c in Category}
    for name in ops:
        counts[annotations[name].category.value] += 1
    return counts


def unclassified_types(annotations: Mapping[str, OpAnnotation], graph: Graph, ops) -> list[str]:
    return sorted({graph.op(n).type for n in ops if Flag.UNCLASSIFIED in annotations[n].flags})

