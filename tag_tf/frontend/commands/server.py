"""`tag-tf server --cluster FILE --task I`: run one machine's TensorFlow server."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("server", help="run one TensorFlow server of a cluster (one per machine)")
    p.add_argument("--cluster", required=True, help="cluster file (JSON/YAML): tasks, cpus_per_task, timeout_ms")
    p.add_argument("--task", type=int, required=True, help="index of this machine in the cluster's tasks")
    p.add_argument("--parent-pid", type=int, help="exit when this process is gone (set by launchers)")
    p.add_argument("--trusted-network", action="store_true",
                   help="allow cluster addresses outside loopback/private ranges (anyone reaching the port can run code)")
    p.set_defaults(func=run)


def run(args) -> int:
    from tag_tf.runtime.cluster import ClusterSpec, serve

    serve(ClusterSpec.load(args.cluster), args.task, parent_pid=args.parent_pid, trusted_network=args.trusted_network)
    return 0
