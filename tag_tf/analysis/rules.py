"""Per-op replication rules: given the states of an op's inputs under data parallelism, what the op
requires of each input and what state each output has.

The batch dimensions themselves come from comparing shapes at two batch sizes (`batch_dims`); these
rules only decide what shapes cannot tell: whether an op treats samples independently (concat), sums
over them (sum), or needs the whole batch (other). Unknown ops are treated conservatively (their
batch inputs are gathered first) and reported as unclassified.

Policy for LOCAL inputs (batch-size-dependent values "as if run on the shard"): they stay LOCAL at
shape-like positions (Reshape targets, Tile multiples...), at index positions into a tensor that is
split along the indexed axis, and through integer arithmetic; everywhere else (data) the op needs the
global value, so the requirement becomes SPLIT (batched) or FULL and the compiler recomputes it.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

import numpy as np

from tag_tf.analysis.batch_dims import SHAPE_LIKE_INPUTS, TensorBatch
from tag_tf.analysis.states import FULL, LOCAL, PARTIAL, Category, Flag, Kind, OpAnnotation, State, local, split
from tag_tf.ir import Graph, Op, opsets
from tag_tf.ir.graph import FLOAT_DTYPES

# Input classes as the rules see them.
PLAIN, BATCH, PART, LOC = "plain", "batch", "partial", "local"


@dataclasses.dataclass
class OpView:
    """What a rule sees of one op."""

    op: Op
    graph: Graph
    ins: tuple[State, ...]            # producers' states
    in_batch: tuple[TensorBatch, ...]
    out_batch: tuple[TensorBatch, ...]
    exact_batch_stats: bool
    classes: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.classes = [self._classify(i) for i in range(len(self.ins))]

    def _classify(self, i: int) -> str:
        s = self.ins[i]
        if s.kind is Kind.SPLIT:
            return BATCH
        if s.kind is Kind.PARTIAL:
            return PART
        if s.kind is Kind.LOCAL:
            return LOC
        return BATCH if self.in_batch[i].batched else PLAIN

    # -- accessors --------------------------------------------------------------------------
    @property
    def type(self) -> str:
        return self.op.type

    def attr(self, key: str, default=None):
        return self.graph.attr(self.op.name, key, default)

    def in_shape(self, i: int):
        return self.graph.tensor(self.op.inputs[i]).shape

    def out_shape(self, j: int = 0):
        return self.op.outputs[j].shape

    def in_rank(self, i: int) -> int | None:
        s = self.in_shape(i)
        return None if s is None else len(s)

    def out_rank(self, j: int = 0) -> int | None:
        s = self.out_shape(j)
        return None if s is None else len(s)

    def const(self, i: int) -> np.ndarray | None:
        """The value of input i when it is a Const (through Identity chains)."""
        ref = self.op.inputs[i]
        for _ in range(8):
            producer = self.graph.op(ref.op)
            if producer.type == "Const":
                return self.graph.attr(producer.name, "value")
            if producer.type != "Identity" or not producer.inputs:
                return None
            ref = producer.inputs[0]
        return None

    def batch_state(self, i: int) -> State:
        """The SPLIT state a batch input must be in (its own batch axis)."""
        s = self.ins[i]
        if s.kind in (Kind.SPLIT, Kind.LOCAL) and s.axis >= 0:
            return split(s.axis, s.mult)
        tb = self.in_batch[i]
        assert tb.axis is not None, f"input {i} of {self.op.name!r} is not batched"   # only asked of batch inputs
        return split(tb.axis, tb.mult)

    def global_state(self, i: int) -> State:
        """The requirement that turns input i into its original (global) value: its shard when it
        has a batch dim (whatever its state now), else the whole value."""
        if self.in_batch[i].batched and not self.in_batch[i].irregular:
            return self.batch_state(i)
        return FULL

    def out_split(self, j: int) -> State | None:
        tb = self.out_batch[j]
        return split(tb.axis, tb.mult) if tb.axis is not None and not tb.irregular else None

    def outputs_int(self) -> bool:
        return bool(self.op.outputs) and all(
            not t.is_resource and t.base_dtype not in FLOAT_DTYPES and t.base_dtype != "string"
            for t in self.op.outputs)

    def has(self, cls: str, positions=None) -> bool:
        idx = range(len(self.classes)) if positions is None else positions
        return any(self.classes[i] == cls for i in idx if i < len(self.classes))


Rule = Callable[[OpView], "OpAnnotation | None"]


# ---------------------------------------------------------------------------------------------
# Building blocks
# ---------------------------------------------------------------------------------------------
def annotate(category: Category, outputs, requires, rule: str, flags=()) -> OpAnnotation:
    return OpAnnotation(category, tuple(outputs), tuple(requires), rule, frozenset(flags))


def needs_full(v: OpView, rule: str, flags=()) -> OpAnnotation:
    """The op needs every input whole: gather batch inputs, aggregate partials, globalise LOCALs."""
    return annotate(Category.OTHER, [FULL] * len(v.op.outputs), [FULL] * len(v.ins), rule, flags)


def invariant(v: OpView) -> OpAnnotation:
    """No input depends on the batch: every replica computes the same full value."""
    return annotate(Category.OTHER, [FULL] * len(v.op.outputs), [FULL] * len(v.ins), "invariant")


def _data_positions(v: OpView) -> tuple[int, ...]:
    shape_like = SHAPE_LIKE_INPUTS.get(v.type, ())
    return tuple(i for i in range(len(v.ins)) if i not in shape_like)


def per_sample(v: OpView, rule: str, *, data: tuple[int, ...] | None = None,
               unbatched_outputs: State | None = None, flags=()) -> OpAnnotation | None:
    """Each sample is computed independently: batch inputs split, the rest whole; every output that
    has a batch dim is split along it. Outputs without one are only allowed when `unbatched_outputs`
    says what they are (e.g. BatchNorm statistics); otherwise the op is not per-sample here."""
    data = _data_positions(v) if data is None else data
    if not any(v.classes[i] == BATCH for i in data):
        return None
    requires = []
    for i, cls in enumerate(v.classes):
        if cls == BATCH:
            requires.append(v.batch_state(i))
        elif cls == LOC and i not in data:
            requires.append(LOCAL)
        else:
            requires.append(v.global_state(i))
    outputs = []
    for j in range(len(v.op.outputs)):
        s = v.out_split(j)
        if s is None:
            if unbatched_outputs is None or v.out_batch[j].irregular:
                return None
            s = unbatched_outputs
        outputs.append(s)
    return annotate(Category.CONCAT, outputs, requires, rule, flags)


def elementwise(v: OpView, rule: str = "elementwise") -> OpAnnotation | None:
    """Broadcasting element-wise op: batch inputs must line up with the output's batch axis."""
    out = v.out_split(0)
    if out is None:
        return None
    out_rank = v.out_rank(0)
    for i, cls in enumerate(v.classes):
        if cls in (PLAIN, PART) and out_rank is not None and (in_rank := v.in_rank(i)) is not None:
            # A whole input broadcast along the batch axis must have extent 1 there; anything else
            # (unknown: a whole-batch value from a sparse feature column whose size follows the
            # data) is not a per-sample operand, so the op runs on whole values.
            axis = out.axis - (out_rank - in_rank)
            if axis >= 0 and v.in_shape(i)[axis] != 1:
                return None
        if cls != BATCH:
            continue
        rank = v.in_rank(i)
        if rank is None or out_rank is None:
            return None
        if v.batch_state(i).axis + (out_rank - rank) != out.axis:  # noqa: SIM102 (the exception has its comment)
            # v1 Select broadcasts a rank-1 condition along the first axis.
            if not (v.type == "Select" and i == 0 and rank == 1 and out.axis == 0):
                return None
    return per_sample(v, rule, data=tuple(range(len(v.ins))))


