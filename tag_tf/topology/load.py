"""Naming a topology: `load_topology(spec)` accepts
  * a preset name: ``testbed``, ``cloud`` (the paper's clusters; ``-nominal`` for datasheet physics),
    ``local`` / ``local:N`` (this machine; N virtual CPU devices when TensorFlow sees no GPU),
    ``random:SEED`` (the paper's random topology generator), ``mixed:N`` (N GPUs in eight-GPU
    machines of H100, A100-80GB and V100-32GB: the scale study's clusters);
  * a path to a ``.yaml`` / ``.yml`` / ``.json`` file (format: `tag_tf.topology.parse`);
  * a dict in the same format (or a Topology, returned as is).

It sits above the format (parse.py) and the named clusters (presets.py, random_gen.py), which do not
import it: the imports run one way.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

from tag_tf.errors import TopologyError
from tag_tf.topology.parse import load_file, topology_from_dict
from tag_tf.topology.presets import cloud, local, mixed, testbed
from tag_tf.topology.random_gen import random_topology
from tag_tf.topology.spec import Topology

PRESETS = ("testbed", "cloud", "testbed-nominal", "cloud-nominal", "local", "local:N", "random:SEED",
           "mixed:N")


def load_topology(spec: str | os.PathLike[str] | Mapping[str, object] | Topology) -> Topology:
    """A Topology from a preset name, a YAML/JSON file path, a dict, or a Topology."""
    if isinstance(spec, Topology):
        return spec
    if isinstance(spec, Mapping):
        return topology_from_dict(spec)
    if not isinstance(spec, (str, os.PathLike)):
        raise TopologyError(f"topology: expected a preset name, a file path or a dict, "
                            f"got {type(spec).__name__}")
    text = os.fspath(spec).strip()
    preset = _load_preset(text)
    if preset is not None:
        return preset
    if os.path.exists(text) or text.lower().endswith((".yaml", ".yml", ".json")):
        return load_file(text)
    raise TopologyError(f"topology {text!r}: not a preset ({', '.join(PRESETS)}) nor an existing "
                        f".yaml/.json file")


def _load_preset(text: str) -> Topology | None:
    name, _, arg = text.lower().partition(":")
    if name in ("testbed", "cloud") and not arg:
        return testbed() if name == "testbed" else cloud()
    if name in ("testbed-nominal", "cloud-nominal") and not arg:
        # The same cluster, named so that it simulates with datasheet physics (no calibration).
        base = testbed() if name == "testbed-nominal" else cloud()
        return dataclasses.replace(base, name=name)
    if name == "local":
        if not arg:
            return local()
        if arg.isdigit() and int(arg) > 0:
            return local(int(arg))
        raise TopologyError(f"topology {text!r}: local:N needs a positive device count")
    if name == "random":
        try:
            return random_topology(int(arg))
        except ValueError:
            raise TopologyError(f"topology {text!r}: random:SEED needs an integer seed") from None
    if name == "mixed":
        if arg.isdigit():
            return mixed(int(arg))
        raise TopologyError(f"topology {text!r}: mixed:N needs a GPU count (a multiple of 8)")
    return None


__all__ = ["PRESETS", "load_topology"]
