"""Device classes (kernels/expand.h): devices a plan treats alike on interchangeable machines are
simulated once. Where the classes only receive, compute and meet in collectives (every whole-replica
baseline), the collapsed run is the full one; where a class sends (PS pushes, activations between
groups on other devices) its transfers go out as one block: such a plan is simulated again device by
device, unless a search asks for the approximation (then the report says it is not exact)."""
from __future__ import annotations

import numpy as np
import pytest
from conftest import analysis_of

from tag_tf.search.registry import baseline
from tag_tf.sim.simulator import Simulator
from tag_tf.strategy import GroupPlan, Option, Strategy
from tag_tf.topology import load_topology
from tag_tf.topology.presets import mixed


@pytest.fixture(scope="module")
def sims():
    out = {}
    for name in ("mlp", "transformer"):
        _, a = analysis_of(name, num_groups=12, batch_size=128)
        out[name] = Simulator(a, mixed(32), calibration=None)
    return out


def _same(a, b):
    assert a.iteration_time_s == pytest.approx(b.iteration_time_s, rel=1e-9)
    assert a.peak_memory_bytes == b.peak_memory_bytes
    assert a.persistent_bytes == b.persistent_bytes
    assert a.oom_devices == b.oom_devices
    np.testing.assert_allclose(a.group_busy, b.group_busy, rtol=1e-9)
    np.testing.assert_allclose(a.device_idle, b.device_idle, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["mlp", "transformer"])
@pytest.mark.parametrize("rule", ["dp", "dp-p", "horovod", "horovod-p"])
def test_whole_replica_baselines_collapse_exactly(sims, name, rule):
    sim = sims[name]
    plan = baseline(rule, sim.num_groups, sim.topology)
    collapsed, full = sim.simulate(plan), sim.simulate(plan, collapse=False)
    assert collapsed.exact and full.exact
    assert collapsed.devices_simulated < 8 and full.devices_simulated == 32
    assert collapsed.num_tasks * 4 < full.num_tasks
    _same(collapsed, full)


def test_a_plan_over_machine_types_collapses_exactly(sims):
    """Groups on the H100 machines, on the A100 and V100 ones, and on all, with AllReduce among
    the replicas of each group and fused buckets: classes per machine type, still exact when no class
    sends to another device."""
    sim = sims["mlp"]
    topo = sim.topology
    h100 = tuple(d.id for d in topo.devices if d.type == "H100")
    everyone = tuple(range(topo.num_devices))
    groups = tuple(GroupPlan(everyone, Option.ALLREDUCE) for _ in range(sim.num_groups))
    shares = tuple({"H100": 3.0, "A100-80GB": 2.0, "V100-32GB": 1.0}[d.type] for d in topo.devices)
    plan = Strategy(groups, shares, name="types", fusion_bytes=1 << 20)
    collapsed, full = sim.simulate(plan), sim.simulate(plan, collapse=False)
    assert collapsed.exact
    _same(collapsed, full)
    assert 3 <= collapsed.devices_simulated < 12
    # A group on one machine type only: activations cross between classes, so not exact, but close.
    moved = list(groups)
    for g in sim.groups_by_compute()[:3]:
        moved[g] = GroupPlan(h100, Option.ALLREDUCE)
    one = Strategy(tuple(moved), shares, name="mixed")
    c, f = sim.simulate(one, approximate=True), sim.simulate(one, collapse=False)
    assert not c.exact and f.exact
    assert c.iteration_time_s == pytest.approx(f.iteration_time_s, rel=0.05)
    # Unless asked for the approximation, such a plan is simulated again device by device.
    again = sim.simulate(one)
    assert again.exact and again.devices_simulated == 32
    _same(again, f)


def test_irregular_plans_stay_close_and_say_so(sims):
    """Random plans over random whole machines (PS, duplicates, model parallel, fusion, barriers):
    the collapsed run is exact where it says so and within 6% elsewhere (measured worst: 5.0%)."""
    rng = np.random.default_rng(0)
    for name, sim in sims.items():
        topo = sim.topology
        machines = [[d.id for d in topo.devices if d.machine == m] for m in range(topo.num_machines)]
        for _ in range(6):
            groups = []
            for _ in range(sim.num_groups):
                chosen = sorted(rng.permutation(len(machines))[:int(rng.integers(1, len(machines) + 1))])
                devices = tuple(d for m in chosen for d in machines[m])
                option = (Option.ALLREDUCE, Option.PS, Option.DUPLICATE, Option.MODEL_PARALLEL)[
                    int(rng.choice(4, p=[.5, .25, .1, .15]))]
                groups.append(GroupPlan(devices, option))
            plan = Strategy(tuple(groups), None, name="random", fusion_bytes=int(rng.choice([0, 1 << 20])),
                            sync_after_backward=bool(rng.random() < .3))
            c, f = sim.simulate(plan, approximate=True), sim.simulate(plan, collapse=False)
            assert c.iteration_time_s == pytest.approx(f.iteration_time_s, rel=0.06), name
            if c.exact:
                _same(c, f)


