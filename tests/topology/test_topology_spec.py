"""Topology model, file format, presets, random generator and the `topology` CLI command."""
from __future__ import annotations

import copy
import json
import math

import pytest
import yaml

from tag_tf.errors import TopologyError
from tag_tf.frontend.cli import main as cli_main
from tag_tf.topology import GPU_TYPES, GpuSpec, Machine, Topology, gpu_type, load_topology, presets, random_topology
from tag_tf.topology.gpus import type_from_device_name
from tag_tf.topology.parse import topology_from_dict
from tag_tf.topology.units import parse_bandwidth

GBPS = 1e9 / 8

EXAMPLE = {
    "name": "example",
    "machines": [
        {"name": "dgx", "gpus": "4x V100-32GB", "intra": "nvlink 50GB/s"},
        {"name": "worker", "replicas": 2,
         "gpus": [{"type": "1080ti", "count": 2}, {"type": "p100", "memory": "12GiB"}],
         "intra": {"link": "pcie", "bandwidth": "15.75GB/s", "latency": "8us"}, "nic": "25Gbps"},
    ],
    "inter": {"switch": "100Gbps", "latency": "30us"},
}


def _check_example(t: Topology) -> None:
    assert t.num_devices == 4 + 2 * 3 and t.num_machines == 3
    assert [m.name for m in t.machines] == ["dgx", "worker-0", "worker-1"]
    assert [d.type for d in t.devices[4:7]] == ["GTX1080Ti", "GTX1080Ti", "P100"]
    assert t.devices[6].memory_bytes == 12 * 2 ** 30
    assert t.devices[4].memory_bytes == GPU_TYPES["GTX1080Ti"].memory_bytes
    assert [(g.machine, g.type, g.devices) for g in t.groups] == [
        (0, "V100-32GB", (0, 1, 2, 3)), (1, "GTX1080Ti", (4, 5)), (1, "P100", (6,)),
        (2, "GTX1080Ti", (7, 8)), (2, "P100", (9,))]
    assert t.bandwidth(0, 1) == 50e9
    assert t.bandwidth(4, 5) == 15.75e9
    assert t.bandwidth(0, 4) == 25 * GBPS          # min(100 Gbps switch port, 25 Gbps nic)
    assert t.latency(4, 6) == pytest.approx(8e-6) and t.latency(0, 9) == pytest.approx(30e-6)


# ---- GPU types --------------------------------------------------------------------------------
def test_gpu_types_and_aliases():
    for name in ("V100-32GB", "V100-16GB", "P100", "GTX1080Ti", "T4", "A100-40GB", "A100-80GB",
                 "H100", "cpu"):
        assert GPU_TYPES[name].name == name
    assert GPU_TYPES["V100-32GB"].peak_flops == pytest.approx(15.7e12)
    assert GPU_TYPES["V100-16GB"].memory_bytes == 16 * 2 ** 30
    assert gpu_type("v100").name == "V100-32GB"
    assert gpu_type("Tesla V100-16GB").name == "V100-16GB"
    assert gpu_type("1080ti").name == "GTX1080Ti"
    assert gpu_type("gtx 1080 ti").name == "GTX1080Ti"
    assert gpu_type("A100").name == "A100-40GB"
    assert gpu_type("h100").name == "H100"
    with pytest.raises(TopologyError, match="unknown GPU type 'V200'.*V100-32GB"):
        gpu_type("V200")


def test_type_from_cuda_device_name():
    assert type_from_device_name("Tesla V100-SXM2-16GB") == "V100-16GB"
    assert type_from_device_name("Tesla V100-SXM2-32GB") == "V100-32GB"
    assert type_from_device_name("NVIDIA A100-SXM4-80GB") == "A100-80GB"
    assert type_from_device_name("NVIDIA GeForce GTX 1080 Ti") == "GTX1080Ti"
    assert type_from_device_name("Tesla T4") == "T4"
    assert type_from_device_name("NVIDIA H100 80GB HBM3") == "H100"
    assert type_from_device_name("Quadro RTX 4000") is None


