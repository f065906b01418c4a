"""State that moves between the user's session and the compiled one: initialisation runs replayed in
the compiled session, runs the compiled program cannot take run on the user's session with the
trained values (`run_on_one_device`), trained values copied back (`sync_back`), and the feeds
and saves a task other than the chief rewrites or skips.
"""
from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from tag_tf.errors import CompileError, TagError, tf_reason
from tag_tf.frontend.program import GraphInfo, Runner
from tag_tf.frontend.session_patch import bypass
from tag_tf.frontend.session_values import read_variables, write_variables
from tag_tf.ir import opsets

if TYPE_CHECKING:
    import tensorflow as tf

    from tag_tf.runtime.roles import Role

log = logging.getLogger("tag_tf.distribute")

# A run by name: (targets, fetches, feeds).
NamedRun = tuple[list[str], list[str], dict[str, np.ndarray]]
# `BaseSession._do_run` as the patch hands it over: (session, handle, targets, fetches, feeds, options, metadata).
OriginalRun = Callable[..., list[object]]

# Inputs whose state (a position in the data) lives in the session that runs them.
STATEFUL_INPUTS = ("IteratorGetNext", "QueueDequeue", "ReaderRead")


@dataclasses.dataclass
class SessionState:
    """What a `tag_tf.distribute` context keeps per user session."""

    runner: Runner | None = None
    # Iterator/table initialisations run before training, by name.
    replay: list[NamedRun] = dataclasses.field(default_factory=list)
    # Whether the user's session holds the compiled session's current variable values (runs on one
    # device use the user's session: it gets the trained values first).
    synced: bool = True
    # Reasons already logged for runs on one device.
    one_device_said: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass(frozen=True)
class UserRun:
    """One intercepted `_do_run`: the user's session, the original method, and its arguments."""

    sess: tf.compat.v1.Session
    original: OriginalRun
    targets: list[tf.Operation]
    fetches: list[tf.Tensor]
    feeds: Mapping[object, np.ndarray]
    options: object
    run_metadata: object

    def names(self) -> list[str]:
        """The ops this run reaches for, targets then fetches."""
        return [op.name for op in self.targets] + [t.op.name for t in self.fetches]

    def by_name(self) -> NamedRun:
        return [op.name for op in self.targets], [t.name for t in self.fetches], feeds_by_name(self.feeds)

    def on_user_session(self, feeds: Mapping[object, np.ndarray] | None = None) -> list[object]:
        """The run as the user asked it, on the user's own session."""
        return self.original(self.sess, None, self.targets, self.fetches, self.feeds if feeds is None else feeds,
                             self.options, self.run_metadata)


def run_on_one_device(run: UserRun, state: SessionState, role: Role | None, reason: str, training: bool
                      ) -> list[object]:
    """A run the compiled program cannot take (`Program.one_device_reason`) runs on the user's own
    session, on one device, with the trained values: they are copied there first; whatever the run
    writes to variables is copied back into every compiled copy. Values are the plain program's."""
    if training and role is not None and len(role.spec.tasks) > 1:
        raise CompileError(f"cannot run this training step on one device in a cluster of "
                           f"{len(role.spec.tasks)} tasks: {reason}")
    runner = state.runner
    assert runner is not None, "a run on one device follows compilation"
    upstream = GraphInfo.upstream(run.sess.graph, run.names())
    inputs = [op.name for op in upstream if op.name in runner.program.ir and op.type.startswith(STATEFUL_INPUTS)]
    if inputs:
        raise CompileError(f"cannot run this step on one device ({reason}): it reads input {inputs[0]!r}, whose "
                           f"position lives in the distributed session (a one-device run would read another "
                           f"copy); feed the values instead, or create the input after training")
    if reason not in state.one_device_said:
        state.one_device_said.add(reason)
        log.info("tag_tf: a %s run on one device (the trained values in this session): %s",
                 "training" if training else "non-training", reason)
    with bypass():
        if not state.synced:
            failed = sync_back(run.sess, runner)
            if failed:
                raise TagError(f"could not copy the trained variables to this session for a run on one "
                               f"device ({reason}): {failed[0]}")
            state.synced = True
        values = run.on_user_session()
        if any(opsets.is_variable_writer(op.type) or opsets.is_optimizer_update(op.type) for op in upstream):
            runner.program.io.load(runner.session, read_variables(run.sess, runner.program.ir))
    return values


