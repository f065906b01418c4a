"""What whole steps take against their traced ops, with and without TensorFlow's graph rewrites
(`OpProfile.runtime_fit`): the profile measures both; the stored costs scale op times to the chosen
runtime and say whether compiled graphs run as written."""
from __future__ import annotations

import dataclasses
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from tag_tf.profile.db import ProfileDB
from tag_tf.profile.op_profile import AS_WRITTEN_MARGIN, OpProfile
from tag_tf.profile.stored import stored_costs

SIZES = (2, 4, 8)


def _profile(written, rewritten) -> OpProfile:
    n = 4
    fixed, per = np.full(n, 1e-3), np.full(n, 1e-4)
    times = fixed[:, None] + per[:, None] * np.array(SIZES)[None, :]
    return OpProfile(device_type="cpu", op_names=tuple(f"op{i}" for i in range(n)), fixed=fixed, per_sample=per,
                     batch_sizes=SIZES, times=times, raw=np.repeat(times.T[:, None, :], 2, axis=1),
                     op_types=("MatMul",) * n, step_times=np.asarray(written, dtype=float), repeats=2,
                     fingerprint="fp1", rewritten_step_times=None if rewritten is None else np.asarray(rewritten))


def _totals(p: OpProfile) -> np.ndarray:
    return np.array([p.total(b) for b in SIZES])


def test_rewrites_that_slow_steps_run_as_written_and_scale_ops_to_the_written_steps():
    base = _profile(np.zeros(3), None)
    written = _totals(base) * 1.5                 # whole steps 1.5x their traced ops (executor, overhead)
    p = _profile(written, written * 2.0)           # the rewrites double every step
    fit = p.runtime_fit()
    assert fit.as_written and fit.rewrites_ratio == pytest.approx(2.0)
    assert fit.scale == pytest.approx(1.5)
    assert "slow whole steps 2.00x: runs as written; op times x1.50" in fit.describe()
    # Serialised and read back: the same fit.
    assert OpProfile.from_dict(p.to_dict()).runtime_fit() == fit
    # A scaled profile predicts the steps it was scaled to.
    scaled = p.scaled(fit.scale)
    np.testing.assert_allclose([scaled.total(b) for b in SIZES], written)


def test_rewrites_that_speed_steps_keep_tensorflows_defaults_and_within_the_margin_too():
    base = _profile(np.zeros(3), None)
    written = _totals(base)
    fit = _profile(written, written * 0.8).runtime_fit()
    assert not fit.as_written and fit.scale == pytest.approx(0.8)       # op times of the rewritten steps
    tie = _profile(written, written * (AS_WRITTEN_MARGIN - 0.05)).runtime_fit()
    assert not tie.as_written and tie.scale == pytest.approx(AS_WRITTEN_MARGIN - 0.05)
    assert _profile(written, None).runtime_fit() is None               # profiles stored before: no fit


def test_an_executor_time_per_op_is_fitted_beside_the_share_of_the_kernels():
    """Small steps are partly the executor's own time per op (a constant share of the traced ops
    extrapolated the mlp's steps 1.6x too slow from batches 8-32 to 48): steps = scale * ops +
    ops count * overhead, where the line's intercept is clearly there; else the share alone."""
    base = _profile(np.zeros(3), None)
    totals = _totals(base)
    steps = 0.75 * totals + base.num_ops * 2e-4
    fit = _profile(steps * 1.5, steps).runtime_fit()
    assert not fit.as_written
    assert fit.scale == pytest.approx(0.75) and fit.op_overhead_s == pytest.approx(2e-4)
    assert "op times x0.75 + 200 us each" in fit.describe()
    scaled = _profile(steps * 1.5, steps).scaled(fit.scale, fit.op_overhead_s)
    np.testing.assert_allclose([scaled.total(b) for b in SIZES], steps)
    wide = 40                                          # far outside the profiled sizes: the line, not the share
    assert scaled.total(wide) == pytest.approx(0.75 * base.total(wide) + base.num_ops * 2e-4)
    # an intercept within noise of nothing, or a falling line: the median share, no overhead
    flat = _profile(totals * 1.3 + 1e-7, None)
    flat = dataclasses.replace(flat, rewritten_step_times=totals * 1.3 + 1e-7)
    assert flat.runtime_fit().op_overhead_s == 0.0 and flat.runtime_fit().scale == pytest.approx(1.3, rel=1e-3)
    falling = dataclasses.replace(base, step_times=totals[::-1].copy(), rewritten_step_times=totals[::-1].copy())
    assert falling.runtime_fit().op_overhead_s == 0.0


def test_stored_costs_scale_the_profile_and_say_how_compiled_graphs_run(tmp_path):
    db = ProfileDB(tmp_path / "db")
    base = _profile(np.zeros(3), None)
    written = _totals(base) * 1.25
    db.put_op_profile(_profile(written, written * 3.0))
    costs = stored_costs(db, ["cpu"], ["fp1"])
    assert costs.as_written and set(costs.runtimes) == {"cpu"}
    (prof,) = costs.profiles
    np.testing.assert_allclose(prof.fixed, base.fixed * 1.25)
    # Another fit of the same program is another plan-cache key.
    other = tmp_path / "db2"
    ProfileDB(other).put_op_profile(_profile(written, written * 0.5))
    costs2 = stored_costs(ProfileDB(other), ["cpu"], ["fp1"])
    assert not costs2.as_written and costs2.digest != costs.digest
    # A profile without the rewritten steps: op times as traced, TensorFlow's defaults.
    plain = tmp_path / "db3"
    ProfileDB(plain).put_op_profile(dataclasses.replace(base, step_times=written))
    costs3 = stored_costs(ProfileDB(plain), ["cpu"], ["fp1"])
    assert not costs3.as_written and costs3.runtimes == {}
    np.testing.assert_allclose(costs3.profiles[0].fixed, base.fixed)


def test_a_real_profile_measures_whole_steps_both_ways():
    """Real sessions: the tiny MLP's untraced steps, as written and rewritten, at every batch size."""
    from tag_tf.measure.ops import profile_model

    p = profile_model("mlp", (2, 4), repeats=3, warmup=1, tiny=True, device="cpu")
    assert p.rewritten_step_times is not None and p.rewritten_step_times.shape == (2,)
    assert np.all(p.rewritten_step_times > 0) and np.all(p.step_times > 0)
    fit = p.runtime_fit()
    assert fit is not None and fit.scale > 0 and fit.batch_sizes == (2, 4)
