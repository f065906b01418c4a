"""Steps that either complete or leave every variable as it was: what elastic runs restore from.

A task's part of a between-graph step (`localize.TaskGraph`) meets the other tasks only in
collectives. When a task is lost mid-step, the survivors' collectives fail; without more, a survivor
may already have applied the gradients whose all-reduce completed and not the others (one bucket of
two), leaving its variables neither at the step before nor after. `atomic_step` makes every
variable write of the task's graph wait for every collective of the step (one NoOp joining them),
so that a step that fails in a collective has written nothing: each survivor holds either the
state before the failed step or the state after it, and `Runner` counts which.

A write that a collective itself depends on (a gradient accumulator read by the all-reduce) cannot
wait for it: `atomic_step` refuses such graphs by name (`CompileError`) rather than restore from a
state that may be half written.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from tag_tf.errors import CompileError
from tag_tf.ir.opsets import is_variable_writer

if TYPE_CHECKING:
    from tensorflow.core.framework.graph_pb2 import GraphDef

BARRIER = "tag/elastic/collectives_done"
CHANGE_QUEUE = "tag_tf_elastic_change"     # per task: membership changes its chief announced


def _source(name: str) -> str:
    return name.lstrip("^").split(":")[0]


def atomic_step(graph_def: GraphDef) -> GraphDef:
    """`graph_def` with every variable write after every collective (a copy; the input is unchanged).
    A graph without collectives or without writes is returned as a copy unchanged."""
    from tensorflow.core.framework.graph_pb2 import GraphDef

    out = GraphDef()
    out.CopyFrom(graph_def)
    nodes = {n.name: n for n in out.node}
    collectives = [n for n in out.node if n.op.startswith("Collective")]
    writers = [n for n in out.node if is_variable_writer(n.op)]
    if not collectives or not writers:
        return out
    # Everything some collective depends on (data and control inputs): a write there cannot wait.
    before: set[str] = set()
    stack = [_source(i) for c in collectives for i in c.input]
    while stack:
        name = stack.pop()
        if name in before or name not in nodes:
            continue
        before.add(name)
        stack.extend(_source(i) for i in nodes[name].input)
    early = [w.name for w in writers if w.name in before]
    if early:
        raise CompileError(f"elastic: op {early[0]!r} ({nodes[early[0]].op}) writes a variable that the step's "
                           f"collectives then read; a step lost between them would leave its variables half "
                           f"written, so this graph cannot be restored exactly after a lost task (run it with "
                           f"elastic=False)")
    barrier = out.node.add()
    barrier.name = BARRIER
    barrier.op = "NoOp"
    barrier.device = collectives[0].device.rsplit("/device:", 1)[0] + "/device:CPU:0" if collectives[0].device else ""
    barrier.input.extend(f"^{c.name}" for c in collectives)
    for w in writers:
        w.input.append(f"^{BARRIER}")
    return out


__all__ = ["BARRIER", "CHANGE_QUEUE", "atomic_step"]
