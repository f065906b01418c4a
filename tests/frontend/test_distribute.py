"""tag_tf.distribute: TF1 Session / MonitoredTrainingSession / Saver code trains on the compiled graph
exactly like it does alone (same losses and variables), with checkpoints interchangeable both ways."""
from __future__ import annotations

import collections
import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pytest

import tag_tf
from tag_tf.errors import ClusterError, GraphError, StrategyError, TagError, TopologyError

tf = pytest.importorskip("tensorflow")

RTOL = 1e-4
Step = collections.namedtuple("Step", "loss accuracy")


# ---------------------------------------------------------------------------------------------
# A small TF1 model and the plain training loops the tests run with and without tag_tf
# ---------------------------------------------------------------------------------------------
class Model:
    """An MLP classifier on placeholders (batch dimension None), Adam, global step and a Saver.
    Built with v1 initializers so the graph seed makes every build identical."""

    def __init__(self, *, dropout: float = 0.0, optimizer: str = "adam", inputs=None):
        self.graph = tf.Graph()
        with self.graph.as_default():
            tf.compat.v1.set_random_seed(7)
            if inputs is None:
                self.x = tf.compat.v1.placeholder(tf.float32, [None, 6], name="x")
                self.y = tf.compat.v1.placeholder(tf.int32, [None], name="y")
            else:
                self.x, self.y = inputs()
            w1 = tf.compat.v1.get_variable("dense/kernel", [6, 10])
            b1 = tf.compat.v1.get_variable("dense/bias", [10], initializer=tf.zeros_initializer())
            w2 = tf.compat.v1.get_variable("out/kernel", [10, 3])
            h = tf.nn.relu(tf.matmul(self.x, w1) + b1)
            if dropout:
                h = tf.nn.dropout(h, rate=dropout)
            logits = tf.matmul(h, w2)
            self.loss = tf.reduce_mean(
                tf.nn.sparse_softmax_cross_entropy_with_logits(labels=self.y, logits=logits), name="loss")
            hits = tf.equal(tf.argmax(logits, 1, output_type=tf.int32), self.y)
            self.accuracy = tf.reduce_mean(tf.cast(hits, tf.float32), name="accuracy")
            self.step = tf.compat.v1.train.get_or_create_global_step()
            opt = (tf.compat.v1.train.AdamOptimizer(0.05) if optimizer == "adam"
                   else tf.compat.v1.train.GradientDescentOptimizer(0.5))
            self.train = opt.minimize(self.loss, global_step=self.step, name="train")
            self.init = tf.compat.v1.global_variables_initializer()
            self.saver = tf.compat.v1.train.Saver()
            self.weights = [w1, b1, w2]


def batch(step: int, n: int = 8) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(100 + step)
    return rng.standard_normal((n, 6)).astype(np.float32), rng.integers(0, 3, n).astype(np.int32)


def train_with_session(model: Model, steps: int, sess=None) -> list[float]:
    """A typical loop: nested fetch structure (dict, namedtuple, list, op, string name)."""
    own = sess is None
    sess = sess or tf.compat.v1.Session(graph=model.graph)
    if own:
        sess.run(model.init)
    losses = []
    for i in range(steps):
        x, y = batch(i)
        out = sess.run({"train": model.train, "step": Step(model.loss, "accuracy:0"), "gs": [model.step]},
                       feed_dict={model.x: x, "y:0": y})
        assert out["train"] is None and isinstance(out["step"], Step)
        assert 0.0 <= out["step"].accuracy <= 1.0
        losses.append(float(out["step"].loss))
    if own:
        sess.close()
    return losses


def values(sess, model: Model) -> list[np.ndarray]:
    return sess.run(model.weights)


@pytest.fixture()
def cache(tmp_path):
    return str(tmp_path / "cache")


def dist(cache: str, **kw):
    kw.setdefault("strategy", "dp")
    kw.setdefault("topology", "local:2")
    return tag_tf.distribute(cache_dir=cache, **kw)


# ---------------------------------------------------------------------------------------------
# Training equivalence, fetch structures, scoping of the patch
# ---------------------------------------------------------------------------------------------
def test_session_trains_like_plain_and_patch_is_scoped(cache):
    from tensorflow.python.client import session

    original = session.BaseSession._do_run
    plain = train_with_session(Model(), 4)
    model = Model()
    with tf.compat.v1.Session(graph=model.graph) as sess:
        sess.run(model.init)                       # before training: runs on the user's session
        with dist(cache) as d:
            assert session.BaseSession._do_run is not original
            losses = train_with_session(model, 4, sess)
            inside = values(sess, model)
            assert sess.run(model.step) == 4
            # RunOptions/RunMetadata pass through: the step ran on both virtual devices.
            meta = tf.compat.v1.RunMetadata()
            sess.run(model.loss, {model.x: batch(0)[0], model.y: batch(0)[1]}, run_metadata=meta,
                     options=tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE))
            assert {d.device.rsplit(":", 1)[-1] for d in meta.step_stats.dev_stats} >= {"0", "1"}
        # Leaving the context hands the trained values back to the still-open session.
        assert session.BaseSession._do_run is original
        after = values(sess, model)
    np.testing.assert_allclose(losses, plain, rtol=RTOL)
    for a, b in zip(inside, after):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert len(d.plans) == 1 and d.plans[0].strategy.name == "dp"
    assert d.programs[0].compiled.stats["allreduce"] > 0    # it really ran replicated


