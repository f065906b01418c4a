"""The topology of a running cluster comes from the cluster: each server reports its devices, the
links are measured between the servers (and cached per cluster), and `tag-tf topology show
--cluster` prints what was found."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest
import tensorflow as tf

from tag_tf.measure.links import discover, fit_link, link_matrix, link_ports
from tag_tf.runtime.cluster import ClusterSpec, free_ports, local_cluster
from tag_tf.runtime.discovery import gather

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_fit_link_recovers_latency_and_bandwidth():
    samples = [(b, 50e-6 + b / 2e9) for b in (4 << 10, 64 << 10, 1 << 20, 4 << 20)]
    bandwidth, latency = fit_link(samples)
    assert abs(bandwidth - 2e9) / 2e9 < 1e-6 and abs(latency - 50e-6) < 1e-9


def test_fit_link_keeps_the_latency_when_large_transfers_are_noisy():
    """Loopback gRPC as measured here: ~80 us for small transfers, the 4 MB one 10% slow. A plain
    least-squares line gave 0 us; the relative-error fit keeps the small transfers' latency."""
    samples = [(4 << 10, 80e-6), (64 << 10, 85e-6), (1 << 20, 80e-6 + (1 << 20) / 3e9),
               (4 << 20, 1.1 * (80e-6 + (4 << 20) / 3e9))]
    bandwidth, latency = fit_link(samples)
    assert 60e-6 < latency < 90e-6 and 2e9 < bandwidth < 3.5e9
    # The probe clamps a sample at 0 when noise swamps it: that sample must not take all the weight.
    bandwidth, latency = fit_link([(4 << 10, 0.0), *samples[1:]])
    assert 60e-6 < latency < 90e-6


def test_pairs_a_slow_port_explains_become_ports_and_others_stay_pairs():
    """A host behind a slow link makes every pair with it slow: the ports explain the pairs (a switch,
    that host's nic). Pairs no ports explain (two hosts slow only to each other) stay a matrix."""
    def links(bws):
        return {"pairs": [{"tasks": list(k), "bandwidth": v} for k, v in bws.items()]}
    fast, slow = 118e6, 6.1e6
    star = links({(0, 1): fast, (0, 2): slow, (1, 2): 1.05 * slow})
    assert link_ports(star, 3) == [fast, fast, 1.05 * slow]
    assert link_ports(links({(0, 1): fast, (0, 2): 0.97 * fast, (1, 2): fast}), 3) is None    # one switch
    odd = links({(0, 1): slow, (0, 2): fast, (1, 2): fast})      # 0 and 1 slow to each other alone
    assert link_ports(odd, 3) is None and link_matrix(odd, 3) is not None


def test_servers_report_devices_and_the_link_is_measured_once(tmp_path):
    with local_cluster(2, 2) as (spec, _):
        topo, report = discover(spec, cache_dir=str(tmp_path))
        assert topo.name == "cpu-2x2" and topo.num_machines == 2 and topo.num_devices == 4
        assert [d.type for d in topo.devices] == ["cpu"] * 4
        hosts = {d["host"] for d in report["descriptions"]}
        assert hosts == {socket.gethostname()} and {d["cpu_devices"] for d in report["descriptions"]} == {2}
        links = report["links"]
        assert not report["cached"] and os.path.exists(report["cache"])
        assert 1e7 < links["bandwidth"] < 1e12 and links["latency"] >= 0       # measured over loopback gRPC
        assert 0 <= links["drive_s"] < 0.1         # a step driven by one client reaching the other task
        assert abs(topo.inter_bandwidth - links["bandwidth"]) / links["bandwidth"] < 1e-3
        again, second = discover(spec, cache_dir=str(tmp_path))
        assert second["cached"] and again.inter_bandwidth == topo.inter_bandwidth

        out = subprocess.run([sys.executable, "-m", "tag_tf.frontend.cli", "topology", "show", "--cluster",
                              _cluster_file(spec, tmp_path), "--json"], cwd=ROOT, capture_output=True, text=True,
                             env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", TAG_TF_CACHE_DIR=str(tmp_path)),
                             timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        shown = json.loads(out.stdout)
        assert shown["num_devices"] == 4 and shown["discovery"]["cached"]
        assert shown["inter"]["bandwidth"] == topo.inter_bandwidth


def _cluster_file(spec: ClusterSpec, tmp_path) -> str:
    path = str(tmp_path / "cluster.json")
    spec.save(path)
    return path


def test_a_server_that_reports_nothing_is_taken_from_the_cluster_file():
    port = free_ports(1)[0]
    server = tf.distribute.Server(tf.train.ClusterSpec({"worker": [f"127.0.0.1:{port}"]}), job_name="worker",
                                  task_index=0, start=True)
    spec = ClusterSpec((f"127.0.0.1:{port}",), cpus_per_task=1)
    assert gather(spec) == [None]
    topo, report = discover(spec)
    assert topo.num_devices == 1 and report["links"] is None
    del server


def test_a_ring_all_reduce_over_every_task_is_measured_and_a_shared_network_says_so():
    """measure_fabric: a CollectiveReduceV2 ring over every task at two sizes gives each hop's rate;
    the fabric (the hops' rate x the tasks) is reported where the hops move less than FABRIC_SHARED
    of the ring's slowest link alone, and not where the links alone explain them."""
    from tag_tf.measure.links import FABRIC_SHARED, measure_fabric

    with local_cluster(3, 1) as (spec, _):
        pairs = [{"tasks": [a, b], "bandwidth": 1e15} for a, b in ((0, 1), (0, 2), (1, 2))]   # links "alone": huge
        found = measure_fabric(spec, pairs, repeats=1)
        assert 1e6 < found["ring_hop"] < 1e12          # loopback gRPC between three processes
        assert found["fabric"] == pytest.approx(3 * found["ring_hop"])
        # Links slower than the ring moved, and slow enough that the ring probe's sizes change: the same
        # servers then see the probe's keys with other shapes (a server aborted that once; keys now differ).
        pairs = [dict(p, bandwidth=min(found["ring_hop"] / 4, 2e7)) for p in pairs]
        again = measure_fabric(spec, pairs, repeats=1)
        assert again["fabric"] is None and again["ring_hop"] > 0
        assert measure_fabric(ClusterSpec(spec.tasks[:2], spec.job), pairs[:1]) == {"fabric": None, "ring_hop": None}
    assert 0 < FABRIC_SHARED < 1


def test_each_tasks_all_reduce_steps_are_measured_while_it_computes():
    """measure_collective_steps: per task, what tiny all-reduces over every task, one after another,
    add to a chain of products on that task, per step; nothing for a cluster of one task."""
    from tag_tf.measure.links import measure_collective_steps

    with local_cluster(3, 1) as (spec, _):
        steps = measure_collective_steps(spec, repeats=3)
        assert len(steps) == 3 and all(0 <= s < 0.05 for s in steps)
    assert measure_collective_steps(ClusterSpec(spec.tasks[:1], spec.job)) == []
