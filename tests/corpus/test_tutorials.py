"""Tutorial-style TF1 programs run unchanged (tests/corpus/tutorials: evaluation after training,
shapeless placeholders, v1 control flow, one-example prediction, concatenated GAN batches, an iterator
initialised first, two optimizers on reference variables, accumulate-then-apply runs, string feature
columns) and one tf.keras script on three TF_CONFIG tasks.

Each program is run plain and inside `tag_tf.distribute` (dp on 2 and 4 devices, auto, two server
processes) from the same seeds; everything it returns (trained variables, accuracies, predictions)
must agree within 10x the noise floor (the plain program trained on batches whose rows are permuted)
and at least 1e-5, each value judged against the larger of its own magnitude and a typical one (a
value training barely moves holds only noise: judged in absolute terms). A program whose class allows
a refusal must stop with its tag_tf error before training; no TensorFlow error may reach the user."""
from __future__ import annotations

import json
import logging
import os
import random
import re
import subprocess
import sys

import numpy as np
import pytest

import tag_tf
from tag_tf.errors import TagError

from .tutorials import PROGRAMS

tf = pytest.importorskip("tensorflow")

NOISE_FACTOR = 10.0
MIN_TOLERANCE = 1e-5
CONFIGS = [("dp", "local:2"), ("dp", "local:4"), ("auto", "local:4")]
TRAINING = [n for n, p in PROGRAMS.items() if p.REFUSAL is None]
REFUSING = [n for n, p in PROGRAMS.items() if p.REFUSAL is not None]
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KERAS_SCRIPT = os.path.join(ROOT, "tests", "corpus", "scripts", "keras_layers_tf_config.py")


def _permuting_feed():
    """A feed wrapper that permutes each training batch's rows (the same permutation for every fed
    array of one run, so that examples keep their labels)."""
    step = [0]

    def feed(d):
        step[0] += 1
        out = {}
        for key, value in d.items():
            value = np.asarray(value)
            if value.ndim:
                value = value[np.random.default_rng(1000 + step[0]).permutation(value.shape[0])]
            out[key] = value
        return out
    return feed


def run(program, distribute_kwargs: dict | None = None, permute: bool = False) -> dict:
    random.seed(3)
    np.random.seed(3)
    v1 = getattr(program, "V1_CONTROL_FLOW", False)
    if v1:
        tf.compat.v1.disable_control_flow_v2()
    try:
        with tf.Graph().as_default():
            tf.compat.v1.set_random_seed(3)
            feed = _permuting_feed() if permute else (lambda d: d)
            if distribute_kwargs is None:
                return program.main(feed)
            with tag_tf.distribute(**distribute_kwargs):
                return program.main(feed)
    finally:
        if v1:
            tf.compat.v1.enable_control_flow_v2()


def max_rel_diff(a: dict, b: dict) -> float:
    """max over values of max|a-b| / max(max|a|, the median of the values' magnitudes, 1e-6)."""
    assert a.keys() == b.keys(), (sorted(a), sorted(b))
    magnitude = {k: float(np.max(np.abs(np.asarray(a[k], np.float64)))) for k in a}
    typical = float(np.median(list(magnitude.values())))
    return max(float(np.max(np.abs(np.asarray(a[k], np.float64) - np.asarray(b[k], np.float64))))
               / max(magnitude[k], typical, 1e-6) for k in a)


_REFERENCE: dict[str, tuple[dict, float]] = {}


def reference(name: str) -> tuple[dict, float]:
    if name not in _REFERENCE:
        plain = run(PROGRAMS[name])
        _REFERENCE[name] = (plain, max_rel_diff(plain, run(PROGRAMS[name], permute=True)))
    return _REFERENCE[name]


def check(name: str, **kwargs) -> None:
    plain, noise = reference(name)
    distributed = run(PROGRAMS[name], kwargs)
    diff, tolerance = max_rel_diff(plain, distributed), max(NOISE_FACTOR * noise, MIN_TOLERANCE)
    assert np.isfinite(diff) and diff <= tolerance, f"max_rel_diff {diff:.3g} > {tolerance:.3g} (noise {noise:.3g})"