def test_traces_and_cpu_devices_are_never_collapsed():
    _, a = analysis_of("mlp", num_groups=12, batch_size=128)
    sim = Simulator(a, mixed(16), calibration=None)
    plan = baseline("horovod", sim.num_groups, sim.topology)
    detail = sim.simulate(plan, detail=True)
    assert detail.devices_simulated == 16 and len(detail.tasks["duration"]) == detail.num_tasks
    cpus = load_topology({"name": "cpus", "machines": [{"name": f"m{i}", "gpus": "2x cpu", "intra": "local"}
                                                        for i in range(3)], "inter": {"switch": "1Gbps"}})
    _, b = analysis_of("mlp", num_groups=12)
    report = Simulator(b, cpus).simulate(baseline("horovod", len(b.grouping.groups), cpus))
    assert report.devices_simulated == 6


def test_machine_kinds_follow_the_cluster():
    from tag_tf.sim.prepare import machine_kinds

    assert list(machine_kinds(mixed(64))) == [0, 0, 1, 1, 1, 2, 2, 2]
    matrix = load_topology({"name": "m", "machines": [{"name": "a", "gpus": "2x V100"}, {"name": "b", "gpus": "2x V100"}],
                            "inter": {"matrix": [[0, "10Gbps"], ["10Gbps", 0]]}})
    assert list(machine_kinds(matrix)) == [0, 1]


def _with(topology, **changes):
    import dataclasses

    return dataclasses.replace(topology, **changes)


def test_hierarchical_all_reduces_are_the_faster_of_two_levels_and_a_flat_ring():
    """Topology.collectives: at 64 GPUs a flat ring pays two latencies per GPU; the two-level form
    (reduce inside each machine, a ring over the machines, gather inside) pays them per machine."""
    _, a = analysis_of("mlp", num_groups=12, batch_size=128)
    ring = _with(mixed(64), collectives="ring")
    plan = baseline("horovod", len(a.grouping.groups), ring)
    flat = Simulator(a, ring, calibration=None).simulate(plan)
    two = Simulator(a, mixed(64), calibration=None).simulate(plan)
    assert two.iteration_time_s < flat.iteration_time_s
    # One machine: nothing to gain, the same all-reduce.
    one = _with(mixed(16), machines=mixed(16).machines[:1])
    inside = baseline("horovod", len(a.grouping.groups), one)
    assert Simulator(a, one, calibration=None).simulate(inside).iteration_time_s == pytest.approx(
        Simulator(a, _with(one, collectives="ring"), calibration=None).simulate(inside).iteration_time_s)
    # The field round-trips and stays out of files that do not name it.
    assert load_topology(mixed(64).to_dict()).collectives == "hierarchical"
    assert "collectives" not in ring.to_dict()["inter"] and ring.fingerprint != mixed(64).fingerprint
    with pytest.raises(Exception, match="collectives"):
        load_topology({**ring.to_dict(), "inter": {**ring.to_dict()["inter"], "collectives": "tree"}})


def test_inputs_read_on_every_machine_are_not_scattered():
    """Topology.input: "local": every replica reads its own part of the batch, so no split of the
    inputs and no transfer of them; "client": one device reads the batch and sends the parts."""
    _, a = analysis_of("mlp", num_groups=12, batch_size=128)
    local = mixed(16)
    client = _with(local, input="client")
    plan = baseline("horovod-p", len(a.grouping.groups), local)
    fed = Simulator(a, client, calibration=None).simulate(plan, detail=True)
    read = Simulator(a, local, calibration=None).simulate(plan, detail=True)
    sources = set(np.flatnonzero(Simulator(a, local).source_ops()))
    def moved(report):
        t = report.tasks
        return sum(1 for k, op in zip(t["kind"], t["op"]) if k == 1 and int(op) in sources)
    assert moved(fed) >= 15 and moved(read) == 0
    assert read.conversions["split"] < fed.conversions["split"]
    assert read.iteration_time_s < fed.iteration_time_s
    assert load_topology(local.to_dict()).input == "local" and "input" not in client.to_dict()
    with pytest.raises(Exception, match="input"):
        load_topology({**client.to_dict(), "input": "disk"})
