"""What a canned DNNClassifier's model_fn builds, written by hand: numeric feature columns through
tf.compat.v1.feature_column.input_layer, hidden layers under a "dnn" scope, a logistic head with
tf.compat.v1.losses.sigmoid_cross_entropy, Adagrad and a global step."""
import numpy as np
import tensorflow as tf

BATCH_NORM = False
STEPS = 3


def build():
    features = {"age": tf.compat.v1.placeholder(tf.float32, [None, 1], name="age"),
                "income": tf.compat.v1.placeholder(tf.float32, [None, 1], name="income"),
                "measurements": tf.compat.v1.placeholder(tf.float32, [None, 3], name="measurements")}
    label = tf.compat.v1.placeholder(tf.float32, [None, 1], name="label")
    columns = [tf.feature_column.numeric_column("age", normalizer_fn=lambda x: (x - 40.0) / 10.0),
               tf.feature_column.numeric_column("income"),
               tf.feature_column.numeric_column("measurements", shape=(3,))]
    with tf.compat.v1.variable_scope("dnn"):
        net = tf.compat.v1.feature_column.input_layer(features, columns)
        for i, units in enumerate([16, 8]):
            net = tf.compat.v1.layers.dense(net, units, activation=tf.nn.relu, name=f"hiddenlayer_{i}")
        logits = tf.compat.v1.layers.dense(net, 1, name="logits")
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(label, logits)
    global_step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.train.AdagradOptimizer(0.1).minimize(loss, global_step=global_step)
    inputs = (features["age"], features["income"], features["measurements"], label)
    return inputs, train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    age, income, measurements, label = inputs
    return {age: rng.uniform(20, 60, (batch, 1)).astype(np.float32),
            income: rng.standard_normal((batch, 1)).astype(np.float32),
            measurements: rng.standard_normal((batch, 3)).astype(np.float32),
            label: rng.integers(0, 2, (batch, 1)).astype(np.float32)}
