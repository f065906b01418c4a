"""tag_tf's graph IR: ops, tensors (dtype + static shape), control edges, colocation, variables.

The IR is built from a GraphDef/MetaGraphDef (see `importer.py`), independent of the Python API that
built the graph. It is immutable: passes derive new graphs instead of editing one. The original
NodeDefs are kept (read-only) so the compiler can rebuild the full graph, attributes and all.
"""
from __future__ import annotations

import dataclasses
import hashlib
import types
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, cast

import numpy as np

from tag_tf.ir.opsets import training_updates

if TYPE_CHECKING:
    from tensorflow.core.framework.attr_value_pb2 import AttrValue
    from tensorflow.core.framework.function_pb2 import FunctionDef, FunctionDefLibrary
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.framework.node_def_pb2 import NodeDef
    from tensorflow.core.framework.tensor_shape_pb2 import TensorShapeProto
    from tensorflow.core.framework.versions_pb2 import VersionDef

T = TypeVar("T")

# Byte sizes of TF dtypes by name; "resource"/"variant"/"string" have no fixed size.
_DTYPE_BYTES = {
    "float16": 2, "bfloat16": 2, "float32": 4, "float64": 8, "half": 2, "float": 4, "double": 8,
    "int8": 1, "uint8": 1, "int16": 2, "uint16": 2, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8,
    "bool": 1, "complex64": 8, "complex128": 16, "qint8": 1, "quint8": 1, "qint32": 4,
}
FLOAT_DTYPES = frozenset({"float16", "bfloat16", "float32", "float64", "half", "float", "double"})


@dataclasses.dataclass(frozen=True, slots=True)
class TensorRef:
    """The `index`-th output of op `op`."""

    op: str
    index: int = 0

    @property
    def name(self) -> str:
        return f"{self.op}:{self.index}"

    def __str__(self) -> str:
        return self.name

    @staticmethod
    def parse(name: str) -> TensorRef:
        """Parse "op", "op:1" (GraphDef input syntax without the control "^" prefix)."""
        if name.startswith("^"):
            raise ValueError(f"{name!r} is a control input, not a tensor")
        op, sep, idx = name.rpartition(":")
        if sep and idx.isdigit():
            return TensorRef(op, int(idx))
        return TensorRef(name, 0)


@dataclasses.dataclass(frozen=True, slots=True)
class TensorInfo:
    """Static type of a tensor. `shape` uses -1 for an unknown dim and None for unknown rank."""

    dtype: str
    shape: tuple[int, ...] | None

    @property
    def is_ref(self) -> bool:
        return self.dtype.endswith("_ref")

    @property
    def base_dtype(self) -> str:
        return self.dtype[:-4] if self.is_ref else self.dtype

    @property
    def is_resource(self) -> bool:
        return self.base_dtype == "resource"

    @property
    def fully_defined(self) -> bool:
        return self.shape is not None and all(d >= 0 for d in self.shape)

    @property
    def num_elements(self) -> int | None:
        if self.shape is None or not self.fully_defined:
            return None
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def itemsize(self) -> int:
        return _DTYPE_BYTES.get(self.base_dtype, 0)

    @property
    def nbytes(self) -> int | None:
        n = self.num_elements
        return None if n is None else n * self.itemsize


@dataclasses.dataclass(frozen=True, slots=True)
class Op:
    name: str
    type: str
    inputs: tuple[TensorRef, ...]
    control_inputs: tuple[str, ...]
    outputs: tuple[TensorInfo, ...]
    device: str = ""
    colocate_with: tuple[str, ...] = ()   # names from the `_class: loc:@name` attribute

    def output(self, index: int = 0) -> TensorRef:
        return TensorRef(self.name, index)


@dataclasses.dataclass(frozen=True)
class Variable:
    """A variable of the training graph and the ops that touch it."""

    name: str                    # op name of the VariableV2 / VarHandleOp
    kind: str                    # "ref" | "resource"
    dtype: str
    shape: tuple[int, ...]
    trainable: bool
    writers: tuple[str, ...]     # ops that update it (Apply*, Assign*, Scatter*)
    initializer: str | None      # the Assign op of the initializer, if found

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * _DTYPE_BYTES.get(self.dtype, 4)


@dataclasses.dataclass(frozen=True)
class GraphMeta:
    """What the IR knows about how the graph is used: the training op, loss, feeds and collections."""

    train_op: str | None = None
    loss: str | None = None                       # tensor name
    feeds: tuple[str, ...] = ()                   # placeholder op names carrying batch data
    collections: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    saver_def: bytes | None = None                # serialized SaverDef, when the MetaGraph had one
    batch_size: int | None = None                 # batch size of the feeds (None: dynamic/unknown)


