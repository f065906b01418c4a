"""Shape arithmetic for the GraphBuilder: the sizes of shards and of the whole batch, in the graph.

Splitting a batch, rescaling a Mean, or answering Shape/Size of a batch tensor all need row counts.
With a static batch they are constants; with a dynamic batch (the placement's `dynamic`) they are
computed at run time from the tensors themselves (Shape, StridedSlice, integer arithmetic), because
the counts exist only once a batch is fed. These helpers emit that arithmetic, so the conversions in
builder.py can ask for "the rows of each replica" or "the global row count" without caring which
case they are in.
"""
from __future__ import annotations

import numpy as np

from tag_tf.analysis.rules import SHAPE_OPS
from tag_tf.analysis.states import Kind, State
from tag_tf.compiler.base import BuilderBase
from tag_tf.ir import TensorRef
from tag_tf.placement.layout import Layout

_WEIGHT_SCALE = 10_000   # integer share weights for run-time (dynamic batch) splitting


def _cumulative_weights(lay: Layout) -> np.ndarray:
    """0, then the running sum of the replicas' integer weights (int64)."""
    w = np.maximum(1, np.round(np.asarray(lay.weights) / min(lay.weights) * _WEIGHT_SCALE)).astype(np.int64)
    return np.concatenate([[0], np.cumsum(w)]).astype(np.int64)


