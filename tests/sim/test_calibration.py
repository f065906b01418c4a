"""Calibration: named physical parameters, validated files, nominal presets unchanged, and a fit that
recovers parameters from measurements the simulator itself generated."""
from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import analysis_of

from tag_tf.errors import TagError
from tag_tf.search.calibration_fit import Case, fit, simulate_cases
from tag_tf.search.registry import baseline
from tag_tf.sim.calibration import PARAMETERS, REQUIRED, Calibration, default_calibration, shipped_path
from tag_tf.sim.simulator import Simulator
from tag_tf.topology.load import load_topology
from tag_tf.topology.parse import topology_from_dict

NOMINAL = {k: PARAMETERS[k.partition(":")[0]].nominal for k in REQUIRED}


def full(**values) -> Calibration:
    return Calibration("test", {**NOMINAL, **values})


def test_nominal_values_change_nothing_and_nominal_presets_are_todays():
    """All-nominal physics reproduces the datasheet simulator exactly, and `testbed-nominal`
    simulates what `testbed` did before calibrations existed."""
    _, a = analysis_of("cnn", batch_size=64)
    for preset in ("testbed", "cloud"):
        topo = load_topology(preset)
        plain = Simulator(a, topo, calibration=None)
        for name in ("dp", "horovod", "dp-p"):
            s = baseline(name, plain.num_groups, topo)
            t = plain.simulate(s).iteration_time_s
            assert plain.with_calibration(full()).simulate(s).iteration_time_s == pytest.approx(t, rel=1e-12)
            nominal = Simulator(a, load_topology(f"{preset}-nominal"))
            assert nominal.calibration is None and nominal.simulate(s).iteration_time_s == t


def test_parameters_move_the_simulation_the_physical_way():
    _, a = analysis_of("cnn", batch_size=64)
    topo = load_topology("testbed")
    sim = Simulator(a, topo, calibration=None)
    dp = baseline("dp", sim.num_groups, topo)
    base = sim.simulate(dp).iteration_time_s
    slower = {"compute_eff:GTX1080Ti": 0.2, "compute_eff:P100": 0.2, "compute_eff:V100-32GB": 0.2}
    assert sim.with_calibration(full(**slower)).simulate(dp).iteration_time_s > base
    assert sim.with_calibration(full(op_overhead_s=50e-6)).simulate(dp).iteration_time_s > base
    assert sim.with_calibration(full(inter_bw_eff=0.05, inter_latency_s=1e-3)).simulate(dp).iteration_time_s > base
    # CPU devices (this machine, profiled for real) are never recalibrated.
    local = Simulator(a, load_topology("local:2"), calibration=None)
    s = baseline("dp", local.num_groups, local.topology)
    assert local.with_calibration(full(**slower, op_overhead_s=1e-4)).simulate(s).iteration_time_s == \
        local.simulate(s).iteration_time_s


@pytest.mark.parametrize("values, message", [
    ({"op_overhead_s": 0.5}, r"'op_overhead_s' = 0.5 s/op is outside its plausible range \[0, 0.0003\]"),
    ({"inter_bw_eff": 3.0}, r"'inter_bw_eff' = 3 fraction is outside its plausible range"),
    ({"compute_eff:V100-32GB": float("nan")}, r"'compute_eff:V100-32GB' must be a finite number"),
    ({"warp_speed": 1.0}, r"unknown calibration parameter 'warp_speed'"),
])
def test_bad_parameter_values_are_named(values, message):
    with pytest.raises(TagError, match=message):
        full(**values)


def test_calibration_file_round_trip_and_missing_parameter(tmp_path):
    cal = full(**{"compute_eff:T4": 0.4, "inter_bw_eff": 0.3})
    path = tmp_path / "cal.json"
    cal.save(str(path))
    back = Calibration.load(str(path))
    assert back.values == cal.values and back.value("compute_eff:T4") == 0.4
    assert back.value("compute_eff:P100") == NOMINAL["compute_eff:*"]       # compute_eff:* covers it
    data = json.loads(path.read_text())
    del data["values"]["inter_latency_s"]
    path.write_text(json.dumps(data))
    with pytest.raises(TagError, match=r"cal.json: parameter 'inter_latency_s' is missing"):
        Calibration.load(str(path))
    data["values"]["inter_latency_s"] = 10.0
    path.write_text(json.dumps(data))
    with pytest.raises(TagError, match=r"cal.json: .*'inter_latency_s' = 10 s is outside its plausible range"):
        Calibration.load(str(path))
    with pytest.raises(TagError, match="no such calibration file"):
        Calibration.load(str(tmp_path / "nope.json"))


def test_calibration_and_measurement_files_are_read_bounded(tmp_path, monkeypatch):
    """A wrong path (a log, a checkpoint) is refused by size before it is read whole, with one line."""
    import tag_tf.datafiles as datafiles
    from tag_tf.frontend.commands.calibrate import load_measurements

    big = tmp_path / "big.json"
    big.write_text("[" + "0," * 600 + "0]")
    monkeypatch.setattr(datafiles, "CALIBRATION_FILE_LIMIT", 1000)
    with pytest.raises(TagError, match=r"big.json: a calibration file is larger than 1000 bytes"):
        Calibration.load(str(big))
    with pytest.raises(TagError, match=r"big.json: a measurements file is larger than 1000 bytes"):
        load_measurements(str(big))
    binary = tmp_path / "bin.json"
    binary.write_bytes(b"\xff\xfe{}")
    with pytest.raises(TagError, match="not UTF-8"):
        Calibration.load(str(binary))


