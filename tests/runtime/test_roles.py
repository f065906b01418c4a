"""One unchanged TF1 script on every task, each with its own TF_CONFIG (as Kubernetes runs it): the
chief plans and compiles one run over every task's server; each task drives its own part of every
step (between-graph), or, for plans only one driver can run, the chief drives them all and the
other tasks serve and exit 0 when it is done. Never again does each task silently train its own copy."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from tag_tf.errors import ClusterError
from tag_tf.runtime.cluster import free_ports
from tag_tf.runtime.roles import from_cluster_dict, from_resolver, from_tf_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "mnist_mlp_session.py")


def test_tf_config_roles_and_machine_order():
    cluster = {"chief": ["h0:1"], "worker": ["h1:1", "h2:1"], "ps": ["h3:1"], "evaluator": ["h4:1"]}
    chief = from_tf_config(json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}))
    assert chief.spec.tasks == ("h0:1", "h1:1", "h2:1", "h3:1") and chief.is_chief and chief.task == 0
    w1 = from_tf_config(json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 1}}))
    assert w1.task == 2 and not w1.is_chief
    with pytest.raises(ClusterError, match="this task is an evaluator"):       # never trains a copy of its own
        from_tf_config(json.dumps({"cluster": cluster, "task": {"type": "evaluator", "index": 0}}))
    # Without a chief, worker 0 drives (TF's convention).
    w0 = from_tf_config(json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 0}}))
    assert w0.is_chief and w0.spec.tasks == ("a:1", "b:1")
    # A cluster of one task, or no TF_CONFIG: nothing to distribute over.
    assert from_tf_config(json.dumps({"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})) is None
    assert from_tf_config("") is None


@pytest.mark.parametrize("text, message", [
    ("{nope", "TF_CONFIG is not JSON"),
    (json.dumps({"cluster": {"worker": ["a:1", "b:1"]}}), "field 'task'"),
    (json.dumps({"cluster": {"worker": ["a:1", "b:1"]}, "task": {"type": "worker", "index": 5}}),
     "task worker:5 is not in the cluster"),
    (json.dumps({"cluster": {"worker": ["a:1", "nocolon"]}, "task": {"type": "worker", "index": 0}}),
     "cluster.worker[1] must be 'host:port'"),
    (json.dumps({"cluster": {"trainer": ["a:1"]}, "task": {"type": "trainer", "index": 0}}), "job 'trainer'"),
])
def test_bad_tf_config_is_named(text, message):
    with pytest.raises(ClusterError, match=re.escape(message)):
        from_tf_config(text)


def test_cluster_resolvers():
    import tensorflow as tf

    spec = tf.train.ClusterSpec({"worker": ["a:1", "b:1"], "chief": ["c:1"]})
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, task_type="worker", task_id=1)
    role = from_resolver(resolver)
    assert role.spec.tasks == ("c:1", "a:1", "b:1") and role.task == 2
    assert from_cluster_dict({"worker": ["a:1"]}, "worker", 0, where="x").is_chief


def _launch(tf_config: dict | None, model_dir: str, cache: str, *extra: str, batch: int = 12,
            strategy: str = "dp") -> subprocess.Popen:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TAG_TF_CACHE_DIR=cache)
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return subprocess.Popen([sys.executable, SCRIPT, "--tiny", "--steps", "3", "--batch", str(batch), "--strategy",
                             strategy, "--model-dir", model_dir, *extra], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _outputs(procs: list[subprocess.Popen]) -> list[tuple[str, str]]:
    """Each process's (stdout, stderr) once all have exited 0 (killed if still running after 300 s)."""
    try:
        outputs = [p.communicate(timeout=300) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0, f"{p.args}\n{out}\n{err[-3000:]}"
    return outputs


def _losses(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"loss ([0-9.]+)", text)]


