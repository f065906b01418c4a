"""Static work of an op: floating-point operations and bytes moved, from its type and static shapes.

`op_work(graph, name)` gives one op's `OpWork`; `graph_work(graph, names)` gives arrays for many ops
(bert-large's ~27k ops take well under a second). Every op also gets an *op class* (`OP_CLASSES`):
the analytical cost model keeps one compute and one memory efficiency factor per class, because a
cuBLAS GEMM, an element-wise kernel and a reduction reach very different fractions of peak.

Conventions
-----------
* A multiply-add counts as 2 FLOPs (MatMul [m,k]x[k,n] = 2mkn). Element-wise ops count a few FLOPs
  per output element (1 for arithmetic, 2-4 for gradients and transcendental functions); these ops are
  memory-bound on every GPU we model, so the exact factor hardly matters.
* bytes_read is the bytes of the op's tensor inputs (resource handles count 0), bytes_written the bytes
  of its outputs -- except where the op touches only part of an input: Gather/Slice read what they
  output, optimizer updates read and write the variable and its slots (resource inputs, whose size the
  handle does not carry: the gradient's shape stands in for it).
* Ops that move no data on a device (Const, Shape, Reshape, Identity, NoOp, variable handles,
  ReadVariableOp, control flow...) have zero work and the class "none": the cost model charges them a
  host-side overhead only.
* Unknown shapes: an unknown dim (-1) counts as 1 and an unknown rank as 0 elements -- we use what is
  known, so a [-1, 128] tensor counts as one sample's worth. Import the graph with concrete batch
  shapes (`from_graph_def(..., input_shapes=...)`) to get real numbers.
* Unknown op types are treated as element-wise: 1 FLOP per output element plus their input/output bytes.

Grappler (evaluated, not used)
------------------------------
TF 2.15's Python exposes Grappler's analytical estimator through a virtual cluster:
`Cluster(devices=[NamedDevice(properties=DeviceProperties(type="GPU", num_cores, frequency,
bandwidth, ...))])` and `Cluster.MeasureCosts(Item(meta_graph))`. It handles our zoo graphs (it
prunes them to the train op's fan-in: resnet101-tiny 13.5k nodes -> 6.5k timed in 1-5 s; cnn 0.02 s)
and covers the heavy op types (MatMul, Conv2D and both backprops, FusedBatchNorm*, pooling,
element-wise, ResourceApplyAdam). But the per-op `OpPerformance.compute_cost/compute_time` come back
0 (times only through the step_stats timeline, in whole nanoseconds); it charges no per-op
executor/launch overhead, so two thirds of the ops get 0-1 ns (median per-op error ~99% against
this CPU's measurements, step totals off by -58%..+740%); its efficiencies are fixed in C++ (nothing
to calibrate); it wants SM count and clock rather than datasheet FLOP/s; it returns times, not FLOPs
and bytes, so a linear model in the batch size needs two runs per device type; and the three conv
kinds get identical times. So we keep this shape-based estimator (vectorised, class-aware,
calibratable); `benchmarks/costmodel_calibrate.py` re-runs the comparison and records it in
`benchmarks/results/costmodel.json`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence

import numpy as np

from tag_tf.ir.graph import FLOAT_DTYPES, Graph, Op, TensorInfo

# Op classes, in the order class indices refer to.
OP_CLASSES: tuple[str, ...] = ("matmul", "conv", "elementwise", "reduction", "data", "optimizer", "none")
CLASS_INDEX: dict[str, int] = {c: i for i, c in enumerate(OP_CLASSES)}


@dataclasses.dataclass(frozen=True, slots=True)
class OpWork:
    """Work of one op instance: FLOPs and bytes read/written (at the graph's static shapes)."""

    flops: float
    bytes_read: float
    bytes_written: float
    op_class: str = "elementwise"     # one of OP_CLASSES

    @property
    def bytes(self) -> float:
        return self.bytes_read + self.bytes_written


# GEMM-like kernel families (index 0: not one): what the GPU kernel model (profile/kernels.py) keeps
# one efficiency for. A convolution is an implicit GEMM; "conv_stem" is a strided or few-channel
# (<= 4 input channels: an image) convolution, which cuDNN runs with other kernels than the body's.
KERNEL_FAMILIES: tuple[str, ...] = ("", "mm", "bmm", "conv3x3", "conv1x1", "conv_kxk", "conv_stem")
KERNEL_INDEX: dict[str, int] = {f: i for i, f in enumerate(KERNEL_FAMILIES)}


@dataclasses.dataclass(frozen=True, eq=False)
class KernelShapes:
    """The GEMM view of matmul and convolution ops (aligned with a GraphWork's ops).

    A MatMul [m,k]x[k,n] is (batch 1, m, n, k); a batched one multiplies `batch` such products; a
    convolution is the implicit GEMM cuDNN runs: forward (N*Ho*Wo, Cout, kh*kw*Cin), input gradient
    (N*H*W, Cin, kh*kw*Cout), filter gradient (kh*kw*Cin, Cout, N*Ho*Wo). `family` indexes
    KERNEL_FAMILIES (0 for every other op, which the plain roofline costs); `backward` marks gradient
    kernels (a conv backprop op, or an op under a "gradients" name scope); `transposed` a matmul with a
    transposed operand; `itemsize` the output's bytes per element (2: half precision); for
    convolutions `channels` the input channels and `spatial` the output's height x width (0 for
    matmuls): what decides whether cuDNN can use Winograd."""

    family: np.ndarray
    backward: np.ndarray
    transposed: np.ndarray
    batch: np.ndarray
    m: np.ndarray
    n: np.ndarray
    k: np.ndarray
    itemsize: np.ndarray
    channels: np.ndarray
    spatial: np.ndarray

    @classmethod
    def empty(cls, n: int) -> KernelShapes:
        z = np.zeros(n)
        return cls(np.zeros(n, dtype=np.int8), np.zeros(n, dtype=bool), np.zeros(n, dtype=bool), z.copy(),
                   z.copy(), z.copy(), z.copy(), np.full(n, 4, dtype=np.int8), z.copy(), z.copy())


@dataclasses.dataclass(frozen=True, eq=False)
class GraphWork:
    """`OpWork` of many ops as arrays (aligned with `op_names`); `classes` indexes OP_CLASSES;
    `kernels` the GEMM view of the matmuls and convolutions among them."""

    op_names: tuple[str, ...]
    flops: np.ndarray
    bytes_read: np.ndarray
    bytes_written: np.ndarray
    classes: np.ndarray
    kernels: KernelShapes | None = None

    @property
    def bytes(self) -> np.ndarray:
        return self.bytes_read + self.bytes_written

    def work(self, i: int) -> OpWork:
        return OpWork(float(self.flops[i]), float(self.bytes_read[i]), float(self.bytes_written[i]),
                      OP_CLASSES[int(self.classes[i])])


# ---------------------------------------------------------------------------------------------
# Op-type tables
# ---------------------------------------------------------------------------------------------
ZERO_WORK = frozenset({
    "Const", "HostConst", "Shape", "ShapeN", "Size", "Rank", "Reshape", "Identity", "IdentityN", "NoOp",
    "VarHandleOp", "VariableV2", "Variable", "ReadVariableOp", "Placeholder", "PlaceholderWithDefault",
    "_Arg", "_Retval", "StopGradient", "PreventGradient", "Squeeze", "ExpandDims", "VarIsInitializedOp",
    "IsVariableInitialized", "ConcatOffset", "BroadcastGradientArgs", "InvertPermutation", "Enter",
    "Exit", "Merge", "Switch", "NextIteration", "LoopCond", "RefEnter", "RefExit", "RefMerge",
    "RefSwitch", "RefNextIteration", "RefIdentity", "ControlTrigger", "Assert", "Print", "PrintV2",
    "DestroyResourceOp", "Snapshot", "EnsureShape", "SaveV2", "RestoreV2", "MergeV2Checkpoints",
    "ShardedFilename", "StringJoin", "_Send", "_Recv", "_HostSend", "_HostRecv",
})

# FLOPs per output element of element-wise ops (anything not listed and not handled below: 1).
_ELEMENTWISE_COST: dict[str, float] = {
    **{t: 4.0 for t in ("Exp", "Expm1", "Log", "Log1p", "Tanh", "Sigmoid", "Erf", "Erfc", "Rsqrt", "Sqrt",
                        "Sin", "Cos", "Tan", "Atan", "Atan2", "Softplus", "Softsign", "Pow", "Elu", "Selu",
                        "Gelu", "SoftplusGrad", "Lgamma", "Digamma")},
    **{t: 2.0 for t in ("TanhGrad", "SigmoidGrad", "ReluGrad", "Relu6Grad", "LeakyReluGrad", "EluGrad",
                        "SeluGrad", "SquaredDifference", "ClipByValue", "Reciprocal", "ReciprocalGrad",
                        "SoftsignGrad")},
    **{t: 3.0 for t in ("RsqrtGrad", "SqrtGrad")},
    # Counter-based RNG (Philox) plus the distribution transform.
    **{t: 8.0 for t in ("RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
                        "StatelessRandomUniformV2", "StatelessRandomNormalV2",
                        "StatelessTruncatedNormalV2", "StatelessRandomUniform", "StatelessRandomNormal")},
}
# Element-wise ops that only write (or copy) and do no arithmetic.
_FILL_OPS = frozenset({"Fill", "ZerosLike", "OnesLike", "BroadcastTo", "Empty"})

_REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "ArgMax", "ArgMin",
                         "EuclideanNorm"})