def sum_over_batch(v: OpView, rule: str, batch_inputs: tuple[int, ...], flags=()) -> OpAnnotation | None:
    """The op sums over the samples of `batch_inputs` (weight gradients): outputs are PARTIAL."""
    if not all(i < len(v.classes) and v.classes[i] == BATCH for i in batch_inputs):
        return None
    if len({v.batch_state(i).mult for i in batch_inputs}) != 1:
        return None
    if any(v.out_batch[j].batched for j in range(len(v.op.outputs))):
        return None
    requires = []
    for i, cls in enumerate(v.classes):
        if i in batch_inputs:
            requires.append(v.batch_state(i))
        elif cls == LOC and i in SHAPE_LIKE_INPUTS.get(v.type, ()):
            requires.append(LOCAL)
        else:
            requires.append(v.global_state(i))
    return annotate(Category.SUM, [PARTIAL] * len(v.op.outputs), requires, rule, flags)


def linear_partial(v: OpView, linear_in: tuple[int, ...] | None = None) -> OpAnnotation | None:
    """A linear op applied to partial sums gives partial sums (AddN of gradients, Reshape of one,
    Mul by a whole scalar). Every input at a `linear_in` position must be PARTIAL, the others whole
    and batch-free."""
    positions = tuple(range(len(v.ins))) if linear_in is None else linear_in
    positions = tuple(i for i in positions if i < len(v.ins))
    if not positions or not all(v.classes[i] == PART for i in positions):
        return None
    if any(tb.batched for tb in v.out_batch):
        # E.g. Tile(d_mean, [B, ...]) in a mean's gradient: aggregate the small partial first,
        # then broadcast it per replica (rule_generator), rather than summing a batch-sized tensor.
        return None
    requires = []
    for i, cls in enumerate(v.classes):
        if i in positions:
            requires.append(PARTIAL)
        elif cls == PLAIN or (cls == LOC and i in SHAPE_LIKE_INPUTS.get(v.type, ())):
            requires.append(FULL)   # a partial sum has the full shape: shape inputs must be global
        else:
            return None
    return annotate(Category.SUM, [PARTIAL] * len(v.op.outputs), requires, "linear")


