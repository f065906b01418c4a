"""Batch dimensions by comparing the same graph at two batch sizes.

A dim that is `k * B` at both batch sizes (same integer k) is a batch dim with multiplier k (k > 1 for
flattened tensors such as [B*T, H]). Int constants whose values change between the two graphs carry
the batch size (TF folds static shapes into constants such as Tile multiples and Reshape targets).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from tag_tf.errors import GraphError
from tag_tf.ir import Graph, TensorRef


@dataclasses.dataclass(frozen=True, slots=True)
class TensorBatch:
    """How a tensor's shape depends on the batch size."""

    axis: int | None = None     # the batch axis, when exactly one dim is k*B
    mult: int = 1               # k
    irregular: bool = False     # depends on B but not as a clean k*B dim (B+1, B/2, two batch axes...)
    dynamic: bool = False       # some dim is unknown even with static inputs (data-dependent sizes)

    @property
    def batched(self) -> bool:
        return self.axis is not None


UNBATCHED = TensorBatch()


@dataclasses.dataclass(frozen=True)
class BatchDims:
    b1: int
    b2: int
    tensors: Mapping[TensorRef, TensorBatch]
    # Int constants whose value carries the batch size: op name -> boolean mask of scaled entries.
    # (Float constants that changed, e.g. a folded 1/B, stay global: nothing to record.)
    batch_consts: Mapping[str, np.ndarray]

    def of(self, ref: TensorRef) -> TensorBatch:
        return self.tensors.get(ref, UNBATCHED)


def compare(g1: Graph, g2: Graph, b1: int, b2: int) -> BatchDims:
    """Compare two imports of one graph at batch sizes b1 != b2 (op names must match)."""
    if b1 == b2:
        raise ValueError("batch sizes must differ")
    tensors: dict[TensorRef, TensorBatch] = {}
    batch_consts: dict[str, np.ndarray] = {}
    for op in g1:
        if op.name not in g2:
            raise GraphError(f"op {op.name!r} exists at batch {b1} but not at batch {b2}")
        other = g2.op(op.name)
        for i, (t1, t2) in enumerate(zip(op.outputs, other.outputs)):
            tb = _compare_shape(t1.shape, t2.shape, b1, b2)
            if tb != UNBATCHED:
                tensors[TensorRef(op.name, i)] = tb
        if op.type == "Const":
            v1, v2 = g1.attr(op.name, "value"), g2.attr(op.name, "value")
            if v1.shape != v2.shape or not np.array_equal(v1, v2):  # noqa: SIM102 (each test has its comment)
                if np.issubdtype(v1.dtype, np.integer) and v1.shape == v2.shape and v1.ndim <= 1:
                    scaled = (v1 != v2) & (v1 % b1 == 0) & (v2 * b1 == v1 * b2)
                    if np.array_equal(scaled, v1 != v2):
                        batch_consts[op.name] = scaled
                        continue
                # Consts whose *shape* scales are handled through `tensors` (sliced per replica).
    return BatchDims(b1, b2, tensors, batch_consts)


def _compare_shape(s1, s2, b1: int, b2: int) -> TensorBatch:
    if s1 is None or s2 is None:
        return TensorBatch(dynamic=True) if s1 != s2 or s1 is None else UNBATCHED
    if len(s1) != len(s2):
        return TensorBatch(irregular=True)
    axes, mults, irregular, dynamic = [], [], False, False
    for axis, (d1, d2) in enumerate(zip(s1, s2)):
        if d1 < 0 or d2 < 0:
            dynamic = True
            continue
        if d1 == d2:
            continue
        k, rem = divmod(d1, b1)
        if rem == 0 and k > 0 and d2 == k * b2:
            axes.append(axis)
            mults.append(k)
        else:
            irregular = True
    if len(axes) > 1:
        return TensorBatch(irregular=True, dynamic=dynamic)
    if axes:
        return TensorBatch(axes[0], mults[0], irregular, dynamic)
    return TensorBatch(irregular=irregular, dynamic=dynamic)