@pytest.mark.parametrize("name", TRAINING)
@pytest.mark.parametrize("strategy,topology", CONFIGS, ids=[f"{s}-{t}" for s, t in CONFIGS])
def test_tutorial_trains_distributed_like_plain(name, strategy, topology, tmp_path):
    kwargs = dict(strategy=strategy, topology=topology, cache_dir=str(tmp_path))
    if strategy == "auto":
        kwargs["budget_s"] = 2
    check(name, **kwargs)


@pytest.mark.parametrize("name", TRAINING)
def test_tutorial_trains_over_two_server_processes(name, two_servers, tmp_path):
    check(name, strategy="dp", cluster=two_servers, cache_dir=str(tmp_path))


@pytest.mark.parametrize("name", REFUSING)
def test_tutorial_is_refused_by_name_before_training(name, tmp_path):
    """The refusal is tag_tf's own error, raised at the first training run before it runs (the
    variables still hold their initial values)."""
    program = PROGRAMS[name]
    with pytest.raises(TagError, match=program.REFUSAL):
        run(program, dict(strategy="dp", topology="local:2", cache_dir=str(tmp_path)))


def test_runs_the_plan_cannot_take_say_so_once(tmp_path, caplog):
    """Evaluation after training and a one-example prediction run on one device with the trained
    values, each reason logged once; a program with no batch feed is said to train on one device."""
    with caplog.at_level(logging.INFO, logger="tag_tf.distribute"):
        check("logistic_regression", strategy="dp", topology="local:2", cache_dir=str(tmp_path))
        check("linear_regression_per_sample", strategy="dp", topology="local:2", cache_dir=str(tmp_path))
    text = caplog.text
    assert text.count("was created after training started") == 1
    assert "fewer than the plan's 2 replicas" in text
    assert "training graph on one device (the session's own): it has no batch input" in text


def test_learned_placeholder_shape_is_enforced(tmp_path):
    """A placeholder without a static shape is compiled with the shape of its first fed value; a later
    feed of another rank is refused by name (not by TensorFlow)."""
    with tf.Graph().as_default():
        x = tf.compat.v1.placeholder("float", name="x")
        w = tf.Variable(1.0)
        loss = tf.reduce_sum(tf.square(x * w - 1.0))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.01).minimize(loss)
        with tag_tf.distribute(strategy="dp", topology="local:2", cache_dir=str(tmp_path)), \
                tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            sess.run(train, {x: np.ones(8, np.float32)})
            sess.run(train, {x: np.ones(6, np.float32)})                 # another batch size: fine
            with pytest.raises(TagError, match=r"cannot feed 'x:0' a value of shape \[2, 3\].*shape \[None\]"):
                sess.run(train, {x: np.ones((2, 3), np.float32)})


def test_keras_layers_on_three_tf_config_tasks(tmp_path):
    """One tf.keras script on a chief and two workers whose Keras initialisers draw other seeds: the
    graphs differ only in values the chief overwrites, so the run is accepted; every task gets the
    plain run's losses, the accuracy built after training and the trained weights."""
    from tag_tf.runtime.cluster import free_ports

    ports = free_ports(3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}
    tasks = [("worker", 0, 11), ("worker", 1, 12), ("chief", 0, 10)]
    procs = []
    for kind, index, seed in tasks + [("plain", 0, 10)]:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TAG_TF_CACHE_DIR=str(tmp_path / "cache"))
        env.pop("TF_CONFIG", None)
        argv = [sys.executable, KERAS_SCRIPT, "--seed", str(seed)]
        if kind == "plain":
            argv.append("--plain")
        else:
            env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})
        procs.append(subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    try:
        outputs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, f"{p.args}\n{out}\n{err[-3000:]}"
    assert "every task drives its own part of each step (between-graph)" in outputs[2][1]
    plain = [float(v) for v in re.findall(r"(?:loss|accuracy|weights) (-?[0-9.]+)", outputs[3][0])]
    assert len(plain) == 5
    for out, _ in outputs[:3]:
        np.testing.assert_allclose([float(v) for v in re.findall(r"(?:loss|accuracy|weights) (-?[0-9.]+)", out)],
                                   plain, rtol=1e-4)