# ---------------------------------------------------------------------------------------------
# Op families
# ---------------------------------------------------------------------------------------------
_UNARY = """Abs Acos Acosh Asin Asinh Atan Atanh Ceil Cos Cosh Digamma Elu Erf Erfc Exp Expm1 Floor
Gelu Inv Invert IsFinite IsInf IsNan LeakyRelu Lgamma Log Log1p LogicalNot Neg OnesLike Reciprocal
Relu Relu6 Rint Round Rsqrt Selu Sigmoid Sign Sin Sinh Softplus Softsign Sqrt Square Tan Tanh
ZerosLike Cast Bitcast Conj Real Imag ClipByValue PopulationCount""".split()
_BINARY = """Add AddV2 AddN Atan2 BiasAdd BiasAddV1 BitwiseAnd BitwiseOr BitwiseXor Div DivNoNan Equal
FloorDiv FloorMod Greater GreaterEqual Less LessEqual LogicalAnd LogicalOr Maximum Minimum Mod Mul
MulNoNan NotEqual Pow RealDiv SquaredDifference Sub TruncateDiv TruncateMod Xdivy Xlogy Xlog1py
ApproximateEqual LeftShift RightShift Select SelectV2 Igamma Igammac Zeta Polygamma Betainc
ReluGrad Relu6Grad EluGrad SeluGrad SigmoidGrad TanhGrad SoftplusGrad SoftsignGrad RsqrtGrad
SqrtGrad ReciprocalGrad InvGrad LeakyReluGrad GeluGrad""".split()
ELEMENTWISE = frozenset(_UNARY + _BINARY)
# Linear in their inputs: partial sums stay partial (all inputs partial).
ADDITIVE = frozenset({"Add", "AddV2", "AddN", "Sub", "Neg", "BiasAdd", "BiasAddV1"})
# Linear in one input when the others are whole: position of the linear input.
SCALED = {"Mul": (0, 1), "RealDiv": (0,), "Div": (0,), "DivNoNan": (0,), "MulNoNan": (0, 1)}
PASS_THROUGH = frozenset({"Identity", "Snapshot", "StopGradient", "PreventGradient", "CheckNumerics",
                          "EnsureShape", "IdentityN", "DebugIdentity", "DebugIdentityV2"})
REDUCTIONS = frozenset({"Sum", "Mean", "Max", "Min", "Prod", "All", "Any", "EuclideanNorm"})
SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size"})
SAMPLE_OPS = frozenset({  # per-sample along non-batch axes; validity checked from shapes
    "Conv2D", "Conv3D", "DepthwiseConv2dNative", "MaxPool", "MaxPoolV2", "AvgPool", "MaxPool3D",
    "AvgPool3D", "LRN", "MaxPoolWithArgmax", "FractionalMaxPool", "MaxPoolGrad", "MaxPoolGradV2",
    "MaxPoolGradGrad", "MaxPoolGradGradV2", "AvgPoolGrad", "AvgPool3DGrad", "MaxPool3DGrad", "LRNGrad",
    "Conv2DBackpropInput", "DepthwiseConv2dNativeBackpropInput", "Conv3DBackpropInputV2",
    "Softmax", "LogSoftmax", "SoftmaxCrossEntropyWithLogits", "SparseSoftmaxCrossEntropyWithLogits",
    "ResizeBilinear", "ResizeNearestNeighbor", "ResizeBilinearGrad", "ResizeNearestNeighborGrad",
    "ResizeBicubic", "SpaceToDepth", "DepthToSpace", "MatrixBandPart", "MatrixDiag", "MatrixDiagPart",
    "MatrixDiagV3", "MatrixDiagPartV3", "MatrixSetDiag", "MatrixSetDiagV3", "TopKV2", "InTopKV2",
    "OneHot", "Fill", "BroadcastTo", "Tile", "Pad", "PadV2", "MirrorPad", "MirrorPadGrad",
    "Slice", "StridedSlice", "StridedSliceGrad", "ExpandDims", "Squeeze", "Reshape", "Transpose",
    "Pack", "ConcatV2", "Concat", "Split", "SplitV", "Unpack", "ArgMax", "ArgMin", "Cumsum", "Cumprod",
    "ReverseV2", "RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt",
    "Einsum", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "L2Normalize", "Cross",
    "Relu6", "Dilation2D", "ExtractImagePatches", "Roll", "Bucketize", "HistogramFixedWidth",
    "FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3", "FusedBatchNormGrad",
    "FusedBatchNormGradV2", "FusedBatchNormGradV3", "GatherV2", "Gather", "ResourceGather",
    "GatherNd", "UnsortedSegmentSum", "UnsortedSegmentMax", "UnsortedSegmentMin",
    "UnsortedSegmentProd", "ScatterNd", "Where", "Unique", "UniqueV2", "Range",
})
SHAPE_STITCH = frozenset({"DynamicStitch", "ParallelDynamicStitch"})
NEEDS_FULL = frozenset({  # ops that genuinely need every sample (or whose output size is data-dependent)
    "Unique", "UniqueV2", "UniqueWithCounts", "Where", "NonMaxSuppressionV3", "NonMaxSuppressionV4",
    "NonMaxSuppressionV5", "Assert", "Print", "PrintV2", "StringFormat", "ScalarSummary",
    "HistogramSummary", "ImageSummary", "MergeSummary", "TensorSummaryV2", "WriteSummary",
    "SpaceToBatchND", "BatchToSpaceND", "SpaceToBatch", "BatchToSpace", "RandomShuffle",
    "ListDiff", "SetSize", "SparseToDense", "SparseReshape", "DynamicPartition", "DynamicStitch",
    "ParallelDynamicStitch", "SaveV2", "RestoreV2", "MergeV2Checkpoints", "Timestamp",
    # Function calls and functional control flow (TF 2.x cond/while_loop): their bodies are not
    # analysed, so they run on whole inputs (exact; not split).
    "If", "StatelessIf", "While", "StatelessWhile", "Case", "StatelessCase", "PartitionedCall",
    "StatefulPartitionedCall", "SymbolicGradient", "RemoteCall",
})


