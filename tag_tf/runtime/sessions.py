"""Session configuration for running original and compiled graphs on TensorFlow's runtime."""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable

DEFAULT_TIMEOUT_MS = 60_000
CLOSE_DEADLINE_S = 10.0

log = logging.getLogger("tag_tf.sessions")


def session_config(num_cpus: int = 1, *, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                   collective_leader: str | None = None) -> Any:
    """A ConfigProto with `num_cpus` virtual CPU devices and an operation timeout (a mistake then
    fails with DeadlineExceeded instead of hanging)."""
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(device_count={"CPU": num_cpus}, allow_soft_placement=True,
                                      operation_timeout_in_ms=timeout_ms)
    if collective_leader:
        config.experimental.collective_group_leader = collective_leader
    return config


def keep_as_written(config: Any) -> Any:
    """Run every node as written: no Grappler, constant folding, CSE or inlining. Profiling needs
    this (traced node names must be the graph's, and no op may be folded away)."""
    from tensorflow.core.protobuf import config_pb2

    config.graph_options.rewrite_options.disable_meta_optimizer = True
    opts = config.graph_options.optimizer_options
    opts.opt_level = config_pb2.OptimizerOptions.L0
    opts.do_constant_folding = False
    opts.do_common_subexpression_elimination = False
    opts.do_function_inlining = False
    return config


def import_graph(graph_def: Any) -> Any:
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return g


def close_within(close: Callable[[], Any], what: str, deadline_s: float = CLOSE_DEADLINE_S) -> bool:
    """Call `close` (a session's close), giving up after `deadline_s`. Closing a distributed session
    tells every task to clean up and waits for each, with no deadline of its own: with a task that
    died it never returns. The close goes on in a daemon thread; False when it was abandoned."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            close()
        except BaseException as e:       # noqa: BLE001 (reported below, in the caller's thread)
            errors.append(e)

    thread = threading.Thread(target=run, name=f"tag_tf close {what}", daemon=True)
    thread.start()
    thread.join(deadline_s)
    if thread.is_alive():
        log.warning("tag_tf: closing %s did not finish in %.0f s (a task of its cluster is gone); left behind",
                    what, deadline_s)
        return False
    if errors:
        raise errors[0]
    return True
