"""Segmented regression, the communication model, and real local TensorFlow transfers/collectives."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest

from tag_tf.errors import ProfileError
from tag_tf.measure.comm import measure_allreduce, measure_p2p, run_allreduce, sizes_up_to
from tag_tf.profile.comm import CommModel, SegmentedLinear
from tag_tf.runtime.cluster import LocalCluster
from tag_tf.topology import load_topology, presets

KiB, MiB = 1 << 10, 1 << 20


# ---- segmented regression ---------------------------------------------------------------------
def _piecewise(x):
    """10 us + x / 1 GB/s below 256 KiB, then x / 0.25 GB/s (continuous)."""
    b = 256 * KiB
    return np.where(x < b, 1e-5 + x / 1e9, 1e-5 + b / 1e9 + (x - b) / 2.5e8)


def test_segmented_recovers_piecewise_linear():
    x = np.array(sizes_up_to(64 * MiB), dtype=float)
    fit = SegmentedLinear.fit(x, _piecewise(x))
    assert fit.num_segments == 2
    assert fit.breakpoints == (256 * KiB,)
    assert fit.slopes == pytest.approx((1e-9, 4e-9), rel=1e-6)
    assert fit.intercepts[0] == pytest.approx(1e-5, rel=1e-6)
    assert fit.predict(x) == pytest.approx(_piecewise(x), rel=1e-6)
    assert fit.error < 1e-6
    assert fit.fit_range == (1024.0, 64.0 * MiB)


def test_segmented_linear_data_gets_one_segment_and_noise_is_tolerated():
    x = np.array(sizes_up_to(16 * MiB), dtype=float)
    line = SegmentedLinear.fit(x, 3e-5 + x / 2e9)
    assert line.num_segments == 1 and line.slopes[0] == pytest.approx(5e-10)
    rng = np.random.default_rng(1)
    noisy = SegmentedLinear.fit(x, _piecewise(x) * (1 + 0.03 * rng.standard_normal(len(x))))
    assert noisy.num_segments <= 3 and all(s >= 0 for s in noisy.slopes)
    assert noisy.predict(x) == pytest.approx(_piecewise(x), rel=0.15)


def test_segmented_predict_and_serialisation():
    x = np.array(sizes_up_to(4 * MiB), dtype=float)
    fit = SegmentedLinear.fit(x, _piecewise(x))
    assert isinstance(fit.predict(5000), float)
    assert fit.predict(0) >= 0.0
    assert fit.predict(1 << 30) == pytest.approx(float(_piecewise(np.array([1 << 30]))[0]), rel=1e-6)
    again = SegmentedLinear.from_dict(json.loads(json.dumps(fit.to_dict())))
    assert again == fit
    assert len(fit.segments) == fit.num_segments
    with pytest.raises(ProfileError):
        SegmentedLinear.fit([1.0], [1.0])
    with pytest.raises(ProfileError):
        SegmentedLinear.from_dict({"slopes": [1]})
    with pytest.raises(ProfileError):
        SegmentedLinear((1.0,), (1.0,), (0.0,))


def test_sizes():
    assert sizes_up_to(16 * KiB) == [1024, 2048, 4096, 8192, 16384]
    assert sizes_up_to()[-1] == 1 << 30 and len(sizes_up_to()) == 21
    with pytest.raises(ProfileError):
        sizes_up_to(512)


# ---- the model --------------------------------------------------------------------------------
def test_comm_model_analytical():
    t = presets.testbed()
    m = CommModel(t)
    nbytes = 8 * MiB
    assert m.p2p(nbytes, 0, 1) == pytest.approx(5e-6 + nbytes / 50e9)
    assert m.p2p(nbytes, 0, 4) == pytest.approx(25e-6 + nbytes / 12.5e9)
    assert m.p2p(nbytes, 3, 3) == 0.0
    assert m.allreduce(nbytes, [0]) == 0.0
    assert m.allreduce(nbytes, [0, 1, 2, 3]) == pytest.approx(2 * 3 / 4 * nbytes / 50e9 + 6 * 5e-6)
    d = 16
    assert m.allreduce(nbytes, range(16)) == pytest.approx(
        2 * (d - 1) / d * nbytes / 12.5e9 + 2 * (d - 1) * 25e-6)
    assert m.allreduce(nbytes, [4, 5, 4]) == m.allreduce(nbytes, [4, 5])


def test_comm_model_fitted_and_round_trip():
    t = load_topology({"machines": [{"name": "a", "gpus": "4x T4"}, {"name": "b", "gpus": "T4"}],
                       "inter": "10Gbps"})
    x = np.array(sizes_up_to(4 * MiB), dtype=float)
    p2p = list(zip(x.astype(int), _piecewise(x)))
    ar = list(zip(x.astype(int), 3 * _piecewise(x)))
    m = CommModel.from_measurements(t, p2p=p2p, allreduce={4: ar})
    assert m.p2p(64 * KiB, 0, 1) == pytest.approx(float(_piecewise(np.array([64 * KiB]))[0]))
    assert m.p2p(64 * KiB, 0, 4) == pytest.approx(25e-6 + 64 * KiB / 1.25e9)   # inter: analytical
    assert m.allreduce(64 * KiB, [0, 1, 2, 3]) == pytest.approx(3 * m.p2p(64 * KiB, 0, 1))
    assert m.allreduce(64 * KiB, [0, 1]) != m.allreduce(64 * KiB, [0, 1, 2, 3])  # no 2-device fit
    d = json.loads(json.dumps(m.to_dict()))
    again = CommModel.from_dict(d)
    assert again.topology == t and again.p2p_fits == m.p2p_fits
    assert again.allreduce(1 * MiB, range(4)) == m.allreduce(1 * MiB, range(4))
    assert CommModel.from_dict(d, topology=t).p2p(100, 0, 1) == m.p2p(100, 0, 1)
    assert CommModel.from_dict({**d, "host_message_s": 3e-5}).host_message_s == 3e-5
    with pytest.raises(ProfileError, match="profiled for topology"):
        CommModel.from_dict(d, topology=presets.testbed())
    with pytest.raises(ProfileError, match="malformed"):
        CommModel.from_dict({"p2p": {}})
    with pytest.raises(ProfileError, match="intra:4"):
        CommModel(t, allreduce_fits={"4": m.allreduce_fits["intra:4"]})


# ---- real TensorFlow runs ---------------------------------------------------------------------
def test_in_process_allreduce_sums_and_is_timed():
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal(1000).astype(np.float32) for _ in range(3)]
    outs = run_allreduce(inputs)
    assert len(outs) == 3
    for out in outs:
        np.testing.assert_allclose(out, np.sum(inputs, axis=0), rtol=1e-5, atol=1e-5)
    record = []
    samples = measure_allreduce(4, [4 * KiB, 256 * KiB], repeats=3, record=record)
    assert [s for s, _ in samples] == [4 * KiB, 256 * KiB]
    assert all(t >= 0 for _, t in samples)
    assert all(r["step_s"] > 0 for r in record)


@pytest.fixture(scope="module")
def cluster():
    """One 2-task cluster for the module (server start-up is the slow part); on teardown its
    processes must be gone."""
    with LocalCluster(2, timeout_ms=30_000) as c:
        assert c.target.startswith("grpc://127.0.0.1:")
        pids = [p.pid for p in c.procs]
        yield c
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_grpc_p2p_between_two_servers(cluster):
    sizes = [KiB, 4 * KiB, 16 * KiB, 64 * KiB, 256 * KiB, MiB]
    samples = measure_p2p(sizes, repeats=7, cluster=cluster)
    assert [s for s, _ in samples] == sizes
    assert all(t >= 0 for _, t in samples)
    line = SegmentedLinear.fit(*zip(*samples), max_segments=1)
    assert line.slopes[0] > 0
    assert samples[-1][1] > 0


def test_cross_process_allreduce(cluster):
    inputs = [np.arange(6, dtype=np.float32), np.full(6, 0.5, np.float32)]
    outs = run_allreduce(inputs, processes=True, cluster=cluster)
    for out in outs:
        np.testing.assert_allclose(out, inputs[0] + inputs[1])
    samples = measure_allreduce(2, [KiB, 64 * KiB], processes=True, repeats=3, cluster=cluster)
    assert [s for s, _ in samples] == [KiB, 64 * KiB] and all(t >= 0 for _, t in samples)