def _axes_of(v: OpView, i: int, rank: int | None) -> set[int] | None:
    value = v.const(i)
    if value is None or rank is None:
        return None
    return {int(a) % rank if rank else 0 for a in np.atleast_1d(value)}


def rule_reduction(v: OpView) -> OpAnnotation | None:
    if v.classes[0] == PART:
        if v.type in ("Sum", "Mean"):
            return linear_partial(v, (0,))
        return None
    if v.classes[0] != BATCH:
        return None
    if v.out_split(0) is not None:               # the batch axis survives: per-sample
        return per_sample(v, "reduce-other-axes", data=(0,))
    axes = _axes_of(v, 1, v.in_rank(0))
    if axes is not None and v.batch_state(0).axis not in axes:
        return None
    if v.type == "Sum":
        return sum_over_batch(v, "reduce-sum-batch", (0,))
    if v.type == "Mean":
        return sum_over_batch(v, "reduce-mean-batch", (0,), flags=(Flag.MEAN_SCALE,))
    if v.type == "EuclideanNorm":
        return None
    return needs_full(v, "reduce-over-batch")


def rule_matmul(v: OpView) -> OpAnnotation | None:
    ta, tb = bool(v.attr("transpose_a", False)), bool(v.attr("transpose_b", False))
    a, b = v.classes[0], v.classes[1]
    if PART in (a, b):
        if (a, b) in ((PART, PLAIN), (PLAIN, PART)):
            return linear_partial(v, (0,) if a == PART else (1,))
        return None
    if a == BATCH and b == BATCH:
        # Batch on both contracted axes: a sum over samples (weight gradient).
        if v.batch_state(0).axis == (0 if ta else 1) and v.batch_state(1).axis == (1 if tb else 0):
            return sum_over_batch(v, "matmul-contract-batch", (0, 1))
        return None
    if a == BATCH and v.batch_state(0).axis == (1 if ta else 0):
        return per_sample(v, "matmul-rows")
    if b == BATCH and v.batch_state(1).axis == (0 if tb else 1):
        return per_sample(v, "matmul-cols")
    return None


def rule_batch_matmul(v: OpView) -> OpAnnotation | None:
    if v.out_split(0) is not None:
        return per_sample(v, "batch-matmul")
    if v.classes[0] == BATCH and v.classes[1] == BATCH:
        return sum_over_batch(v, "batch-matmul-contract-batch", (0, 1))
    return None


def rule_einsum(v: OpView) -> OpAnnotation | None:
    if v.out_split(0) is not None:
        return per_sample(v, "einsum")
    if len(v.ins) == 2 and v.classes[0] == BATCH and v.classes[1] == BATCH:
        equation = v.attr("equation", "")
        lhs, _, out = equation.partition("->")
        terms = lhs.split(",")
        if len(terms) == 2 and "." not in equation:
            la, lb = terms[0][v.batch_state(0).axis], terms[1][v.batch_state(1).axis]
            if la == lb and la not in out:
                return sum_over_batch(v, "einsum-contract-batch", (0, 1))
    return None


def rule_conv_filter_grad(v: OpView) -> OpAnnotation | None:
    # (input, filter_sizes, out_backprop): sums over the samples.
    return sum_over_batch(v, "conv-filter-grad", (0, 2))


def rule_bias_add_grad(v: OpView) -> OpAnnotation | None:
    if v.classes[0] == PART:
        return linear_partial(v, (0,))
    return sum_over_batch(v, "bias-add-grad", (0,))


def rule_l2loss(v: OpView) -> OpAnnotation | None:
    return sum_over_batch(v, "l2loss", (0,))


def rule_batch_norm(v: OpView) -> OpAnnotation | None:
    training = bool(v.attr("is_training", True))
    if v.classes[0] != BATCH:
        return None
    if not training:
        return per_sample(v, "batchnorm-inference", data=(0,), unbatched_outputs=FULL)
    if v.exact_batch_stats:
        return needs_full(v, "batchnorm-exact-stats")
    return per_sample(v, "batchnorm-replica-stats", data=(0,), unbatched_outputs=FULL,
                      flags=(Flag.BATCH_STATS,))