def test_units():
    assert parse_bandwidth("100Gbps", 1.0) == 12.5e9
    assert parse_bandwidth("100 Gb/s", 1.0) == 12.5e9
    assert parse_bandwidth("25 GB/s", 1.0) == 25e9
    assert parse_bandwidth("25GBps", 1.0) == 25e9
    assert parse_bandwidth("1 GiB/s", 1.0) == 2 ** 30
    assert parse_bandwidth(40, GBPS) == 5e9


# ---- files ------------------------------------------------------------------------------------
def test_yaml_file(tmp_path):
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(EXAMPLE))
    t = load_topology(str(path))
    _check_example(t)
    assert t.name == "example"


def test_json_file_and_default_name(tmp_path):
    d = copy.deepcopy(EXAMPLE)
    del d["name"]
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(d))
    t = load_topology(str(path))
    _check_example(t)
    assert t.name == "mine"


def test_plain_numbers_units_and_matrix_by_name(tmp_path):
    path = tmp_path / "m.yaml"
    path.write_text("""
units: {bandwidth: GB/s, memory: GiB, latency: us}
machines:
  - {name: a, gpus: 2x T4, intra: {link: pcie, bandwidth: 12}}
  - {name: b, gpus: [{type: T4, memory: 8}]}
  - {name: c, gpus: H100}
inter:
  matrix: {a: {b: 1, c: 2}, b: {c: 3, a: 4}}
  latency: 40
""")
    t = load_topology(str(path))
    assert t.bandwidth(0, 1) == 12e9
    assert t.devices[2].memory_bytes == 8 * 2 ** 30
    assert t.bandwidth(0, 2) == 1e9 and t.bandwidth(2, 0) == 4e9      # row = sender
    assert t.bandwidth(0, 3) == t.bandwidth(3, 0) == 2e9              # given once: both ways
    assert t.bandwidth(2, 3) == 3e9
    assert t.latency(0, 3) == pytest.approx(40e-6)
    assert t.machines[1].intra_link == "pcie"                        # intra defaults to PCIe


def test_list_matrix_and_custom_gpu_type():
    d = {"machines": [{"name": "x", "gpus": "2x RTX2080Ti"}, {"name": "y", "gpus": "v100"}],
         "inter": {"matrix": [[0, "10Gbps"], ["10Gbps", None]]},
         "gpu_types": [{"name": "RTX2080Ti", "peak_tflops": 13.4, "mem_bandwidth": "616GB/s",
                        "memory": "11GiB", "half_tflops": 53.8, "sm_count": 68}]}
    t = load_topology(d)
    assert t.devices[0].type == "RTX2080Ti" and t.devices[0].memory_bytes == 11 * 2 ** 30
    assert t.gpu_type(0).peak_flops == pytest.approx(13.4e12)
    assert t.gpu_type(0).rate("half") == pytest.approx(53.8e12) and t.gpu_type(0).rate("tf32") == pytest.approx(13.4e12)
    assert t.gpu_type(0).sm_count == 68
    assert t.gpu_type(2).name == "V100-32GB"
    assert t.bandwidth(0, 2) == 10 * GBPS
    assert topology_from_dict(json.loads(json.dumps(t.to_dict()))) == t


def test_a_custom_type_may_not_shadow_a_built_in_one():
    d = {"machines": [{"name": "x", "gpus": "2x RTX3090"}],
         "gpu_types": [{"name": "RTX3090", "peak_tflops": 35.6, "mem_bandwidth": "936GB/s", "memory": "24GiB"}]}
    with pytest.raises(TopologyError, match="already defined"):
        load_topology(d)
    t = load_topology({"machines": [{"name": "x", "gpus": "2x rtx3090"}]})
    assert t.gpu_type(0).name == "RTX3090" and t.gpu_type(0).rate("tf32") == pytest.approx(35.6e12)