# FLOPs per element of the (first) input for normalisation / softmax-like ops.
_ROWWISE_COST: dict[str, float] = {
    "L2Loss": 2.0, "BiasAddGrad": 1.0,
    "Softmax": 5.0, "LogSoftmax": 5.0, "SoftmaxCrossEntropyWithLogits": 6.0,
    "SparseSoftmaxCrossEntropyWithLogits": 5.0,
    "FusedBatchNorm": 5.0, "FusedBatchNormV2": 5.0, "FusedBatchNormV3": 5.0,     # mean, var, normalise
    "FusedBatchNormGrad": 8.0, "FusedBatchNormGradV2": 8.0, "FusedBatchNormGradV3": 8.0,
    "LRN": 10.0, "LRNGrad": 12.0,
}
_POOLS = frozenset({"MaxPool", "AvgPool", "MaxPool3D", "AvgPool3D", "MaxPoolV2", "MaxPoolWithArgmax"})
_POOL_GRADS = frozenset({"MaxPoolGrad", "AvgPoolGrad", "MaxPool3DGrad", "AvgPool3DGrad", "MaxPoolGradV2",
                         "MaxPoolGradGrad", "MaxPoolGradGradV2", "MaxPoolGradWithArgmax"})

# Data movement: no arithmetic, bytes in and out (generic rule) unless handled specially below.
_DATA_OPS = frozenset({
    "ConcatV2", "Concat", "Pack", "Unpack", "Split", "SplitV", "Transpose", "ConjugateTranspose", "Pad",
    "PadV2", "MirrorPad", "MirrorPadGrad", "Tile", "ReverseV2", "Reverse", "StridedSliceGrad",
    "DynamicStitch", "ParallelDynamicStitch", "DepthToSpace", "SpaceToDepth", "SpaceToBatchND",
    "BatchToSpaceND", "ScatterNd", "TensorScatterUpdate", "TensorScatterAdd", "Copy", "DeepCopy",
    "MatrixBandPart", "MatrixDiag", "MatrixDiagPart", "MatrixDiagV3", "MatrixDiagPartV3", "OneHot", "Range",
    "Cast", "Bitcast", "ResizeNearestNeighbor", "ResizeNearestNeighborGrad",
})
# Ops that read only what they output (plus their index tensors).
_PARTIAL_READS = frozenset({"Gather", "GatherV2", "ResourceGather", "GatherNd", "ResourceGatherNd",
                            "Slice", "StridedSlice"})