def test_patch_restored_after_an_error(cache):
    from tensorflow.python.client import session

    original = session.BaseSession._do_run
    with pytest.raises(RuntimeError, match="boom"):
        with dist(cache):
            raise RuntimeError("boom")
    assert session.BaseSession._do_run is original


def test_decorator_and_make_callable(cache):
    plain = train_with_session(Model(), 3)

    @dist(cache)
    def train():
        model = Model()
        with tf.compat.v1.Session(graph=model.graph) as sess:
            sess.run(model.init)
            step = sess.make_callable([model.train, model.loss], [model.x, model.y])
            return [float(step(*batch(i))[1]) for i in range(3)]

    np.testing.assert_allclose(train(), plain, rtol=RTOL)
    assert train.__name__ == "train"


def test_bare_decorator_uses_the_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("TAG_TF_CACHE_DIR", str(tmp_path))

    @tag_tf.distribute
    def train():
        return train_with_session(Model(), 2)

    np.testing.assert_allclose(train(), train_with_session(Model(), 2), rtol=RTOL)
    assert len(os.listdir(tmp_path / "plans")) == 1       # planned ("auto" on local:4) and cached


def test_graph_without_training_passes_through(cache):
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        v = tf.compat.v1.get_variable("v", [3], initializer=tf.ones_initializer())
        total = tf.reduce_sum(x * v)
        bump = v.assign_add(tf.ones([3]))          # a variable update that is not an optimizer
    with dist(cache) as d, tf.compat.v1.Session(graph=g) as sess:
        sess.run(v.initializer)
        sess.run(bump)
        assert sess.run(total, {x: np.ones((2, 3))}) == pytest.approx(12.0)
    assert d.plans == []


# ---------------------------------------------------------------------------------------------
# Plans: cache, strategies
# ---------------------------------------------------------------------------------------------
def test_planning_uses_profiles_stored_for_the_graph(cache):
    """distribute plans with the op times measured for this graph in cache_dir/profiles, and a plan
    made with other op times is another cached plan."""
    from tag_tf.profile.db import ProfileDB
    from tag_tf.profile.op_profile import OpProfile

    with dist(cache) as d:
        train_with_session(Model(), 1)
    first = d.plans[0]
    graph = d.programs[0].analysis.graph
    names = tuple(graph.order)
    n = len(names)          # every op 1 ms: not what the datasheet predicts for this MLP
    measured = OpProfile(device_type="cpu", op_names=names, fixed=np.full(n, 1e-3), per_sample=np.zeros(n),
                         batch_sizes=(2, 4), times=np.full((n, 2), 1e-3), raw=np.full((2, 1, n), 1e-3), repeats=1)
    ProfileDB(os.path.join(cache, "profiles")).put_op_profile(measured, graph.fingerprint)
    with dist(cache) as d:
        train_with_session(Model(), 1)
    assert not d.plans[0].cache_hit and d.plans[0].cache_path != first.cache_path


def test_compiled_sessions_run_as_written_where_the_profile_found_rewrites_slower(cache, monkeypatch):
    """A profile whose whole steps ran 3x slower with TensorFlow's graph rewrites: the compiled
    graph's session runs as written (Grappler off), still training like the plain program."""
    from tag_tf.frontend.target import Target
    from tag_tf.profile.db import ProfileDB
    from tag_tf.profile.op_profile import OpProfile

    plain = train_with_session(Model(), 2)
    with dist(cache) as d:
        train_with_session(Model(), 1)
    assert d.programs[0].as_written is False                    # no profile: TensorFlow's defaults
    graph = d.programs[0].analysis.graph
    names = tuple(graph.order)
    n = len(names)
    steps = np.array([n * 1e-5, n * 1e-5])
    measured = OpProfile(device_type="cpu", op_names=names, fixed=np.full(n, 1e-5), per_sample=np.zeros(n),
                         batch_sizes=(2, 4), times=np.full((n, 2), 1e-5), raw=np.full((2, 1, n), 1e-5), repeats=1,
                         step_times=steps, rewritten_step_times=3 * steps)
    ProfileDB(os.path.join(cache, "profiles")).put_op_profile(measured, graph.fingerprint)
    configs = []
    real = Target.config
    monkeypatch.setattr(Target, "config", lambda self, *a, **k: configs.append(real(self, *a, **k)) or configs[-1])
    with dist(cache) as d:
        losses = train_with_session(Model(), 2)
    assert d.programs[0].as_written is True
    assert configs and all(c.graph_options.rewrite_options.disable_meta_optimizer for c in configs)
    np.testing.assert_allclose(losses, plain, rtol=1e-5)
    # A strategy given as a file is not planned, and still runs as the profile says.
    path = os.path.join(cache, "plan.json")
    d.programs[0].plan.strategy.save(path)
    configs.clear()
    with dist(cache, strategy=path) as d:
        losses = train_with_session(Model(), 2)
    assert d.programs[0].as_written is True
    assert configs and all(c.graph_options.rewrite_options.disable_meta_optimizer for c in configs)
    np.testing.assert_allclose(losses, plain, rtol=1e-5)


