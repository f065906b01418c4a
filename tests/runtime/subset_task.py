"""One task of a TF_CONFIG cluster (or, without TF_CONFIG, the plain run): the tiny zoo MLP trained for
three steps with a plan whose every group runs on devices 0 and 1 only, so on a three-task cluster the
third task has no part in it. Prints "loss X" per step."""
import contextlib
import os

import numpy as np
import tensorflow as tf

import tag_tf
from tag_tf.analysis import analyze
from tag_tf.context import PassContext
from tag_tf.frontend.loading import model_ir
from tag_tf.models import build_model
from tag_tf.profile.weights import reference_weights
from tag_tf.strategy import Strategy

BATCH = 12
model = build_model("mlp", tiny=True, batch_size=BATCH, dropout=0.0, optimizer="momentum")
groups = len(analyze(PassContext(), model_ir(model), batch_size=BATCH, weight_fn=reference_weights).grouping.groups)
plan = Strategy.uniform(groups, (0, 1))
rng = np.random.default_rng(0)
batches = [model.feed(rng, BATCH) for _ in range(3)]
with tag_tf.distribute(strategy=plan) if os.environ.get("TF_CONFIG") else contextlib.nullcontext():
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.import_graph_def(model.graph_def, name="")
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(model.init_op)
        for feed in batches:
            _, loss = sess.run([model.train_op, model.loss], feed)
            print(f"loss {float(loss):.6f}", flush=True)
