"""A tf.estimator.Estimator (custom model_fn, tf.data input_fn) trained, then evaluated.

A plain Estimator script; tag_tf adds one line (marked below): training runs distributed,
evaluation runs single-device on the trained checkpoint. `--plain` skips that line, to compare.

    python examples/estimator_train.py --steps 100 --model-dir /tmp/estimator
    python examples/estimator_train.py --steps 100 --model-dir /tmp/estimator-plain --plain
"""
import argparse
import os

import numpy as np
import tensorflow as tf

import tag_tf
import tag_tf.estimator


def synthetic_data(n, features, classes, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, features)).astype(np.float32)
    teacher = np.random.default_rng(99).standard_normal((features, classes)).astype(np.float32)
    return x, np.argmax(x @ teacher, axis=1).astype(np.int32)


def model_fn(features, labels, mode, params):
    x = features["x"]
    w1 = tf.compat.v1.get_variable("dense/kernel", [x.shape[-1], params["hidden"]])
    b1 = tf.compat.v1.get_variable("dense/bias", [params["hidden"]], initializer=tf.zeros_initializer())
    w2 = tf.compat.v1.get_variable("logits/kernel", [params["hidden"], params["classes"]])
    logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2)
    predictions = tf.argmax(logits, axis=1, output_type=tf.int32)
    if mode == tf.estimator.ModeKeys.PREDICT:
        return tf.estimator.EstimatorSpec(mode, predictions={"class": predictions})
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=labels, logits=logits)
    if mode == tf.estimator.ModeKeys.EVAL:
        metrics = {"accuracy": tf.compat.v1.metrics.accuracy(labels, predictions)}
        return tf.estimator.EstimatorSpec(mode, loss=loss, eval_metric_ops=metrics)
    optimizer = tf.compat.v1.train.AdamOptimizer(params["lr"])
    train_op = optimizer.minimize(loss, global_step=tf.compat.v1.train.get_global_step())
    return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op, training_hooks=[PrintHook(loss)])


class PrintHook(tf.compat.v1.train.SessionRunHook):
    """Prints the training loss of every step."""

    def __init__(self, loss):
        self._loss = loss

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._loss)

    def after_run(self, run_context, run_values):
        print(f"train loss {run_values.results:.6f}", flush=True)


def main(args):
    features, classes = (6, 3) if args.tiny else (32, 10)
    x, y = synthetic_data(args.batch * 8, features, classes, args.seed)

    def input_fn():
        return tf.data.Dataset.from_tensor_slices(({"x": x}, y)).repeat().batch(args.batch)

    config = tf.estimator.RunConfig(model_dir=args.model_dir, tf_random_seed=args.seed, log_step_count_steps=None,
                                    save_summary_steps=max(1, args.steps))
    estimator = tf.estimator.Estimator(model_fn, config=config,
                                       params={"hidden": 16 if args.tiny else 128, "classes": classes, "lr": args.lr})
    if not args.plain:
        estimator = tag_tf.estimator.distributed(estimator, strategy=args.strategy)   # the one line

    estimator.train(input_fn, steps=args.steps)
    metrics = estimator.evaluate(input_fn, steps=2)
    print(f"eval loss {metrics['loss']:.6f} accuracy {metrics['accuracy']:.3f} global_step {metrics['global_step']}")


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="small sizes (tests)")
    p.add_argument("--model-dir", default=None, help="the Estimator's model_dir (a temporary one if omitted)")
    p.add_argument("--strategy", default="auto", help="tag_tf strategy: auto, dp, dp-p or a plan JSON")
    p.add_argument("--plain", action="store_true", default=bool(os.environ.get("TAG_TF_PLAIN")),
                   help="run without tag_tf (also: TAG_TF_PLAIN=1)")
    return p.parse_args()


if __name__ == "__main__":
    main(parse_args())
