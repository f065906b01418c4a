"""The scoped patch of `BaseSession`: the one place where user sessions are redirected.

Why patch: `tag_tf.distribute` promises unchanged TF1 code, and Session, MonitoredSession, hooks,
Saver and Estimator all end in a raw `Session.run`, for which TensorFlow has no hook. So while a
context is active `BaseSession._do_run` is replaced: it gets the flattened fetches, targets and
validated feeds after TensorFlow has parsed the user's fetch structure, and TensorFlow rebuilds that
structure from whatever values it returns. `make_callable` (its fast callables skip `_do_run`) and
`close` (to close the compiled session with the user's) are replaced too.

How it is scoped and undone: `install` patches on entry of the first context and `uninstall` puts
the originals back on exit of the last one (contexts nest; a session is served by the innermost
context that compiled for it, else the innermost). Runs with a partial-run handle, sessions tag_tf
opens itself (`_tag_tf_internal`) and tag_tf's own work inside `bypass()` go straight to the
original. The active contexts and the saved originals are this module's (process-wide) state.
"""
from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import numpy as np
    import tensorflow as tf
    from tensorflow.python.client.session import BaseSession as Session

# `BaseSession._do_run(session, handle, targets, fetches, feeds, options, run_metadata)`: the fetched values.
# Its feeds are keyed by `Tensor.ref()`, each value an array (TensorFlow's `run` has converted them).
DoRun = Callable[..., list[object]]


class Context(Protocol):
    """What the patch needs of a `tag_tf.distribute` context (`distribute.Distribution`)."""

    def owns(self, sess: Session) -> bool: ...

    def dispatch(self, sess: Session, original: DoRun, targets: list[tf.Operation], fetches: list[tf.Tensor],
                 feeds: dict[object, np.ndarray], options: object, run_metadata: object) -> list[object]: ...

    def session_closed(self, sess: Session) -> None: ...


_patch_lock = threading.Lock()
_active: list[Context] = []             # entered contexts, innermost last
_saved: dict[str, Callable[..., object]] = {}      # the original BaseSession methods while patched
_local = threading.local()              # .bypass: depth of tag_tf's own session work in this thread


class bypass:
    """tag_tf's own session work (verification, migration) goes straight to TensorFlow."""

    def __enter__(self) -> None:
        _local.bypass = getattr(_local, "bypass", 0) + 1

    def __exit__(self, *exc: object) -> None:
        _local.bypass -= 1


def original_do_run(sess: Session, handle: object, target_list: list[tf.Operation], fetch_list: list[tf.Tensor],
                    feed_dict: dict[object, np.ndarray], options: object, run_metadata: object) -> list[object]:
    """TensorFlow's own `BaseSession._do_run` (how compiled sessions run)."""
    return _do_run_of(_saved)(sess, handle, target_list, fetch_list, feed_dict, options, run_metadata)


def _do_run_of(saved: dict[str, Callable[..., object]]) -> DoRun:
    return saved["_do_run"]  # type: ignore[return-value]   # TensorFlow's _do_run returns the fetched values


def _owner(sess: Session) -> Context | None:
    contexts = tuple(_active)
    for d in reversed(contexts):
        if d.owns(sess):
            return d
    return contexts[-1] if contexts else None


def _do_run(self: Session, handle: object, target_list: list[tf.Operation], fetch_list: list[tf.Tensor],
            feed_dict: dict[object, np.ndarray], options: object, run_metadata: object) -> list[object]:
    original = _do_run_of(_saved)
    if handle is not None or getattr(_local, "bypass", 0) > 0 or getattr(self, "_tag_tf_internal", False):
        return original(self, handle, target_list, fetch_list, feed_dict, options, run_metadata)
    owner = _owner(self)
    if owner is None:
        return original(self, handle, target_list, fetch_list, feed_dict, options, run_metadata)
    return owner.dispatch(self, original, target_list, fetch_list, feed_dict, options, run_metadata)


def _make_callable(self: Session, fetches: object, feed_list: Sequence[object] | None = None,
                   accept_options: bool = False) -> Callable[..., object]:
    # TF's fast callables skip `_do_run`; route them through `run` while a context is active.
    if getattr(self, "_tag_tf_internal", False):
        made: Callable[..., object] = _saved["make_callable"](self, fetches, feed_list, accept_options)  # type: ignore[assignment]
        return made
    feed_list = list(feed_list or ())

    def call(*args: object, **kwargs: object) -> object:
        return self.run(fetches, feed_dict=dict(zip(feed_list, args)) or None, **kwargs)
    return call


def _close(self: Session) -> None:
    for d in tuple(_active):
        d.session_closed(self)
    _saved["close"](self)


def install(d: Context) -> None:
    from tensorflow.python.client import session

    with _patch_lock:
        if not _active:
            for name, fn in (("_do_run", _do_run), ("make_callable", _make_callable), ("close", _close)):
                _saved[name] = getattr(session.BaseSession, name)
                setattr(session.BaseSession, name, fn)
        _active.append(d)


def uninstall(d: Context) -> None:
    from tensorflow.python.client import session

    with _patch_lock:
        if d in _active:
            _active.remove(d)
        if not _active:
            for name, fn in _saved.items():
                setattr(session.BaseSession, name, fn)