@pytest.mark.parametrize("strategy", ["dp", "horovod"])
def test_one_script_three_tasks_with_tf_config(tmp_path, strategy):
    """chief + 2 workers on 127.0.0.1, the example script unchanged in each: every task drives its
    own part of each step (between-graph) over the three servers (3 machines), and every task's
    session returns the plain run's losses and accuracies (a batch of 13: shards of 5, 4 and 4 rows);
    the tasks share one model directory, as on a shared file system, and only the chief writes the
    checkpoint; every process exits 0. With fused buckets (`horovod`), the loss and accuracy sums
    over the tasks ride the gradients' all-reduce (compiler/localize)."""
    ports = free_ports(3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}
    cache = str(tmp_path / "cache")
    tasks = [("worker", 0), ("worker", 1), ("chief", 0)]        # workers first: the chief finds them up
    shared = str(tmp_path / "shared")
    procs = [_launch({"cluster": cluster, "task": {"type": t, "index": i}}, shared, cache, batch=13, strategy=strategy)
             for t, i in tasks]
    plain = _launch(None, str(tmp_path / "plain"), cache, "--plain", batch=13)
    outputs = []
    try:
        for p in procs + [plain]:
            outputs.append(p.communicate(timeout=300))
    finally:
        for p in procs + [plain]:
            if p.poll() is None:
                p.kill()
    for p, (out, err) in zip(procs + [plain], outputs):
        assert p.returncode == 0, f"{p.args}\n{out}\n{err[-3000:]}"
    chief_out, chief_err = outputs[2]
    assert "on 3 device(s)" in chief_err and "cpu-3x1" in chief_err       # one plan over all three tasks
    assert "every task drives its own part of each step (between-graph)" in chief_err
    # The loss's sum over the tasks (the accuracy is gathered: a mean of a cast, not a sum of partials).
    riding = "1 whole-batch fetch(es) summed over the tasks ride the gradients' all-reduce"
    assert [riding in err for _, err in outputs[:3]] == [strategy == "horovod"] * 3
    for out, _err in outputs[:3]:
        assert len(_losses(out)) == 3
        np.testing.assert_allclose(_losses(out), _losses(outputs[3][0]), rtol=1e-4)
        assert re.findall(r"accuracy ([0-9.]+)", out) == re.findall(r"accuracy ([0-9.]+)", outputs[3][0])
    assert sum("checkpoint save skipped (the chief writes it)" in err for _, err in outputs[:2]) == 2
    assert tf.train.latest_checkpoint(shared).endswith("model.ckpt-3")


