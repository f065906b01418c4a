"""Emulated heterogeneous clusters on one Linux machine: every host a network namespace behind a
shaped link on a private bridge, with its own CPU quota (cgroup v1). A launcher beside the runtime:
the CLI (`tag-tf emulate`), tests and benchmarks start clusters with it; no pass imports it."""
from tag_tf.emulate.spec import EmulatedCluster, Host, load_cluster

__all__ = ["EmulatedCluster", "Host", "load_cluster"]
