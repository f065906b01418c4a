"""Losing a machine mid-training: the dead task is named, and re-running resumes from the last
checkpoint, on the machines that are left (re-planned for them) and on one process. The example
script runs unchanged in every process, each started with its own TF_CONFIG, as Kubernetes does."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import tensorflow as tf

from tag_tf.runtime.cluster import free_ports

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "cnn_monitored_session.py")
DEADLINE_S = 120


def _start(tmp, name: str, model_dir: str, steps: int, tf_config: dict | None = None) -> tuple[subprocess.Popen, str]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TAG_TF_CACHE_DIR=str(tmp / "cache"), TAG_TF_CHIEF_GRACE_S="10")
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    log = str(tmp / f"{name}.log")
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, SCRIPT, "--tiny", "--batch", "12", "--strategy", "dp", "--steps",
                                 str(steps), "--save-steps", "3", "--model-dir", model_dir],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    return proc, log


def _cluster(n: int) -> tuple[dict, list[int]]:
    ports = free_ports(n)
    return {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}, ports


def _tasks(cluster: dict) -> list[dict]:
    return [{"cluster": cluster, "task": {"type": "chief", "index": 0}}] + [
        {"cluster": cluster, "task": {"type": "worker", "index": i}} for i in range(len(cluster["worker"]))]


def _wait(proc: subprocess.Popen, what: str) -> int:
    try:
        return proc.wait(timeout=DEADLINE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"{what} still running after {DEADLINE_S} s") from None


def _saved_step(model_dir: str) -> int:
    latest = tf.train.latest_checkpoint(model_dir)
    return int(latest.rsplit("-", 1)[1]) if latest else -1


def _start_step(log: str) -> int:
    return int(re.search(r"starting at global step (\d+)", open(log).read()).group(1))


def test_a_killed_worker_is_named_and_the_run_resumes_on_fewer_machines(tmp_path):
    model_dir = str(tmp_path / "model")
    cluster, ports = _cluster(3)
    procs = [_start(tmp_path, f"task{i}", model_dir, 100_000, cfg) for i, cfg in enumerate(_tasks(cluster))]
    try:
        deadline = time.monotonic() + DEADLINE_S
        while _saved_step(model_dir) < 6:           # two checkpoints written: well into training
            assert time.monotonic() < deadline, Path(procs[0][1]).read_text()[-3000:]
            assert procs[0][0].poll() is None, Path(procs[0][1]).read_text()[-3000:]
            time.sleep(0.2)
        os.kill(procs[2][0].pid, signal.SIGKILL)    # worker 1 is gone for good
        assert _wait(procs[0][0], "the chief") != 0
        chief_log = Path(procs[0][1]).read_text()
        assert f"127.0.0.1:{ports[2]}" in chief_log and "died or became unreachable" in chief_log, chief_log[-3000:]
        assert _wait(procs[1][0], "the surviving worker") == 0, Path(procs[1][1]).read_text()[-3000:]
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
    saved = _saved_step(model_dir)
    assert saved >= 6

    # The same command on the two machines that are left: re-planned for them, resumed where saved.
    cluster, _ = _cluster(2)
    procs = [_start(tmp_path, f"two{i}", model_dir, 4, cfg) for i, cfg in enumerate(_tasks(cluster))]
    for i, (proc, log) in enumerate(procs):
        assert _wait(proc, f"task {i}") == 0, Path(log).read_text()[-3000:]
    assert _start_step(procs[0][1]) == saved
    assert "cpu-2x1" in Path(procs[0][1]).read_text()
    assert _saved_step(model_dir) == saved + 4

    # And on one process.
    proc, log = _start(tmp_path, "one", model_dir, 2)
    assert _wait(proc, "the single process") == 0, Path(log).read_text()[-3000:]
    assert _start_step(log) == saved + 4 and _saved_step(model_dir) == saved + 6


def test_a_killed_worker_is_named_when_every_task_drives_its_own_step(tmp_path):
    """Between-graph (each task drives its part; a fed batch): the chief's next step names the task
    that died, instead of waiting for its collective forever."""
    cluster, ports = _cluster(2)
    script = os.path.join(ROOT, "examples", "mnist_mlp_session.py")
    procs = []
    for i, cfg in enumerate(_tasks(cluster)):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TAG_TF_CACHE_DIR=str(tmp_path / "cache"),
                   TAG_TF_CHIEF_GRACE_S="5", TF_CONFIG=json.dumps(cfg))
        log = str(tmp_path / f"mlp{i}.log")
        with open(log, "w") as out:
            procs.append((subprocess.Popen([sys.executable, script, "--tiny", "--batch", "12", "--strategy", "dp",
                                            "--steps", "100000"], cwd=ROOT, env=env, stdout=out,
                                           stderr=subprocess.STDOUT, text=True), log))
    try:
        deadline = time.monotonic() + DEADLINE_S
        while "step 20 " not in Path(procs[0][1]).read_text():
            assert time.monotonic() < deadline and procs[0][0].poll() is None, Path(procs[0][1]).read_text()[-3000:]
            time.sleep(0.2)
        assert "between-graph" in Path(procs[0][1]).read_text()
        os.kill(procs[1][0].pid, signal.SIGKILL)
        assert _wait(procs[0][0], "the chief") != 0
        chief_log = Path(procs[0][1]).read_text()
        assert f"127.0.0.1:{ports[1]}" in chief_log and "died or became unreachable" in chief_log, chief_log[-3000:]
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