_SEGMENT_SUMS = frozenset({"UnsortedSegmentSum", "UnsortedSegmentMax", "UnsortedSegmentMin",
                           "UnsortedSegmentProd", "SegmentSum", "SegmentMean", "SegmentMax", "SegmentMin",
                           "SparseSegmentSum", "SparseSegmentMean", "SparseSegmentSqrtN",
                           "SparseSegmentSumGrad", "SparseSegmentMeanGrad", "SparseSegmentSqrtNGrad"})
_ASSIGNS = frozenset({"Assign", "AssignVariableOp"})
_ASSIGN_ARITH = frozenset({"AssignAdd", "AssignSub", "AssignAddVariableOp", "AssignSubVariableOp"})

# FLOPs per updated element of optimizer updates (after stripping "Resource"/"Sparse").
_OPTIMIZER_COST: dict[str, float] = {
    "ApplyGradientDescent": 2.0, "ApplyProximalGradientDescent": 6.0, "ApplyMomentum": 4.0,
    "ApplyKerasMomentum": 4.0, "ApplyAdagrad": 6.0, "ApplyAdagradV2": 6.0, "ApplyAdagradDA": 10.0,
    "ApplyProximalAdagrad": 10.0, "ApplyAdam": 12.0, "ApplyAdaMax": 10.0, "ApplyAdamWithAmsgrad": 14.0,
    "ApplyRMSProp": 10.0, "ApplyCenteredRMSProp": 12.0, "ApplyAdadelta": 12.0, "ApplyFtrl": 20.0,
    "ApplyFtrlV2": 20.0, "ApplyAddSign": 8.0, "ApplyPowerSign": 10.0,
}

