"""tag_tf: deploy unchanged TF1 training graphs across heterogeneous GPU clusters (TAG).

The one line most users need::

    with tag_tf.distribute(strategy="auto", topology="testbed"):   # or a topology file, or local GPUs
        ...existing tf.compat.v1 training code...

The pipeline underneath, for programs that drive it themselves::

    model = tag_tf.build_model("mlp", batch_size=32)                # or any TF1 GraphDef + MetaGraphDef
    graph = tag_tf.ir.from_graph_def(model.graph_def, model.meta_graph_def)     # IR
    ctx = tag_tf.PassContext()
    analysis = tag_tf.analyze(ctx, graph, weight_fn=tag_tf.reference_weights)   # batch dims, groups
    topology = tag_tf.load_topology("testbed")
    dp = tag_tf.Strategy.uniform(len(analysis.grouping.groups), range(topology.num_devices))
    report = tag_tf.Simulator(analysis, topology).simulate(dp)    # predicted iteration (simulated)
    local = tag_tf.Strategy.uniform(len(analysis.grouping.groups), range(4))
    compiled = tag_tf.compile_strategy(ctx, analysis, local, tag_tf.DeviceMap.local_cpus(4))

Names are imported on first use, so `import tag_tf` stays cheap (TensorFlow loads when needed).
"""
from __future__ import annotations

import importlib

_EXPORTS = {
    "distribute": "tag_tf.frontend.distribute",
    "DistributeOptions": "tag_tf.frontend.options",
    "analyze": "tag_tf.analysis",
    "Analysis": "tag_tf.analysis",
    "reference_weights": "tag_tf.profile.weights",
    "PassContext": "tag_tf.context",
    "Options": "tag_tf.context",
    "Strategy": "tag_tf.strategy",
    "GroupPlan": "tag_tf.strategy",
    "Option": "tag_tf.strategy",
    "Topology": "tag_tf.topology.spec",
    "load_topology": "tag_tf.topology.load",
    "Simulator": "tag_tf.sim.simulator",
    "compile_strategy": "tag_tf.compiler",
    "DeviceMap": "tag_tf.compiler",
    "build_model": "tag_tf.models",
}

__all__ = sorted(_EXPORTS)


# Submodules users reach as attributes (`tag_tf.estimator.distributed(...)`), also imported on first use.
_SUBMODULES = frozenset({"estimator", "errors", "ir", "models"})


def __getattr__(name: str):
    if name in _SUBMODULES:
        value = importlib.import_module(f"tag_tf.{name}")
        globals()[name] = value
        return value
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'tag_tf' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(__all__) | _SUBMODULES)