class Graph:
    """An immutable graph: ops in a topological order plus use/def indexes.

    Build one with `tag_tf.ir.importer.from_graph_def`. `node_def(name)` returns the original NodeDef;
    treat it as read-only (copy before editing).
    """

    def __init__(self, ops: Iterable[Op], node_defs: Mapping[str, NodeDef], meta: GraphMeta,
                 variables: Iterable[Variable] = (), library: FunctionDefLibrary | None = None,
                 versions: VersionDef | None = None):
        ops = tuple(ops)
        self._ops: Mapping[str, Op] = types.MappingProxyType({op.name: op for op in ops})
        self.order: tuple[str, ...] = tuple(op.name for op in ops)
        self._node_defs = types.MappingProxyType(dict(node_defs))
        self.meta = meta
        self.variables: Mapping[str, Variable] = types.MappingProxyType({v.name: v for v in variables})
        self.library = library
        self.versions = versions
        consumers: dict[TensorRef, list[tuple[str, int]]] = {}
        control_consumers: dict[str, list[str]] = {}
        for op in ops:
            for i, ref in enumerate(op.inputs):
                consumers.setdefault(ref, []).append((op.name, i))
            for c in op.control_inputs:
                control_consumers.setdefault(c, []).append(op.name)
        self._consumers = {k: tuple(v) for k, v in consumers.items()}
        self._control_consumers = {k: tuple(v) for k, v in control_consumers.items()}
        self._fingerprint: str | None = None
        self._training_updates: frozenset[str] | None = None
        self._memo: dict[str, object] = {}

    def cached(self, key: str, make: Callable[[], T]) -> T:
        """`make()`, computed once per graph under `key`: facts derived from an immutable graph
        (the passes above ask for some of them once per candidate plan)."""
        if key not in self._memo:
            self._memo[key] = make()
        return cast(T, self._memo[key])

    # -- lookup -------------------------------------------------------------------------------
    @property
    def ops(self) -> Mapping[str, Op]:
        return self._ops

    def __len__(self) -> int:
        return len(self._ops)

    def __iter__(self) -> Iterator[Op]:
        return (self._ops[n] for n in self.order)

    def __contains__(self, name: str) -> bool:
        return name in self._ops

    def op(self, name: str) -> Op:
        try:
            return self._ops[name]
        except KeyError:
            raise KeyError(f"no op named {name!r} in the graph") from None

    def tensor(self, ref: TensorRef | str) -> TensorInfo:
        ref = TensorRef.parse(ref) if isinstance(ref, str) else ref
        op = self.op(ref.op)
        if ref.index >= len(op.outputs):
            raise KeyError(f"op {ref.op!r} ({op.type}) has no output {ref.index}")
        return op.outputs[ref.index]

    def consumers(self, ref: TensorRef) -> tuple[tuple[str, int], ...]:
        """(consumer op, input index) pairs reading `ref`."""
        return self._consumers.get(ref, ())

    def op_consumers(self, name: str) -> tuple[str, ...]:
        """Ops reading any output of `name` (data edges only), without duplicates, in graph order."""
        op = self.op(name)
        seen: dict[str, None] = {}
        for i in range(len(op.outputs)):
            for c, _ in self._consumers.get(TensorRef(name, i), ()):
                seen[c] = None
        return tuple(seen)

    def training_updates(self) -> frozenset[str]:
        """Ops that train: optimizer updates and variable writes of gradient-derived values."""
        if self._training_updates is None:
            self._training_updates = training_updates(
                (op.name, op.type, [r.op for r in op.inputs]) for op in self)
        return self._training_updates

    def control_consumers(self, name: str) -> tuple[str, ...]:
        return self._control_consumers.get(name, ())

    def node_def(self, name: str) -> NodeDef:
        return self._node_defs[name]

    def attr(self, name: str, key: str, default: Any = None) -> Any:
        """A NodeDef attribute as a Python value (ints, floats, bools, strings, lists, dtypes by name,
        shapes as tuples, tensors as numpy arrays)."""
        node = self._node_defs[name]
        if key not in node.attr:
            return default
        return attr_value_to_python(node.attr[key])

    # -- whole-graph views ---------------------------------------------------------------------
    def ancestors(self, roots: Iterable[str], *, control: bool = True) -> set[str]:
        """All ops that `roots` depend on (including the roots)."""
        seen: set[str] = set()
        stack = [r for r in roots]
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            op = self._ops[name]
            stack.extend(ref.op for ref in op.inputs)
            if control:
                stack.extend(op.control_inputs)
        return seen

    @property
    def fingerprint(self) -> str:
        """A stable hash of the graph's structure and attributes (keys caches of profiles and plans).

        The same model built twice must hash alike, even in one process: `_output_shapes` (present
        only in exported graphs) is ignored, functions (cond/while bodies) are named by order of
        first use, since TF names them with process-wide counters, and so are the values only
        variable initialisation reads (`initial_value_ops`: Keras 2.15 initialisers seed themselves
        from Python's unseeded `random`, so one script builds other seed constants in every process,
        while the computation, and every value tag_tf loads into the variables, is the same)."""
        if self._fingerprint is None:
            self._fingerprint = _fingerprint(self, [self._node_defs[n] for n in self.order],
                                             self.initial_value_ops())
        return self._fingerprint

    def initial_value_ops(self) -> frozenset[str]:
        """Ops that only the variables' initialisers read: their values are overwritten by whatever
        values a session loads, so they are not part of what the graph computes."""
        inits = [v.initializer for v in self.variables.values() if v.initializer]
        if not inits:
            return frozenset()
        initial = self.ancestors(inits)
        after: set[str] = set()                  # what runs after an initialiser (init groups)
        stack = list(inits)
        while stack:
            name = stack.pop()
            if name not in after:
                after.add(name)
                stack.extend(self.op_consumers(name))
                stack.extend(self.control_consumers(name))
        needed = self.ancestors(n for n in self.order if n not in initial and n not in after)
        return frozenset(initial - needed)

    def to_graph_def(self) -> GraphDef:
        from tensorflow.core.framework import graph_pb2

        gd = graph_pb2.GraphDef()
        for name in self.order:
            gd.node.add().CopyFrom(self._node_defs[name])
        if self.library is not None:
            gd.library.CopyFrom(self.library)
        if self.versions is not None:
            gd.versions.CopyFrom(self.versions)
        return gd