class ShapesMixin(BuilderBase):
    # -- row counts: each replica's (split sizes), one tensor's, the whole batch's ----------------
    def _runtime_sizes(self, full: str, dtype: str, need: State, lay: Layout, at: int) -> str:
        """Rows per replica computed in the graph from the actual batch: floor(N*W_j/W) boundaries."""
        device = self.devices[at]
        rows = self._dim(full, need.axis, dtype, device)
        base = f"tag/sizes/{full.split(':')[0]}"
        n = self.f.binary(f"{base}/samples", "FloorDiv", rows,
                          self.f.const(f"{base}/mult", need.mult, "int32", device), "int32", device)
        cum = _cumulative_weights(lay)
        return self._rows_between(base, n, cum, int(cum[-1]), need.mult, device)

    def _micro_sizes(self, ref: TensorRef, lay: Layout, need: State, m: int, at: int) -> str:
        """Rows of micro-batch m's replicas of a dynamic micro-batched layout, at run time: the
        same bounds `_runtime_sizes` gives the whole batch (floor(N * W_j / W)), those of replicas
        m * k .. (m + 1) * k only."""
        device = self.devices[at]
        k = lay.size // lay.micro
        cum = _cumulative_weights(lay)
        n = self._global_rows(1, device, of=ref.op)
        return self._rows_between(f"tag/sizes/{ref.op}/m{m}", n, cum[m * k:(m + 1) * k + 1], int(cum[-1]),
                                  need.mult, device)

    def _rows_between(self, base: str, n: str, cum: np.ndarray, total: int, mult: int, device: str) -> str:
        """int32 rows of the replicas between bounds floor(n * cum / total), times `mult`. In int64:
        n * cum overflows int32 from a batch of a few thousand over many replicas and micro-batches."""
        n64 = self.f.cast(f"{base}/samples64", n, "int32", "int64", device)
        scaled = self.f.binary(f"{base}/scaled", "Mul", n64, self.f.const(f"{base}/cum", cum, "int64", device),
                               "int64", device)
        bounds = self.f.binary(f"{base}/bounds", "FloorDiv", scaled, self.f.const(f"{base}/total", total, "int64", device),
                               "int64", device)
        one, zero, minus = self._c1(base, 1, device), self._c1(base, 0, device), self._c1(base, -1, device)
        hi = self.f.node(f"{base}/hi", "StridedSlice", [bounds, one, zero, one], device,
                         T=("type", "int64"), Index=("type", "int32"), end_mask=("int", 1))
        lo = self.f.node(f"{base}/lo", "StridedSlice", [bounds, zero, minus, one], device,
                         T=("type", "int64"), Index=("type", "int32"))
        diff = self.f.cast(f"{base}/samples_each", self.f.binary(f"{base}/diff", "Sub", hi, lo, "int64", device),
                           "int64", "int32", device)
        return self.f.binary(f"{base}/rows_each", "Mul", diff,
                             self.f.const(f"{base}/mult2", mult, "int32", device), "int32", device)

    def _c1(self, base: str, v: int, device: str) -> str:
        return self.f.const(f"{base}/c", [v], "int32", device)

    def _dim(self, tensor: str, axis: int, dtype: str, device: str) -> str:
        """Scalar int32: size of `tensor` along `axis`, at run time."""
        base = f"tag/dim/{tensor.split(':')[0]}"
        shape = self.f.shape(f"{base}/shape", tensor, dtype, device)
        return self.f.node(f"{base}/d{axis}", "StridedSlice",
                           [shape, self._c1(base, axis, device), self._c1(base, axis + 1, device),
                            self._c1(base, 1, device)], device,
                           T=("type", "int32"), Index=("type", "int32"), shrink_axis_mask=("int", 1))

    def _global_rows(self, mult: int, device: str, of: str | None = None) -> str:
        """Scalar int32: the global batch size times `mult` (at run time for dynamic graphs, read from
        a batch input that op `of` computes from: a run feeding only some inputs, such as a GAN's
        generator step, must not need the others)."""
        if not self.placement.dynamic:
            return self._memo_get(("global_rows", mult, device), lambda: self.f.const(
                "tag/global_rows", self.a.batch_size * mult, "int32", device))
        feeds = list(self.graph.meta.feeds)
        if of is not None and len(feeds) > 1:
            upstream = self.graph.ancestors([of])
            feeds = [f for f in feeds if TensorRef.parse(f).op in upstream] or feeds
        feed = TensorRef.parse(feeds[0])

        def batch() -> str:
            fdev = self.placement.of(feed.op).devices[0]
            return self._dim(self.out(feed, 0), 0, self._dtype(feed), self.devices[fdev])
        n = self._memo_get(("global_batch", feed.name), batch)
        if mult == 1:
            return n
        return self._memo_get(("global_rows", feed.name, mult, device), lambda: self.f.binary(
            "tag/global_rows", "Mul", n, self.f.const("tag/mult", mult, "int32", device), "int32", device))

    # -- Shape/ShapeN/Size of batch tensors, built without moving their data -----------------------
    def _static_local(self, op: str, lay: Layout, j: int) -> list[str] | None:
        """Shape/Size of a statically shaped tensor on a shard is a constant: emit that."""
        src = self.graph.op(op)
        if src.type not in SHAPE_OPS or not lay.counts:
            return None
        device = self.devices[lay.devices[j]]
        outs = []
        for k, ref in enumerate(src.inputs if src.type == "ShapeN" else src.inputs[:1]):
            shape = self.a.graph_b1.tensor(ref).shape
            tb = self.a.batch.of(ref)
            if shape is None or any(d < 0 for d in shape) or tb.irregular:
                return None
            dims = list(shape)
            if tb.axis is not None:       # batched
                dims[tb.axis] = lay.counts[j] * tb.mult
            dtype = src.outputs[k].base_dtype
            value = int(np.prod(dims)) if src.type == "Size" else dims
            outs.append(self.f.const(f"tag/local/{op}/r{j}", value, dtype, device) + ":0")
        return outs

    def _global_shapes(self, op: str, device: int) -> list[str] | None:
        """Whole-batch Shape/ShapeN/Size outputs of `op` at run time, without moving the data.

        Recomputing the op on one device would gather its split input (a Concat of every shard)
        only to read its shape: one activation-sized transfer per layer-norm gradient per step.
        Instead, take the shape of a shard (the one on `device` when there is one), which differs
        from the whole only along the batch axis, and put the global row count there. None when
        an input is not a plain split tensor (the caller recomputes).
        """
        src = self.graph.op(op)
        dev = self.devices[device]
        outs = []
        for k, ref in enumerate(src.inputs if src.type == "ShapeN" else src.inputs[:1]):
            state, tb = self.state_of(ref), self.a.batch.of(ref)
            if state.kind is not Kind.SPLIT or tb.irregular or tb.axis != state.axis:
                return None
            out_type = src.outputs[k].base_dtype
            play = self.placement.of(ref.op)
            j = play.devices.index(device) if device in play.devices else 0    # a shard already there
            base = f"tag/global/{op}/{k}"
            shard_shape = self.f.shape(f"{base}/shard_shape", self.out(ref, j), self._dtype(ref),
                                       self.devices[play.devices[j]])
            rows = self.f.node(f"{base}/rows", "Reshape",
                               [self._global_rows(tb.mult, dev, ref.op), self._c1(base, 1, dev)], dev,
                               T=("type", "int32"), Tshape=("type", "int32"))
            shape = self.f.node(f"{base}/shape", "TensorScatterUpdate",
                                [shard_shape, self.f.const(f"{base}/axis", [[tb.axis]], "int32", dev), rows], dev,
                                T=("type", "int32"), Tindices=("type", "int32"))
            if src.type == "Size":
                shape = self.f.node(f"{base}/size", "Prod", [shape, self.f.const(f"{base}/dims", [0], "int32", dev)],
                                    dev, T=("type", "int32"), Tidx=("type", "int32"), keep_dims=("bool", False))
            if out_type != "int32":
                shape = self.f.cast(f"{base}/cast", shape, "int32", out_type, dev)
            outs.append(shape + ":0")
        return outs
