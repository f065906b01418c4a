"""One deadline type (tag_tf.deadline.Deadline), carried by the pass context and checked inside the
long loops: the search, SFB, the calibration fit and profiling each stop at it."""
from __future__ import annotations

import math
import time

import pytest
from conftest import analysis_of

from tag_tf.context import PassContext
from tag_tf.deadline import Deadline
from tag_tf.errors import DeadlineExceeded
from tag_tf.search.calibration_fit import Case, fit, simulate_cases
from tag_tf.search.local_search import local_search
from tag_tf.search.mcts import MctsOptions, mcts_search
from tag_tf.search.registry import baseline
from tag_tf.sim.calibration import Calibration
from tag_tf.sim.simulator import Simulator
from tag_tf.topology.load import load_topology


def test_the_deadline_type():
    never = Deadline.never()
    assert not never.bounded and not never.expired() and never.left() == math.inf and never.share(0.5) is never
    soon = Deadline.after(10.0)
    assert soon.bounded and 9.0 < soon.left() <= 10.0 and not soon.expired()
    assert soon.within(1.0).left() <= 1.0 and soon.within(100.0).end == soon.end
    assert 4.0 < soon.share(0.5).left() <= 5.0 and never.within(2.0).left() <= 2.0
    past = Deadline.after(-1.0)
    assert past.expired() and past.share(0.5).expired()
    with pytest.raises(DeadlineExceeded, match="the search: out of time"):
        past.check("the search")
    soon.check("the search")                     # not yet: nothing raised


def test_the_pass_context_carries_one():
    given = Deadline.after(60.0)
    ctx = PassContext(deadline=given)
    assert ctx.deadline is given and 0 < ctx.time_left() <= 60.0
    assert PassContext().deadline.bounded is False and PassContext().time_left() is None
    with pytest.raises(DeadlineExceeded, match="analyze: the deadline of 0 s ran out"):
        PassContext(deadline_s=0.0).check_deadline("analyze")


def test_searches_end_at_the_deadline_they_are_given():
    """A budget of minutes but a deadline already past: MCTS and the local search return at once
    with the best baseline (the fixed rules are still simulated: the plan is never worse)."""
    _, a = analysis_of("mlp", num_groups=4)
    topology = load_topology("testbed")
    sim = Simulator(a, topology)
    for search in (lambda d: mcts_search(sim, topology, MctsOptions(budget_s=600.0), deadline=d),
                   lambda d: local_search(sim, topology, budget_s=600.0, deadline=d)):
        start = time.perf_counter()
        result = search(Deadline.after(0.0))
        assert time.perf_counter() - start < 60.0 and result.found
        assert result.iteration_time_s <= min(result.baselines.values()) + 1e-12


def test_the_calibration_fit_ends_at_its_deadline_with_what_it_has():
    _, a = analysis_of("mlp", batch_size=64, tiny=False)
    topology = load_topology("testbed")
    sim = Simulator(a, topology, calibration=None)
    cases = [Case("dp", sim, baseline("dp", sim.num_groups, topology), 1.0)]
    truth = Calibration("truth", {"op_overhead_s": 40e-6})
    cases = [Case(c.label, c.sim, c.strategy, t) for c, t in zip(cases, simulate_cases(cases, truth))]
    stopped = fit(cases, ["op_overhead_s"], deadline=Deadline.after(0.0))
    assert stopped.iterations == 0 and stopped.evaluations == 1          # the starting point only
    assert fit(cases, ["op_overhead_s"]).iterations >= 1


def test_profiling_stops_at_its_deadline():
    from tag_tf.measure.ops import profile_model

    with pytest.raises(DeadlineExceeded, match="profiling the training step: out of time"):
        profile_model("mlp", (2, 4), repeats=2, warmup=0, tiny=True, device="cpu", deadline=Deadline.after(0.0))


def test_the_profile_command_stops_at_its_budget(tmp_path, capsys):
    from tag_tf.frontend.cli import main

    code = main(["profile", "--model", "mlp", "--tiny", "--batch-sizes", "2,4", "--warmup", "0", "--budget-s", "1e-6",
                 "--db", str(tmp_path), "--json"])
    assert code != 0 and "profiling the training step: out of time" in capsys.readouterr().err
    assert main(["profile", "--model", "mlp", "--tiny", "--budget-s", "-1", "--db", str(tmp_path)]) != 0
