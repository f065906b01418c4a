"""An unchanged TF1 script with tf.keras layers, run on every task of a TF_CONFIG cluster: Keras 2.15's
initialisers seed themselves from Python's `random`, so each task builds other seed constants (here
each task seeds `random` with its own number, as unseeded processes would draw). Prints each step's
loss, then an accuracy built after training, then the sum of the trained weights.

    python keras_layers_tf_config.py [--plain] [--seed N]
"""
import argparse
import os
import random

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tag_tf  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--plain", action="store_true")
parser.add_argument("--seed", type=int, default=0)
args = parser.parse_args()
random.seed(args.seed)
tf.compat.v1.disable_eager_execution()


def main():
    rng = np.random.default_rng(0)
    X = rng.standard_normal((48, 8)).astype(np.float32)
    Y = rng.integers(0, 3, 48)
    x = tf.compat.v1.placeholder(tf.float32, [None, 8])
    y = tf.compat.v1.placeholder(tf.int64, [None])
    hidden = tf.keras.layers.Dense(16, activation="relu")(x)
    logits = tf.keras.layers.Dense(3)(hidden)
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss)
    with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(3):
            _, value = sess.run([train, loss], {x: X[step * 12:(step + 1) * 12], y: Y[step * 12:(step + 1) * 12]})
            print(f"loss {value:.6f}", flush=True)
        accuracy = tf.reduce_mean(tf.cast(tf.equal(tf.argmax(logits, 1), y), tf.float32))
        print(f"accuracy {sess.run(accuracy, {x: X, y: Y}):.6f}", flush=True)
        total = sum(float(np.sum(v)) for v in sess.run(tf.compat.v1.trainable_variables()))
        print(f"weights {total:.6f}", flush=True)


if args.plain:
    main()
else:
    with tag_tf.distribute(strategy="dp"):
        main()