def rule_batch_norm_grad(v: OpView) -> OpAnnotation | None:
    training = bool(v.attr("is_training", True))
    if v.classes[0] != BATCH or v.classes[1] != BATCH:
        return None
    if training and v.exact_batch_stats:
        return needs_full(v, "batchnorm-grad-exact-stats")
    requires = [v.batch_state(0), v.batch_state(1)] + [FULL] * (len(v.ins) - 2)
    outputs = [v.out_split(0) or FULL] + [PARTIAL, PARTIAL] + [FULL] * (len(v.op.outputs) - 3)
    if v.out_split(0) is None:
        return None
    flags = (Flag.BATCH_STATS,) if training else ()
    return annotate(Category.SUM, outputs, requires,
                    "batchnorm-grad-replica-stats" if training else "batchnorm-grad-inference", flags)


def rule_shape(v: OpView) -> OpAnnotation | None:
    outputs = []
    for j in range(len(v.op.outputs)):
        i = j if v.type == "ShapeN" else 0
        depends = v.classes[i] in (BATCH, LOC) and (v.in_batch[i].batched or v.classes[i] == LOC)
        outputs.append(LOCAL if depends else FULL)
    requires = [v.batch_state(i) if c == BATCH else (v.ins[i] if c in (LOC, PART) else FULL)
                for i, c in enumerate(v.classes)]
    return annotate(Category.CONCAT if LOCAL in outputs else Category.OTHER, outputs, requires, "shape")


def rule_pass_through(v: OpView) -> OpAnnotation | None:
    requires = tuple(v.batch_state(i) if c == BATCH else v.ins[i] for i, c in enumerate(v.classes))
    outputs = tuple(requires[j] if j < len(requires) else FULL for j in range(len(v.op.outputs)))
    if any(s.kind is Kind.PARTIAL for s in outputs):
        cat = Category.SUM
    elif any(s.kind in (Kind.SPLIT, Kind.LOCAL) for s in outputs) or v.has(BATCH):
        cat = Category.CONCAT
    else:
        cat = Category.OTHER
    return annotate(cat, outputs, requires, "pass-through")


def rule_gather(v: OpView) -> OpAnnotation | None:
    """GatherV2(params, indices, axis) / Gather / ResourceGather(resource, indices)."""
    params, indices = v.classes[0], v.classes[1]
    out = v.out_split(0)
    if params in (PLAIN,) and indices in (BATCH, LOC):
        if out is None:
            return None
        return per_sample(v, "gather-lookup", data=(0, 1)) if indices == BATCH else None
    if params == BATCH and out is not None:
        axis = 0
        if v.type == "GatherV2":
            value = v.const(2)
            if value is None:
                return None
            axis = int(value) % (v.in_rank(0) or 1)
        batch_dims = int(v.attr("batch_dims", 0) or 0)
        if axis != v.batch_state(0).axis:
            if indices == PLAIN or batch_dims > v.batch_state(0).axis:
                return per_sample(v, "gather-other-axis", data=(0, 1))
            return None
        if indices == LOC:
            # Rows picked by local row numbers (e.g. BERT's gather of masked positions): stays exact.
            requires = [v.batch_state(0), v.ins[1]] + [FULL] * (len(v.ins) - 2)
            return annotate(Category.CONCAT, [out], requires, "gather-local-rows")
    return None


def rule_gather_nd(v: OpView) -> OpAnnotation | None:
    params, indices = v.classes[0], v.classes[1]
    out = v.out_split(0)
    if out is None:
        return None
    if params == PLAIN and indices == BATCH:
        return per_sample(v, "gathernd-lookup", data=(0, 1))
    if params == BATCH and indices == LOC:
        return annotate(Category.CONCAT, [out], [v.batch_state(0), v.ins[1]], "gathernd-local-rows")
    return None


def rule_segment(v: OpView) -> OpAnnotation | None:
    """UnsortedSegment*(data, segment_ids, num_segments)."""
    data, ids = v.classes[0], v.classes[1]
    out = v.out_split(0)
    if data == PART and ids == PLAIN and v.type == "UnsortedSegmentSum":
        return linear_partial(v, (0,))
    if data != BATCH:
        return None
    n_req = LOCAL if v.classes[2] == LOC else FULL
    if out is not None and ids == LOC:
        # Scatter of rows into local row numbers (gradient of a local-rows gather).
        return annotate(Category.CONCAT, [out], [v.batch_state(0), v.ins[1], n_req], "segment-local-rows")
    if out is None and ids == BATCH and v.type == "UnsortedSegmentSum":
        shape = v.out_shape(0)
        if v.const(2) is None and (not shape or shape[0] < 0):
            # A sparse gradient deduplicated by the optimizer (Unique ids, num_segments = the number
            # of distinct ids this step): its row count changes every step, and a collective keeps
            # the shape it first saw per instance. Gather the rows instead (as MultiWorkerMirrored
            # does for IndexedSlices) and sum them whole: exact, and never densified.
            return needs_full(v, "segment-sum-gathered-rows")
        return annotate(Category.SUM, [PARTIAL], [v.batch_state(0), v.batch_state(1), FULL],
                        "segment-sum-batch")
    return None