# Input positions whose value is a shape/size (TF folds static shapes into consts there).
SHAPE_LIKE_INPUTS: Mapping[str, tuple[int, ...]] = {
    "Reshape": (1,), "Tile": (1,), "Fill": (0,), "BroadcastTo": (1,), "Slice": (1, 2),
    "StridedSlice": (1, 2, 3), "StridedSliceGrad": (0, 1, 2, 3), "RandomUniform": (0,),
    "RandomStandardNormal": (0,), "TruncatedNormal": (0,), "RandomUniformInt": (0,),
    "Empty": (0,), "ScatterNd": (2,), "Conv2DBackpropInput": (0,), "Conv2DBackpropFilter": (1,),
    "DepthwiseConv2dNativeBackpropInput": (0,), "DepthwiseConv2dNativeBackpropFilter": (1,),
    "Conv3DBackpropInputV2": (0,), "Conv3DBackpropFilterV2": (1,), "AvgPoolGrad": (0,),
    "AvgPool3DGrad": (0,), "UnsortedSegmentSum": (2,), "UnsortedSegmentMax": (2,),
    "UnsortedSegmentMin": (2,), "UnsortedSegmentProd": (2,), "Range": (0, 1, 2), "SplitV": (1,),
    "ResizeBilinear": (1,), "ResizeNearestNeighbor": (1,), "BroadcastArgs": (0, 1),
    "BroadcastGradientArgs": (0, 1), "Pad": (1,), "PadV2": (1,), "MirrorPad": (1,),
    "QueueDequeueManyV2": (1,), "QueueDequeueMany": (1,), "QueueDequeueUpToV2": (1,), "QueueDequeueUpTo": (1,),
}


SUBSTITUTIONS = ("leading", "equal", "multiples")


def substitute_batch(graph_def, inputs: Mapping[str, tuple[int, ...]], b1: int, b2: int,
                     within: frozenset[str] | None = None, mode: str = "multiples"):
    """A copy of a static-batch GraphDef at batch b2, for graphs we cannot rebuild.

    Placeholder shapes are overridden; int constants feeding shape-like inputs of ops in `within`
    (the training ops; default all) are rescaled to b2 where they hold the batch size: `mode`
    "leading" rescales a first entry equal to b1 (the batch leads TF's shape vectors), "equal" every
    entry equal to b1, "multiples" every multiple of b1 (flattened [B*T] shapes).
    This is a heuristic (a hidden size equal to a multiple of the batch size would be rescaled too);
    the caller checks that shape inference still succeeds. Initialisers are outside `within`: their
    shapes are the variables' and never carry the batch.
    """
    from tensorflow.core.framework import graph_pb2
    from tensorflow.python.framework import tensor_util

    gd = graph_pb2.GraphDef()
    gd.CopyFrom(graph_def)
    by_name = {n.name: n for n in gd.node}
    shape_like_consts: set[str] = set()
    for node in gd.node:
        if within is not None and node.name not in within:
            continue
        for pos in SHAPE_LIKE_INPUTS.get(node.op, ()):
            if pos < len(node.input) and not node.input[pos].startswith("^"):
                src = TensorRef.parse(node.input[pos]).op
                if src in by_name and by_name[src].op == "Const":
                    shape_like_consts.add(src)
    for name in shape_like_consts:
        node = by_name[name]
        value = tensor_util.MakeNdarray(node.attr["value"].tensor)
        if not np.issubdtype(value.dtype, np.integer) or value.ndim > 1:
            continue
        if mode == "multiples":
            hit = (value > 0) & (value % b1 == 0)
        elif mode == "equal":
            hit = value == b1
        else:
            hit = np.zeros(value.shape, dtype=bool)
            if value.size and value.reshape(-1)[0] == b1:
                hit.reshape(-1)[0] = True
        scaled = np.where(hit, value // b1 * b2, value).astype(value.dtype)
        if not np.array_equal(scaled, value):
            node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(scaled, dtype=value.dtype,
                                                                           shape=value.shape))
    from tag_tf.ir.importer import override_input_shapes

    override_input_shapes(gd, inputs)
    return gd