def test_plan_cache_hit_on_second_run(cache, monkeypatch):
    from tag_tf.frontend import planning

    calls = []
    real = planning.plan
    monkeypatch.setattr(planning, "plan", lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    for expected_hit in (False, True):
        with dist(cache, strategy="auto") as d:
            train_with_session(Model(), 1)
        assert d.plans[0].cache_hit is expected_hit
    assert calls == ["auto"]                               # planned once
    files = os.listdir(os.path.join(cache, "plans"))
    assert len(files) == 1 and json.loads(Path(os.path.join(cache, "plans", files[0])).read_text())["request"] == "auto"


@pytest.mark.parametrize("name", ["horovod", "horovod-p", "heterog"])
def test_named_baselines_train_like_plain(cache, name):
    plain = train_with_session(Model(), 2)
    with dist(cache, strategy=name, topology="local:3", budget_s=2.0) as d:
        losses = train_with_session(Model(), 2)
    np.testing.assert_allclose(losses, plain, rtol=RTOL)
    assert d.plans[0].strategy.name == name and d.plans[0].request == name
    if name.startswith("horovod"):
        assert d.plans[0].strategy.fusion_bytes == 64 * 2**20


def test_given_strategy_file_and_object(cache, tmp_path):
    from tag_tf.strategy import Strategy

    plain = train_with_session(Model(), 2)
    with dist(cache, strategy="dp-p") as d:
        train_with_session(Model(), 2)
    shares = d.plans[0].strategy
    assert shares.name == "dp-p" and shares.shares == (0.5, 0.5)
    path = tmp_path / "plan.json"
    uneven = Strategy(shares.groups, (1.0, 3.0), name="uneven")    # 2 and 6 samples of a batch of 8
    uneven.save(str(path))
    for given in (str(path), uneven):
        with dist(cache, strategy=given) as d:
            losses = train_with_session(Model(), 2)
        np.testing.assert_allclose(losses, plain, rtol=RTOL)
        assert d.plans[0].strategy.shares == (1.0, 3.0) and not d.plans[0].cache_hit
    with pytest.raises(StrategyError, match="nope"):
        with dist(cache, strategy="nope"):
            train_with_session(Model(), 1)


def test_a_budget_used_up_by_analysis_leaves_the_best_baseline(cache, monkeypatch):
    """budget_s bounds analysis and planning together: the search gets what analysis left of it
    (here nothing: `auto` falls back to the best baseline without searching) and still trains like
    the plain graph; without a budget the planner keeps its own default."""
    import tag_tf.frontend.compiling as distribute_module

    given = []
    real = distribute_module.resolve_strategy

    def spy(*args, **kwargs):
        given.append(kwargs["budget_s"])
        return real(*args, **kwargs)

    monkeypatch.setattr(distribute_module, "resolve_strategy", spy)
    plain = train_with_session(Model(), 3)
    with dist(cache, strategy="auto", budget_s=1e-9):
        losses = train_with_session(Model(), 3)
    np.testing.assert_allclose(losses, plain, rtol=RTOL)
    with dist(cache, strategy="dp"):
        train_with_session(Model(), 1)
    assert given == [0.0, None]


def test_auto_plans_by_simulation(small_graph):
    """"auto" is never slower (simulated) than either DP baseline; with no budget it is the better
    baseline."""
    from tag_tf.analysis import analyze
    from tag_tf.context import PassContext
    from tag_tf.frontend.planning import baseline, choose_auto
    from tag_tf.profile.weights import reference_weights
    from tag_tf.sim.simulator import Simulator
    from tag_tf.strategy import Option, Strategy
    from tag_tf.topology import load_topology

    analysis = analyze(PassContext(), small_graph, weight_fn=reference_weights)
    uneven = load_topology({"name": "mixed", "machines": [
        {"name": "m", "gpus": [{"type": "V100", "count": 1}, {"type": "T4", "count": 1}], "intra": "pcie"}]})
    sim = Simulator(analysis, uneven)
    times = {name: sim.simulate(baseline(name, analysis, uneven)).iteration_time_s for name in ("dp", "dp-p")}
    chosen = choose_auto(analysis, uneven)
    assert chosen.name == "auto" and chosen.graph == analysis.graph.fingerprint
    assert sim.simulate(chosen).iteration_time_s <= min(times.values()) + 1e-12
    quick = choose_auto(analysis, uneven, budget_s=0, sfb=False)
    # With no budget: the best fixed plan, a baseline or the model on one device alone (the plain
    # program: on a model this small, the V100 alone); SFB (the default) can only make it faster.
    alone = [Strategy.uniform(len(analysis.grouping.groups), (d,), Option.ALLREDUCE) for d in range(2)]
    best = min([sim.simulate(baseline(name, analysis, uneven)).iteration_time_s
                for name in ("dp", "dp-p", "horovod", "horovod-p")] + [sim.simulate(p).iteration_time_s for p in alone])
    assert sim.simulate(quick).iteration_time_s == pytest.approx(best)
    assert sim.simulate(choose_auto(analysis, uneven, budget_s=0)).iteration_time_s <= best
    tiny = load_topology({"name": "tiny", "machines": [
        {"name": "m", "gpus": [{"type": "V100-32GB", "count": 2, "memory": "4B"}]}]})
    with pytest.raises(StrategyError, match="no plan fits 'tiny'"):
        choose_auto(analysis, tiny, budget_s=1)


# ---------------------------------------------------------------------------------------------
# Checkpoints, both ways
# ---------------------------------------------------------------------------------------------
def test_checkpoint_saved_distributed_restores_plain(cache, tmp_path):
    model = Model()
    with dist(cache), tf.compat.v1.Session(graph=model.graph) as sess:
        sess.run(model.init)
        train_with_session(model, 3, sess)
        trained = values(sess, model)
        path = model.saver.save(sess, str(tmp_path / "ckpt"), global_step=model.step)
    plain = Model()
    with tf.compat.v1.Session(graph=plain.graph) as sess:
        plain.saver.restore(sess, path)
        for a, b in zip(values(sess, plain), trained):
            np.testing.assert_allclose(a, b, rtol=1e-6)
        assert sess.run(plain.step) == 3
    assert path.endswith("ckpt-3")


def test_checkpoint_saved_plain_restores_distributed(cache, tmp_path):
    plain = Model()
    with tf.compat.v1.Session(graph=plain.graph) as sess:
        sess.run(plain.init)
        train_with_session(plain, 2, sess)
        saved = values(sess, plain)
        path = plain.saver.save(sess, str(tmp_path / "ckpt"))
    model = Model()
    with dist(cache) as d, tf.compat.v1.Session(graph=model.graph) as sess:
        sess.run(model.init)
        train_with_session(model, 1, sess)           # now running distributed
        model.saver.restore(sess, path)              # the restore runs on the compiled graph
        for a, b in zip(values(sess, model), saved):
            np.testing.assert_allclose(a, b, rtol=1e-6)
        program = d.programs[0]
        runner = next(iter(d._sessions.values())).runner
        for name, copies in program.io.read_all(runner.session).items():
            assert len(copies) == 2 and all(np.array_equal(c, copies[0]) for c in copies), name


# ---------------------------------------------------------------------------------------------
# Input pipelines and MonitoredTrainingSession
# ---------------------------------------------------------------------------------------------
def dataset_inputs(kind: str):
    def build():
        xs = np.concatenate([batch(i)[0] for i in range(4)])
        ys = np.concatenate([batch(i)[1] for i in range(4)])
        ds = tf.data.Dataset.from_tensor_slices((xs, ys)).repeat().batch(8)
        if kind == "one_shot":
            it = tf.compat.v1.data.make_one_shot_iterator(ds)
        else:
            it = tf.compat.v1.data.make_initializable_iterator(ds)
            tf.compat.v1.add_to_collection("iterator_init", it.initializer)
        return it.get_next()
    return build


@pytest.mark.parametrize("kind", ["one_shot", "initializable"])
def test_tf_data_iterators(cache, kind):
    def run(steps):
        model = Model(inputs=dataset_inputs(kind))
        with tf.compat.v1.Session(graph=model.graph) as sess:
            sess.run([model.init] + model.graph.get_collection("iterator_init"))
            return [float(sess.run([model.train, model.loss])[1]) for _ in range(steps)]

    plain = run(3)
    with dist(cache):
        losses = run(3)
    np.testing.assert_allclose(losses, plain, rtol=RTOL)


def test_queue_runner_inputs(cache):
    """Queue inputs: the first enqueue/dequeue run moves the session to the compiled graph (the queue
    is filled where training dequeues). Until the IR infers dequeue shapes this fails cleanly."""
    def inputs():
        xs = np.concatenate([batch(i)[0] for i in range(4)])
        ys = np.concatenate([batch(i)[1] for i in range(4)])
        x, y = tf.compat.v1.train.slice_input_producer([tf.constant(xs), tf.constant(ys)], shuffle=False)
        return tf.compat.v1.train.batch([x, y], batch_size=8, num_threads=1, capacity=16)

    def run(steps):
        model = Model(inputs=inputs)
        with tf.compat.v1.Session(graph=model.graph) as sess:
            sess.run([model.init, tf.compat.v1.local_variables_initializer()])
            coord = tf.compat.v1.train.Coordinator()
            threads = tf.compat.v1.train.start_queue_runners(sess, coord)
            try:
                return [float(sess.run([model.train, model.loss])[1]) for _ in range(steps)]
            finally:
                coord.request_stop()
                coord.join(threads, stop_grace_period_secs=10)

    plain = run(3)
    with dist(cache):
        losses = run(3)
    np.testing.assert_allclose(losses, plain, rtol=RTOL)


def test_monitored_training_session(cache, tmp_path):
    def run(model_dir, steps):
        model = Model(inputs=dataset_inputs("initializable"))
        losses = []
        with model.graph.as_default():
            scaffold = tf.compat.v1.train.Scaffold(
                local_init_op=tf.group(model.graph.get_collection("iterator_init")))
            hooks = [tf.compat.v1.train.StopAtStepHook(num_steps=steps),
                     tf.compat.v1.train.LoggingTensorHook({"loss": model.loss}, every_n_iter=1)]
            with tf.compat.v1.train.MonitoredTrainingSession(
                    checkpoint_dir=model_dir, hooks=hooks, scaffold=scaffold, save_checkpoint_steps=2,
                    save_summaries_steps=None, log_step_count_steps=None) as sess:
                while not sess.should_stop():
                    losses.append(float(sess.run({"t": model.train, "l": model.loss})["l"]))
        return losses

    plain = run(str(tmp_path / "plain"), 3) + run(str(tmp_path / "plain"), 2)
    with dist(cache) as d:
        first = run(str(tmp_path / "dist"), 3)
        resumed = run(str(tmp_path / "dist"), 2)        # restores the distributed checkpoint
    np.testing.assert_allclose(first + resumed, plain, rtol=RTOL)
    assert len(d.plans) == 2     # one graph per MonitoredTrainingSession, each compiled
    assert tf.train.latest_checkpoint(str(tmp_path / "dist")).endswith("model.ckpt-5")


# ---------------------------------------------------------------------------------------------
# verify=True
# ---------------------------------------------------------------------------------------------
def test_verify_accepts_an_equivalent_graph(cache):
    plain = train_with_session(Model(), 2)
    with dist(cache, verify=True):
        losses = train_with_session(Model(), 2)
    np.testing.assert_allclose(losses, plain, rtol=RTOL)


def test_verify_with_iterator_inputs_uses_synthetic_batches(cache):
    model = Model(inputs=dataset_inputs("one_shot"))
    with dist(cache, verify=True) as d, tf.compat.v1.Session(graph=model.graph) as sess:
        sess.run(model.init)
        sess.run(model.train)
    assert len(d.programs) == 1


def test_verify_refuses_a_graph_that_differs(cache):
    from tag_tf.errors import VerificationError

    # Dropout draws different masks on each replica: not the same computation.
    with pytest.raises(VerificationError, match=r"max_rel_diff [0-9.e+-]+ > 0.0001"):
        with dist(cache, verify=True):
            train_with_session(Model(dropout=0.5), 1)


# ---------------------------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------------------------
def test_train_op_collection_without_gradients_is_an_error(cache):
    """A run fetching an op of the TRAIN_OP collection that writes no gradient-derived value (here a
    decay of the weights) is the one case where tag_tf is told to train and cannot."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        w = tf.compat.v1.get_variable("w", [3])
        decay = w.assign(w * 0.5 + tf.reduce_mean(x) * 0.0).op
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, decay)
    with dist(cache), tf.compat.v1.Session(graph=g) as sess:
        sess.run(w.initializer)
        with pytest.raises(GraphError, match=rf"no train op found: '{decay.name}' is in the TRAIN_OP"):
            sess.run(decay, {x: np.ones((2, 3))})


def _manual_sgd_graph():
    """The tutorials' training step: `w.assign_sub(lr * g)` from tf.gradients, no Optimizer."""
    g = tf.Graph()
    with g.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        w = tf.compat.v1.get_variable("w", [3, 2], initializer=tf.compat.v1.random_normal_initializer(seed=1))
        b = tf.compat.v1.get_variable("b", [2], initializer=tf.zeros_initializer())
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - 1.0))
        gw, gb = tf.gradients(loss, [w, b])
        train = tf.group(w.assign_sub(0.1 * gw), b.assign_sub(0.1 * gb))
    return g, x, w, loss, train