_MATMULS = frozenset({"MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "SparseMatMul",
                      "_FusedMatMul"})
_CONVS = frozenset({"Conv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter", "Conv3D",
                    "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2", "Conv3DBackpropInput",
                    "Conv3DBackpropFilter", "_FusedConv2D", "DepthwiseConv2dNative",
                    "DepthwiseConv2dNativeBackpropInput", "DepthwiseConv2dNativeBackpropFilter", "Conv"})


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def _elems(t: TensorInfo) -> int:
    """Elements of a tensor; unknown dims count 1, unknown rank 0 (see module docstring)."""
    shape = t.shape
    if shape is None:
        return 0
    n = 1
    for d in shape:
        if d >= 0:
            n *= d
    return n


def _nbytes(t: TensorInfo) -> int:
    return _elems(t) * t.itemsize


def _prod(dims: Iterable[int]) -> int:
    n = 1
    for d in dims:
        if d >= 0:
            n *= d
    return n


def _inputs(graph: Graph, op: Op) -> list[TensorInfo]:
    out = []
    for ref in op.inputs:
        src = graph.op(ref.op)
        # An input past the producer's known outputs (shape inference gave none) counts as empty.
        out.append(src.outputs[ref.index] if ref.index < len(src.outputs) else TensorInfo("resource", None))
    return out


_Handler = Callable[[Graph, Op, list, tuple, int, int], tuple[float, float, float, str]]


# ---------------------------------------------------------------------------------------------
# Per-family rules: each returns (flops, bytes_read, bytes_written, class)
# ---------------------------------------------------------------------------------------------
def _matmul(graph, op, ins, outs, read, written):
    if not ins or ins[0].shape is None or len(ins[0].shape) < 2:
        return float(_elems(outs[0]) if outs else 0), read, written, "matmul"
    a = ins[0].shape
    if op.type == "MatMul" or op.type in ("SparseMatMul", "_FusedMatMul"):
        k = a[0] if graph.attr(op.name, "transpose_a", False) else a[1]
    else:
        adj = graph.attr(op.name, "adj_x", False)
        k = a[-2] if adj else a[-1]
    return 2.0 * _elems(outs[0]) * max(k, 1), read, written, "matmul"


def _einsum(graph, op, ins, outs, read, written):
    equation = str(graph.attr(op.name, "equation", "") or "").replace(" ", "")
    lhs, _, rhs = equation.partition("->")
    sizes: dict[str, int] = {}
    for subs, info in zip(lhs.split(","), ins):
        shape = info.shape
        if shape is None:
            continue
        if "..." in subs:
            head, _, tail = subs.partition("...")
            dims = list(shape[:len(head)]) + list(shape[len(shape) - len(tail):] if tail else [])
            subs = head + tail
        else:
            dims = list(shape)
        for letter, d in zip(subs, dims):
            if d >= 0:
                sizes[letter] = max(sizes.get(letter, 1), d)
    out_letters = set(rhs.replace("...", ""))
    contracted = [c for c in sizes if c not in out_letters]
    out = _elems(outs[0]) if outs else 0
    if not contracted:   # a transpose / broadcast product: element-wise
        return float(out), read, written, "elementwise"
    return 2.0 * out * _prod(sizes[c] for c in contracted), read, written, "matmul"


def _conv(graph, op, ins, outs, read, written):
    t = op.type
    if "BackpropFilter" in t:
        filt = outs[0].shape if outs else None
        grad = ins[2] if len(ins) > 2 else None
    elif "BackpropInput" in t:
        filt = ins[1].shape if len(ins) > 1 else None
        grad = ins[2] if len(ins) > 2 else None
    else:
        filt = ins[1].shape if len(ins) > 1 else None
        grad = outs[0] if outs else None
    if filt is None or grad is None or len(filt) < 3:
        return float(_elems(outs[0]) if outs else 0), read, written, "conv"
    # Regular conv filters are [k..., Cin, Cout]: every output-side element does prod(k)*Cin MACs.
    # Depthwise filters are [kh, kw, Cin, mult]: each output channel sees one input channel.
    taps = _prod(filt[:-2]) if t.startswith("Depthwise") else _prod(filt[:-1])
    return 2.0 * _elems(grad) * taps, read, written, "conv"