def _with(path_value):
    d = copy.deepcopy(EXAMPLE)
    for path, value in path_value:
        target = d
        for key in path[:-1]:
            target = target[key]
        if value is _DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value
    return d


_DELETE = object()

BAD = [
    ("unknown type", [(("machines", 0, "gpus"), "4x V200")], ["machines[0] (dgx).gpus.type",
                                                               "V200", "known types"]),
    ("unknown type in list", [(("machines", 1, "gpus", 0, "type"), "K80")],
     ["machines[1] (worker).gpus[0].type", "K80"]),
    ("negative intra", [(("machines", 1, "intra", "bandwidth"), -5)],
     ["machines[1] (worker).intra.bandwidth", "positive"]),
    ("zero switch", [(("inter", "switch"), "0Gbps")], ["inter.switch", "positive"]),
    ("zero nic", [(("machines", 1, "nic"), 0)], ["machines[1] (worker).nic"]),
    ("bad bandwidth text", [(("machines", 0, "intra"), "nvlink fast")],
     ["machines[0] (dgx).intra.bandwidth", "fast"]),
    ("zero count", [(("machines", 1, "gpus", 0, "count"), 0)],
     ["machines[1] (worker).gpus[0].count"]),
    ("zero count text", [(("machines", 0, "gpus"), "0x V100")], ["machines[0] (dgx).gpus.count"]),
    ("no gpus", [(("machines", 0, "gpus"), [])], ["machines[0] (dgx).gpus", "at least one GPU"]),
    ("missing gpus", [(("machines", 0, "gpus"), _DELETE)], ["machines[0] (dgx).gpus", "missing"]),
    ("duplicate names", [(("machines", 1, "name"), "dgx"), (("machines", 1, "replicas"), _DELETE)],
     ["duplicate machine name 'dgx'"]),
    ("machines not a list", [(("machines",), "dgx")], ["machines", "expected a list"]),
    ("count wrong type", [(("machines", 1, "gpus", 0, "count"), "two")],
     ["machines[1] (worker).gpus[0].count", "'two'"]),
    ("memory wrong type", [(("machines", 1, "gpus", 1, "memory"), [12])],
     ["machines[1] (worker).gpus[1].memory"]),
    ("replicas wrong type", [(("machines", 1, "replicas"), 1.5)],
     ["machines[1] (worker).replicas"]),
    ("unknown key", [(("machines", 0, "gpu"), "V100")], ["machines[0]", "unknown key 'gpu'"]),
    ("bad link", [(("machines", 0, "intra"), "infiniband")], ["intra.link", "infiniband"]),
    ("both inter kinds", [(("inter", "matrix"), [[0, 1], [1, 0]])], ["inter", "not both"]),
    ("matrix names missing machine",
     [(("inter",), {"matrix": {"dgx": {"worker-0": 10, "nope": 10}}})],
     ["inter.matrix.dgx", "unknown machine 'nope'"]),
    ("matrix row names missing machine",
     [(("inter",), {"matrix": {"ghost": {"dgx": 10}}})], ["inter.matrix", "unknown machine 'ghost'"]),
    ("matrix pair missing",
     [(("inter",), {"matrix": {"dgx": {"worker-0": 10, "worker-1": 10}}})],
     ["inter.matrix", "no bandwidth between machines 'worker-0' and 'worker-1'"]),
    ("non-square matrix", [(("inter",), {"matrix": [[0, 1, 1], [1, 0, 1]]})],
     ["inter.matrix", "square", "3x3"]),
    ("ragged matrix", [(("inter",), {"matrix": [[0, 1, 1], [1, 0], [1, 1, 0]]})],
     ["inter.matrix", "square"]),
    ("negative matrix entry", [(("inter",), {"matrix": [[0, 1, 1], [1, 0, -1], [1, 1, 0]]})],
     ["inter.matrix[1][2]", "positive"]),
    ("matrix with nic", [(("inter",), {"matrix": [[0, 1, 1], [1, 0, 1], [1, 1, 0]]})],
     ["nic", "inter.matrix"]),
    ("no network", [(("inter",), _DELETE), (("machines", 1, "nic"), _DELETE)],
     ["inter", "'dgx'"]),
    ("bad unit section", [(("units",), {"bandwidth": "furlongs"})], ["units.bandwidth", "furlongs"]),
    ("negative latency", [(("inter", "latency"), "-3us")], ["inter.latency"]),
    ("name wrong type", [(("name",), 42)], ["name", "42"]),
]