@pytest.mark.parametrize("fallback", ["error", "single"])
def test_assign_based_training_is_distributed(cache, fallback):
    """Training is what writes gradient-derived values, not what has an Apply* op: a group of
    assigns is compiled and distributed (never run on one device without a word)."""
    data = [np.random.default_rng(i).standard_normal((8, 3)).astype(np.float32) for i in range(3)]
    results = []
    for scope in (None, dist(cache, fallback=fallback)):
        g, x, w, loss, train = _manual_sgd_graph()
        with (scope or contextlib.nullcontext()), tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.variables_initializer(g.get_collection("variables")))
            losses = [sess.run([train, loss], {x: d})[1] for d in data]
            results.append((losses, sess.run(w)))
        if scope is not None:
            assert len(scope.plans) == 1 and scope.programs[0].replicas == 2
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=RTOL)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=RTOL, atol=1e-6)


def test_fallback_single_trains_undistributed_with_one_warning(cache, caplog):
    """A training graph tag_tf refuses (feeds of unequal batch sizes: 2n rows of labels for n samples
    concatenated twice) trains on the user's session with fallback="single", after one warning
    naming the feeds; with the default it fails, naming them."""
    def graph():
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
            y = tf.compat.v1.placeholder(tf.float32, [None, 3], name="y")
            w = tf.compat.v1.get_variable("w", [3])
            h = tf.concat([x * w, x * w * 2.0], 0)
            loss = tf.reduce_mean(tf.square(h - y))
            train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        return g, x, y, w, train
    feed = lambda x, y: {x: np.ones((4, 3)), y: np.zeros((8, 3))}     # noqa: E731
    g, x, y, w, train = graph()
    with dist(cache), tf.compat.v1.Session(graph=g) as sess:
        sess.run(w.initializer)
        with pytest.raises(GraphError, match=r"batch inputs 'x:0', 'y:0' do not share one batch size"):
            sess.run(train, feed(x, y))
    assert not os.path.exists(cache) or not os.listdir(cache)   # refused before planning: nothing cached
    g, x, y, w, train = graph()
    with caplog.at_level("WARNING", logger="tag_tf.distribute"):
        with dist(cache, fallback="single") as scope, tf.compat.v1.Session(graph=g) as sess:
            sess.run(w.initializer)
            before = sess.run(w)
            for _ in range(2):
                sess.run(train, feed(x, y))
            assert not np.allclose(sess.run(w), before)       # it trained, on the user's session
    assert scope.plans == []
    warnings = [r for r in caplog.records if "fallback='single'" in r.getMessage()]
    assert len(warnings) == 1 and "do not share one batch size" in warnings[0].getMessage()


