"""A pass context's deadline is checked between phases: no phase starts after it (Grappler's rule)."""
from __future__ import annotations

import pytest

from tag_tf.analysis import analyze
from tag_tf.context import Options, PassContext
from tag_tf.errors import DeadlineExceeded
from tag_tf.models import build_model
from tag_tf.profile.weights import reference_weights


def test_no_phase_starts_after_the_deadline():
    ir = build_model("mlp", tiny=True).ir()
    with pytest.raises(DeadlineExceeded, match=r"analyze/batch_dims: the deadline of 0 s ran out"):
        analyze(PassContext(Options(num_groups=4), deadline_s=0.0), ir, weight_fn=reference_weights)
    ctx = PassContext(Options(num_groups=4), deadline_s=3600.0)
    analysis = analyze(ctx, ir, weight_fn=reference_weights)
    assert len(analysis.grouping.groups) <= 4 and 0 < ctx.time_left() < 3600.0
    assert set(ctx.timing_report()) >= {"analyze/batch_dims", "analyze/grouping"}
