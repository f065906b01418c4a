"""Session configuration for running original and compiled graphs on TensorFlow's runtime."""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import tensorflow as tf
    from tensorflow.core.framework.graph_pb2 import GraphDef
    from tensorflow.core.protobuf.config_pb2 import ConfigProto

DEFAULT_TIMEOUT_MS = 60_000
CLOSE_DEADLINE_S = 10.0

log = logging.getLogger("tag_tf.sessions")


def session_config(num_cpus: int | None = 1, *, timeout_ms: int = DEFAULT_TIMEOUT_MS,
                   collective_leader: str | None = None, soft_placement: bool = True,
                   num_gpus: int | None = None, device_filters: Sequence[str] = (),
                   inter_op_threads: int | None = None, intra_op_threads: int | None = None,
                   gpu_allow_growth: bool = False, as_written: bool = False) -> ConfigProto:
    """The ConfigProto of every session and server tag_tf starts: `num_cpus` virtual CPU devices
    and an operation timeout (a mistake then fails with DeadlineExceeded instead of hanging).

    What callers differ in, each field set only when asked for: `num_cpus` None leaves the CPU
    count to TensorFlow; `num_gpus` (0: hide the GPUs); `collective_leader` (cross-process
    collectives need it on every server and client); `soft_placement`; `device_filters` (the tasks
    a session may use); `inter_op_threads` / `intra_op_threads` (0 or None: TensorFlow's default);
    `gpu_allow_growth`; `as_written` (`keep_as_written`: no graph optimization)."""
    import tensorflow as tf

    config = tf.compat.v1.ConfigProto(allow_soft_placement=soft_placement, operation_timeout_in_ms=timeout_ms,
                                      device_filters=list(device_filters))
    if num_cpus is not None:
        config.device_count["CPU"] = num_cpus
    if num_gpus is not None:
        config.device_count["GPU"] = num_gpus
    if inter_op_threads:
        config.inter_op_parallelism_threads = int(inter_op_threads)
    if intra_op_threads:
        config.intra_op_parallelism_threads = int(intra_op_threads)
    if gpu_allow_growth:
        config.gpu_options.allow_growth = True
    if collective_leader:
        config.experimental.collective_group_leader = collective_leader
    if as_written:
        keep_as_written(config)
    return config


def keep_as_written(config: ConfigProto) -> ConfigProto:
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


def import_graph(graph_def: GraphDef) -> tf.Graph:
    import tensorflow as tf

    g = tf.Graph()
    with g.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return g


def close_within(close: Callable[[], object], what: str, deadline_s: float = CLOSE_DEADLINE_S) -> bool:
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


def close_later(close: Callable[[], object]) -> None:
    """Call `close` in a daemon thread and do not wait: a session of a cluster that lost a task
    (an elastic run's previous generation) may never finish closing."""
    def run() -> None:
        try:
            close()
        except Exception:                # noqa: BLE001 (nobody waits for it: a generation left behind)
            log.debug("tag_tf: closing a previous generation's session failed", exc_info=True)

    threading.Thread(target=run, name="tag_tf close later", daemon=True).start()

