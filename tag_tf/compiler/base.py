"""What every part of the GraphBuilder shares: its inputs, the instances it emitted, and the memo.

GraphBuilder (builder.py) is assembled from mixins over this base: the op instances and the
conversions between layouts (builder.py), the all-reduces and fused sums (collectives.py), and the
shape arithmetic for shards and dynamic batches (shapes.py). Each part reads the same inputs
(analysis, placement, devices), adds nodes through one NodeFactory, finds the original ops'
instances in `outputs`, and builds every conversion through `_memo_get`. The memo is what lets all
consumers share one conversion, and it records who first needed each one, so that `counts` can tell
the conversions the training step runs from those only a fetch would run.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar, cast

from tag_tf.analysis import Analysis
from tag_tf.analysis.states import FULL, State
from tag_tf.compiler.devices import DeviceMap
from tag_tf.compiler.nodes import NodeFactory
from tag_tf.ir import TensorRef
from tag_tf.placement.layout import Mode, Placement

T = TypeVar("T")


class BuilderBase:
    def __init__(self, analysis: Analysis, placement: Placement, devices: DeviceMap):
        self.a = analysis
        self.graph = analysis.graph
        self.placement = placement
        self.devices = devices
        self.f = NodeFactory(self.graph.order)
        self.outputs: dict[str, list[list[str]]] = {}        # op -> per instance -> per output tensor name
        self.instances: dict[str, list[str]] = {}            # op -> node names of its instances
        self._memo: dict[tuple, object] = {}              # conversion key -> what building it gave
        # Who needs each memoised conversion: "training" (an op of the training step), "other" (ops
        # that only run when fetched: init, save, dangling gradient outputs) or "recompute" (inside
        # the recomputation of a LOCAL value). Reuse by a training op upgrades the entry.
        self._origin: dict[tuple, str] = {}
        self._nested: dict[tuple, list[tuple]] = {}   # conversions built while building another
        self._building: list[tuple] = []
        # What is being emitted right now, which decides the origin recorded above.
        self._emitting_training = False
        self._recompute_depth = 0

    def state_of(self, ref: TensorRef) -> State:
        lay = self.placement.of(ref.op)
        if lay.mode is not Mode.REPLICATED:
            return FULL
        outs = self.a.annotations[ref.op].outputs
        return outs[ref.index] if ref.index < len(outs) else FULL

    def out(self, ref: TensorRef, j: int) -> str:
        return self.outputs[ref.op][j][ref.index]

    def _dtype(self, ref: TensorRef) -> str:
        return self.graph.tensor(ref).base_dtype

    def _memo_get(self, key: tuple, build: Callable[[], T]) -> T:
        context = "recompute" if self._recompute_depth else ("training" if self._emitting_training else "other")
        value = self._memo.get(key)
        if value is None:
            self._origin[key] = context
            if self._building:
                self._nested.setdefault(self._building[-1], []).append(key)
            self._building.append(key)
            try:
                value = build()
            finally:
                self._building.pop()
            self._memo[key] = value
        elif context == "training":
            self._mark_training(key)
        return cast(T, value)      # a key is always built by the same kind of `build`

    def _mark_training(self, key: tuple) -> None:
        stack = [key]
        while stack:
            k = stack.pop()
            if self._origin.get(k) != "training":
                self._origin[k] = "training"
                stack.extend(self._nested.get(k, ()))
