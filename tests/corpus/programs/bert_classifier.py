"""A tiny BERT-style classifier written the way the original BERT code is: word/position/type
embeddings, [B*T, H] matrices for the dense layers, masked multi-head self-attention, layer norm, a
pooler over the first token, and the BERT AdamWeightDecayOptimizer (a custom Optimizer whose
apply_gradients is a group of plain assigns), global-norm clipping, polynomial decay with warm-up and
`global_step.assign(global_step + 1)` grouped into the train op."""
import re

import numpy as np
import tensorflow as tf

BATCH_NORM = False
STEPS = 3
VOCAB, SEQ, HIDDEN, HEADS, CLASSES = 20, 5, 16, 2, 3


class AdamWeightDecayOptimizer(tf.compat.v1.train.Optimizer):
    """Adam with decoupled weight decay; the update is a group of assigns to the variable and its m/v."""

    def __init__(self, learning_rate, weight_decay_rate=0.01, beta_1=0.9, beta_2=0.999, epsilon=1e-6,
                 exclude_from_weight_decay=None, name="AdamWeightDecayOptimizer"):
        super().__init__(False, name)
        self.learning_rate = learning_rate
        self.weight_decay_rate = weight_decay_rate
        self.beta_1, self.beta_2, self.epsilon = beta_1, beta_2, epsilon
        self.exclude_from_weight_decay = exclude_from_weight_decay or []

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
        assignments = []
        for grad, param in grads_and_vars:
            if grad is None or param is None:
                continue
            param_name = re.sub(r":\d+$", "", param.name)
            m = tf.compat.v1.get_variable(param_name + "/adam_m", shape=param.shape.as_list(), dtype=tf.float32,
                                          trainable=False, initializer=tf.zeros_initializer())
            v = tf.compat.v1.get_variable(param_name + "/adam_v", shape=param.shape.as_list(), dtype=tf.float32,
                                          trainable=False, initializer=tf.zeros_initializer())
            next_m = tf.multiply(self.beta_1, m) + tf.multiply(1.0 - self.beta_1, grad)
            next_v = tf.multiply(self.beta_2, v) + tf.multiply(1.0 - self.beta_2, tf.square(grad))
            update = next_m / (tf.sqrt(next_v) + self.epsilon)
            if self._do_use_weight_decay(param_name):
                update += self.weight_decay_rate * param
            next_param = param - self.learning_rate * update
            assignments.extend([param.assign(next_param), m.assign(next_m), v.assign(next_v)])
        return tf.group(*assignments, name=name)

    def _do_use_weight_decay(self, param_name):
        return not any(re.search(r, param_name) for r in self.exclude_from_weight_decay)


def layer_norm(x, name):
    with tf.compat.v1.variable_scope(name):
        size = x.shape[-1]
        gamma = tf.compat.v1.get_variable("gamma", [size], initializer=tf.ones_initializer())
        beta = tf.compat.v1.get_variable("beta", [size], initializer=tf.zeros_initializer())
        mean, var = tf.nn.moments(x, axes=[-1], keepdims=True)
        return (x - mean) * tf.math.rsqrt(var + 1e-12) * gamma + beta


def init(stddev=0.02):
    return tf.compat.v1.truncated_normal_initializer(stddev=stddev)


def attention_layer(x2d, mask, batch, seq):
    """x2d: [B*T, H]; mask: [B, T] float."""
    size = HIDDEN // HEADS

    def heads(t):
        return tf.transpose(tf.reshape(t, [batch, seq, HEADS, size]), [0, 2, 1, 3])

    q = tf.compat.v1.layers.dense(x2d, HIDDEN, name="query", kernel_initializer=init())
    k = tf.compat.v1.layers.dense(x2d, HIDDEN, name="key", kernel_initializer=init())
    v = tf.compat.v1.layers.dense(x2d, HIDDEN, name="value", kernel_initializer=init())
    scores = tf.matmul(heads(q), heads(k), transpose_b=True) * (1.0 / np.sqrt(size))
    adder = (1.0 - tf.expand_dims(tf.expand_dims(mask, 1), 1)) * -10000.0
    probs = tf.nn.softmax(scores + adder)
    context = tf.transpose(tf.matmul(probs, heads(v)), [0, 2, 1, 3])
    return tf.reshape(context, [batch * seq, HIDDEN])


