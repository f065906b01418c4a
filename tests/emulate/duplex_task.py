"""Run on both hosts of an emulated cluster: each task serves; the chief times 4 MB moved from task 0
to task 1, from task 1 to task 0, and both at once (TensorFlow's own transfers, over gRPC), and prints
one JSON line of median milliseconds; then tells the other task to stop through a file."""
import json
import sys
import time

import numpy as np
from task_done import finish, wait

from tag_tf.runtime import roles

done_file = sys.argv[1]
role = roles.from_tf_config()
server = roles.start_server(role)
if role.is_chief:
    import tensorflow as tf

    roles.wait_for_tasks(role)
    job, n = role.spec.job, 1 << 20                  # 4 MB of float32
    graph = tf.Graph()
    with graph.as_default():
        moved = {}
        for src, dst in ((0, 1), (1, 0)):
            with tf.device(f"/job:{job}/task:{src}/device:CPU:0"):
                x = tf.Variable(tf.ones([n]), name=f"x{src}") * 1.0
            with tf.device(f"/job:{job}/task:{dst}/device:CPU:0"):
                moved[(src, dst)] = tf.reduce_sum(x)
        init = tf.compat.v1.global_variables_initializer()
    config = tf.compat.v1.ConfigProto(operation_timeout_in_ms=60_000)
    with tf.compat.v1.Session(server.target, graph=graph, config=config) as sess:
        sess.run(init)
        found = {}
        for label, fetch in (("there", [moved[(0, 1)]]), ("back", [moved[(1, 0)]]), ("both", list(moved.values()))):
            times = []
            for _ in range(4):
                start = time.perf_counter()
                sess.run(fetch)
                times.append(time.perf_counter() - start)
            found[label] = float(np.median(times[1:])) * 1e3
    print(json.dumps(found), flush=True)
    finish(done_file)
else:
    wait(done_file)