def sync_back(sess: tf.compat.v1.Session, runner: Runner) -> list[str]:
    """Give the user's session the trained values (code after the context sees them), through each
    variable's initializer with its value fed. Returns the failures (the caller closes every
    session first, then raises)."""
    try:
        values = runner.program.io.read(runner.session)
        write_variables(sess, runner.program.ir, values)
    except Exception as e:
        log.error("tag_tf: could not copy trained variables back to the session: %s", e)
        return [f"{type(e).__name__}: {tf_reason(e)}"]
    return []


def remember(replay: list[NamedRun], run: NamedRun) -> None:
    """Add an initialisation run to be replayed; the same run again replaces its earlier record
    (an iterator re-initialised every epoch is replayed once, with its latest feeds)."""
    key = (run[0], run[1])
    replay[:] = [r for r in replay if (r[0], r[1]) != key]
    replay.append(run)


def skip_save(fetches: Sequence[tf.Tensor], feeds: Mapping[object, np.ndarray]) -> list[object] | None:
    """On a task other than the chief, a Saver's save run returns the path it was given without
    writing: the chief writes the checkpoint (tasks share one trained state), and two tasks writing
    one path would corrupt it. None when the run is not a plain save (it then runs as asked)."""
    by_name = feeds_by_name(feeds)
    values: list[object] = []
    for t in fetches:
        if t.op.type != "Identity" or t.op.inputs[0].name not in by_name:
            return None
        item = by_name[t.op.inputs[0].name].item()
        values.append(item.encode() if isinstance(item, str) else item)     # as TensorFlow returns strings
    for value in values:
        # The Saver then writes its checkpoint list beside the checkpoint: where the save would have
        # made the directory, make it (this task's file system may be its own).
        path = value.decode() if isinstance(value, bytes) else str(value)
        if os.path.dirname(path):
            os.makedirs(os.path.dirname(path), exist_ok=True)
    log.info("tag_tf: this task's checkpoint save skipped (the chief writes it)")
    return values


def readable_restore(feeds: Mapping[object, np.ndarray], prefixes: frozenset[str]) -> Mapping[object, np.ndarray]:
    """A restore's feeds with each fed checkpoint path replaced by the newest readable checkpoint
    (itself, unless it is damaged): a run resumes from a checkpoint that reads back whole or not at all."""
    from tag_tf.runtime.checkpoints import readable_checkpoint

    out = dict(feeds)
    for key, value in feeds.items():
        if _name(key) not in prefixes:
            continue
        path = value.item() if isinstance(value, np.ndarray) else value
        path = path.decode() if isinstance(path, bytes) else str(path)
        chosen = readable_checkpoint(path)
        if chosen != path:
            out[key] = np.asarray(chosen, dtype=value.dtype)
    return out


def feeds_by_name(feeds: Mapping[object, np.ndarray]) -> dict[str, np.ndarray]:
    """Feeds keyed by tensor name (TensorFlow keys validated feeds by tensor reference, `Tensor.ref()`)."""
    return {_name(k): v for k, v in feeds.items()}


def _name(key: object) -> str:
    tensor = key.deref() if hasattr(key, "deref") else key
    return str(getattr(tensor, "name", key))


__all__ = ["NamedRun", "OriginalRun", "STATEFUL_INPUTS", "SessionState", "UserRun", "feeds_by_name",
           "readable_restore", "remember", "run_on_one_device", "skip_save", "sync_back"]