def test_presets_name_their_default_calibration():
    for preset in ("testbed", "cloud"):
        cal = default_calibration(load_topology(preset))
        assert cal is not None and shipped_path(preset).endswith(f"calibration_{preset}.json")
        assert set(REQUIRED) <= set(cal.values)
    assert default_calibration(load_topology("testbed-nominal")) is None
    assert default_calibration(load_topology("local:2")) is None


def _topology(name, machines):
    return topology_from_dict({"name": name, "machines": machines, "inter": {"switch": "25Gbps", "latency": "25us"}})


def test_fit_recovers_parameters_from_simulated_measurements():
    """Measurements generated by the simulator under a known calibration (several models, batch
    sizes, clusters and strategies) are fitted back to that calibration."""
    truth = full(**{"compute_eff:V100-32GB": 0.45, "compute_eff:GTX1080Ti": 0.7, "op_overhead_s": 20e-6,
                    "inter_bw_eff": 0.3, "inter_latency_s": 300e-6})
    clusters = [_topology("one-v100", [{"name": "a", "gpus": "1x V100-32GB", "intra": "nvlink 50GB/s"}]),
                _topology("one-1080", [{"name": "a", "gpus": "1x GTX1080Ti", "intra": "pcie 15.75GB/s"}]),
                _topology("two-1080", [{"name": "a", "gpus": "1x GTX1080Ti", "intra": "pcie 15.75GB/s"},
                                       {"name": "b", "gpus": "1x GTX1080Ti", "intra": "pcie 15.75GB/s"}]),
                _topology("mixed", [{"name": "a", "gpus": "1x V100-32GB", "intra": "nvlink 50GB/s"},
                                    {"name": "b", "gpus": "1x GTX1080Ti", "intra": "pcie 15.75GB/s"}])]
    cases = []
    for model, batch in (("mlp", 64), ("mlp", 1024), ("cnn", 16), ("cnn", 128)):
        _, a = analysis_of(model, batch_size=batch, tiny=False)      # compute that shows
        for topo in clusters:
            sim = Simulator(a, topo, calibration=None)
            for name in (("dp", "horovod") if topo.num_devices > 1 else ("dp",)):
                strategy = baseline(name, sim.num_groups, topo)
                cases.append(Case(f"{model}/{batch}/{topo.name}/{name}", sim, strategy, 1.0))
    measured = simulate_cases(cases, truth)
    cases = [Case(c.label, c.sim, c.strategy, t) for c, t in zip(cases, measured)]
    free = ["compute_eff:V100-32GB", "compute_eff:GTX1080Ti", "op_overhead_s", "inter_bw_eff", "inter_latency_s"]
    result = fit(cases, free)
    assert result.mape < 0.02, result.residuals
    for key in free:
        got, want = result.calibration.value(key), truth.value(key)
        assert got == pytest.approx(want, rel=0.25), (key, got, want)
    # Starting far away, the nominal calibration was off by much more.
    nominal = simulate_cases(cases, None)
    assert np.mean([abs(s / c.seconds - 1) for c, s in zip(cases, nominal)]) > 0.3


def test_indistinguishable_fits_keep_the_datasheet_order_of_gpu_speeds():
    """Two fits as good as each other (one makes the V100 the straggler, one the P100): the one
    that keeps V100 > 1080 Ti > P100 (datasheet peaks) is chosen; a clearly better fit still wins
    whatever its order."""
    from tag_tf.search.calibration_fit import FitResult, choose_basin, speed_inversions

    peak = {"V100-32GB": 15.7e12, "GTX1080Ti": 11.3e12, "P100": 9.3e12}

    def result(v100, p100, cost):
        cal = full(**{"compute_eff:V100-32GB": v100, "compute_eff:GTX1080Ti": 1.0, "compute_eff:P100": p100})
        return FitResult(cal, {}, {}, 1, 1, cost)

    slow_v100, slow_p100 = result(0.09, 1.0, 0.1919), result(1.0, 0.13, 0.1923)
    assert speed_inversions(slow_v100.calibration, peak) == 2       # V100 now below the 1080 Ti and the P100
    assert speed_inversions(slow_p100.calibration, peak) == 0
    assert choose_basin([slow_v100, slow_p100], peak) is slow_p100
    much_better = result(0.09, 1.0, 0.15)
    assert choose_basin([much_better, slow_p100], peak) is much_better


def test_fits_within_akaikes_criterion_are_tied_and_clearly_worse_ones_are_not():
    """With residuals on n figures, two basins whose costs differ by less than AIC_TIE in Akaike's
    criterion (n ln(cost_b / cost_a)) are tied, and the datasheet's order decides; a fit far outside
    it loses whatever its order."""
    import math

    from tag_tf.search.calibration_fit import AIC_TIE, FitResult, choose_basin, tie_limit

    peak = {"V100-32GB": 15.7e12, "GTX1080Ti": 11.3e12, "P100": 9.3e12}
    residuals = {f"figure-{i}": 0.1 for i in range(11)}

    def result(v100, p100, cost):
        cal = full(**{"compute_eff:V100-32GB": v100, "compute_eff:GTX1080Ti": 1.0, "compute_eff:P100": p100})
        return FitResult(cal, residuals, {}, 1, 1, cost)

    slow_v100, slow_p100 = result(0.09, 1.0, 0.1740), result(1.0, 0.13, 0.1811)   # today's testbed basins
    assert tie_limit([slow_v100, slow_p100]) == pytest.approx(0.1740 * math.exp(AIC_TIE / 11))
    assert choose_basin([slow_v100, slow_p100], peak) is slow_p100
    just_out = result(1.0, 0.13, 0.1740 * math.exp(AIC_TIE / 11) * 1.01)
    assert choose_basin([slow_v100, just_out], peak) is slow_v100
    assert choose_basin([slow_v100, result(1.0, 0.13, 1.6531)], peak) is slow_v100