def test_bad_fallback_is_refused():
    with pytest.raises(TagError, match=r"fallback=\.\.\.\): expected one of 'error', 'single', got 'maybe'"):
        tag_tf.distribute(fallback="maybe")


def test_ops_created_after_training_run_on_one_device_with_the_trained_values(cache):
    """A tutorial's ending: ops built after the training loop (an accuracy, a sum, an assign) run on
    the user's session with the trained values; what they write reaches every distributed copy, and
    training goes on in the distributed session."""
    model = Model()
    with dist(cache), tf.compat.v1.Session(graph=model.graph) as sess:
        sess.run(model.init)
        train_with_session(model, 2, sess)
        trained = sess.run(model.weights[0])             # read from the distributed session
        with model.graph.as_default():
            late = tf.reduce_sum(model.weights[0], name="late_sum")   # created after training started
            reset = tf.compat.v1.assign(model.weights[1], tf.ones([10]), name="late_reset")
        assert sess.run(late) == pytest.approx(float(np.sum(trained)), rel=1e-6)
        sess.run(reset)
        np.testing.assert_array_equal(sess.run(model.weights[1]), np.ones(10))   # every copy got it
        step = sess.run(model.step)
        train_with_session(model, 1, sess)
        assert sess.run(model.step) == step + 1
        assert not np.array_equal(sess.run(model.weights[1]), np.ones(10))


