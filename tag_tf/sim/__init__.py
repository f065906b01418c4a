"""Discrete-event simulator of task graphs (native engine in kernels/engine.h).

trace and gantt (Chrome trace export, matplotlib charts) are imported on demand:
`from tag_tf.sim.trace import write_chrome_trace`, `from tag_tf.sim.gantt import plot_gantt`.
"""
from tag_tf.sim.engine import (
    CycleError,
    Engine,
    SimResult,
    SimSummary,
    TaskGraph,
    TaskGraphBuilder,
    make_task_graph,
    simulate,
)

__all__ = ["CycleError", "Engine", "SimResult", "SimSummary", "TaskGraph", "TaskGraphBuilder",
           "make_task_graph", "simulate"]