def rule_scatter_nd(v: OpView) -> OpAnnotation | None:
    """ScatterNd(indices, updates, shape)."""
    out = v.out_split(0)
    if out is not None and v.classes[0] == LOC and v.classes[1] == BATCH:
        req_shape = LOCAL if v.classes[2] == LOC else FULL
        return annotate(Category.CONCAT, [out], [v.ins[0], v.batch_state(1), req_shape], "scatternd-local-rows")
    if out is None and v.classes[0] == BATCH and v.classes[1] == BATCH:
        return sum_over_batch(v, "scatternd-sum-batch", (0, 1))
    return None


def rule_concat(v: OpView) -> OpAnnotation | None:
    axis_pos = 0 if v.type == "Concat" else len(v.ins) - 1
    data = tuple(i for i in range(len(v.ins)) if i != axis_pos)
    if all(v.classes[i] == PART for i in data):
        return linear_partial(v, data)
    if not all(v.classes[i] == BATCH for i in data):
        return None
    axis = v.const(axis_pos)
    rank = v.out_rank(0)
    if axis is None or rank is None:
        return None
    if int(axis) % rank == v.batch_state(data[0]).axis:
        return None                                     # concatenation along the batch: reorders rows
    return per_sample(v, "concat-other-axis", data=data)


def rule_pack(v: OpView) -> OpAnnotation | None:
    if all(c == PART for c in v.classes):
        return linear_partial(v)
    if all(c == BATCH for c in v.classes):
        return per_sample(v, "pack")
    return None


def rule_split(v: OpView) -> OpAnnotation | None:
    """Split(axis, value) / SplitV(value, sizes, axis) / Unpack(value)."""
    value_pos = 1 if v.type == "Split" else 0
    if v.classes[value_pos] == PART:
        return linear_partial(v, (value_pos,))
    if v.classes[value_pos] != BATCH:
        return None
    if v.type == "Unpack":
        axis = int(v.attr("axis", 0))
    else:
        const = v.const(0 if v.type == "Split" else 2)
        if const is None:
            return None
        axis = int(const)
    rank = v.in_rank(value_pos)
    if rank is None or axis % rank == v.batch_state(value_pos).axis:
        return None
    return per_sample(v, "split-other-axis", data=(value_pos,))


def rule_axis_op(v: OpView) -> OpAnnotation | None:
    """Cumsum/Cumprod(x, axis), ReverseV2(x, axes), Softmax-like on the last axis: not along the batch."""
    if v.classes[0] != BATCH:
        return None
    axis = v.batch_state(0).axis
    rank = v.in_rank(0)
    if v.type in ("Cumsum", "Cumprod", "ReverseV2", "Roll"):
        pos = 2 if v.type == "Roll" else 1
        axes = _axes_of(v, pos, rank)
        if axes is None or axis in axes:
            return None
    elif v.type in ("Softmax", "LogSoftmax", "TopKV2") and rank is not None and axis == rank - 1:
        return None
    return per_sample(v, "per-sample-axis")


def _prod(dims) -> int | None:
    if dims is None or any(d < 0 for d in dims):
        return None
    return int(np.prod(dims, dtype=np.int64))


def rule_reshape(v: OpView) -> OpAnnotation | None:
    """A reshape keeps shards contiguous only if the batch stays the outermost factor of its dim:
    the dims before the batch axis must hold the same number of elements before and after."""
    if v.classes[0] != BATCH:
        return None
    out = v.out_split(0)
    if out is None:
        return None
    if v.classes[1] == PLAIN and v.const(1) is None and _reads_batch(v, 1):
        # A target shape computed from whole values of the batch (e.g. the Shape of a partitioned
        # embedding lookup's stitched rows) may hold the whole batch's size, which a shard cannot
        # take. Targets built from constants and weights' shapes (tf.stack([-1, n])) are fine.
        return None
    a = v.batch_state(0).axis
    before_in, before_out = _prod(v.in_shape(0)[:a]), _prod(v.out_shape(0)[:out.axis])
    if before_in is None or before_in != before_out:
        return None
    return per_sample(v, "reshape-batch-outer")


def _reads_batch(v: OpView, i: int) -> bool:
    """Whether input `i` of the op is computed (through any chain) from a batch input."""
    sources = {name.rpartition(":")[0] for name in v.graph.meta.feeds}
    return bool(sources & v.graph.ancestors([v.op.inputs[i].op], control=False))


def rule_generator(v: OpView) -> OpAnnotation | None:
    """Fill/BroadcastTo/Tile whose batch rows are copies of one whole input: each replica makes
    its own rows from the LOCAL shape."""
    out = v.out_split(0)
    if out is None:
        return None
    data = _data_positions(v)
    if any(v.classes[i] == BATCH for i in data):
        if v.type == "Tile":   # tiling along the batch axis would repeat the batch: reorders rows
            i = data[0]
            if v.batch_state(i).axis != out.axis or v.batch_state(i).mult != out.mult:
                return None
        return per_sample(v, "broadcast-per-sample")
    if any(v.classes[i] not in (PLAIN, PART) for i in data):
        return None
    if v.type == "Tile":
        shape = v.in_shape(0)
        if shape is None or out.axis >= len(shape) or shape[out.axis] not in (1, out.mult):
            return None
    requires = [LOCAL if c == LOC else FULL for c in v.classes]     # partial sums aggregated first
    return annotate(Category.CONCAT, [out], requires, "broadcast-rows")