def test_a_run_signature_is_resolved_once_and_repeated_fetches_keep_their_places(cache):
    """The compiled run of a signature (targets, fetches, fed names) is resolved on its first run and
    reused: a training loop of one signature resolves one; a fetch list naming the loss twice gets it
    in both places, with the plain program's values."""
    def run(distributed: bool) -> tuple[list[float], int]:
        model = Model()
        context = dist(cache) if distributed else contextlib.nullcontext()
        with context as d, tf.compat.v1.Session(graph=model.graph) as sess:
            sess.run(model.init)
            train_with_session(model, 3, sess)
            x, y = batch(9)
            out = sess.run([model.loss, model.accuracy, model.loss], {model.x: x, model.y: y})
            resolved = len(d._sessions[sess].runner._resolved) if distributed else 0
            return [float(v) for v in out], resolved

    plain, _ = run(False)
    distributed, resolved = run(True)
    assert distributed[0] == distributed[2]
    np.testing.assert_allclose(distributed, plain, rtol=RTOL)
    assert resolved == 2              # the loop's signature and the last run's


def test_run_signatures_kept_resolved_are_bounded_and_one_evicted_runs_again(cache, monkeypatch):
    """A program running ever other fetch lists keeps at most RESOLVED_MAX signatures resolved (the
    oldest goes first); a signature evicted is resolved again and gets the same values."""
    from tag_tf.frontend import program

    monkeypatch.setattr(program, "RESOLVED_MAX", 3)
    model = Model()
    x, y = batch(9)
    feed = {model.x: x, model.y: y}
    lists = [[model.loss], [model.accuracy], [model.loss, model.accuracy], [model.accuracy, model.loss]]
    with dist(cache) as d, tf.compat.v1.Session(graph=model.graph) as sess:
        sess.run(model.init)
        train_with_session(model, 1, sess)          # the session's program is compiled by its training
        values = [[float(v) for v in sess.run(fetches, feed)] for fetches in lists]
        resolved = d._sessions[sess].runner._resolved
        assert len(resolved) == 3
        newest = {tuple(f.name for f in fetches) for fetches in lists[1:]}
        assert {key[1] for key in resolved} == newest
        assert [float(v) for v in sess.run(lists[0], feed)] == values[0]
        assert len(resolved) == 3 and ("loss:0",) in {key[1] for key in resolved}
    assert values[2] == [values[0][0], values[1][0]] and values[3] == values[2][::-1]