def test_the_chief_drives_every_step_when_asked_to(tmp_path):
    """TAG_TF_BETWEEN_GRAPH=0 (or a plan that only one driver can run): the chief drives every task's
    part of each step, the worker only serves and trains nothing itself."""
    ports = free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    cache = str(tmp_path / "cache")
    procs = []
    for t in ("worker", "chief"):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TAG_TF_CACHE_DIR=cache, TAG_TF_BETWEEN_GRAPH="0",
                   TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": t, "index": 0}}))
        procs.append(subprocess.Popen([sys.executable, SCRIPT, "--tiny", "--steps", "3", "--batch", "12", "--strategy",
                                       "dp", "--model-dir", str(tmp_path / t)], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    plain = _launch(None, str(tmp_path / "plain"), cache, "--plain")
    outputs = _outputs(procs + [plain])
    (worker_out, worker_err), (chief_out, chief_err) = outputs[:2]
    assert "the chief drives every step on every task (TAG_TF_BETWEEN_GRAPH=0)" in chief_err
    assert "the chief ended the run" in worker_err and _losses(worker_out) == []
    np.testing.assert_allclose(_losses(chief_out), _losses(outputs[2][0]), rtol=1e-4)


def test_a_task_whose_chief_never_comes_names_it_and_exits_1(tmp_path):
    ports = free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TAG_TF_CHIEF_GRACE_S="3",
               TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": 0}}))
    p = subprocess.run([sys.executable, SCRIPT, "--tiny", "--steps", "1", "--strategy", "dp"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert f"the chief (task 0, 127.0.0.1:{ports[0]}) has been unreachable for 3 s" in p.stderr
    assert "loss" not in p.stdout


def test_public_cluster_addresses_need_trusted_network(tmp_path):
    """A TensorFlow server runs whatever graph reaches it: a cluster on public addresses is refused
    (one line naming the address) unless the user says the network is theirs."""
    import tag_tf
    from tag_tf.frontend.cli import main
    from tag_tf.runtime.cluster import ClusterSpec, check_trusted, untrusted_addresses

    assert untrusted_addresses(["127.0.0.1:1", "10.1.2.3:1", "192.168.0.9:1", "[::1]:5", "8.8.8.8:2222"]) == \
        ["8.8.8.8:2222"]
    spec = ClusterSpec(("10.0.0.1:2222", "8.8.8.8:2222"))
    with pytest.raises(ClusterError, match=r"cluster address 8.8.8.8:2222 is not loopback or private"):
        check_trusted(spec, trusted_network=False)
    check_trusted(spec, trusted_network=True)
    path = tmp_path / "cluster.json"
    spec.save(str(path))
    with pytest.raises(ClusterError, match="8.8.8.8:2222"):
        with tag_tf.distribute(strategy="dp", cluster=str(path)):
            pass
    assert main(["server", "--cluster", str(path), "--task", "1"]) == 2
    with pytest.raises(ClusterError, match="the host name does not resolve"):
        check_trusted(ClusterSpec(("no-such-host.invalid:2222",)), trusted_network=False, resolve_timeout_s=0)


def _three_tasks(tmp_path, envs: list[dict], extra: list[list[str]]) -> list[tuple[subprocess.Popen, str, str]]:
    """Start the example script in 3 processes (envs[i], extra args[i]); their outputs, all exited."""
    procs = []
    for _i, (env_extra, args) in enumerate(zip(envs, extra)):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TAG_TF_CACHE_DIR=str(tmp_path / "cache"), **env_extra)
        env.pop("TF_CONFIG", None)
        procs.append(subprocess.Popen([sys.executable, SCRIPT, "--tiny", "--steps", "3", "--batch", "12", "--strategy",
                                       "dp", *args], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    out = []
    try:
        for p in procs:
            out.append((p, *p.communicate(timeout=300)))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return out


def _consecutive_free_ports(n: int) -> int:
    import socket

    for base in range(20000, 60000, 97):
        try:
            socks = []
            for port in range(base, base + n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no free port range")


def _check_one_plan(results) -> None:
    """Every task ran its part of the chief's plan over the 3 tasks, and got the same losses."""
    for p, out, err in results:
        assert p.returncode == 0, f"{p.args}\n{out}\n{err[-3000:]}"
    chief = [err for _, _, err in results if "between-graph" in err and "training graph" in err]
    assert len(chief) == 3 and all("on 3 device(s)" in err and "cpu-3x1" in err for err in chief)
    losses = [_losses(out) for _, out, _ in results]
    assert len(losses[0]) == 3
    for other in losses[1:]:
        np.testing.assert_allclose(other, losses[0], rtol=1e-5)


def test_one_script_three_tasks_with_a_simple_cluster_resolver(tmp_path):
    ports = free_ports(3)
    spec = json.dumps({"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]})
    tasks = ["worker:0", "worker:1", "chief:0"]
    _check_one_plan(_three_tasks(tmp_path, [{}] * 3,
                                   [["--resolver", "simple", "--cluster-spec", spec, "--task", t] for t in tasks]))


def test_one_script_three_tasks_under_slurm_variables(tmp_path):
    """TF's SlurmClusterResolver on one machine: what srun would set (SLURM_PROCID, SLURM_STEP_NUM_TASKS,
    SLURM_STEP_NODELIST, SLURM_STEP_TASKS_PER_NODE); ports are --port-base + i on the node."""
    base = _consecutive_free_ports(3)
    common = {"SLURM_STEP_NUM_TASKS": "3", "SLURM_STEP_NODELIST": "localhost", "SLURM_STEP_TASKS_PER_NODE": "3"}
    results = _three_tasks(tmp_path, [dict(common, SLURM_PROCID=str(i)) for i in (1, 2, 0)],
                           [["--resolver", "slurm", "--port-base", str(base)]] * 3)
    _check_one_plan(results)


def test_an_estimator_under_tf_config(tmp_path):
    """Estimator reads TF_CONFIG itself (its RunConfig keeps the chief's session to the chief's own
    devices); through tag_tf's wrapper the chief still drives both tasks and the worker serves."""
    ports = free_ports(2)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
    script = os.path.join(ROOT, "examples", "estimator_train.py")
    procs = []
    for task in ({"type": "worker", "index": 0}, {"type": "chief", "index": 0}):
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TAG_TF_CACHE_DIR=str(tmp_path / "cache"),
                   TF_CONFIG=json.dumps({"cluster": cluster, "task": task}))
        procs.append(subprocess.Popen([sys.executable, script, "--tiny", "--steps", "3", "--strategy", "dp",
                                       "--model-dir", str(tmp_path / "model")], cwd=ROOT, env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    outputs = _outputs(procs)
    assert "on 2 device(s)" in outputs[1][1] and "cpu-2x1" in outputs[1][1]
    assert "the chief ended the run" in outputs[0][1]


def test_tasks_feeding_different_batches_are_told(tmp_path):
    """Between-graph, each task trains on its shards of the batch it feeds: the run equals the
    single-device one only when every task feeds the same batches. A chief that resumes from its own
    checkpoint (and so feeds later rows) and a worker that starts afresh are named, not silent."""
    cache = str(tmp_path / "cache")

    def run_pair() -> list[tuple[str, str]]:
        ports = free_ports(2)
        cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{ports[1]}"]}
        procs = [_launch({"cluster": cluster, "task": {"type": t, "index": 0}}, str(tmp_path / t), cache)
                 for t in ("worker", "chief")]
        return _outputs(procs)

    first = run_pair()
    assert not any("fed another first batch" in err for _, err in first)
    second = run_pair()        # the chief restores step 3 from its directory; the worker has none
    assert "restored" in second[1][0] and "restored" not in second[0][0]
    assert "task 0 fed another first batch than task(s) 1" in second[1][1]
    assert "task 1 fed another first batch than task(s) 0" in second[0][1]


def test_a_task_the_plan_leaves_out_serves_and_the_others_train_between_graph(tmp_path):
    """A plan on the first two tasks' devices only (as `best-subset` makes when a host is not worth
    its link): the two drive their own parts and return the plain run's losses; the third says it
    has no part, serves until the chief ends the run and exits 0 (it crashed with a KeyError and took
    the run down before), and the chief does not wait out the finish deadline for it."""
    script = os.path.join(os.path.dirname(__file__), "subset_task.py")
    ports = free_ports(3)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}

    def launch(tf_config: dict | None) -> subprocess.Popen:
        env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TAG_TF_CACHE_DIR=str(tmp_path / "cache"))
        env.pop("TF_CONFIG", None)
        if tf_config is not None:
            env["TF_CONFIG"] = json.dumps(tf_config)
        return subprocess.Popen([sys.executable, script], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    started = time.monotonic()
    procs = [launch({"cluster": cluster, "task": {"type": t, "index": i}})
             for t, i in (("worker", 0), ("worker", 1), ("chief", 0))]
    plain = launch(None)
    (w0, w1, chief), (plain_out, _) = _outputs(procs), plain.communicate(timeout=300)
    assert time.monotonic() - started < 200          # not the chief's 300 s wait for a task that never finishes
    assert "every task drives its own part of each step (between-graph)" in chief[1]
    assert "task 2 has no part in the chief's plan (it runs on task(s) 0, 1)" in w1[1], w1[1][-2000:]
    assert _losses(w1[0]) == [] and len(_losses(plain_out)) == 3
    for out, _ in (chief, w0):
        np.testing.assert_allclose(_losses(out), _losses(plain_out), rtol=1e-4)
