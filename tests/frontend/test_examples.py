"""The examples run as scripts, with and without their one tag_tf line: same losses, checkpoints that
restore across the two, and the plan cache hit on a second distributed run."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RTOL = 1e-4


def launch(script: str, *args: str, cache: str) -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TAG_TF_CACHE_DIR=cache)
    env.pop("TAG_TF_PLAIN", None)
    return subprocess.Popen([sys.executable, os.path.join(ROOT, "examples", script), "--tiny", *args],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_pair(*procs: subprocess.Popen) -> list[tuple[str, str]]:
    """Wait for processes started together (two at a time keeps this machine busy, not overloaded)."""
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=300)
        assert p.returncode == 0, f"{p.args}\n{stdout}\n{stderr[-3000:]}"
        out.append((stdout, stderr))
    return out


def numbers(pattern: str, text: str) -> list[float]:
    return [float(x) for x in re.findall(pattern, text)]


def test_mnist_mlp_session(tmp_path):
    cache, a, b = str(tmp_path / "cache"), str(tmp_path / "a"), str(tmp_path / "b")
    common = ("--steps", "3", "--batch", "16")
    (plain, _), (dist, dist_err) = run_pair(
        launch("mnist_mlp_session.py", *common, "--model-dir", a, "--plain", cache=cache),
        launch("mnist_mlp_session.py", *common, "--model-dir", b, cache=cache))
    loss = r"step \d+ loss ([0-9.]+)"
    assert len(numbers(loss, plain)) == 3
    np.testing.assert_allclose(numbers(loss, dist), numbers(loss, plain), rtol=RTOL)
    assert "tag_tf: training graph" in dist_err and "planned in" in dist_err
    # Checkpoints both ways: the distributed run continues the plain checkpoint, the plain run the
    # distributed one; both continue identically. The distributed graph's plan comes from the cache.
    common = ("--steps", "2", "--batch", "16")
    (resumed_dist, resumed_err), (resumed_plain, _) = run_pair(
        launch("mnist_mlp_session.py", *common, "--model-dir", a, cache=cache),
        launch("mnist_mlp_session.py", *common, "--model-dir", b, "--plain", cache=cache))
    assert "restored" in resumed_dist and "restored" in resumed_plain
    assert re.findall(r"^step (\d+)", resumed_dist, re.M) == ["4", "5"]
    np.testing.assert_allclose(numbers(loss, resumed_dist), numbers(loss, resumed_plain), rtol=RTOL)
    assert "plan cache hit" in resumed_err


def test_cnn_monitored_session(tmp_path):
    cache, a, b = str(tmp_path / "cache"), str(tmp_path / "a"), str(tmp_path / "b")
    common = ("--steps", "4", "--batch", "8")
    (plain, _), (dist, _) = run_pair(
        launch("cnn_monitored_session.py", *common, "--model-dir", a, "--plain", cache=cache),
        launch("cnn_monitored_session.py", *common, "--model-dir", b, cache=cache))
    loss = r"step \d+ loss ([0-9.]+)"
    assert len(numbers(loss, plain)) == 4
    np.testing.assert_allclose(numbers(loss, dist), numbers(loss, plain), rtol=RTOL)
    # MonitoredTrainingSession restores the distributed run's checkpoint and continues.
    (resumed_dist, err), (resumed_plain, _) = run_pair(
        launch("cnn_monitored_session.py", "--steps", "2", "--batch", "8", "--model-dir", b, cache=cache),
        launch("cnn_monitored_session.py", "--steps", "2", "--batch", "8", "--model-dir", a, "--plain",
               cache=cache))
    assert re.findall(r"^step (\d+)", resumed_dist, re.M) == ["4", "5"]
    assert "starting at global step 4" in resumed_dist
    np.testing.assert_allclose(numbers(loss, resumed_dist), numbers(loss, resumed_plain), rtol=RTOL)
    assert "plan cache hit" in err


def test_estimator_train(tmp_path):
    cache = str(tmp_path / "cache")
    common = ("--steps", "4", "--batch", "8")
    (plain, _), (dist, err) = run_pair(
        launch("estimator_train.py", *common, "--model-dir", str(tmp_path / "a"), "--plain", cache=cache),
        launch("estimator_train.py", *common, "--model-dir", str(tmp_path / "b"), cache=cache))
    train = r"train loss ([0-9.]+)"
    assert len(numbers(train, plain)) == 4
    np.testing.assert_allclose(numbers(train, dist), numbers(train, plain), rtol=RTOL)
    evaluation = r"eval loss ([0-9.]+) accuracy ([0-9.]+) global_step (\d+)"
    np.testing.assert_allclose(np.array(re.findall(evaluation, dist), float),
                               np.array(re.findall(evaluation, plain), float), rtol=RTOL)
    assert "tag_tf: training graph" in err