def test_batch_smaller_than_the_replicas_runs_on_one_device(cache):
    """Predicting one example after training: the plan splits batches over 2 replicas, a batch of 1
    runs on one device with the trained values (the plain program's result), and so does a training
    step on it (its update reaches the distributed copies)."""
    def run(distributed: bool) -> tuple[float, list[np.ndarray]]:
        model = Model()
        context = dist(cache) if distributed else contextlib.nullcontext()
        with context, tf.compat.v1.Session(graph=model.graph) as sess:
            sess.run(model.init)
            train_with_session(model, 2, sess)
            x, y = batch(5, n=1)
            one = float(sess.run(model.loss, {model.x: x, model.y: y}))
            sess.run(model.train, {model.x: x, model.y: y})
            train_with_session(model, 1, sess)
            return one, values(sess, model)

    plain, distributed = run(False), run(True)
    assert distributed[0] == pytest.approx(plain[0], rel=1e-5)
    for a, b in zip(plain[1], distributed[1]):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-6)


def test_unreachable_cluster(cache, tmp_path):
    from tag_tf.runtime.cluster import ClusterSpec, free_ports

    path = str(tmp_path / "cluster.json")
    port = free_ports(1)[0]
    ClusterSpec((f"127.0.0.1:{port}",), cpus_per_task=2).save(path)
    with pytest.raises(ClusterError, match=rf"task 0 \(127.0.0.1:{port}\) unreachable"):
        with tag_tf.distribute(strategy="dp", cluster=path, cache_dir=cache):
            train_with_session(Model(), 1)


def test_gpu_topology_cannot_run_here(cache):
    with pytest.raises(TopologyError, match="'testbed'.*can be planned and simulated but not run here"):
        with tag_tf.distribute(topology="testbed", cache_dir=cache):
            pass


def test_cluster_topology_must_match_tasks(tmp_path):
    from tag_tf.runtime.cluster import ClusterSpec

    path = str(tmp_path / "cluster.json")
    ClusterSpec(("127.0.0.1:1", "127.0.0.1:2")).save(path)
    with pytest.raises(TopologyError, match="1 machine.*2 task"):
        with tag_tf.distribute(topology="local:2", cluster=path):
            pass


@pytest.mark.slow
def test_runs_on_a_cluster(cache):
    """Two `tag-tf server` processes with one CPU device each: the compiled graph runs there."""
    from tag_tf.runtime.cluster import local_cluster

    plain = train_with_session(Model(), 2)
    with local_cluster(2, 1) as (spec, _):
        with tag_tf.distribute(strategy="dp", cluster=spec, cache_dir=cache) as d:
            losses = train_with_session(Model(), 2)
    np.testing.assert_allclose(losses, plain, rtol=RTOL)
    assert d.target.devices.names[1].startswith("/job:worker/replica:0/task:1")