def rule_strided_slice(v: OpView) -> OpAnnotation | None:
    """Slicing keeps the shards only if it takes the whole batch axis in order."""
    if v.classes[0] == PART:
        return None
    if v.classes[0] != BATCH or v.out_split(0) is None:
        return None
    a = v.batch_state(0).axis
    if v.type == "Slice":
        begin = v.const(1)
        if begin is not None:
            return per_sample(v, "slice-keeps-batch") if int(np.atleast_1d(begin)[a]) == 0 else None
        # A computed begin (e.g. ConcatOffset in a concat's gradient): if the output keeps the whole
        # batch extent at both batch sizes, begin must be 0 there (begin + size <= extent).
        return per_sample(v, "slice-keeps-batch") if v.out_split(0) == v.batch_state(0) else None
    strides, begin = v.const(3), v.const(1)
    if strides is None or np.any(np.asarray(strides) <= 0):
        return None
    ellipsis, new_axis = int(v.attr("ellipsis_mask", 0)), int(v.attr("new_axis_mask", 0))
    if (ellipsis or new_axis) and not (a == 0 and not (ellipsis & 1) and not (new_axis & 1)):
        return None
    begin_mask = int(v.attr("begin_mask", 0))
    if a < len(np.atleast_1d(strides)):
        if int(np.atleast_1d(strides)[a]) != 1:
            return None
        if not (begin_mask >> a) & 1 and (begin is None or int(np.atleast_1d(begin)[a]) != 0):
            return None
    return per_sample(v, "slice-keeps-batch")


def rule_range(v: OpView) -> OpAnnotation | None:
    if v.has(LOC):
        return annotate(Category.CONCAT, [local(*_local_axis(v, 0))], list(v.ins), "range-local")
    return None


def rule_random(v: OpView) -> OpAnnotation | None:
    """Random ops drawing a batch-shaped tensor: each replica draws its own rows (values differ from
    the original run in any case)."""
    out = v.out_split(0)
    if out is None:
        return None
    requires = [LOCAL if c == LOC else FULL for c in v.classes]
    return annotate(Category.CONCAT, [out], requires, "random-batch", (Flag.RANDOM,))


def rule_variable_update(v: OpView) -> OpAnnotation:
    return needs_full(v, "variable-update")


def _local_axis(v: OpView, j: int) -> tuple[int, int]:
    tb = v.out_batch[j]
    return (tb.axis, tb.mult) if tb.axis is not None else (-1, 1)


def rule_int_local(v: OpView) -> OpAnnotation | None:
    """Integer arithmetic on LOCAL values stays LOCAL: it describes the shard, and consumers either
    use it as a shape or index (where local is right) or globalise it."""
    if not v.outputs_int() or not v.has(LOC):
        return None
    return _int_local(v)


def _int_local(v: OpView) -> OpAnnotation:
    """Computed on each shard as is: LOCAL inputs stay local, batch inputs come split, others whole."""
    requires = []
    for i, cls in enumerate(v.classes):
        requires.append(v.ins[i] if cls == LOC else (v.batch_state(i) if cls == BATCH else FULL))
    outputs = [local(*_local_axis(v, j)) for j in range(len(v.op.outputs))]
    return annotate(Category.CONCAT, outputs, requires, "int-local")


RULES: Mapping[str, Rule] = {
    "MatMul": rule_matmul, "BatchMatMul": rule_batch_matmul, "BatchMatMulV2": rule_batch_matmul,
    "BatchMatMulV3": rule_batch_matmul, "Einsum": rule_einsum,
    "Conv2DBackpropFilter": rule_conv_filter_grad, "DepthwiseConv2dNativeBackpropFilter": rule_conv_filter_grad,
    "Conv3DBackpropFilterV2": rule_conv_filter_grad, "BiasAddGrad": rule_bias_add_grad, "L2Loss": rule_l2loss,
    "FusedBatchNorm": rule_batch_norm, "FusedBatchNormV2": rule_batch_norm, "FusedBatchNormV3": rule_batch_norm,
    "FusedBatchNormGrad": rule_batch_norm_grad, "FusedBatchNormGradV2": rule_batch_norm_grad,
    "FusedBatchNormGradV3": rule_batch_norm_grad,
    "GatherV2": rule_gather, "Gather": rule_gather, "ResourceGather": rule_gather, "GatherNd": rule_gather_nd,
    "UnsortedSegmentSum": rule_segment, "UnsortedSegmentMax": rule_segment,
    "UnsortedSegmentMin": rule_segment, "UnsortedSegmentProd": rule_segment, "ScatterNd": rule_scatter_nd,
    "ConcatV2": rule_concat, "Concat": rule_concat, "Pack": rule_pack,
    "Split": rule_split, "SplitV": rule_split, "Unpack": rule_split,
    "Cumsum": rule_axis_op, "Cumprod": rule_axis_op, "ReverseV2": rule_axis_op, "Roll": rule_axis_op,
    "Softmax": rule_axis_op, "LogSoftmax": rule_axis_op, "TopKV2": rule_axis_op,
    "Range": rule_range, "Reshape": rule_reshape,
    "Fill": rule_generator, "BroadcastTo": rule_generator, "Tile": rule_generator, "Empty": rule_generator,
    "StridedSlice": rule_strided_slice, "Slice": rule_strided_slice,
    "RandomUniform": rule_random, "RandomStandardNormal": rule_random, "TruncatedNormal": rule_random,
    "RandomUniformInt": rule_random,
    **{t: rule_reduction for t in REDUCTIONS},
    **{t: rule_shape for t in SHAPE_OPS},
}


