"""Emulated heterogeneous clusters, for real: network namespaces, shaped veth links, cgroup CPU
quotas (root; CI runs as root). Set-up and teardown whatever ends a run, what the hosts measure,
discovery seeing a slow host and a slow link, and a real training run with uneven shares."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tag_tf.emulate import load_cluster, system
from tag_tf.emulate.cluster import Emulation
from tag_tf.errors import EmulationError

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HERE = os.path.dirname(os.path.abspath(__file__))
CLI = [sys.executable, "-m", "tag_tf.frontend.cli"]
MISSING = system.requirements_missing()
needs_root = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")


def _ours(tag: str) -> tuple[list[str], list[str]]:
    ns = [n for n in system.namespaces() if n.startswith(f"{system.PREFIX}{tag}")]
    return ns, [g for g in system.cgroups() if g.startswith(f"{system.PREFIX}{tag}")]


def _nothing_left(tag: str) -> None:
    assert _ours(tag) == ([], []), _ours(tag)


def test_cluster_files_are_checked_field_by_field(tmp_path):
    c = load_cluster({"hosts": [{"name": "a", "cpu": 1.0, "nic": "1Gbps"}, {"name": "b", "cpu": 0.25, "nic": "50Mbps"}],
                      "links": [{"between": ["a", "b"], "bandwidth": "20Mbps"}]})
    assert c.bandwidth(0, 1) == pytest.approx(20e6 / 8) and c.address(1) == "10.77.0.2"
    assert json.loads(c.tf_config(1))["task"] == {"type": "worker", "index": 1}
    assert c.cpusets([0, 1]) == ["0", "1"]            # quotas that fit a core each get their own
    halves = load_cluster({"hosts": [{"name": n, "cpu": 0.5} for n in "abc"] + [{"name": "d", "cpu": 0.25}]})
    # two half-core hosts would fill a core (the kernel moves their packets there too): one each;
    # the third fits no core and takes its quota on any; a quarter still fits beside a half
    assert halves.cpusets([0, 1]) == ["0", "1", None, "0"]
    assert load_cluster({"hosts": [{"name": "f", "cpu": 1.0}, {"name": "h", "cpu": 0.5}, {"name": "q", "cpu": 0.25}]}
                        ).cpusets([0, 1]) == ["0", "1", "1"]
    bad = [({"hosts": []}, "hosts"), ({"hosts": [{"name": "a", "cpu": 0}]}, "cpu"),
           ({"hosts": [{"name": "a", "nic": "fast"}]}, "nic"), ({"hosts": [{"name": "a"}], "subnet": "8.8.8.0/24"}, "subnet"),
           ({"hosts": [{"name": "a"}, {"name": "a"}]}, "unique"),
           ({"hosts": [{"name": "a"}], "links": [{"between": ["a", "z"], "bandwidth": 1}]}, "between")]
    for data, word in bad:
        with pytest.raises(EmulationError, match=word):
            load_cluster(data)
    path = tmp_path / "c.yaml"
    path.write_text("hosts:\n  - {name: a, cpu: 0.5, colour: red}\n")
    with pytest.raises(EmulationError, match=r"c\.yaml: hosts\[0\]: unknown key 'colour'"):
        load_cluster(str(path))


@needs_root
def test_not_root_is_one_clear_line(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("hosts:\n  - {name: a}\n  - {name: b}\n")
    done = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *CLI, "emulate",
                           "--cluster", str(path), "--", "true"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == ("tag-tf emulate: error: emulated clusters need root "
                                                    "(network namespaces, tc and cgroups); run as root")


@needs_root
def test_hosts_measure_their_quota_and_their_links_and_everything_goes():
    cluster = load_cluster({"hosts": [{"name": "fast", "cpu": 1.0, "nic": "1Gbps"},
                                      {"name": "slow", "cpu": 0.25, "nic": "50Mbps"}]})
    with Emulation(cluster) as emu:
        ns, groups = _ours(emu.tag)
        assert len(ns) == 3 and len(groups) == 2
        measured = emu.measure(seconds_per_link=0.4)
        lines: list[str] = []
        code = emu.run_everywhere(["sh", "-c", 'echo "$TAG_TF_EMULATED_HOST $TF_CONFIG"'], timeout_s=30, out=lines.append)
    _nothing_left(emu.tag)
    assert code == 0
    assert any(line.startswith("[slow] slow {") and '"index": 1' in line for line in lines), lines
    fast, slow = measured.cpu_speed
    assert 0.15 < slow / fast < 0.4, measured.cpu_speed                       # a quarter of a core
    assert 40e6 / 8 < measured.bandwidth[(0, 1)] < 52e6 / 8, measured.bandwidth   # 50 Mbit/s, both ways
    assert 40e6 / 8 < measured.bandwidth[(1, 0)] < 52e6 / 8, measured.bandwidth
    # Each way at its rate while the other way runs too (at the OS level: this holds with one queue per
    # link as well; test_a_slow_link_is_full_duplex_for_tensorflows_transfers catches that queue).
    for key in ((0, 1), (1, 0)):
        assert measured.duplex[key] > 0.9 * measured.bandwidth[key], (measured.duplex, measured.bandwidth)
    assert "slow -> fast" in measured.render()


@needs_root
def test_a_slow_link_is_full_duplex_for_tensorflows_transfers(tmp_path):
    """4 MB each way at once over a 50 Mbit/s link take as long as 4 MB one way. gRPC's flow control
    sends small frames against the data: behind one queue of the other direction's data they waited
    up to 100 ms, and both ways at once took 816-907 ms where one way took 670 ms."""
    cluster = load_cluster({"hosts": [{"name": "a", "cpu": 1.0, "nic": "1Gbps"}, {"name": "b", "cpu": 1.0, "nic": "50Mbps"}]})
    lines: list[str] = []
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    with Emulation(cluster) as emu:
        code = emu.run_everywhere([sys.executable, os.path.join(HERE, "duplex_task.py"), str(tmp_path / "done")],
                                  timeout_s=240, env=env, out=lines.append)
    _nothing_left(emu.tag)
    assert code == 0, "\n".join(lines[-20:])
    ms = json.loads(next(line.split("] ", 1)[1] for line in lines if line.startswith("[a") and "{" in line))
    one_way = max(ms["there"], ms["back"])
    assert 4.0e6 / (52e6 / 8) * 1e3 < one_way < 4.2e6 / (40e6 / 8) * 1e3, ms       # the link's rate
    assert ms["both"] < 1.1 * one_way, ms


@needs_root
def test_a_killed_task_stops_the_others_and_nothing_is_left_behind():
    cluster = load_cluster({"hosts": [{"name": "a", "cpu": 0.5}, {"name": "b", "cpu": 0.5, "nic": "100Mbps"},
                                      {"name": "c"}]})
    lines: list[str] = []
    start = time.monotonic()
    with Emulation(cluster) as emu:
        code = emu.run_everywhere(["sh", "-c", 'if [ "$TAG_TF_EMULATED_HOST" = b ]; then sleep 1; kill -9 $$; fi; '
                                   'sleep 300 & wait'], timeout_s=120, out=lines.append)
        pids = [p.pid for p in emu.processes]
    assert code == -signal.SIGKILL and time.monotonic() - start < 60
    assert "[emulate] host b exited with code -9: stopping the others" in lines
    _nothing_left(emu.tag)
    assert not [p for p in pids if os.path.exists(f"/proc/{p}")]
    assert not subprocess.run(["pgrep", "-f", "sleep 300"], capture_output=True).stdout


@needs_root
def test_keep_going_lets_the_others_run_and_restart_after_starts_a_host_again(tmp_path):
    """--keep-going: a host killed mid-run does not stop the others, and every host's exit codes are
    reported; --restart-after: the killed host's command runs again (a second time: it finds its
    marker and exits 0) while the others still run; nothing is left behind."""
    cluster = load_cluster({"hosts": [{"name": "a", "cpu": 0.5}, {"name": "b", "cpu": 0.5}, {"name": "c"}]})
    marker = tmp_path / "b-ran"
    script = (f'if [ "$TAG_TF_EMULATED_HOST" = b ]; then if [ -e {marker} ]; then echo back; exit 0; fi; '
              f'touch {marker}; sleep 0.5; kill -9 $$; fi; sleep 3; echo $TAG_TF_EMULATED_HOST done')
    lines: list[str] = []
    with Emulation(cluster) as emu:
        code = emu.run_everywhere(["sh", "-c", script], timeout_s=60, out=lines.append, keep_going=True)
    assert code == -signal.SIGKILL
    assert "[emulate] host b exited with code -9; the others run on" in lines
    assert any(line.endswith("a done") for line in lines) and any(line.endswith("c done") for line in lines)
    assert lines[-1] == "[emulate] exit codes: a 0, b -9, c 0"
    _nothing_left(emu.tag)
    marker.unlink()
    lines = []
    with Emulation(cluster) as emu:
        code = emu.run_everywhere(["sh", "-c", script], timeout_s=60, out=lines.append, restart_after_s=0.5)
    assert code == 0, lines
    assert "[emulate] host b exited with code -9: starting it again in 0.5 s" in lines
    assert lines.index("[emulate] host b started again") < min(i for i, line in enumerate(lines) if line.endswith("done"))
    assert any(line.endswith("back") for line in lines)
    assert lines[-1] == "[emulate] exit codes: a 0, b -9->0, c 0"
    _nothing_left(emu.tag)


@needs_root
@pytest.mark.parametrize("how", ["SIGTERM", "timeout", "SIGKILL"])
def test_the_launcher_removes_everything_however_it_ends(tmp_path, how):
    """`tag-tf emulate` stopped by SIGTERM or by its timeout removes everything itself; killed by
    SIGKILL it cannot, and `tag-tf emulate --cleanup` removes what it left (and nothing of a live one)."""
    path = tmp_path / "c.yaml"
    path.write_text("hosts:\n  - {name: a, cpu: 0.5}\n  - {name: b, cpu: 0.5, nic: 100Mbps}\n")
    timeout = "2" if how == "timeout" else "120"
    p = subprocess.Popen([*CLI, "emulate", "--cluster", str(path), "--no-measure", "--timeout", timeout, "--",
                          "sleep", "301"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    tag = str(p.pid)
    deadline = time.monotonic() + 60
    while len(_ours(tag)[0]) < 3 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(_ours(tag)[0]) == 3
    time.sleep(1.0)
    if how != "timeout":
        p.send_signal(getattr(signal, how))
    out, err = p.communicate(timeout=60)
    if how == "SIGKILL":
        assert p.returncode == -signal.SIGKILL and len(_ours(tag)[0]) == 3
        done = subprocess.run([*CLI, "emulate", "--cleanup"], capture_output=True, text=True, cwd=ROOT, timeout=120)
        assert done.returncode == 0 and "removed 3 namespace(s) and 2 cgroup(s)" in done.stdout, done.stdout
    elif how == "SIGTERM":
        assert p.returncode == 128 + signal.SIGTERM and "stopped by SIGTERM" in err
    else:
        assert p.returncode == 124 and "ran past its 2 s" in out
    _nothing_left(tag)
    assert not subprocess.run(["pgrep", "-f", "sleep 301"], capture_output=True).stdout


@needs_root
def test_discovery_finds_the_slow_host_and_the_slow_link(tmp_path):
    """Three TF_CONFIG tasks on unequal hosts: each task's speed is measured on that task (its own
    quota), every pair's link is measured, and the topology has the speeds and the far host's port."""
    cluster = load_cluster({"hosts": [{"name": "fast", "cpu": 1.0, "nic": "1Gbps"},
                                      {"name": "slow", "cpu": 0.25, "nic": "1Gbps"},
                                      {"name": "far", "cpu": 1.0, "cpus": "1", "nic": "50Mbps"}]})
    lines: list[str] = []
    env = dict(os.environ, TAG_TF_CACHE_DIR=str(tmp_path / "cache"), TF_CPP_MIN_LOG_LEVEL="2")
    with Emulation(cluster) as emu:
        code = emu.run_everywhere([sys.executable, os.path.join(HERE, "discover_task.py"), str(tmp_path / "done")],
                                  timeout_s=300, env=env, out=lines.append)
    assert code == 0, "\n".join(lines[-20:])
    found = json.loads(next(line.split("] ", 1)[1] for line in lines if line.startswith("[fast") and "{" in line))
    machines = found["topology"]["machines"]
    assert [m["name"] for m in machines] == ["fast", "slow", "far"]
    speeds = [m.get("speed", 1.0) for m in machines]
    # the quota-limited host is found (0.25 of a core), and clearly below both full-core hosts; the two
    # full-core hosts differ by noise and by "far" being pinned to one core (CI measured 0.68 for it)
    assert speeds[1] < 0.45 and speeds[1] < 0.6 * min(speeds[0], speeds[2]), speeds
    assert min(speeds[0], speeds[2]) > 0.5, speeds
    # what a message costs each host's CPU while it computes, where the probe found any (the quarter
    # core measured 0-316 us over four runs against 64-93 us on a full core: the probe does not yet
    # tell the hosts apart reliably, so only its range is asked here)
    messages = [m.get("message", 0.0) for m in machines]
    assert all(0 <= s < 2e-3 for s in messages) and any(messages), messages
    # and what an all-reduce's bytes cost its CPU beyond the link: a few hundred MB/s on a full core
    copies = [m.get("copy") for m in machines]
    assert all(copies) and 50e6 < copies[0] < 5e9 and copies[1] < copies[0], copies
    # every pair's link is explained by the hosts' ports: a switch, the far host behind its 50 Mbit/s
    inter, nic = found["topology"]["inter"], machines[2].get("nic")
    assert "matrix" not in inter and nic and 40e6 / 8 < nic < 55e6 / 8, (inter, machines[2])
    assert inter["switch"] > 5 * nic and "nic" not in machines[0] and "nic" not in machines[1], (inter, machines)


def _losses(text: str) -> list[float]:
    return [float(x) for x in re.findall(r"loss ([0-9.]+)", text)]


@needs_root
def test_a_real_run_on_two_unequal_hosts_takes_uneven_shares_and_the_plain_losses(tmp_path):
    """The example script, unchanged, on a fast host and one on 0.4 of a core behind 200 Mbit/s:
    discovery sees the slow host, dp-p gives it the smaller share, and both tasks print the
    single-device run's losses."""
    path = tmp_path / "c.yaml"
    path.write_text("hosts:\n  - {name: fast, cpu: 1.0}\n  - {name: slow, cpu: 0.4, nic: 200Mbps}\n")
    env = dict(os.environ, TAG_TF_CACHE_DIR=str(tmp_path / "cache"), TF_CPP_MIN_LOG_LEVEL="2")
    script = [sys.executable, "examples/mnist_mlp_session.py", "--tiny", "--steps", "3", "--batch", "13"]
    done = subprocess.run([*CLI, "emulate", "--cluster", str(path), "--timeout", "300", "--", *script,
                           "--strategy", "dp-p"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=400)
    plain = subprocess.run([*script, "--plain"], capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0 and plain.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    out = done.stdout
    assert re.search(r"\[fast\] tag_tf: cluster topology .*task speeds 1/0\.[2-5]", out), out[-3000:]
    shares = re.search(r"\[fast\] tag_tf: training graph .* on 2 device\(s\) .*plan dp-p .*batch shares "
                       r"([0-9.]+)/([0-9.]+)", out)
    assert shares and float(shares.group(1)) > 0.6 > float(shares.group(2)), out[-3000:]
    for host in ("fast", "slow"):
        mine = _losses("\n".join(line for line in out.splitlines() if line.startswith(f"[{host}]")))
        assert len(mine) == 3
        np.testing.assert_allclose(mine, _losses(plain.stdout), rtol=1e-4)
