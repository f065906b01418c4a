"""Wide & deep in the DNNLinearCombinedClassifier style: a linear_model over sparse columns trained with
FTRL and a DNN over an embedding column and a numeric column trained with Adagrad, logits added, both
minimize ops (over disjoint variable lists) and the global step increment grouped into one train op."""
import numpy as np
import tensorflow as tf

BATCH_NORM = False
STEPS = 3
BUCKETS = 20


def build():
    features = {"item": tf.compat.v1.placeholder(tf.int64, [None, 1], name="item"),
                "price": tf.compat.v1.placeholder(tf.float32, [None, 1], name="price")}
    label = tf.compat.v1.placeholder(tf.float32, [None, 1], name="label")
    item = tf.feature_column.categorical_column_with_identity("item", num_buckets=BUCKETS)
    price = tf.feature_column.numeric_column("price")
    with tf.compat.v1.variable_scope("linear") as linear_scope:
        wide_logits = tf.compat.v1.feature_column.linear_model(features, [item, price])
    with tf.compat.v1.variable_scope("dnn") as dnn_scope:
        net = tf.compat.v1.feature_column.input_layer(
            features, [tf.feature_column.embedding_column(item, dimension=4), price])
        net = tf.compat.v1.layers.dense(net, 12, activation=tf.nn.relu, name="hiddenlayer_0")
        deep_logits = tf.compat.v1.layers.dense(net, 1, name="logits")
    logits = wide_logits + deep_logits
    loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels=label, logits=logits))

    global_step = tf.compat.v1.train.get_or_create_global_step()
    linear_vars = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, linear_scope.name)
    dnn_vars = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES, dnn_scope.name)
    train_ops = [tf.compat.v1.train.FtrlOptimizer(0.1).minimize(loss, var_list=linear_vars),
                 tf.compat.v1.train.AdagradOptimizer(0.05).minimize(loss, var_list=dnn_vars)]
    train_op = tf.group(*train_ops)
    with tf.control_dependencies([train_op]):
        train_op = tf.compat.v1.assign_add(global_step, 1).op
    return (features["item"], features["price"], label), train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    item, price, label = inputs
    return {item: rng.integers(0, BUCKETS, (batch, 1)),
            price: rng.standard_normal((batch, 1)).astype(np.float32),
            label: rng.integers(0, 2, (batch, 1)).astype(np.float32)}
