"""Helper processes of the local machine model's measurements: other processes of a setup, started
as `python -m <module> <json spec>` under the setup's runtime, spoken to one line at a time (a
helper that dies, stalls or says something else is an error naming it)."""
from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
from collections.abc import Mapping

from tag_tf.errors import ProfileError
from tag_tf.localmachine.runtime import RUNTIME_KEYS, Runtime

READY = "helper-ready"
TIMEOUT_S = 300.0
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_STDERR = "_tag_tf_stderr"      # the Popen attribute holding a helper's stderr file (closed by `stop`)


def start(module: str, spec: Mapping[str, object], runtime: Runtime) -> subprocess.Popen:
    """Start `python -m module json(spec)` with `runtime`'s environment; it says READY when built."""
    env = {k: v for k, v in os.environ.items() if k not in RUNTIME_KEYS}
    env.update(runtime.env)
    errors = tempfile.TemporaryFile("w+")  # noqa: SIM115 (the helper's stderr, for its error; `stop` closes it)
    proc = subprocess.Popen([sys.executable, "-m", module, json.dumps(dict(spec))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=errors, text=True, env=env, cwd=ROOT)
    setattr(proc, _STDERR, errors)
    expect(proc, READY)
    return proc


def tell(proc: subprocess.Popen, line: str) -> None:
    assert proc.stdin is not None
    proc.stdin.write(line + "\n")
    proc.stdin.flush()


def expect(proc: subprocess.Popen, what: str, timeout_s: float = TIMEOUT_S) -> None:
    """Wait for the helper's next line, which must be `what`."""
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    line = proc.stdout.readline().strip() if ready else ""
    if line != what:
        exited = proc.poll()
        if exited is None:
            proc.kill()           # stalled or off script: its words are complete once it is gone
        errors = getattr(proc, _STDERR, None)
        proc.wait()
        tail = ""
        if errors is not None:
            errors.seek(0)
            lines = [x for x in errors.read().splitlines() if x.strip()]
            tail = f"; its last words: {lines[-1][:300]}" if lines else ""
        stop(proc)
        raise ProfileError(f"measurement helper (pid {proc.pid}) "
                           + (f"said {line!r}, expected {what!r}" if line else
                              f"exited {exited}" if exited is not None else
                              f"sent nothing in {timeout_s:.0f} s") + tail)


def stop(proc: subprocess.Popen) -> None:
    """Close its input (the helper's signal to finish) and wait for it; kill it if it hangs."""
    try:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        proc.kill()
        proc.wait()
    errors = getattr(proc, _STDERR, None)
    if errors is not None and not errors.closed:
        errors.close()


def say(line: str) -> None:
    """A helper's line to the process that started it."""
    print(line, flush=True)
