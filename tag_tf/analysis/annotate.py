"""Annotate every op with its replication semantics (see `states.py`), in topological order."""
from __future__ import annotations

from typing import Mapping

from tag_tf.analysis.batch_dims import BatchDims
from tag_tf.analysis.rules import OpView, annotate, decide
from tag_tf.analysis.states import FULL, Category, Flag, OpAnnotation, State, local, split
from tag_tf.ir import Graph, TensorRef


def annotate_graph(graph: Graph, batch: BatchDims, *, exact_batch_stats: bool = False
                   ) -> dict[str, OpAnnotation]:
    """`graph` must carry static shapes at batch size `batch.b1`."""
    sources = {TensorRef.parse(t).op for t in graph.meta.feeds}
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
        result[op.name] = decide(view)
    return result


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