# Attributes of an initial-value op that do not change what a graph computes (seeds and constants).
INITIAL_VALUE_ATTRS = ("value", "seed", "seed2")


def without_initial_values(node: NodeDef) -> NodeDef:
    """A copy of NodeDef `node` without the attributes that only give a variable its initial value."""
    copy = type(node)()
    copy.CopyFrom(node)
    for key in INITIAL_VALUE_ATTRS:
        if key in copy.attr:
            del copy.attr[key]
    return copy


def _fingerprint(graph: Graph, nodes: list[NodeDef], initial: frozenset[str] = frozenset()) -> str:
    functions = {f.signature.name: f for f in graph.library.function} if graph.library is not None else {}
    canonical: dict[str, str] = {}

    def canon(node_like: NodeDef, top: bool = False) -> bytes:
        copy = type(node_like)()
        copy.CopyFrom(node_like)
        if "_output_shapes" in copy.attr:
            del copy.attr["_output_shapes"]
        if top and copy.name in initial:
            copy = without_initial_values(copy)
        for key in sorted(copy.attr):            # protobuf maps iterate in no fixed order
            _rename_functions(copy.attr[key], functions, canonical)
        return copy.SerializeToString(deterministic=True)

    h = hashlib.sha256()
    for node in nodes:
        h.update(canon(node, True))
    done: set[str] = set()
    while len(done) < len(canonical):            # bodies of the functions used, in first-use order
        for name in [n for n in canonical if n not in done]:
            done.add(name)
            fdef = functions[name]
            h.update(canonical[name].encode())
            for inner in fdef.node_def:
                h.update(canon(inner))
            signature = type(fdef.signature)()
            signature.CopyFrom(fdef.signature)
            signature.name = ""                   # the counter-laden name is replaced by canonical[name]
            for arg in (*signature.input_arg, *signature.output_arg):
                arg.ClearField("handle_data")     # shape annotations, like _output_shapes
            h.update(signature.SerializeToString(deterministic=True))
    return h.hexdigest()[:16]


def _rename_functions(value: AttrValue, functions: Mapping[str, FunctionDef], canonical: dict[str, str]) -> None:
    kind = value.WhichOneof("value")
    targets = [value.func] if kind == "func" else list(value.list.func) if kind == "list" else []
    for func in targets:
        if func.name in functions:
            func.name = canonical.setdefault(func.name, f"fn{len(canonical)}")


def attr_value_to_python(value: AttrValue) -> Any:
    """Decode an AttrValue proto into plain Python (dtypes become their names)."""
    from tensorflow.python.framework import dtypes, tensor_util

    kind = value.WhichOneof("value")
    if kind == "i":
        return int(value.i)
    if kind == "f":
        return float(value.f)
    if kind == "b":
        return bool(value.b)
    if kind == "s":
        return value.s.decode("utf-8", "replace")
    if kind == "type":
        return dtypes.as_dtype(value.type).name
    if kind == "shape":
        return shape_proto_to_tuple(value.shape)
    if kind == "tensor":
        return tensor_util.MakeNdarray(value.tensor)
    if kind == "list":
        lst = value.list
        if lst.i:
            return [int(x) for x in lst.i]
        if lst.f:
            return [float(x) for x in lst.f]
        if lst.b:
            return [bool(x) for x in lst.b]
        if lst.s:
            return [x.decode("utf-8", "replace") for x in lst.s]
        if lst.type:
            return [dtypes.as_dtype(t).name for t in lst.type]
        if lst.shape:
            return [shape_proto_to_tuple(s) for s in lst.shape]
        return []
    if kind == "func":
        return value.func.name
    return None


def shape_proto_to_tuple(shape: TensorShapeProto) -> tuple[int, ...] | None:
    if shape.unknown_rank:
        return None
    return tuple(int(d.size) for d in shape.dim)