@pytest.mark.parametrize("label,edits,expected", BAD, ids=[b[0] for b in BAD])
def test_validation_errors_name_the_field(label, edits, expected):
    with pytest.raises(TopologyError) as err:
        load_topology(_with(edits))
    for text in expected:
        assert text in str(err.value), (label, str(err.value))


def test_file_errors_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(_with([(("machines", 0, "gpus"), "2x V200")])))
    with pytest.raises(TopologyError, match=r"topology file .*bad\.yaml: machines\[0\] \(dgx\)"):
        load_topology(str(bad))
    broken = tmp_path / "broken.yaml"
    broken.write_text("machines: [\n")
    with pytest.raises(TopologyError, match=r"broken\.yaml: invalid YAML"):
        load_topology(str(broken))
    broken_json = tmp_path / "broken.json"
    broken_json.write_text("{")
    with pytest.raises(TopologyError, match=r"broken\.json: invalid JSON"):
        load_topology(str(broken_json))
    with pytest.raises(TopologyError, match="missing.yaml: cannot read"):
        load_topology(str(tmp_path / "missing.yaml"))
    top = tmp_path / "list.json"
    top.write_text("[1, 2]")
    with pytest.raises(TopologyError, match=r"list\.json: topology: expected a mapping"):
        load_topology(str(top))


def test_bad_preset_names():
    with pytest.raises(TopologyError, match="not a preset"):
        load_topology("testbedd")
    with pytest.raises(TopologyError, match="positive device count"):
        load_topology("local:0")
    with pytest.raises(TopologyError, match="integer seed"):
        load_topology("random:abc")
    with pytest.raises(TopologyError, match="expected a preset name"):
        load_topology(42)


def test_programmatic_validation():
    with pytest.raises(TopologyError, match="at least one GPU"):
        Machine("m", (), 1e9)
    with pytest.raises(TopologyError, match="intra.link"):
        Machine.of("m", "T4", 2, 1e9, intra_link="ethernet")
    with pytest.raises(TopologyError, match="intra.bandwidth"):
        Machine.of("m", "T4", 2, 0.0)
    m = Machine.of("m", "T4", 2, 1e9)
    with pytest.raises(TopologyError, match="duplicate machine name"):
        Topology("t", (m, m), 1e9)
    with pytest.raises(TopologyError, match="unknown GPU type 'X'"):
        Topology("t", (Machine("m", (GpuSpec("X", 1),), 1e9),))
    with pytest.raises(TopologyError, match="2x2"):
        Topology("t", (m, Machine.of("n", "T4", 1, 1e9)), ((0.0, 1.0),))


# ---- presets ----------------------------------------------------------------------------------
def test_testbed_matches_paper():
    t = presets.testbed()
    assert t.num_devices == 16 and t.num_machines == 7
    assert [(len(g.devices), g.type) for g in t.groups] == \
        [(4, "V100-32GB")] + [(2, "GTX1080Ti")] * 4 + [(2, "P100")] * 2
    assert [m.intra_link for m in t.machines] == ["nvlink"] + ["pcie"] * 6
    assert t.inter_bandwidth == 100 * GBPS
    assert t.bandwidth(0, 15) == 100 * GBPS
    assert t.bandwidth(0, 3) == 50e9 and t.bandwidth(12, 13) == 15.75e9