def _rule_for(op_type: str) -> Rule | None:
    if op_type in RULES:
        return RULES[op_type]
    if op_type in PASS_THROUGH:
        return rule_pass_through
    if opsets.is_variable_writer(op_type):
        return rule_variable_update
    return None


def decide(v: OpView) -> OpAnnotation:
    """The annotation of one op, given its inputs' states: the first of these steps that decides."""
    if not v.ins or all(c == PLAIN for c in v.classes):
        return invariant(v)                  # nothing that depends on the batch flows in
    forced = _forced(v)
    if forced is not None:
        return forced
    rule = _rule_for(v.type)
    for step in (_by_rule, _partial_family, _local_family, _sample_family):
        result = step(v, rule)
        if result is not None:
            return result
    return _fallback(v, rule)


def _forced(v: OpView) -> OpAnnotation | None:
    """Ops whose annotation no rule may override."""
    if v.type in SHAPE_STITCH and v.has(LOC) and all(c in (PLAIN, LOC) for c in v.classes) and v.outputs_int():
        # A shape assembled from shard shapes and constants (math_ops.reduced_shape in every Sum/Mean
        # gradient over a non-batch axis with a dynamic batch): on the shard it is the shard's shape,
        # which is what LOCAL means. Globalising it would hand a replica the whole batch's shape
        # (`Input to reshape is a tensor with 4 values, but the requested shape has 8`). Only
        # stitches: other value-sized ops (SparseReshape...) read indices, not shapes.
        return rule_int_local(v)
    if v.type in NEEDS_FULL:
        return needs_full(v, "needs-full-batch")
    return None


def _by_rule(v: OpView, rule: Rule | None) -> OpAnnotation | None:
    """The op type's own rule (RULES, pass-through, variable writers), when it has one that applies."""
    return rule(v) if rule is not None else None


def _partial_family(v: OpView, rule: Rule | None) -> OpAnnotation | None:
    """Partial-sum inputs: aggregated first, or kept partial through ops that are linear in them."""
    if not v.has(PART):
        return None
    if v.type in ADDITIVE and all(c in (PLAIN, PART) for c in v.classes) and not all(c == PART for c in v.classes):
        # E.g. a weight-decay gradient plus the data gradient: aggregate the partial sum first
        # (the same single all-reduce the update needs anyway), then add on whole values.
        return needs_full(v, "sum-whole-and-partial")
    linear = None
    if v.type in ADDITIVE:
        linear = linear_partial(v)
    elif v.type in SCALED:
        for pos in SCALED[v.type]:
            linear = linear or linear_partial(v, (pos,))
    elif v.type in ("Reshape", "Transpose", "ExpandDims", "Squeeze", "Tile", "Cast"):
        linear = linear_partial(v, (0,)) if v.type != "Cast" or _float_to_float(v) else None
    return linear


def _local_family(v: OpView, rule: Rule | None) -> OpAnnotation | None:
    """LOCAL inputs through integer arithmetic stay LOCAL."""
    return rule_int_local(v) if v.has(LOC) else None


def _sample_family(v: OpView, rule: Rule | None) -> OpAnnotation | None:
    """Elementwise ops, and ops without a rule known to treat samples independently."""
    if v.type in ELEMENTWISE:
        return elementwise(v)
    if v.type in SAMPLE_OPS and rule is None:
        return per_sample(v, "per-sample")
    return None


def _fallback(v: OpView, rule: Rule | None) -> OpAnnotation:
    """No step decided: a known op mixes samples; an unknown one is exact on the shard if it only
    computes integers, and otherwise gets the whole batch (reported as unclassified)."""
    if rule is not None or v.type in ELEMENTWISE or v.type in SAMPLE_OPS:
        # A known op used in a way that mixes samples (e.g. concat along the batch axis).
        return needs_full(v, "mixes-samples")
    if v.outputs_int():
        # Unknown integer op: computing it on the shard is what LOCAL means, so it is exact.
        return _int_local(v)
    return needs_full(v, "unclassified", (Flag.UNCLASSIFIED,))


def _float_to_float(v: OpView) -> bool:
    """A cast to the same or a wider float type is exact, hence linear on partial sums."""
    src, dst = v.graph.tensor(v.op.inputs[0]), v.op.outputs[0]
    return (src.base_dtype in FLOAT_DTYPES and dst.base_dtype in FLOAT_DTYPES
            and (src.base_dtype == dst.base_dtype or src.itemsize < dst.itemsize))
