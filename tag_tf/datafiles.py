"""Users' data files (cluster, plan, topology) are read as bounded UTF-8 text, never executed; the
caches' files are written whole and durably (`write_atomic`).

The parsers that follow are `json` and `yaml.safe_load` (no pickle, no eval, no YAML tags that build
objects); the size limit keeps a wrong path (a log, a checkpoint) from being read whole into memory.
"""
from __future__ import annotations

import os

CLUSTER_FILE_LIMIT = 1 << 20        # bytes: a cluster file lists host:port strings
TOPOLOGY_FILE_LIMIT = 16 << 20
PLAN_FILE_LIMIT = 256 << 20         # a plan lists a group per planned op: large graphs, large files
CALIBRATION_FILE_LIMIT = 16 << 20   # a calibration's constants, or the measurements it is fitted to


def read_text(path: str, what: str, limit: int, error: type[Exception]) -> str:
    """The file's text; `error` (one line naming the file) when unreadable, too large or not UTF-8."""
    try:
        with open(path, "rb") as f:
            raw = f.read(limit + 1)
    except OSError as e:
        raise error(f"{path}: cannot read {what} ({e.strerror or e})") from None
    if len(raw) > limit:
        raise error(f"{path}: {what} is larger than {limit} bytes; refusing to read it")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: {what} is not UTF-8 text (byte {e.start})") from None


def fsync_dir(folder: str) -> None:
    """Make a rename inside `folder` durable (the file's own fsync does not cover its directory
    entry); a filesystem that cannot open directories keeps the rename as the OS does."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path: str, text: str) -> None:
    """Write `text` to `path` whole or not at all, durably, readable by others (0644): a temporary
    file in the same folder (`.tmp-*.tmp`, removed on failure), fsynced, renamed over `path`, the
    rename fsynced. Two processes writing one path leave one writer's whole file. OSError as raised."""
    import tempfile

    folder = os.path.dirname(path) or "."
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())        # a crash leaves the old file or the new one, never half
        os.chmod(tmp, 0o644)            # mkstemp makes 0600; caches are shared
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    fsync_dir(folder)