def test_cloud_matches_paper():
    t = presets.cloud()
    assert t.num_devices == 32 and t.num_machines == 6
    assert [(len(g.devices), g.type) for g in t.groups] == \
        [(8, "V100-16GB")] * 2 + [(4, "T4")] * 4
    assert t.bandwidth(0, 8) == 10 * GBPS and t.bandwidth(16, 31) == 10 * GBPS
    assert t.machines[0].intra_link == "nvlink" and t.machines[2].intra_link == "pcie"


def test_local_cpu_devices():
    t = presets.local(3)
    if t.devices[0].type != "cpu":
        pytest.skip("this machine has GPUs")
    assert t.num_devices == 3 and t.num_machines == 1 and len(t.groups) == 1
    assert t.machines[0].intra_link == "local" and t.bandwidth(0, 2) == 100e9
    assert load_topology("local:2").num_devices == 2


# ---- random generator -------------------------------------------------------------------------
def test_random_topology_ranges_and_determinism():
    seen_machines, seen_counts, seen_types = set(), set(), set()
    for seed in range(300):
        t = random_topology(seed)
        assert 1 <= t.num_machines <= 6
        seen_machines.add(t.num_machines)
        for mi, m in enumerate(t.machines):
            assert 1 <= m.num_gpus <= 8
            seen_counts.add(m.num_gpus)
            assert len({g.type for g in m.gpus}) == 1
            seen_types.add(m.gpus[0].type)
            assert 64 * GBPS <= m.intra_bandwidth <= 160 * GBPS
            assert len([g for g in t.groups if g.machine == mi]) == 1
        matrix = t.inter_bandwidth
        for i in range(t.num_machines):
            for j in range(t.num_machines):
                if i != j:
                    assert 20 * GBPS <= matrix[i][j] <= 50 * GBPS
                    assert matrix[i][j] == matrix[j][i]
    assert seen_machines == set(range(1, 7))
    assert seen_counts == set(range(1, 9))
    assert seen_types == {"V100-32GB", "GTX1080Ti", "P100"}
    assert random_topology(7) == random_topology(7)
    assert random_topology(7).fingerprint == random_topology(7).fingerprint
    assert len({random_topology(s).fingerprint for s in range(20)}) == 20
    assert {d.type for d in random_topology(3, types=("t4",)).devices} == {"T4"}
    assert load_topology("random:7") == random_topology(7)


# ---- links ------------------------------------------------------------------------------------
def test_bandwidth_latency_link_ring():
    t = presets.testbed()
    assert t.bandwidth(2, 2) == math.inf and t.latency(2, 2) == 0.0 and t.link(2, 2) == ()
    assert t.latency(0, 1) == pytest.approx(5e-6) and t.latency(0, 4) == pytest.approx(25e-6)
    # NVLink: one resource per ordered pair
    assert t.link(0, 1) == (("nvlink", 0, 0, 1),)
    assert t.link(0, 1) != t.link(1, 0) and t.link(0, 1) != t.link(0, 2)
    # PCIe: the sender's and the receiver's port
    assert t.link(4, 5) == (("pcie_tx", 1, 0), ("pcie_rx", 1, 1))
    assert not set(t.link(4, 5)) & set(t.link(5, 4))
    # switch: sender uplink + receiver downlink; two sends out of one machine share its uplink
    assert t.link(0, 4) == (("nic_tx", 0), ("nic_rx", 1))
    assert set(t.link(0, 4)) & set(t.link(1, 6)) == {("nic_tx", 0)}
    hash(t.link(0, 4))
    # rings
    assert t.ring_bandwidth([3, 1, 0, 2]) == 50e9
    assert t.ring_bandwidth([4, 5]) == 15.75e9
    assert t.ring_bandwidth(range(16)) == 100 * GBPS
    assert t.ring_bandwidth([7]) == math.inf
    with pytest.raises(TopologyError, match="no device 99"):
        t.bandwidth(0, 99)