def _window(graph: Graph, op: Op, ins, outs) -> int:
    ksize = graph.attr(op.name, "ksize")
    if ksize:
        return max(_prod(ksize), 1)
    # MaxPoolV2 & co take ksize as a tensor: approximate by the input/output element ratio.
    if ins and outs and _elems(outs[0]):
        return max(_elems(ins[0]) // _elems(outs[0]), 1)
    return 1


def _pool(graph, op, ins, outs, read, written):
    return float(_elems(outs[0]) * _window(graph, op, ins, outs)), read, written, "reduction"


def _pool_grad(graph, op, ins, outs, read, written):
    grad = ins[-1] if ins else None
    return float((_elems(grad) if grad else 0) * _window(graph, op, ins, outs)), read, written, "reduction"


def _reduction(graph, op, ins, outs, read, written):
    return float(_elems(ins[0]) if ins else 0), read, written, "reduction"


def _rowwise(graph, op, ins, outs, read, written):
    return _ROWWISE_COST[op.type] * (_elems(ins[0]) if ins else 0), read, written, "reduction"


def _fill(graph, op, ins, outs, read, written):
    # Fill/ZerosLike only write their output (ZerosLike's input is read for its shape only).
    return 0.0, 0, written, "elementwise"


def _partial_read(graph, op, ins, outs, read, written):
    # Gather/Slice read the rows/elements they output, plus index/begin/size tensors.
    small = sum(_nbytes(t) for t in ins[1:]) if op.type not in ("ResourceGather", "ResourceGatherNd") \
        else sum(_nbytes(t) for t in ins)
    return 0.0, written + small, written, "data"


def _segment(graph, op, ins, outs, read, written):
    return float(_elems(ins[0]) if ins else 0), read, written, "data"


def _data(graph, op, ins, outs, read, written):
    return 0.0, read, written, "data"


def _scatter(graph, op, ins, outs, read, written):
    # Scatter*(var, indices, updates): reads and writes the updated rows of var.
    updates = _nbytes(ins[-1]) if ins else 0
    indices = _nbytes(ins[1]) if len(ins) > 1 else 0
    return float(_elems(ins[-1]) if ins else 0), 2 * updates + indices, updates, "data"


def _assign(graph, op, ins, outs, read, written):
    value = _nbytes(ins[1]) if len(ins) > 1 else 0
    return 0.0, value, value, "data"


def _assign_arith(graph, op, ins, outs, read, written):
    value = ins[1] if len(ins) > 1 else None
    n = _elems(value) if value is not None else 0
    b = _nbytes(value) if value is not None else 0
    return float(n), 2 * b, b, "elementwise"


def _optimizer(graph, op, ins, outs, read, written):
    t = op.type
    base = t[len("Resource"):] if t.startswith("Resource") else t
    sparse = base.startswith("Sparse")
    base = base[len("Sparse"):] if sparse else base
    # Variable and slot inputs are ref tensors or resource handles; the rest are scalars (hyper-
    # parameters), the gradient and, for sparse updates, the indices.
    states = sum(1 for x in ins if x.is_resource or x.is_ref)
    values = [x for x in ins if not (x.is_resource or x.is_ref)]
    grad = max(values, key=_elems, default=None)
    n = _elems(grad) if grad is not None else 0
    item = grad.itemsize if grad is not None else 4
    state_bytes = max(states, 1) * n * item
    extra = sum(_nbytes(x) for x in values)          # gradient (+ indices, scalars)
    return _OPTIMIZER_COST.get(base, 8.0) * n, state_bytes + extra, state_bytes, "optimizer"


def _addn(graph, op, ins, outs, read, written):
    return float(max(len(ins) - 1, 1) * (_elems(outs[0]) if outs else 0)), read, written, "elementwise"


def _elementwise(graph, op, ins, outs, read, written):
    out = _elems(outs[0]) if outs else 0
    return _ELEMENTWISE_COST.get(op.type, 1.0) * out, read, written, "elementwise"


_HANDLERS: dict[str, _Handler] = {
    **{t: _matmul for t in _MATMULS},
    "Einsum": _einsum,
    **{t: _conv for t in _CONVS},
    **{t: _pool for t in _POOLS},
    **{t: _pool_grad for t in _POOL_GRADS},
    **{t: _reduction for t in _REDUCTIONS},
    **{t: _rowwise for t in _ROWWISE_COST},
    **{t: _fill for t in _FILL_OPS},
    **{t: _partial_read for t in _PARTIAL_READS},
    **{t: _segment for t in _SEGMENT_SUMS},
    **{t: _data for t in _DATA_OPS},
    **{t: _assign for t in _ASSIGNS},
    **{t: _assign_arith for t in _ASSIGN_ARITH},
    "AddN": _addn,
}


def _handler(op_type: str) -> _Handler:
    h = _HANDLERS.get(op_type)
    if h is not None:
        return h
    if op_type.startswith(("Apply", "ResourceApply", "SparseApply", "ResourceSparseApply")):
        return _optimizer
    if op_type.startswith(("Scatter", "ResourceScatter")):
        return _scatter
    return _elementwise


_ZERO = OpWork(0.0, 0.0, 0.0, "none")


def _op_work(graph: Graph, op: Op) -> OpWork:
    if op.type in ZERO_WORK:
        return _ZERO
    ins = _inputs(graph, op)
    outs = op.outputs
    read = sum(_nbytes(t) for t in ins)
    written = sum(_nbytes(t) for t in outs)
    flops, r, w, cls = _handler(op.type)(graph, op, ins, outs, read, written)
    return OpWork(float(flops), float(r), float(w), cls)


# ---------------------------------------------------------------------------------------------
# GEMM views of matmuls and convolutions
# ---------------------------------------------------------------------------------------------
def _is_gradient(name: str) -> bool:
    return any(part.startswith("gradients") or part.startswith("gradient_tape") for part in name.split("/")[:-1])


_View = tuple[str, bool, bool, float, float, float, float, int, float, float]


def _gemm_view(graph: Graph, op: Op) -> _View | None:
    """(family, backward, transposed, batch, m, n, k, itemsize, channels, spatial) of a matmul or 2-D
    convolution; None for anything else or unknown shapes."""
    t = op.type
    ins = _inputs(graph, op)
    outs = op.outputs
    if not outs or outs[0].shape is None or any(d < 0 for d in outs[0].shape):
        return None
    out = outs[0].shape
    itemsize = int(outs[0].itemsize) if outs[0].base_dtype in FLOAT_DTYPES else 0    # 0: not a float kernel
    if t in ("MatMul", "_FusedMatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3"):
        if not ins or ins[0].shape is None or len(ins[0].shape) < 2 or len(out) < 2:
            return None
        a = ins[0].shape
        if t in ("MatMul", "_FusedMatMul"):
            ta, tb = bool(graph.attr(op.name, "transpose_a", False)), bool(graph.attr(op.name, "transpose_b", False))
        else:
            ta, tb = bool(graph.attr(op.name, "adj_x", False)), bool(graph.attr(op.name, "adj_y", False))
        k = a[-2] if ta else a[-1]
        batch = _prod(out[:-2])
        if k < 0:
            return None
        family = "bmm" if batch > 1 else "mm"
        return (family, _is_gradient(op.name), ta or tb, float(batch), float(out[-2]), float(out[-1]), float(k),
                itemsize, 0.0, 0.0)
    if t not in ("Conv2D", "_FusedConv2D", "Conv2DBackpropInput", "Conv2DBackpropFilter"):
        return None
    filt: tuple[int, ...] | None
    grad: tuple[int, ...] | None
    if "BackpropFilter" in t:
        filt, grad = out, (ins[2].shape if len(ins) > 2 else None)
    elif "BackpropInput" in t:
        filt, grad = (ins[1].shape if len(ins) > 1 else None), (ins[2].shape if len(ins) > 2 else None)
    else:
        filt, grad = (ins[1].shape if len(ins) > 1 else None), out
    if filt is None or grad is None or len(filt) != 4 or any(d < 0 for d in filt) or any(d < 0 for d in grad):
        return None
    kh, kw, cin, cout = filt
    strides = list(graph.attr(op.name, "strides", None) or [1, 1, 1, 1])
    fmt = graph.attr(op.name, "data_format", "NHWC")
    fmt = fmt.decode() if isinstance(fmt, bytes) else str(fmt)
    stride = max([int(v) for v in (strides[2:4] if fmt == "NCHW" else strides[1:3])] or [1])
    dilations = list(graph.attr(op.name, "dilations", None) or [1, 1, 1, 1])
    dilated = max([int(v) for v in (dilations[2:4] if fmt == "NCHW" else dilations[1:3])] or [1]) > 1
    if cin <= 4 or stride > 1:
        family = "conv_stem"
    elif dilated:
        family = "conv_kxk"          # a dilated 3x3 has no Winograd kernel
    elif (kh, kw) == (3, 3):
        family = "conv3x3"
    elif (kh, kw) == (1, 1):
        family = "conv1x1"
    else:
        family = "conv_kxk"
    grad_rows = float(_prod(grad) // max(cout, 1))           # N*Ho*Wo
    conv = (float(cin), float(_prod(grad[2:4] if fmt == "NCHW" else grad[1:3])))   # (input channels, output HxW)
    if "BackpropFilter" in t:
        return (family, True, False, 1.0, float(kh * kw * cin), float(cout), grad_rows, itemsize, *conv)
    if "BackpropInput" in t:
        return (family, True, False, 1.0, float(_prod(out) // max(cin, 1)), float(cin), float(kh * kw * cout),
                itemsize, *conv)
    return (family, _is_gradient(op.name), False, 1.0, grad_rows, float(cout), float(kh * kw * cin), itemsize, *conv)


# ---------------------------------------------------------------------------------------------
# Public API
# ---------------------------------------------------------------------------------------------
def op_work(graph: Graph, op_name: str) -> OpWork:
    """FLOPs and bytes of one op at the graph's static shapes (see the module docstring)."""
    return _op_work(graph, graph.op(op_name))


def op_class(op_type: str) -> str:
    """The cost-model class of an op type (shape-independent)."""
    if op_type in ZERO_WORK:
        return "none"
    h = _handler(op_type)
    return {_matmul: "matmul", _conv: "conv", _pool: "reduction", _pool_grad: "reduction",
            _reduction: "reduction", _rowwise: "reduction", _partial_read: "data", _segment: "data",
            _data: "data", _assign: "data", _scatter: "data", _optimizer: "optimizer"}.get(h, "elementwise")


def graph_work_detail(graph: Graph, op_names: Sequence[str] | None = None) -> GraphWork:
    """`OpWork` of many ops (default: all, in graph order) as aligned arrays."""
    names = tuple(graph.order if op_names is None else op_names)
    n = len(names)
    flops = np.zeros(n)
    read = np.zeros(n)
    written = np.zeros(n)
    classes = np.full(n, CLASS_INDEX["none"], dtype=np.int8)
    kernels = KernelShapes.empty(n)
    gemm_classes = (CLASS_INDEX["matmul"], CLASS_INDEX["conv"])
    ops = graph.ops
    for i, name in enumerate(names):
        op = ops.get(name)
        if op is None:
            raise KeyError(f"no op named {name!r} in the graph")
        if op.type in ZERO_WORK:
            continue
        w = _op_work(graph, op)
        flops[i] = w.flops
        read[i] = w.bytes_read
        written[i] = w.bytes_written
        classes[i] = CLASS_INDEX[w.op_class]
        if classes[i] in gemm_classes:
            view = _gemm_view(graph, op)
            if view is not None:
                family, backward, transposed, batch, m, k_n, k_k, itemsize, channels, spatial = view
                kernels.family[i] = KERNEL_INDEX[family]
                kernels.backward[i] = backward
                kernels.transposed[i] = transposed
                kernels.batch[i], kernels.m[i], kernels.n[i], kernels.k[i] = batch, m, k_n, k_k
                kernels.itemsize[i] = itemsize
                kernels.channels[i], kernels.spatial[i] = channels, spatial
    return GraphWork(names, flops, read, written, classes, kernels)


def graph_work(graph: Graph, op_names: Sequence[str] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(flops[], bytes[]) of many ops, bytes = read + written; see `graph_work_detail` for classes."""
    w = graph_work_detail(graph, op_names)
    return w.flops, w.bytes


__all__ = ["OP_CLASSES", "CLASS_INDEX", "KERNEL_FAMILIES", "KERNEL_INDEX", "KernelShapes", "OpWork", "GraphWork", "ZERO_WORK", "op_work", "op_class",
           "graph_work", "graph_work_detail"]
