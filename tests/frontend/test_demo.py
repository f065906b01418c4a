"""`make demo` end to end (small budget): plan is simulated, training is real and matches."""
from __future__ import annotations

import json


def test_demo_writes_a_report_and_matches_single_device(tmp_path):
    from tag_tf.frontend.demo import run_demo

    lines: list[str] = []
    result = run_demo(str(tmp_path), budget_s=5.0, steps=3, say=lines.append)
    text = "\n".join(lines)
    assert "SIMULATED" in text and "speed-up over DP" in text
    assert result.max_rel_loss_diff <= 1e-4 and len(result.losses_tag) == 3
    # The real run is distributed: work on at least two local devices, a plan that is not one device,
    # trained variables that differ from the plain run's (not identical by construction) within 10x
    # the noise floor (the plain run on row-permuted batches).
    assert sum(n > 10 for n in result.ops_per_device.values()) >= 2, result.ops_per_device
    assert "mapped onto them" in result.local_plan or result.local_plan.startswith("data parallelism")
    assert 0 < result.max_rel_weight_diff <= max(10 * result.weight_noise_floor, 1e-5), (
        result.max_rel_weight_diff, result.weight_noise_floor)
    assert "ops on CPU:1" in (tmp_path / "report.md").read_text()
    assert result.speedup_over_dp >= 1.0
    for name in ("report.md", "plan.json", "plan_local.json", "timeline.png", "timeline_dp.png", "trace.json"):
        assert (tmp_path / name).stat().st_size > 0, name
    assert "simulated" in (tmp_path / "report.md").read_text()
    assert json.loads((tmp_path / "trace.json").read_text())["traceEvents"]
    assert json.loads((tmp_path / "plan.json").read_text())["groups"]
