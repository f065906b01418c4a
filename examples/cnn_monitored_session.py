"""A small CNN trained with tf.compat.v1.train.MonitoredTrainingSession: a tf.data input pipeline,
hooks (StopAtStepHook, a loss-logging hook), a Scaffold and checkpoints in --model-dir.

A plain TF1 script; tag_tf adds one line (marked below). `--plain` skips that line, to compare.

    python examples/cnn_monitored_session.py --steps 100 --model-dir /tmp/cnn
    python examples/cnn_monitored_session.py --steps 100 --model-dir /tmp/cnn --plain

MonitoredTrainingSession restores the latest checkpoint in --model-dir, so a second run continues
(also on fewer machines: tag_tf re-plans for what is there, checkpoints do not depend on the plan).
"""
import argparse
import contextlib
import os

import numpy as np
import tensorflow as tf

import tag_tf


def synthetic_images(n, side, classes, seed):
    """Images whose class is the quadrant with the brightest blob (learnable, deterministic)."""
    rng = np.random.default_rng(seed)
    images = rng.random((n, side, side, 1), dtype=np.float32) * 0.5
    labels = rng.integers(0, classes, n)
    half = side // 2
    for i, c in enumerate(labels):
        r, q = divmod(int(c) % 4, 2)
        images[i, r * half:(r + 1) * half, q * half:(q + 1) * half, 0] += 0.5
    return images, labels.astype(np.int32)


def conv_layer(x, name, filters):
    kernel = tf.compat.v1.get_variable(f"{name}/kernel", [3, 3, int(x.shape[-1]), filters])
    bias = tf.compat.v1.get_variable(f"{name}/bias", [filters], initializer=tf.zeros_initializer())
    y = tf.nn.relu(tf.nn.conv2d(x, kernel, strides=1, padding="SAME") + bias)
    return tf.nn.max_pool2d(y, ksize=2, strides=2, padding="VALID")


class PrintLoss(tf.compat.v1.train.SessionRunHook):
    """Prints the loss of every step (a hook fetching tensors alongside the train op)."""

    def __init__(self, loss, global_step):
        self._fetches = {"loss": loss, "step": global_step}

    def after_create_session(self, session, coord):
        print(f"starting at global step {session.run(self._fetches['step'])}", flush=True)

    def before_run(self, run_context):
        return tf.compat.v1.train.SessionRunArgs(self._fetches)

    def after_run(self, run_context, run_values):
        print(f"step {run_values.results['step']} loss {run_values.results['loss']:.6f}", flush=True)


def main(args):
    side = 8 if args.tiny else 28
    filters = (4, 8) if args.tiny else (32, 64)
    classes = 4
    images, labels = synthetic_images(args.batch * 8, side, classes, args.seed)

    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.set_random_seed(args.seed)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().batch(args.batch)
    x, y = tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    h = conv_layer(x, "conv1", filters[0])
    h = conv_layer(h, "conv2", filters[1])
    flat = tf.reshape(h, [-1, (side // 4) ** 2 * filters[1]])
    w = tf.compat.v1.get_variable("logits/kernel", [flat.shape[-1], classes])
    logits = tf.matmul(flat, w)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(labels=y, logits=logits)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.MomentumOptimizer(args.lr, 0.9).minimize(loss, global_step=global_step)
    tf.compat.v1.summary.scalar("loss", loss)

    hooks = [tf.compat.v1.train.StopAtStepHook(num_steps=args.steps), PrintLoss(loss, global_step)]
    with tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=args.model_dir, hooks=hooks, scaffold=tf.compat.v1.train.Scaffold(),
            save_checkpoint_steps=(args.save_steps or max(1, args.steps // 2)) if args.model_dir else None,
            save_summaries_steps=max(1, args.steps // 2) if args.model_dir else None,
            log_step_count_steps=None) as sess:
        while not sess.should_stop():
            sess.run(train_op)


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="small sizes (tests)")
    p.add_argument("--model-dir", default=None, help="checkpoints and summaries (a second run continues)")
    p.add_argument("--save-steps", type=int, default=0, help="steps between checkpoints (default: steps / 2)")
    p.add_argument("--strategy", default="auto", help="tag_tf strategy: auto, dp, dp-p or a plan JSON")
    p.add_argument("--plain", action="store_true", default=bool(os.environ.get("TAG_TF_PLAIN")),
                   help="run without tag_tf (also: TAG_TF_PLAIN=1)")
    return p.parse_args()


if __name__ == "__main__":
    args = parse_args()
    with contextlib.nullcontext() if args.plain else tag_tf.distribute(strategy=args.strategy):  # the one line
        main(args)
