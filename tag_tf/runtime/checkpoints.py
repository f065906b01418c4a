"""Resume only from checkpoints that read back whole.

TensorFlow's Saver writes a checkpoint under temporary names and updates the `checkpoint` state
file last, so a task killed while saving leaves the previous checkpoint as the latest. A file
damaged afterwards (a truncated copy, a full disk, a bad sector) is another matter: restoring it
fails with DataLossError on every restart, or, for a missing shard, never gets that far. Before a
restore runs, the checkpoint is read back in full (TensorFlow checks every tensor's CRC32C on
read); if it does not read, the newest older checkpoint of the same directory that does is
restored instead, with a warning naming both. With none left, the error names the directory.
"""
from __future__ import annotations

import logging
import os

from tag_tf.errors import TagError, tf_reason

log = logging.getLogger("tag_tf.checkpoints")


class CheckpointError(TagError):
    """No readable checkpoint to resume from."""


def unreadable(prefix: str) -> str | None:
    """Why the checkpoint at `prefix` cannot be restored, or None when every tensor reads back."""
    import tensorflow as tf

    try:
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
        for name in reader.get_variable_to_dtype_map():
            reader.get_tensor(name)
    except (tf.errors.OpError, ValueError, OSError) as e:
        return f"{type(e).__name__}: {tf_reason(e)}"
    return None


def older_checkpoints(prefix: str) -> list[str]:
    """The other checkpoints listed in the state file of `prefix`'s directory, newest first."""
    import tensorflow as tf

    directory = os.path.dirname(prefix) or "."
    state = tf.train.get_checkpoint_state(directory)
    if state is None:
        return []
    paths = [p if os.path.isabs(p) else os.path.join(directory, p) for p in state.all_model_checkpoint_paths]
    same = os.path.normpath(prefix)
    return [p for p in reversed(paths) if os.path.normpath(p) != same]


def readable_checkpoint(prefix: str) -> str:
    """`prefix` when it reads back whole, else the newest older checkpoint that does (warned)."""
    reason = unreadable(prefix)
    if reason is None:
        return prefix
    tried = [f"{prefix} ({reason})"]
    for older in older_checkpoints(prefix):
        why = unreadable(older)
        if why is None:
            log.warning("tag_tf: checkpoint %s does not read back (%s); restoring %s, the newest one that "
                        "does", prefix, reason, older)
            return older
        tried.append(f"{older} ({why})")
    raise CheckpointError(f"no readable checkpoint to restore in {os.path.dirname(prefix) or '.'}: "
                          + "; ".join(tried))
