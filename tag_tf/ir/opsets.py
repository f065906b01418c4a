"""Families of TF op types the IR and passes need to recognise structurally (not batch semantics:
those live in `tag_tf.analysis.rules`)."""
from __future__ import annotations

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


def is_variable_writer(op_type: str) -> bool:
    return op_type in _WRITER_EXACT or op_type.startswith(_WRITER_PREFIXES)


def is_optimizer_update(op_type: str) -> bool:
    return op_type.startswith(_UPDATE_PREFIXES)


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