def build():
    input_ids = tf.compat.v1.placeholder(tf.int32, [None, SEQ], name="input_ids")
    input_mask = tf.compat.v1.placeholder(tf.int32, [None, SEQ], name="input_mask")
    segment_ids = tf.compat.v1.placeholder(tf.int32, [None, SEQ], name="segment_ids")
    label_ids = tf.compat.v1.placeholder(tf.int32, [None], name="label_ids")
    batch = tf.shape(input_ids)[0]

    with tf.compat.v1.variable_scope("bert"):
        with tf.compat.v1.variable_scope("embeddings"):
            word = tf.compat.v1.get_variable("word_embeddings", [VOCAB, HIDDEN], initializer=init())
            out = tf.gather(word, input_ids)
            token_type = tf.compat.v1.get_variable("token_type_embeddings", [2, HIDDEN], initializer=init())
            flat_types = tf.reshape(segment_ids, [-1])
            types = tf.matmul(tf.one_hot(flat_types, depth=2), token_type)
            out += tf.reshape(types, [batch, SEQ, HIDDEN])
            position = tf.compat.v1.get_variable("position_embeddings", [SEQ, HIDDEN], initializer=init())
            out += tf.expand_dims(position, 0)
            out = layer_norm(out, "LayerNorm")
        mask = tf.cast(input_mask, tf.float32)
        with tf.compat.v1.variable_scope("encoder/layer_0"):
            x2d = tf.reshape(out, [-1, HIDDEN])
            with tf.compat.v1.variable_scope("attention"):
                with tf.compat.v1.variable_scope("self"):
                    ctx = attention_layer(x2d, mask, batch, SEQ)
                with tf.compat.v1.variable_scope("output"):
                    att = tf.compat.v1.layers.dense(ctx, HIDDEN, kernel_initializer=init())
                    att = layer_norm(att + x2d, "LayerNorm")
            with tf.compat.v1.variable_scope("intermediate"):
                inter = tf.compat.v1.layers.dense(att, 4 * HIDDEN, activation=tf.nn.gelu, kernel_initializer=init())
            with tf.compat.v1.variable_scope("output"):
                y = tf.compat.v1.layers.dense(inter, HIDDEN, kernel_initializer=init())
                y = layer_norm(y + att, "LayerNorm")
            sequence_output = tf.reshape(y, [batch, SEQ, HIDDEN])
        with tf.compat.v1.variable_scope("pooler"):
            first = tf.squeeze(sequence_output[:, 0:1, :], axis=1)
            pooled = tf.compat.v1.layers.dense(first, HIDDEN, activation=tf.tanh, kernel_initializer=init())

    output_weights = tf.compat.v1.get_variable("output_weights", [CLASSES, HIDDEN], initializer=init())
    output_bias = tf.compat.v1.get_variable("output_bias", [CLASSES], initializer=tf.zeros_initializer())
    logits = tf.nn.bias_add(tf.matmul(pooled, output_weights, transpose_b=True), output_bias)
    log_probs = tf.nn.log_softmax(logits, axis=-1)
    one_hot = tf.one_hot(label_ids, depth=CLASSES, dtype=tf.float32)
    loss = tf.reduce_mean(-tf.reduce_sum(one_hot * log_probs, axis=-1))

    global_step = tf.compat.v1.train.get_or_create_global_step()
    init_lr, num_train_steps, num_warmup_steps = 1e-2, 100, 2
    learning_rate = tf.compat.v1.train.polynomial_decay(tf.constant(init_lr), global_step, num_train_steps,
                                                        end_learning_rate=0.0, power=1.0, cycle=False)
    global_steps_int = tf.cast(global_step, tf.int32)
    warmup_steps_int = tf.constant(num_warmup_steps, dtype=tf.int32)
    warmup_percent_done = tf.cast(global_steps_int, tf.float32) / tf.cast(warmup_steps_int, tf.float32)
    warmup_learning_rate = init_lr * warmup_percent_done + 1e-3
    is_warmup = tf.cast(global_steps_int < warmup_steps_int, tf.float32)
    learning_rate = (1.0 - is_warmup) * learning_rate + is_warmup * warmup_learning_rate

    optimizer = AdamWeightDecayOptimizer(learning_rate, weight_decay_rate=0.01,
                                         exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"])
    tvars = tf.compat.v1.trainable_variables()
    grads = tf.gradients(loss, tvars)
    grads, _ = tf.clip_by_global_norm(grads, clip_norm=1.0)
    train_op = optimizer.apply_gradients(zip(grads, tvars), global_step=global_step)
    train_op = tf.group(train_op, [global_step.assign(global_step + 1)])
    return (input_ids, input_mask, segment_ids, label_ids), train_op, loss


def feed(inputs, step, batch=8):
    rng = np.random.default_rng(step)
    input_ids, input_mask, segment_ids, label_ids = inputs
    lengths = rng.integers(2, SEQ + 1, batch)
    mask = (np.arange(SEQ)[None, :] < lengths[:, None]).astype(np.int32)
    return {input_ids: rng.integers(0, VOCAB, (batch, SEQ)).astype(np.int32) * mask,
            input_mask: mask,
            segment_ids: (np.arange(SEQ)[None, :] >= 2).astype(np.int32).repeat(batch, 0) * mask,
            label_ids: rng.integers(0, CLASSES, batch).astype(np.int32)}
