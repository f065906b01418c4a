"""An MNIST-style MLP trained with tf.compat.v1.Session and a Saver (synthetic data: no download).

A plain TF1 script; tag_tf adds one line (marked below). `--plain` skips that line, to compare.

    python examples/mnist_mlp_session.py --steps 100 --model-dir /tmp/mnist
    python examples/mnist_mlp_session.py --steps 100 --model-dir /tmp/mnist --plain

Each run continues from the latest checkpoint in --model-dir and saves one at the end.

On a cluster, the same command runs on every task. tag_tf reads TF_CONFIG when it is set; the
launchers that do not set it are reached through a TensorFlow ClusterResolver:

    --resolver slurm                      # srun: SLURM_PROCID, SLURM_STEP_NODELIST, ... (port --port-base + i)
    --resolver simple --cluster-spec '{"chief": ["h0:2222"], "worker": ["h1:2222"]}' --task worker:0
"""
import argparse
import contextlib
import json
import os

import numpy as np
import tensorflow as tf

import tag_tf


def synthetic_mnist(n, features, classes, seed):
    """Images with labels from a fixed random linear teacher (learnable, deterministic)."""
    rng = np.random.default_rng(seed)
    images = rng.random((n, features), dtype=np.float32)
    teacher = np.random.default_rng(1234).standard_normal((features, classes)).astype(np.float32)
    labels = np.argmax((images - 0.5) @ teacher, axis=1).astype(np.int64)
    return images, labels


def main(args):
    features = 64 if args.tiny else 784
    hidden = 24 if args.tiny else 256
    classes = 10
    images, labels = synthetic_mnist(args.batch * 8, features, classes, args.seed)

    tf.compat.v1.disable_eager_execution()
    tf.compat.v1.set_random_seed(args.seed)
    x = tf.compat.v1.placeholder(tf.float32, [None, features], name="images")
    y = tf.compat.v1.placeholder(tf.int64, [None], name="labels")
    w1 = tf.compat.v1.get_variable("hidden/weights", [features, hidden])
    b1 = tf.compat.v1.get_variable("hidden/biases", [hidden], initializer=tf.zeros_initializer())
    w2 = tf.compat.v1.get_variable("softmax/weights", [hidden, classes])
    b2 = tf.compat.v1.get_variable("softmax/biases", [classes], initializer=tf.zeros_initializer())
    logits = tf.matmul(tf.nn.relu(tf.matmul(x, w1) + b1), w2) + b2
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits), name="loss")
    correct = tf.equal(tf.argmax(logits, 1), y)
    accuracy = tf.reduce_mean(tf.cast(correct, tf.float32), name="accuracy")
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdamOptimizer(args.lr).minimize(loss, global_step=global_step)
    saver = tf.compat.v1.train.Saver()
    init = tf.compat.v1.global_variables_initializer()

    with tf.compat.v1.Session() as sess:
        latest = tf.train.latest_checkpoint(args.model_dir) if args.model_dir else None
        if latest:
            saver.restore(sess, latest)
            print(f"restored {latest}")
        else:
            sess.run(init)
        first = sess.run(global_step)
        print(f"starting at global step {first}", flush=True)
        last = args.until_step if args.until_step is not None else first + args.steps
        for i in range(first, last):
            start = (i * args.batch) % len(images)
            feed = {x: images[start:start + args.batch], y: labels[start:start + args.batch]}
            _, loss_value, acc = sess.run([train_op, loss, accuracy], feed_dict=feed)
            print(f"step {i + 1} loss {loss_value:.6f} accuracy {acc:.3f}", flush=True)
            if args.model_dir and args.save_every and (i + 1) % args.save_every == 0:
                saver.save(sess, os.path.join(args.model_dir, "model.ckpt"), global_step=global_step)
        if args.model_dir:
            path = saver.save(sess, os.path.join(args.model_dir, "model.ckpt"), global_step=global_step)
            print(f"saved {path}")


def cluster_resolver(args):
    """The ClusterResolver named on the command line (None: TF_CONFIG when set, else this machine)."""
    resolvers = tf.distribute.cluster_resolver
    if args.resolver == "slurm":
        # The resolver hands out tasks by GPU slots (one GPU each here); on CPU-only nodes it would
        # find no slot and ask nvidia-smi, so give it room for any number of tasks per node.
        gpus = len(tf.config.list_physical_devices("GPU"))
        return resolvers.SlurmClusterResolver(port_base=args.port_base, gpus_per_node=gpus or 1024,
                                              gpus_per_task=1, auto_set_gpu=bool(gpus))
    if args.resolver == "simple":
        task_type, _, index = args.task.partition(":")
        return resolvers.SimpleClusterResolver(tf.train.ClusterSpec(json.loads(args.cluster_spec)),
                                               task_type=task_type, task_id=int(index))
    return None


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tiny", action="store_true", help="small sizes (tests)")
    p.add_argument("--model-dir", default=None, help="checkpoints: restore the latest, save at the end")
    p.add_argument("--save-every", type=int, default=0, metavar="N", help="with --model-dir: also save every N steps")
    p.add_argument("--until-step", type=int, default=None, metavar="K",
                   help="train until global step K (instead of --steps more steps)")
    p.add_argument("--strategy", default="auto", help="tag_tf strategy: auto, dp, dp-p or a plan JSON")
    p.add_argument("--plain", action="store_true", default=bool(os.environ.get("TAG_TF_PLAIN")),
                   help="run without tag_tf (also: TAG_TF_PLAIN=1)")
    p.add_argument("--resolver", choices=("slurm", "simple"), help="take the cluster from this ClusterResolver")
    p.add_argument("--port-base", type=int, default=8888, help="--resolver slurm: first port on each node")
    p.add_argument("--cluster-spec", help="--resolver simple: JSON {job: [host:port, ...]}")
    p.add_argument("--task", default="worker:0", help="--resolver simple: this task, JOB:INDEX")
    return p.parse_args()


if __name__ == "__main__":
    args = parse_args()
    with (contextlib.nullcontext() if args.plain else
          tag_tf.distribute(strategy=args.strategy, cluster=cluster_resolver(args))):  # the one line
        main(args)
