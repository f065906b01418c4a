"""Families of TF op types the IR and passes need to recognise structurally (not batch semantics:
those live in `tag_tf.analysis.rules`)."""
from __future__ import annotations

from collections.abc import Iterable, Sequence

VARIABLE_OPS = frozenset({"VariableV2", "Variable", "VarHandleOp"})

# Ops that write a variable through their first (ref or resource) input.
_WRITER_EXACT = frozenset({
    "Assign", "AssignAdd", "AssignSub", "AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp",
})
_WRITER_PREFIXES = ("Apply", "ResourceApply", "SparseApply", "ResourceSparseApply", "Scatter",
                    "ResourceScatter", "ResourceStridedSliceAssign", "StridedSliceAssign")
_UPDATE_PREFIXES = ("Apply", "ResourceApply", "SparseApply", "ResourceSparseApply")

# TF1 control flow: its frames must not be split across devices or replicated piecemeal.
CONTROL_FLOW_OPS = frozenset({"Enter", "Exit", "Merge", "Switch", "NextIteration", "LoopCond",
                              "RefEnter", "RefExit", "RefMerge", "RefSwitch", "RefNextIteration"})


# Ops that write a lookup table (its initialisers, imports and inserts) through their first input.
TABLE_WRITERS = frozenset({"InitializeTable", "InitializeTableV2", "InitializeTableFromTextFile",
                           "InitializeTableFromTextFileV2", "InitializeTableFromDataset", "LookupTableImport",
                           "LookupTableImportV2", "LookupTableInsert", "LookupTableInsertV2", "LookupTableRemoveV2"})


def is_variable_writer(op_type: str) -> bool:
    return op_type in _WRITER_EXACT or op_type.startswith(_WRITER_PREFIXES)


def is_optimizer_update(op_type: str) -> bool:
    return op_type.startswith(_UPDATE_PREFIXES)


# Kernels that only a backward pass emits (tf.gradients names them <Op>Grad, Conv2DBackprop*, ...).
_GRADIENT_TYPE_SUFFIXES = ("Grad", "GradV2", "GradV3", "GradGrad", "BackpropInput", "BackpropInputV2",
                           "BackpropFilter", "BackpropFilterV2")
_GRADIENT_TYPES = frozenset({"BroadcastGradientArgs", "SymbolicGradient"})
# Name scopes tf.gradients / GradientTape / Optimizer.compute_gradients put the backward pass under.
_GRADIENT_SCOPES = ("gradients", "gradient_tape")


def is_gradient_op(name: str, op_type: str) -> bool:
    """An op of a backward pass: a gradient kernel, or any op in a gradient name scope
    (`gradients/`, `gradients_1/`, `gradient_tape/`, also nested under the user's own scopes)."""
    if op_type in _GRADIENT_TYPES or op_type.endswith(_GRADIENT_TYPE_SUFFIXES):
        return True
    for part in name.split("/")[:-1]:
        head, _, tail = part.partition("_")
        if part in _GRADIENT_SCOPES or (head == "gradients" and tail.isdigit()):
            return True
    return False


def training_updates(ops: Iterable[tuple[str, str, Sequence[str]]]) -> frozenset[str]:
    """The ops that train: optimizer updates (Apply*), and any other variable write (Assign*,
    Scatter*, ref or resource) whose written value depends on a gradient. That is what training
    is, whatever the optimizer looks like: the official BERT optimizer is a group of plain assigns,
    tutorials write `w.assign_sub(lr * g)`. Writes that follow no gradient (initialisers,
    `global_step.assign_add(1)`, restores) are not training by themselves.

    `ops`: (name, type, names of the ops it reads through data edges), for every op of the graph, in
    an order where an op comes after what it reads (the IR's order; a tf.Graph's creation order). A
    loop's back edge (NextIteration) reads something later and is not followed."""
    from_gradient: dict[str, bool] = {}
    out = set()
    for name, op_type, ins in ops:
        from_gradient[name] = is_gradient_op(name, op_type) or any(from_gradient.get(i, False) for i in ins)
        if is_optimizer_update(op_type) or (
                is_variable_writer(op_type) and any(from_gradient.get(i, False) for i in ins[1:])):
            out.add(name)
    return frozenset(out)


def gradient_input(op_type: str) -> int | None:
    """Index of the gradient input ("grad", or "delta" for gradient descent) of an optimizer update."""
    if not is_optimizer_update(op_type):
        return None
    from tensorflow.python.framework import op_def_registry

    op_def = op_def_registry.get(op_type)
    if op_def is None:
        return None
    for i, arg in enumerate(op_def.input_arg):
        if arg.name in ("grad", "delta"):
            return i
    return None
