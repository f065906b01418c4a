"""Small constructors for the NodeDefs the compiler inserts (Split, Concat, AddN, collectives...).

They write NodeDefs directly (no Python-level TF graph building): compile time stays low on graphs
with tens of thousands of ops. TF fills attributes left at their defaults when the graph is imported.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

if TYPE_CHECKING:
    from numpy.typing import ArrayLike
    from tensorflow.core.framework.node_def_pb2 import NodeDef

# A NodeDef attribute to set: (kind, value), the kind naming the AttrValue field the value goes to.
AttrSpec = (tuple[Literal["type"], str] | tuple[Literal["int"], int] | tuple[Literal["f"], float]
            | tuple[Literal["bool"], bool] | tuple[Literal["s"], str | bytes]
            | tuple[Literal["list_int"], Sequence[int]])


def _dtype_enum(dtype: str) -> int:
    from tensorflow.python.framework import dtypes

    return dtypes.as_dtype(dtype).as_datatype_enum


class NodeFactory:
    """Creates uniquely named NodeDefs and collects them in order."""

    def __init__(self, taken: Iterable[str] = ()):
        from tensorflow.core.framework import node_def_pb2

        self._NodeDef = node_def_pb2.NodeDef
        self.nodes: list[NodeDef] = []
        self._taken = set(taken)
        self._counters: dict[str, int] = {}

    def unique(self, base: str) -> str:
        if base not in self._taken:
            self._taken.add(base)
            return base
        k = self._counters.get(base, 1)
        while f"{base}_{k}" in self._taken:
            k += 1
        self._counters[base] = k + 1
        name = f"{base}_{k}"
        self._taken.add(name)
        return name

    def reserve(self, name: str) -> None:
        self._taken.add(name)

    def add(self, node: NodeDef) -> NodeDef:
        self.nodes.append(node)
        return node

    def node(self, base: str, op: str, inputs: Sequence[str], device: str, *,
             control: Sequence[str] = (), unique: bool = True, **attrs: AttrSpec) -> str:
        """Append a node; returns its name. `attrs` values: ('type', 'float32'), ('int', 3), ..."""
        node = self._NodeDef()
        node.name = self.unique(base) if unique else base
        node.op = op
        node.input.extend(inputs)
        node.input.extend(f"^{c}" for c in control)
        node.device = device
        for key, spec in attrs.items():
            set_attr(node, key, spec)
        self.nodes.append(node)
        return node.name

    # -- common ops -----------------------------------------------------------------------------
    def const(self, base: str, value: ArrayLike, dtype: str, device: str) -> str:
        from tensorflow.python.framework import tensor_util

        arr = np.asarray(value, dtype=np.dtype(dtype) if dtype != "bfloat16" else np.float32)
        node = self._NodeDef()
        node.name = self.unique(base)
        node.op = "Const"
        node.device = device
        node.attr["dtype"].type = _dtype_enum(dtype)
        node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(arr, dtype=dtype, shape=arr.shape))
        self.nodes.append(node)
        return node.name

    def concat(self, base: str, values: Sequence[str], axis: int, dtype: str, device: str) -> str:
        ax = self.const(f"{base}/axis", axis, "int32", device)
        return self.node(base, "ConcatV2", list(values) + [ax], device,
                         N=("int", len(values)), T=("type", dtype), Tidx=("type", "int32"))

    def split_v(self, base: str, value: str, sizes: str, axis: int, num: int, dtype: str, device: str) -> str:
        ax = self.const(f"{base}/axis", axis, "int32", device)
        return self.node(base, "SplitV", [value, sizes, ax], device,
                         num_split=("int", num), T=("type", dtype), Tlen=("type", "int32"))

    def slice(self, base: str, value: str, begin: str, size: str, dtype: str, device: str) -> str:
        return self.node(base, "Slice", [value, begin, size], device, T=("type", dtype), Index=("type", "int32"))

    def add_n(self, base: str, values: Sequence[str], dtype: str, device: str, *, unique: bool = True) -> str:
        if len(values) == 1:
            return self.node(base, "Identity", list(values), device, unique=unique, T=("type", dtype))
        return self.node(base, "AddN", list(values), device, unique=unique, N=("int", len(values)),
                         T=("type", dtype))

    def binary(self, base: str, op: str, x: str, y: str, dtype: str, device: str) -> str:
        return self.node(base, op, [x, y], device, T=("type", dtype))

    def cast(self, base: str, x: str, src: str, dst: str, device: str) -> str:
        return self.node(base, "Cast", [x], device, SrcT=("type", src), DstT=("type", dst),
                         Truncate=("bool", False))

    def unary(self, base: str, op: str, x: str, dtype: str, device: str) -> str:
        return self.node(base, op, [x], device, T=("type", dtype))

    def shape(self, base: str, x: str, dtype: str, device: str, out_type: str = "int32") -> str:
        return self.node(base, "Shape", [x], device, T=("type", dtype), out_type=("type", out_type))

    def no_op(self, base: str, control: Sequence[str], device: str) -> str:
        return self.node(base, "NoOp", [], device, control=control)

    def collective_reduce(self, base: str, value: str, dtype: str, device: str, *, group_size: int,
                          group_key: int, instance_key: int, control: Sequence[str] = (),
                          unique: bool = True) -> str:
        gs = self.const(f"{base}/group_size", group_size, "int32", device)
        gk = self.const(f"{base}/group_key", group_key, "int32", device)
        ik = self.const(f"{base}/instance_key", instance_key, "int32", device)
        return self.node(base, "CollectiveReduceV2", [value, gs, gk, ik], device, control=control, unique=unique,
                         T=("type", dtype), merge_op=("s", "Add"), final_op=("s", "Id"),
                         communication_hint=("s", "auto"), timeout_seconds=("f", 0.0),
                         Nordering_token=("int", 0))

    def nccl_all_reduce(self, base: str, value: str, dtype: str, device: str, *, num_devices: int,
                        shared_name: str, control: Sequence[str] = (), unique: bool = True) -> str:
        return self.node(base, "NcclAllReduce", [value], device, control=control, unique=unique,
                         reduction=("s", "sum"),
                         T=("type", dtype), num_devices=("int", num_devices), shared_name=("s", shared_name))


def set_attr(node: NodeDef, key: str, spec: AttrSpec) -> None:
    attr = node.attr[key]
    if spec[0] == "type":
        attr.type = _dtype_enum(spec[1])
    elif spec[0] == "int":
        attr.i = int(spec[1])
    elif spec[0] == "f":
        attr.f = float(spec[1])
    elif spec[0] == "bool":
        attr.b = bool(spec[1])
    elif spec[0] == "s":
        attr.s = spec[1].encode() if isinstance(spec[1], str) else spec[1]
    elif spec[0] == "list_int":
        attr.list.i.extend(int(v) for v in spec[1])
    else:
        raise ValueError(f"unknown attr kind {spec[0]!r}")
