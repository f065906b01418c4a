"""The compiler: apply a strategy to the graph, inserting the ops that keep it equivalent."""
from tag_tf.compiler.compile import Compiled, check_compilable, check_compiled, compile_strategy
from tag_tf.compiler.devices import DeviceMap
from tag_tf.placement.layout import HOST, Layout, Mode, Placement, resolve

__all__ = ["Compiled", "check_compilable", "check_compiled", "compile_strategy", "DeviceMap", "HOST", "Layout", "Mode",
           "Placement", "resolve"]
