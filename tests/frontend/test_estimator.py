"""tag_tf.estimator: an unchanged Estimator trains distributed, then evaluates single-device on the
checkpoint it wrote; losses and metrics equal a plain Estimator's."""
from __future__ import annotations

import numpy as np
import pytest

import tag_tf
import tag_tf.estimator

tf = pytest.importorskip("tensorflow")
pytest.importorskip("tensorflow_estimator")

RTOL = 1e-4


class RecordLoss(tf.compat.v1.train.SessionRunHook):
    def __init__(self):
        self.losses = []

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)[0])

    def after_run(self, run_context, run_values):
        self.losses.append(float(run_values.results))


def model_fn(features, labels, mode):
    w = tf.compat.v1.get_variable("w", [5, 3])
    b = tf.compat.v1.get_variable("b", [3], initializer=tf.zeros_initializer())
    logits = tf.matmul(features["x"], w) + b
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"probs": tf.nn.softmax(logits),
                                                             "label": tf.argmax(logits, 1)})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels, logits)
    if mode == tf.estimator.ModeKeys.EVAL:
        accuracy = tf.compat.v1.metrics.accuracy(labels, tf.argmax(logits, 1))
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops={"accuracy": accuracy})
    train_op = tf.compat.v1.train.AdamOptimizer(0.05).minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def input_fn():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((48, 5)).astype(np.float32)
    y = rng.integers(0, 3, 48).astype(np.int32)
    return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).repeat().batch(8)


def train_and_evaluate(model_dir, how, cache=None):
    config = tf.estimator.RunConfig(model_dir=str(model_dir), tf_random_seed=3, log_step_count_steps=None,
                                    save_summary_steps=100)
    estimator = tf.estimator.Estimator(model_fn, config=config)
    if how == "wrapper":
        estimator = tag_tf.estimator.distributed(estimator, strategy="dp", topology="local:2", cache_dir=cache)
        assert isinstance(estimator, tf.estimator.Estimator)
    hook = RecordLoss()
    if how == "context":
        with tag_tf.distribute(strategy="dp", topology="local:2", cache_dir=cache) as scope:
            estimator.train(input_fn, steps=3, hooks=[hook])
        plans = scope.plans
    else:
        estimator.train(input_fn, steps=3, hooks=[hook])
        plans = getattr(estimator, "tag_tf_plans", [])
    metrics = estimator.evaluate(input_fn, steps=2)
    return hook.losses, metrics, plans


@pytest.mark.parametrize("how", ["wrapper", "context"])
def test_estimator_trains_distributed_then_evaluates(tmp_path, how):
    plain_losses, plain_metrics, _ = train_and_evaluate(tmp_path / "plain", "plain")
    losses, metrics, plans = train_and_evaluate(tmp_path / how, how, cache=str(tmp_path / "cache"))
    assert len(plans) == 1 and plans[0].strategy.name == "dp"          # training was distributed
    np.testing.assert_allclose(losses, plain_losses, rtol=RTOL)
    assert metrics["global_step"] == plain_metrics["global_step"] == 3
    np.testing.assert_allclose(metrics["loss"], plain_metrics["loss"], rtol=RTOL)
    assert metrics["accuracy"] == pytest.approx(plain_metrics["accuracy"])


def test_estimator_predict_distributed_with_inference(tmp_path):
    """`inference=True`: predict's forward-only graph is planned and compiled too (its iterator
    split over the replicas); predictions equal the plain Estimator's on the same checkpoint."""
    train_and_evaluate(tmp_path / "m", "plain")
    config = tf.estimator.RunConfig(model_dir=str(tmp_path / "m"), tf_random_seed=3)
    plain = tf.estimator.Estimator(model_fn, config=config)

    def predict_input():
        x = np.random.default_rng(1).standard_normal((24, 5)).astype(np.float32)
        return tf.data.Dataset.from_tensor_slices({"x": x}).batch(8)

    expected = list(plain.predict(predict_input))
    wrapped = tag_tf.estimator.distributed(tf.estimator.Estimator(model_fn, config=config), strategy="dp",
                                           topology="local:2", cache_dir=str(tmp_path / "cache"), inference=True)
    got = list(wrapped.predict(predict_input))
    assert len(wrapped.tag_tf_plans) == 1 and wrapped.tag_tf_plans[0].strategy.name == "dp"
    assert len(got) == len(expected) == 24
    for a, b in zip(got, expected):
        np.testing.assert_allclose(a["probs"], b["probs"], rtol=RTOL, atol=1e-7)
        assert a["label"] == b["label"]