def test_matrix_links_and_nic_override():
    r = random_topology(3)
    last = r.num_devices - 1
    ma, mb = r.device(0).machine, r.device(last).machine
    assert r.link(0, last) == r.link(last, 0) == (("wan", ma, mb),)
    assert r.bandwidth(0, last) == r.inter_bandwidth[ma][mb]
    m = load_topology({"units": {"bandwidth": "GB/s"},
                       "machines": [{"name": "a", "gpus": "2x T4", "intra": "pcie 10"},
                                    {"name": "b", "gpus": "T4"}, {"name": "c", "gpus": "T4"}],
                       "inter": {"matrix": {"a": {"b": 5, "c": 1}, "b": {"c": 3}}}})
    assert m.ring_bandwidth(range(4)) == 1e9          # a -> b -> c -> a: the c-a hop is slowest
    assert m.ring_bandwidth([0, 1, 2]) == 5e9
    assert m.ring_bandwidth([3, 2]) == 3e9
    assert m.ring_latency([0, 1]) == pytest.approx(5e-6) and m.ring_latency([0, 3]) == 25e-6
    t = load_topology(EXAMPLE)
    assert t.bandwidth(0, 4) == 25 * GBPS and t.bandwidth(4, 7) == 25 * GBPS
    assert t.port_bandwidth(0) == 100 * GBPS


def test_group_of_and_describe():
    t = presets.testbed()
    assert t.group_of(5).id == 1 and t.group_of(5).devices == (4, 5)
    text = t.describe()
    assert "V100-32GB" in text and "100 Gbps" in text and "gtx1080ti-3" in text


def test_round_trip_and_fingerprint(tmp_path):
    for t in (presets.testbed(), presets.cloud(), random_topology(11), load_topology(EXAMPLE)):
        d = json.loads(json.dumps(t.to_dict()))
        assert topology_from_dict(d) == t
        path = tmp_path / f"{t.fingerprint}.yaml"
        path.write_text(yaml.safe_dump(d))
        assert load_topology(str(path)) == t
    t = presets.testbed()
    renamed = topology_from_dict({**t.to_dict(), "name": "other"})
    assert renamed.fingerprint == t.fingerprint
    faster = _with([(("inter", "switch"), "200Gbps")])
    assert load_topology(faster).fingerprint != load_topology(EXAMPLE).fingerprint
    assert len(t.fingerprint) == 12


# ---- CLI --------------------------------------------------------------------------------------
def test_cli_show_json(capsys):
    assert cli_main(["topology", "show", "testbed", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["num_devices"] == 16 and len(out["groups"]) == 7
    assert out["devices"][4] == {"id": 4, "machine": 1, "machine_name": "gtx1080ti-0", "index": 0,
                                 "type": "GTX1080Ti", "memory_bytes": 11 * 2 ** 30}
    assert out["inter"]["bandwidth"] == 100 * GBPS
    assert topology_from_dict(out["topology"]) == presets.testbed()


def test_cli_show_text_and_errors(capsys, tmp_path):
    assert cli_main(["topology", "show", "cloud"]) == 0
    assert "T4" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text("machines: [{gpus: 2x V200}]\n")
    assert cli_main(["topology", "show", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "bad.yaml" in err and "V200" in err and len(err.strip().splitlines()) == 1


def test_mixed_presets_are_the_scale_study_clusters():
    from collections import Counter

    t = load_topology("mixed:256")
    assert t.num_devices == 256 and t.num_machines == 32
    assert Counter(d.type for d in t.devices) == {"H100": 64, "A100-80GB": 96, "V100-32GB": 96}
    assert all(m.num_gpus == 8 and m.intra_link == "nvlink" for m in t.machines)
    assert {m.nic_bandwidth for m in t.machines} == {200e9 / 8, 100e9 / 8}
    assert load_topology("mixed:16").num_machines == 2
    for bad in ("mixed:12", "mixed:8", "mixed:x", "mixed:"):
        with pytest.raises(TopologyError, match="mixed"):
            load_topology(bad)
