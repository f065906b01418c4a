"""A damaged checkpoint is never the one resumed from: a restore under tag_tf reads the checkpoint
back first and falls back to the newest older one that reads whole, naming both; with none left the
error names the directory."""
from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import tag_tf
from tag_tf.runtime.checkpoints import CheckpointError, unreadable


def _graph():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        w = tf.compat.v1.get_variable("w", [3, 1], initializer=tf.compat.v1.ones_initializer())
        step = tf.compat.v1.train.get_or_create_global_step()
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) - 1.0))
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step)
        saver = tf.compat.v1.train.Saver(max_to_keep=5)
        init = tf.compat.v1.global_variables_initializer()
    return graph, train, step, saver, init


def _save_two(model_dir: str) -> list[str]:
    graph, train, step, saver, init = _graph()
    feed = {"x:0": np.ones((4, 3), np.float32)}
    paths = []
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        for _ in range(2):
            sess.run(train, feed)
            paths.append(saver.save(sess, os.path.join(model_dir, "model.ckpt"), global_step=step))
    return paths


def _corrupt(prefix: str) -> None:
    data = prefix + ".data-00000-of-00001"
    raw = bytearray(Path(data).read_bytes())
    for i in range(len(raw)):
        raw[i] ^= 0xFF
    Path(data).write_bytes(bytes(raw))


def _restore_under_tag_tf(path: str) -> int:
    graph, train, step, saver, _ = _graph()
    with tag_tf.distribute(strategy="dp", topology="local:2", verify=False):
        with tf.compat.v1.Session(graph=graph) as sess:
            saver.restore(sess, path)
            restored = int(sess.run(step))
            sess.run(train, {"x:0": np.ones((4, 3), np.float32)})      # and it trains on from there
            assert int(sess.run(step)) == restored + 1
    return restored


def test_a_damaged_latest_checkpoint_falls_back_to_the_newest_readable_one(tmp_path, caplog):
    first, latest = _save_two(str(tmp_path))
    assert unreadable(latest) is None
    _corrupt(latest)
    assert "Checksum does not match" in unreadable(latest)
    graph, _, _, saver, _ = _graph()
    with tf.compat.v1.Session(graph=graph) as sess, pytest.raises(tf.errors.DataLossError):
        saver.restore(sess, latest)                 # what a plain restart would hit, every time
    with caplog.at_level(logging.WARNING, logger="tag_tf.checkpoints"):
        assert _restore_under_tag_tf(tf.train.latest_checkpoint(str(tmp_path))) == 1
    assert latest in caplog.text and first in caplog.text


def test_no_readable_checkpoint_is_named(tmp_path):
    first, latest = _save_two(str(tmp_path))
    _corrupt(latest)
    os.remove(first + ".index")                     # a partial copy: the older one has lost its index
    with pytest.raises(CheckpointError, match="no readable checkpoint to restore in " + str(tmp_path)) as e:
        _restore_under_tag_tf(latest)
    assert latest in str(e.value) and first in str(e.value)       # each named, with why it failed
