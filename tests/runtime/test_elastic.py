"""Elastic runs: a task SIGKILLed mid-run, and the others go on from the step it was lost in, with the
same global batch, on real server processes (the README example unchanged in every process, each with
its own TF_CONFIG, elastic asked for by $TAG_TF_ELASTIC as a launcher would)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from tag_tf.errors import OptionsError
from tag_tf.frontend.elastic import decide
from tag_tf.frontend.options import DistributeOptions
from tag_tf.runtime.cluster import free_ports
from tag_tf.runtime.membership import Decision, Report, decode_values, encode_values
from tag_tf.topology.presets import testbed
from tag_tf.topology.spec import restrict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "examples", "mnist_mlp_session.py")
DEADLINE_S = 240
STEPS = 200


def _launch(tmp: Path, name: str, tf_config: dict | None, steps: int, *extra: str, tiny: bool = True,
            **env_extra: str) -> tuple[subprocess.Popen, Path]:
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TAG_TF_CACHE_DIR=str(tmp / "cache"), **env_extra)
    env.pop("TF_CONFIG", None)
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    log = tmp / f"{name}.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, SCRIPT, *(["--tiny"] if tiny else []), "--steps", str(steps), "--batch", "13",
                                 "--strategy", "dp", "--model-dir", str(tmp / f"model-{name}"), *extra],
                                cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
    return proc, log


def _three(tmp: Path, steps: int, *extra: str, tiny: bool = True, tasks: int = 3, **env: str
           ) -> tuple[list[tuple[subprocess.Popen, Path]], list[int]]:
    ports = free_ports(tasks)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}
    roles = [("chief", 0)] + [("worker", k) for k in range(tasks - 1)]
    procs = [_launch(tmp, f"task{i}", {"cluster": cluster, "task": {"type": t, "index": k}}, steps, *extra,
                     tiny=tiny, TAG_TF_ELASTIC="1", **env) for i, (t, k) in enumerate(roles)]
    return procs, ports


def _kill_when(procs: list[tuple[subprocess.Popen, Path]], victim: int, step: int) -> None:
    """SIGKILL task `victim` as soon as the chief has printed `step`."""
    deadline = time.monotonic() + DEADLINE_S
    while f"step {step} " not in procs[0][1].read_text():
        assert time.monotonic() < deadline and procs[0][0].poll() is None, procs[0][1].read_text()[-3000:]
        time.sleep(0.005)
    os.kill(procs[victim][0].pid, signal.SIGKILL)


def _wait_all(procs: list[tuple[subprocess.Popen, Path]]) -> list[int]:
    codes = []
    try:
        for proc, _ in procs:
            codes.append(proc.wait(timeout=DEADLINE_S))
    finally:
        for proc, _ in procs:
            if proc.poll() is None:
                proc.kill()
    return codes


def _nothing_listens(*logs: str) -> None:
    """Every server any task started (every generation's: "serving on host:port") is gone with its
    process: no port is left listening."""
    import socket

    addresses = {a for text in logs for a in re.findall(r"tag_tf: task \d+ serving on (\S+);", text)}
    assert len(addresses) >= 2
    for address in addresses:
        host, _, port = address.rpartition(":")
        with socket.socket() as s:
            assert s.connect_ex((host, int(port))) != 0, f"{address} still listens"


def _losses(text: str) -> list[tuple[int, float]]:
    return [(int(s), float(v)) for s, v in re.findall(r"^step (\d+) loss ([0-9.]+)", text, re.M)]


def _variables(model_dir: Path) -> dict[str, np.ndarray]:
    reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(model_dir)))
    return {n: reader.get_tensor(n) for n in reader.get_variable_to_shape_map()}


def test_a_killed_worker_is_left_behind_and_the_others_train_on_exactly(tmp_path):
    """Worker 1 (task 2) is SIGKILLed after step 30 of 200: the chief and worker 0 name it in one
    line with each phase's time, go on over two tasks from the step it was lost in, and print every
    step once, with the plain single-process run's losses; the chief's checkpoint holds global step
    200 (nothing skipped, nothing applied twice) and the plain run's variables."""
    procs, ports = _three(tmp_path, STEPS)
    plain = _launch(tmp_path, "plain", None, STEPS, "--plain")
    _kill_when(procs, 2, 30)
    codes = _wait_all([*procs, plain])
    logs = [log.read_text() for _, log in [*procs, plain]]
    assert codes[:2] == [0, 0] and codes[3] == 0, logs[0][-3000:] + logs[1][-3000:]
    assert codes[2] == -signal.SIGKILL
    expected = _losses(logs[3])
    assert [s for s, _ in expected] == list(range(1, STEPS + 1))
    for text in logs[:2]:
        line = re.search(r"tag_tf: elastic: lost task\(s\) (\S+) \(unreachable\); generation 1 goes on with 2 "
                         r"task\(s\) from step (\d+) .*; detect ([0-9.]+) s, agree .* total ([0-9.]+) s", text)
        assert line, text[-3000:]
        assert line.group(1) == f"127.0.0.1:{ports[2]}" and 30 <= int(line.group(2)) <= 32
        got = _losses(text)
        assert [s for s, _ in got] == list(range(1, STEPS + 1))      # every step once
        np.testing.assert_allclose([v for _, v in got], [v for _, v in expected], rtol=1e-4, atol=1e-5)
    assert tf.train.latest_checkpoint(str(tmp_path / "model-task0")).endswith(f"model.ckpt-{STEPS}")
    _nothing_listens(*logs[:3])          # both generations' servers, the killed task's included
    trained, reference = _variables(tmp_path / "model-task0"), _variables(tmp_path / "model-plain")
    assert int(trained["global_step"]) == STEPS
    assert set(trained) == set(reference)
    for name in reference:
        np.testing.assert_allclose(trained[name], reference[name], rtol=1e-3, atol=1e-4, err_msg=name)


def test_two_of_four_lost_at_once_the_other_two_train_on_exactly(tmp_path):
    """Workers 1 and 2 of four tasks are SIGKILLed together: one change names both, the chief and
    worker 0 go on from the step they were lost in and print the plain run's losses, every step once."""
    steps = 150
    procs, ports = _three(tmp_path, steps, tasks=4)
    plain = _launch(tmp_path, "plain", None, steps, "--plain")
    deadline = time.monotonic() + DEADLINE_S
    while "step 30 " not in procs[0][1].read_text():
        assert time.monotonic() < deadline and procs[0][0].poll() is None, procs[0][1].read_text()[-3000:]
        time.sleep(0.005)
    for victim in (2, 3):
        os.kill(procs[victim][0].pid, signal.SIGKILL)
    codes = _wait_all([*procs, plain])
    logs = [log.read_text() for _, log in [*procs, plain]]
    assert codes[:2] == [0, 0] and codes[4] == 0, logs[0][-3000:] + logs[1][-3000:]
    expected = _losses(logs[4])
    for text in logs[:2]:
        lost = re.findall(r"elastic: lost task\(s\) ([^(]+) \(unreachable\); generation (\d+) goes on with (\d) task", text)
        assert len(lost) == 1 and lost[0][1:] == ("1", "2"), text[-3000:]           # one change names both
        assert {a.strip() for a in lost[0][0].split(",")} == {f"127.0.0.1:{ports[2]}", f"127.0.0.1:{ports[3]}"}
        got = _losses(text)
        assert [s for s, _ in got] == list(range(1, steps + 1))
        np.testing.assert_allclose([v for _, v in got], [v for _, v in expected], rtol=1e-4, atol=1e-5)


def test_below_min_tasks_the_run_stops_naming_the_lost_task(tmp_path):
    """min_tasks=3 ($TAG_TF_MIN_TASKS): losing worker 1 ends the run on the others with one line naming
    it and the steps completed; every process ends (none left behind)."""
    procs, ports = _three(tmp_path, 100_000, TAG_TF_MIN_TASKS="3")
    _kill_when(procs, 2, 20)
    codes = _wait_all(procs)
    assert codes[0] != 0 and codes[1] != 0
    for _, log in procs[:2]:
        text = log.read_text()
        found = re.search(r"ClusterError: elastic: lost task 2 \(127\.0\.0\.1:(\d+)\); 2 task\(s\) left, fewer than "
                          r"min_tasks=3: the run stops after (\d+) completed step\(s\)", text)
        assert found, text[-3000:]
        assert int(found.group(1)) == ports[2] and int(found.group(2)) >= 20
    _nothing_listens(*(log.read_text() for _, log in procs))


def test_losing_the_chief_the_first_worker_takes_over_and_training_goes_on_exactly(tmp_path):
    """The chief (task 0) is SIGKILLed after step 30: worker 0 says it takes over, the two workers go
    on with the plain run's losses, and worker 0, now the chief, writes the final checkpoint (global
    step 200)."""
    procs, ports = _three(tmp_path, STEPS)
    plain = _launch(tmp_path, "plain", None, STEPS, "--plain")
    _kill_when(procs, 0, 30)
    codes = _wait_all([*procs, plain])
    logs = [log.read_text() for _, log in [*procs, plain]]
    assert codes[1:] == [0, 0, 0], logs[1][-3000:] + logs[2][-3000:]
    expected = _losses(logs[3])
    assert f"tag_tf: elastic: the chief (task 0, 127.0.0.1:{ports[0]}) is lost: task 1 takes over" in logs[1]
    for text in logs[1:3]:
        assert re.search(rf"elastic: lost task\(s\) 127\.0\.0\.1:{ports[0]} \(unreachable\); generation 1 goes on "
                         r"with 2 task\(s\)", text), text[-3000:]
        got = _losses(text)
        assert [s for s, _ in got] == list(range(1, STEPS + 1))
        np.testing.assert_allclose([v for _, v in got], [v for _, v in expected], rtol=1e-4, atol=1e-5)
    trained = _variables(tmp_path / "model-task1")
    assert int(trained["global_step"]) == STEPS
    assert tf.train.latest_checkpoint(str(tmp_path / "model-task2")) is None      # only the chief writes
    for name, value in _variables(tmp_path / "model-plain").items():
        np.testing.assert_allclose(trained[name], value, rtol=1e-3, atol=1e-4, err_msg=name)


def _report(task: int, steps: int) -> Report:
    return Report(task, 0, steps, f"h{task}:1")


def test_the_chiefs_decision():
    """Survivors differ by at most one step: the run resumes from the fewest, restored from the chief
    where it holds that step, else from the first member that does; too few members stop it."""
    addresses = ("h0:0", "h1:0", "h2:0", "h3:0")
    d = decide(1, (0, 1, 2, 3), {0: _report(0, 7), 1: _report(1, 7), 3: _report(3, 7)}, 0, 1, addresses)
    assert (d.members, d.addresses, d.resume, d.source, d.lost, d.stop) == ((0, 1, 3), ("h0:1", "h1:1", "h3:1"),
                                                                            7, 0, (2,), "")
    d = decide(2, (0, 1, 3), {0: _report(0, 8), 1: _report(1, 8), 3: _report(3, 7)}, 0, 1, addresses)
    assert (d.resume, d.source) == (7, 3)
    d = decide(2, (0, 1, 3), {0: _report(0, 8), 3: _report(3, 8)}, 0, 3, addresses)
    assert d.stop.startswith("elastic: lost task 1 (h1:0); 2 task(s) left, fewer than min_tasks=3")
    assert Decision.from_json(d.to_json()) == d


def test_the_chiefs_decision_takes_tasks_that_came_back_in():
    """Tasks that came back follow the members, with the addresses they announced; the step and the
    copy to restore from are the members' (a task that came back has none); they count for min_tasks."""
    addresses = ("h0:0", "h1:0", "h2:0")
    joining = {2: Report(2, -1, 0, "h2:9")}
    d = decide(3, (0, 1), {0: _report(0, 40), 1: _report(1, 40)}, 0, 3, addresses, joining)
    assert (d.members, d.addresses, d.resume, d.source, d.lost, d.stop) == ((0, 1, 2), ("h0:1", "h1:1", "h2:9"),
                                                                            40, 0, (), "")
    d = decide(3, (0, 1), {0: _report(0, 41), 1: _report(1, 40)}, 0, 1, addresses, joining)
    assert (d.resume, d.source) == (40, 1)
    assert decide(3, (0, 1), {0: _report(0, 40)}, 0, 2, addresses, joining).members == (0, 2)   # it counts


def test_values_travel_whole():
    values = {"a/b": np.arange(6, dtype=np.float32).reshape(2, 3), "step": np.int64(7), "s": np.array([b"x"])}
    back = decode_values(encode_values(values))
    assert list(back) == list(values)
    for k in values:
        np.testing.assert_array_equal(back[k], values[k])


def test_the_topology_of_the_machines_left():
    topo = testbed()
    left = restrict(topo, (0, 2, 3))
    assert [m.name for m in left.machines] == [topo.machines[i].name for i in (0, 2, 3)]
    assert left.bandwidth(left.machines[0].num_gpus, left.num_devices - 1) > 0
    with pytest.raises(Exception, match="not distinct machines"):
        restrict(topo, (0, 0))


def test_elastic_options():
    assert DistributeOptions().elastic is None
    assert DistributeOptions(elastic=True, min_tasks=2).fewest_tasks == 2
    with pytest.raises(OptionsError, match="min_tasks"):
        DistributeOptions(min_tasks=0)
    with pytest.raises(OptionsError, match="elastic"):
        DistributeOptions(elastic="yes")   # type: ignore[arg-type]


def test_a_task_that_comes_back_is_planned_back_in_and_resumes_at_the_runs_step(tmp_path):
    """Worker 1 is SIGKILLed at step 30 and started again (its TF_CONFIG, the same command) once the
    others go on: it announces itself, the chief's simulator finds three tasks faster than two (the MLP
    at full size, batch 4096), and after the step the chief announced all three go on as generation 2;
    the worker's script resumes at the run's global step (its session gets the run's variables after
    its own initialisation), and every task prints the plain run's losses, every step once (the
    returning one from where it came back), to the last step (`--until-step`)."""
    steps = 300
    until = ("--until-step", str(steps), "--batch", "4096")
    procs, ports = _three(tmp_path, steps, *until, tiny=False)
    plain = _launch(tmp_path, "plain", None, steps, "--plain", *until, tiny=False)
    _kill_when(procs, 2, 30)
    deadline = time.monotonic() + DEADLINE_S
    while "generation 1 goes on" not in procs[0][1].read_text():
        assert time.monotonic() < deadline and procs[0][0].poll() is None, procs[0][1].read_text()[-3000:]
        time.sleep(0.05)
    cluster = {"chief": [f"127.0.0.1:{ports[0]}"], "worker": [f"127.0.0.1:{p}" for p in ports[1:]]}
    back = _launch(tmp_path, "back", {"cluster": cluster, "task": {"type": "worker", "index": 1}}, steps, *until,
                   tiny=False, TAG_TF_ELASTIC="1")
    codes = _wait_all([procs[0], procs[1], back, plain])
    logs = [log.read_text() for _, log in (procs[0], procs[1], back, plain)]
    assert codes == [0, 0, 0, 0], "\n".join(text[-2500:] for text in logs[:3])
    expected = dict(_losses(logs[3]))
    assert len(expected) == steps
    joined = re.search(rf"elastic: task\(s\) 127\.0\.0\.1:{ports[2]} came back; generation 2 goes on with 3 "
                       r"task\(s\) from step (\d+)", logs[0])
    assert joined, logs[0][-3000:]
    for text in logs[:2]:
        got = _losses(text)
        assert [s for s, _ in got] == list(range(1, steps + 1))
        np.testing.assert_allclose([v for _, v in got], [expected[s] for s, _ in got], rtol=1e-4, atol=1e-5)
    resumed = int(re.findall(r"starting at global step (\d+)", logs[2])[-1])
    got = _losses(logs[2])
    assert resumed + 1 == int(joined.group(1)) and [s for s, _ in got] == list(range(resumed + 1, steps + 1))
    np.testing.assert_allclose([v for _, v in got], [expected[s] for s, _ in got], rtol=1e-4, atol=1e-5)
    assert int(_variables(tmp_path / "model-task0")["global_step"]) == steps
    _nothing_listens(*logs[:3])          # three generations' servers, the first life of the returning task's too