def test_several_train_ops(cache):
    """Train ops fetched together in the first training run are compiled as one group, with every
    other train op of the graph: a later run of another one (a GAN's second optimizer) trains like
    the plain run, whichever came first."""
    def build():
        g = tf.Graph()
        with g.as_default():
            tf.compat.v1.set_random_seed(1)
            x = tf.compat.v1.placeholder(tf.float32, [None, 6], name="x")
            y = tf.compat.v1.placeholder(tf.int32, [None], name="y")
            a = tf.compat.v1.get_variable("a", [6, 4])
            b = tf.compat.v1.get_variable("b", [4, 3])
            logits = tf.matmul(tf.nn.tanh(tf.matmul(x, a)), b)
            loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
            train_a = tf.compat.v1.train.GradientDescentOptimizer(0.3).minimize(loss, var_list=[a], name="train_a")
            train_b = tf.compat.v1.train.GradientDescentOptimizer(0.3).minimize(loss, var_list=[b], name="train_b")
            init = tf.compat.v1.global_variables_initializer()
        return g, x, y, loss, train_a, train_b, init

    def run(first, later):
        g, x, y, loss, train_a, train_b, init = build()
        ops = {"a": train_a, "b": train_b}
        with tf.compat.v1.Session(graph=g) as sess:
            sess.run(init)
            out = []
            for i, which in enumerate([first] + [later] * 2):
                xb, yb = batch(i)
                out.append(float(sess.run([[ops[k] for k in which], loss], {x: xb, y: yb})[1]))
            return out

    for first, later in (("ab", "a"), ("a", "b"), ("b", "ab")):
        plain = run(first, later)
        with dist(cache):
            np.testing.assert_allclose(run(first, later), plain, rtol=RTOL)


@pytest.mark.parametrize("devices", [2, 4])
def test_reductions_over_non_batch_axes_with_dynamic_batch(cache, devices):
    """Mean/Sum over non-batch axes with a `None` batch: their gradients reshape with a shape that
    DynamicStitch computes from the batch's Shape at run time; on a replica it must be the replica's
    (it was the whole batch's: `Input to reshape is a tensor with 4 values, but the requested shape
    has 8` in gradients/Sum_grad/Reshape)."""
    def graph():
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 5, 4], name="x")
            w = tf.compat.v1.get_variable("w", [4, 3], initializer=tf.compat.v1.random_normal_initializer(seed=1))
            h = tf.tensordot(x, w, 1)                                   # [B, 5, 3]
            pooled = tf.reduce_mean(h, axis=1)                          # GlobalAveragePooling1D
            loss = tf.reduce_mean(tf.reduce_sum(tf.square(pooled), axis=-1)) + tf.reduce_mean(
                tf.reduce_max(h, axis=[1, 2]))
            train = tf.compat.v1.train.AdamOptimizer(0.01).minimize(loss)
        return g, x, w, loss, train
    data = [np.random.default_rng(i).standard_normal((8, 5, 4)).astype(np.float32) for i in range(3)]
    results = []
    for scope in (None, dist(cache, topology=f"local:{devices}")):
        g, x, w, loss, train = graph()
        with (scope or contextlib.nullcontext()), tf.compat.v1.Session(graph=g) as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            losses = [sess.run([train, loss], {x: d})[1] for d in data]
            results.append((losses, sess.run(w)))
    np.testing.assert_allclose(results[1][0], results[0][0], rtol=RTOL)
    np.testing.assert_allclose(results[1][1], results[0][1], rtol=RTOL, atol=1e-5)


def test_inference_graph_distributed_only_when_asked(cache):
    """A forward-only graph (no train op): with inference=True its prediction runs are compiled and
    split over the replicas, values equal to the single-device run; without it, untouched."""
    def graph():
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 6], name="x")
            w = tf.compat.v1.get_variable("w", [6, 4], initializer=tf.compat.v1.random_normal_initializer(seed=2))
            h = tf.nn.relu(tf.matmul(x, w))
            probs = tf.nn.softmax(h, name="probs")
            mean = tf.reduce_mean(h, axis=0, name="mean")      # a whole-batch statistic
        return g, x, w, probs, mean
    data = [np.random.default_rng(i).standard_normal((n, 6)).astype(np.float32) for i, n in enumerate((8, 6))]
    results = []
    for kw in (None, dict(inference=False), dict(inference=True)):
        g, x, w, probs, mean = graph()
        scope = dist(cache, **kw) if kw is not None else contextlib.nullcontext()
        with scope, tf.compat.v1.Session(graph=g) as sess:
            sess.run(w.initializer)
            results.append([sess.run({"p": probs, "m": mean}, {x: d}) for d in data])
        if kw is not None:
            assert len(scope.plans) == (1 if kw["inference"] else 0)
            if kw["inference"]:
                assert scope.programs[0].replicas == 2
    for other in results[1:]:
        for a, b in zip(other, results[0]):
            np.testing.assert_allclose(a["p"], b["p"], rtol=1e-5, atol=1e-7)
            np.testing.assert_allclose(a["m"], b["m"], rtol=1e-5, atol=1e-7)


def test_failed_copy_back_is_an_error_not_a_log_line(cache):
    """Leaving the context with the user's session open copies the trained values back; when that
    fails the user's session would silently keep its old values, so leaving raises, naming it."""
    model = Model()
    with pytest.raises(TagError, match=r"could not copy the trained variables back"):
        with dist(cache) as scope:
            sess = tf.compat.v1.Session(graph=model.graph)
            sess.run(model.init)
            train_with_session(model, 1, sess)
            scope._sessions[sess].runner.session.close()      # the compiled values are gone
    sess.close()
