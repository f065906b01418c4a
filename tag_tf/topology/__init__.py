"""Cluster topologies: GPU types, machines and links, presets and the topology file format."""
from tag_tf.topology.gpus import GPU_TYPES, GpuType, gpu_type
from tag_tf.topology.load import load_topology
from tag_tf.topology.presets import cloud, local, testbed
from tag_tf.topology.random_gen import random_topology
from tag_tf.topology.spec import Device, DeviceGroup, GpuSpec, Machine, Topology

__all__ = ["GPU_TYPES", "Device", "DeviceGroup", "GpuSpec", "GpuType", "Machine", "Topology",
           "cloud", "gpu_type", "load_topology", "local", "random_topology", "testbed"]
