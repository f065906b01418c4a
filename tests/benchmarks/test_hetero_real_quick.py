"""benchmarks/hetero_real.py end to end (CI smoke test, root): on the compute-heterogeneous emulated
cluster, the cnn trains plain on the fastest host, under every tag_tf row and under
MultiWorkerMirroredStrategy; every row's losses are the plain run's, and each tag_tf row names its
plan and its predicted step. Timings are reported, never asserted."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tag_tf.emulate import system

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MISSING = system.requirements_missing()


@pytest.mark.skipif(MISSING is not None, reason=MISSING or "")
def test_hetero_real_quick(tmp_path):
    import glob
    import tempfile

    out = tmp_path / "hetero.json"
    caches = os.path.join(tempfile.gettempdir(), "tag_tf_hetero_compute_cnn_*")
    before = set(glob.glob(caches))
    p = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "hetero_real.py"), "--quick", "--out",
                        str(out)], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    assert set(glob.glob(caches)) <= before          # the run's plan and profile caches are gone
    data = json.loads(out.read_text())
    rows = data["clusters"]["compute"]["models"]["cnn"]
    assert [h["name"] for h in data["clusters"]["compute"]["measured"]["hosts"]] == ["fast", "half", "quarter"]
    for name in ("plain", "plain-as-written", "tag-auto", "tag-dp", "tag-dp-p", "tag-horovod", "tag-horovod-p",
                 "tag-best-subset", "mwms"):
        assert "median_ms" in rows[name], (name, rows[name])
        assert abs(rows[name]["last_loss"] - rows["plain"]["last_loss"]) <= 1e-4 * abs(rows["plain"]["last_loss"]), name
    assert "absent" in rows["horovod"] or "median_ms" in rows["horovod"]
    for name in ("tag-auto", "tag-dp", "tag-dp-p", "tag-horovod", "tag-horovod-p", "tag-best-subset"):
        assert rows[name]["predicted_ms"] > 0 and rows[name]["plan"]["hosts"], name
    auto = rows["tag-auto"]
    if auto["plan"]["one_device"] and auto["plan"]["hosts"] == ["fast"]:     # the chief's host alone: its own session
        assert any("runs in this process's own session" in line for line in auto["log"]), auto["log"]
    shares = rows["tag-dp-p"]["plan"]["shares"]
    assert shares[0] > shares[1] > shares[2], shares          # discovery saw 1 : 0.5 : 0.25
    assert rows["tag-dp"]["plan"]["shares"] is None
    verdict = data["verdicts"]["compute/cnn"]
    assert verdict["best_baseline"] in ("plain", "plain-as-written", "tag-dp", "tag-dp-p", "tag-horovod",
                                        "tag-horovod-p", "tag-best-subset")


def test_rounds_report_the_median_round_with_its_own_plan_and_prediction():
    """A prediction is judged against its own plan's time: where the rounds ran different plans (the
    link cluster's transformer: round 1 on host far, predicted 183 ms; rounds 2 and 3 on a+b), the
    row is the median round's, and every round's plan is kept."""
    from benchmarks.hetero_real import combine_rounds

    def run(hosts, predicted, median, planned):
        return {"plan": {"hosts": hosts, "shares": None}, "predicted_ms": predicted, "median_ms": median,
                "planned_s": planned, "first_step_s": planned + 1}

    rounds = [run(["far"], 182.7, 237.7, 14.8), run(["a", "b"], 150.0, 162.2, 0.1), run(["a", "b"], 135.7, 157.1, 0.1)]
    row = combine_rounds(rounds)
    assert row["median_ms"] == 162.2 and row["predicted_ms"] == 150.0 and row["plan"]["hosts"] == ["a", "b"]
    assert row["planned_s"] == 14.8                          # the first round planned; later ones were cached
    assert [r["hosts"] for r in row["rounds_plans"]] == [["far"], ["a", "b"], ["a", "b"]]
    same = combine_rounds([run(["a"], 10.0, 11.0, 1.0), run(["a"], 10.0, 12.0, 0.1)])
    assert same["median_ms"] == 11.5 and same["predicted_ms"] == 10.0 and "rounds_plans" not in same
    failed = combine_rounds([{"error": "boom"}, run(["a"], 10.0, 11.0, 1.0)])
    assert failed["rounds_failed"] == ["boom"] and failed["median_ms"] == 11.0


def test_a_searched_plan_on_several_hosts_is_named_with_its_speedup_and_a_variant_keeps_its_batch():
    """auto's plan counts as one only the search finds where it is neither whole replicas nor one
    device and spans two or more hosts; the verdict and the section name it with auto over the best
    of the baselines and plain. cnn-wide runs at its own batch (MODEL_BATCH), shown beside its name."""
    import argparse

    from benchmarks.hetero_real import model_batch, render, searched_multi_host, verdicts

    sfb_plan = {"hosts": ["a", "b", "far"], "options": ["allreduce"], "shares": [0.333, 0.333, 0.333], "sfb": 1,
                "whole_replicas": False, "one_device": False}
    assert searched_multi_host(sfb_plan)
    assert not searched_multi_host(dict(sfb_plan, whole_replicas=True, sfb=0))
    assert not searched_multi_host(dict(sfb_plan, hosts=["a"]))
    assert not searched_multi_host(dict(sfb_plan, one_device=True, hosts=["a"]))
    assert not searched_multi_host({})

    def row(ms, predicted=None, plan=None):
        r = {"median_ms": ms, "last_loss": 2.3}
        if predicted is not None:
            r.update(predicted_ms=predicted, plan=plan)
        return r
    whole = {"hosts": ["a", "b"], "options": ["allreduce"], "shares": [0.5, 0.5], "whole_replicas": True,
             "one_device": False}
    rows = {"plain": row(1375.0), "tag-auto": row(1133.0, 748.0, sfb_plan), "tag-best-subset": row(1408.0, 1167.0, whole),
            "tag-horovod-p": row(12749.0, 11800.0, dict(whole, hosts=["a", "b", "far"])), "batch": 96}
    data = {"date": "2026-11-27", "machine": "x86_64", "cores": 2, "commit": "abc", "batch": 48, "steps": 15,
            "warmup": 5, "clusters": {"link": {"measured": {"hosts": [{"name": "a", "cpu_speed": 0.5}],
                                                            "links": [{"bandwidth_bps": 48e6}]},
                                               "models": {"cnn-wide": rows}}}}
    data["verdicts"] = verdicts(data)
    v = data["verdicts"]["link/cnn-wide"]
    assert v["searched_multi_host"] and v["best_baseline"] == "plain"
    assert v["auto_over_best_baseline"] == pytest.approx(1133.0 / 1375.0)
    text = render(data)
    assert "cnn-wide (batch 96)" in text and "SFB on 1 gradient(s) (searched: not whole replicas)" in text
    assert "link/cnn-wide on a+b+far, auto / best of the baselines and plain 0.82x (plain)" in text
    args = argparse.Namespace(batch=48)
    assert model_batch("cnn-wide", args) == 96 and model_batch("cnn", args) == 48


def test_a_plan_with_groups_on_several_device_sets_shows_each_sets_shares():
    """Shares are per device and mean something only within a group's devices: a plan with groups on
    a+b and on far alone shows each set with its groups and the split within it, not the per-device
    shares over all hosts (0.0/0.0/1.0 read as "far takes the batch")."""
    from benchmarks.hetero_real import group_sets_text, render

    topology = {"machines": [{"name": n, "gpus": [{"count": 1, "type": "cpu"}]} for n in ("a", "b", "far")]}
    strategy = {"groups": [{"devices": [0, 1]}, {"devices": [1]}, {"devices": [1, 0]}, {"devices": [2]}],
                "shares": [0.0003, 0.0001, 0.9996]}
    auto = {"strategy": strategy, "topology": topology, "median_ms": 1000.0, "predicted_ms": 990.0,
            "plan": {"hosts": ["a", "b", "far"], "options": ["allreduce"], "shares": [0.0, 0.0, 1.0],
                     "whole_replicas": False, "one_device": False, "devices": [0, 1, 2]}}
    assert group_sets_text(auto) == "groups a+b x2 (0.75/0.25), b x1, far x1"
    assert group_sets_text(dict(auto, strategy=dict(strategy, groups=strategy["groups"][:1]))) is None
    assert group_sets_text({"plan": auto["plan"]}) is None
    data = {"date": "2026-11-27", "machine": "x86_64", "cores": 2, "commit": "abc", "batch": 48, "steps": 15,
            "warmup": 5, "clusters": {"link": {"measured": {"hosts": [{"name": "a", "cpu_speed": 0.5}],
                                                            "links": [{"bandwidth_bps": 48e6}]},
                                               "models": {"cnn-wide": {"tag-auto": auto, "plain": {"median_ms": 1400.0}}}}}}
    text = render(data)
    assert "a+b+far ['allreduce'] groups a+b x2 (0.75/0.25), b x1, far x1" in text and "0.0/0.0/1.0" not in text


def test_rows_measured_now_replace_only_themselves_and_the_rest_say_when_they_were_measured():
    """`--rows tag-auto,tag-best-subset --merge`: the model's other rows stay, each cell naming the
    code it was measured with; an unknown row is refused by name."""
    import argparse

    from benchmarks.hetero_real import carry_rows, render, rows_to_measure, verdicts

    assert rows_to_measure(argparse.Namespace(rows=None))[0] == "plain"
    assert rows_to_measure(argparse.Namespace(rows="tag-best-subset, plain,tag-auto")) == ("plain", "tag-auto", "tag-best-subset")
    with pytest.raises(SystemExit, match="unknown row.*tag-fast"):
        rows_to_measure(argparse.Namespace(rows="tag-auto,tag-fast"))
    old = {"plain": {"median_ms": 2.0, "last_loss": 2.3}, "tag-dp": {"median_ms": 500.0, "last_loss": 2.3},
           "tag-auto": {"median_ms": 2.2, "last_loss": 2.3}, "profile": {"profiled_s": 1.0}}
    fresh = {"tag-auto": {"median_ms": 1.9, "last_loss": 2.3}, "profile": {"profiled_s": 2.0}}
    rows = carry_rows(fresh, old, {"commit": "old1234", "date": "2026-11-26"})
    assert rows["tag-auto"]["median_ms"] == 1.9 and "measured_with" not in rows["tag-auto"]
    assert rows["tag-dp"]["measured_with"]["commit"] == "old1234" and rows["profile"]["profiled_s"] == 2.0
    data = {"date": "2026-11-27", "machine": "x86_64", "cores": 2, "commit": "new5678", "batch": 48, "steps": 15,
            "warmup": 5, "clusters": {"link": {"measured": {"hosts": [{"name": "a", "cpu_speed": 0.5}],
                                                            "links": [{"bandwidth_bps": 48e6}]},
                                               "models": {"mlp": rows}}}}
    data["verdicts"] = verdicts(data)
    text = render(data)
    assert "| 2.0 (code old1234) |" in text and "| 1.9 |" in text and "| 500.0 (code old1234) |" in text


def test_rows_that_ran_autos_plan_are_named_and_auto_is_also_judged_against_the_other_plans():
    """A baseline with auto's devices, options, SFB and shares (or the plain program, where auto keeps
    one device of the chief's host) ran auto's plan: the verdict names it and compares auto with the
    best row of another plan too."""
    from benchmarks.hetero_real import same_plan, verdicts

    one = {"hosts": ["fast"], "devices": [0], "options": ["allreduce"], "sfb": 0, "whole_replicas": True,
           "one_device": True, "shares": None}
    assert same_plan(one, dict(one, shares=[1.0]), "fast") and same_plan(one, None, "fast")
    assert not same_plan(one, None, "half") and not same_plan(one, dict(one, devices=[1]), "fast")
    two = dict(one, hosts=["fast", "half"], devices=[0, 1], one_device=False, shares=[0.6, 0.4])
    assert not same_plan(two, dict(two, shares=[0.5, 0.5]), "fast") and not same_plan(two, None, "fast")

    def row(ms, plan=None):
        return {"median_ms": ms, "last_loss": 2.3, **({"plan": plan, "predicted_ms": ms} if plan else {})}
    rows = {"plain": row(1.6), "plain-as-written": row(1.9), "tag-auto": row(1.7, one),
            "tag-best-subset": row(1.6, dict(one, shares=[1.0])), "tag-dp": row(50.0, dict(two, shares=None))}
    data = {"clusters": {"compute": {"cluster": {"hosts": [{"name": "fast"}]}, "models": {"mlp": rows}}}}
    v = verdicts(data)["compute/mlp"]
    assert v["same_plan_as"] == ["plain", "tag-best-subset"]
    assert v["auto_over_best_baseline"] == pytest.approx(1.7 / 1.6)
    assert v["auto_over_best_other_plan"] == pytest.approx(1.7 / 1.9)
    # auto ran its one device with TensorFlow's rewrites off: the plain program as written ran its plan
    # (said by the plan, or by the run's log in rows from before the plan said it)
    for auto in (row(1.7, dict(one, as_written=True)), dict(row(1.7, one), log=["tag_tf: ... 2.56x: runs as written"])):
        v = verdicts({"clusters": {"compute": dict(data["clusters"]["compute"], models={
            "mlp": dict(rows, **{"tag-auto": auto})})}})["compute/mlp"]
        assert v["same_plan_as"] == ["plain-as-written", "tag-best-subset"]
        assert v["auto_over_best_other_plan"] == pytest.approx(1.7 / 1.6)


def test_auto_never_slower_allows_only_the_spread_of_rounds_of_its_own_plan():
    """auto a little slower than a row that ran its own plan is never slower where the interleaved
    rounds of that plan spread wider than the gap; never where the faster row ran another plan, where
    the gap is wider than the rounds' spread, or without rounds to measure it."""
    from benchmarks.hetero_real import never_slower, same_plan_noise, verdicts

    one = {"hosts": ["fast"], "devices": [0], "options": ["allreduce"], "sfb": 0, "whole_replicas": True,
           "one_device": True, "shares": None}

    def row(rounds, plan=None):
        return {"mean_ms": sorted(rounds)[(len(rounds) - 1) // 2], "rounds_ms": rounds, "last_loss": 2.3,
                **({"plan": plan, "predicted_ms": 10.0} if plan else {})}
    rows = {"plain": row([10.0, 10.4, 10.1]), "plain-as-written": row([13.0, 13.2, 13.1]),
            "tag-auto": row([10.9, 10.3, 10.5], one), "tag-best-subset": row([10.2, 10.8, 10.6], dict(one, shares=[1.0]))}
    data = {"clusters": {"compute": {"cluster": {"hosts": [{"name": "fast"}]}, "models": {"mlp": rows}}}}
    v = verdicts(data)["compute/mlp"]
    assert v["best_baseline"] == "plain" and v["auto_over_best_baseline"] == pytest.approx(10.5 / 10.1)
    assert v["same_plan_noise"] == pytest.approx((10.9 - 10.3) / 10.5)     # auto's own rounds spread widest
    assert v["never_slower"] is True
    # the gap wider than the rounds' spread
    slow = dict(rows, **{"tag-auto": row([12.0, 12.1, 12.2], one)})
    assert verdicts({"clusters": {"compute": dict(data["clusters"]["compute"], models={"mlp": slow})}}
                    )["compute/mlp"]["never_slower"] is False
    # one round each: no spread measured, 1.0x is the bound
    assert same_plan_noise([{"median_ms": 1.0}, {"median_ms": 1.1}]) is None
    assert never_slower(1.01, True, None) is False and never_slower(0.99, False, None) is True
    # the faster row ran another plan: no allowance
    assert never_slower(1.01, False, 0.2) is False and never_slower(1.01, True, 0.2) is True


def test_the_predicted_order_is_judged_on_distinct_plans_with_ties_at_their_average_rank():
    """Rows that ran one plan (same plan, same prediction) count once, at their mean measured
    time; tied values share their average rank; plans the prediction tells apart (another fusion,
    another prediction) stay apart."""
    from benchmarks.hetero_real import _spearman, distinct_plans, verdicts

    assert _spearman([1.0, 2.0, 3.0], [10.0, 20.0, 30.0]) == pytest.approx(1.0)
    assert _spearman([1.0, 2.0, 3.0], [30.0, 20.0, 10.0]) == pytest.approx(-1.0)
    assert _spearman([1.0, 1.0, 2.0, 3.0], [5.0, 4.0, 6.0, 7.0]) == pytest.approx(0.9486833)   # a tie, not an order
    assert _spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None
    assert _spearman([1.0, 2.0], [1.0, 2.0]) is None

    one = {"hosts": ["fast"], "devices": [0], "options": ["allreduce"], "sfb": 0, "whole_replicas": True,
           "one_device": True, "shares": [1.0]}
    three = dict(one, hosts=["fast", "half", "quarter"], devices=[0, 1, 2], one_device=False, shares=None)

    def row(measured, predicted, plan):
        return {"median_ms": measured, "predicted_ms": predicted, "last_loss": 2.3, "plan": plan}
    rows = {"plain": {"median_ms": 30.0, "last_loss": 2.3},
            "tag-auto": row(32.0, 31.0, one), "tag-best-subset": row(29.0, 31.0, one),
            "tag-dp": row(120.0, 130.0, dict(three, fusion_bytes=None)),
            "tag-horovod": row(100.0, 110.0, dict(three, fusion_bytes=64 << 20)),
            "tag-horovod-p": row(80.0, 90.0, dict(three, fusion_bytes=64 << 20, shares=[0.6, 0.3, 0.1]))}
    plans = distinct_plans(rows, ["tag-auto", "tag-best-subset", "tag-dp", "tag-horovod", "tag-horovod-p"], "fast")
    assert plans == [("tag-auto", "tag-best-subset"), ("tag-dp",), ("tag-horovod",), ("tag-horovod-p",)]
    data = {"clusters": {"compute": {"cluster": {"hosts": [{"name": "fast"}]}, "models": {"cnn": rows}}}}
    v = verdicts(data)["compute/cnn"]
    assert v["spearman"] == pytest.approx(1.0)                # one-device < horovod-p < horovod < dp, both ways
    assert v["spearman_rows"] < 1.0                           # row by row, the one plan's two runs disagree
    rows["tag-horovod"] = row(100.0, 110.0, dict(three, fusion_bytes=None))     # as dp's plan: the prediction
    assert len(distinct_plans(rows, ["tag-dp", "tag-horovod"], "fast")) == 2  # still tells them apart


def test_a_rows_step_is_its_mean_step_and_even_shares_are_the_plan_without_shares():
    """A row's step time is the mean of its timed steps (a host on a CPU quota runs short steps in
    two modes: their median is one mode, their mean the run's time per step); rows from before rows
    had a mean count at their median and say so. dp (no shares: an even split) and dp-p with even
    shares ran one plan."""
    from benchmarks.hetero_real import render, same_plan, step_ms, verdicts
    from benchmarks.peers import summarize

    # three short steps, then two that waited for the next CFS period (after two warm-up steps)
    row = summarize([0.5, 0.1, 0.002, 0.002, 0.002, 0.009, 0.008], [2.0] * 7, warmup=2)
    assert row["median_ms"] == pytest.approx(2.0) and row["mean_ms"] == pytest.approx(4.6)
    assert step_ms(row) == pytest.approx(4.6) and step_ms({"median_ms": 3.0}) == 3.0
    assert step_ms({"error": "boom"}) is None and step_ms(3) is None

    three = {"hosts": ["a", "b", "far"], "devices": [0, 1, 2], "options": ["allreduce"], "sfb": 0,
             "whole_replicas": True, "one_device": False, "fusion_bytes": None, "microbatches": 1, "shares": None}
    assert same_plan(three, dict(three, shares=[0.333, 0.333, 0.333]), "a")
    assert not same_plan(three, dict(three, shares=[0.357, 0.361, 0.282]), "a")
    assert not same_plan(three, dict(three, shares=[0.5, 0.5]), "a")

    def tag(mean, median, predicted, plan):
        return {"mean_ms": mean, "median_ms": median, "predicted_ms": predicted, "last_loss": 2.3, "plan": plan}
    one = dict(three, hosts=["a"], devices=[0], one_device=True, shares=[1.0])
    rows = {"plain": {"mean_ms": 3.5, "median_ms": 1.9, "last_loss": 2.3},
            "tag-auto": tag(3.8, 6.9, 3.4, one), "tag-dp": tag(500.0, 490.0, 505.0, three),
            "tag-dp-p": tag(497.0, 495.0, 505.0, dict(three, shares=[0.333, 0.333, 0.333])),
            "tag-horovod": tag(480.0, 485.0, 500.0, dict(three, fusion_bytes=64 << 20))}
    data = {"date": "2026-11-28", "machine": "x86_64", "cores": 2, "commit": "abc", "batch": 48, "steps": 15,
            "warmup": 5, "clusters": {"link": {"cluster": {"hosts": [{"name": "a"}]},
                                               "measured": {"hosts": [{"name": "a", "cpu_speed": 0.5}],
                                                            "links": [{"bandwidth_bps": 48e6}]},
                                               "models": {"mlp": rows}}}}
    v = verdicts(data)["link/mlp"]
    assert v["auto_over_best_baseline"] == pytest.approx(3.8 / 3.5)        # means, not the medians' 6.9 / 1.9
    assert ["tag-dp", "tag-dp-p"] in v["plans"]
    assert v["mape"] == pytest.approx((0.4 / 3.8 + 5 / 500 + 8 / 497 + 20 / 480) / 4)
    text = render(data)
    assert "batch 48, mean of 15 steps" in text and "| 3.5 | " in text
    del rows["plain"]["mean_ms"]                                # a row from before rows had a mean
    assert "mean (median where marked)" in render(data) and "| 1.9 (median) |" in render(data)


def test_horovod_runs_where_each_emulated_host_name_resolves_to_its_own_address(tmp_path):
    """Gloo (Horovod 0.28) finds a process set's address by the host name: the horovod row runs each
    host in its own UTS and mount namespace, named after the host, with an /etc/hosts mapping every
    host's name to its address (on a shared /etc/hosts the name resolved to loopback and Gloo
    connected to 127.0.0.1)."""
    import types

    from benchmarks.hetero_real import CLUSTERS, _own_host_names
    from tag_tf.context import EMULATED_HOST_ENV
    from tag_tf.emulate import load_cluster

    cluster = load_cluster(dict(CLUSTERS["compute"], name="compute"))
    argv = _own_host_names(types.SimpleNamespace(cluster=cluster), ["python", "x.py"], str(tmp_path))
    assert argv[:3] == ["unshare", "--mount", "--uts"] and argv[-2:] == ["python", "x.py"]
    assert f'hostname "${EMULATED_HOST_ENV}"' in argv[5] and f"mount --bind {tmp_path}/hosts /etc/hosts" in argv[5]
    lines = (tmp_path / "hosts").read_text().splitlines()
    assert lines[0] == "127.0.0.1 localhost"
    assert lines[1:] == [f"{cluster.address(i)} {h.name}" for i, h in enumerate(cluster.hosts)]


def test_a_row_that_stopped_names_the_first_error_any_host_logged():
    """Where one task fails the others' last lines say only that it went away: the row keeps the
    first error logged (TensorFlow's error log line and the call it names, or a Python exception),
    and the section shows it under the cluster's table."""
    from benchmarks.hetero_real import _failed, first_error, render

    lines = ["[a  ] starting",
             "[far] 2026-11-29 12:34:47.356641: E external/local_tsl/tsl/distributed_runtime/coordination/"
             "coordination_service_agent.cc:770] Coordination agent is set to ERROR: DEADLINE_EXCEEDED: Deadline Exceeded",
             "[b  ] Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling "
             "/tensorflow.WorkerService/RecvTensor:",
             "[far] Additional GRPC error information from remote target /job:worker/replica:0/task:0 while calling "
             "/tensorflow.CoordinationService/Heartbeat:",
             "[b  ] 2026-11-29 12:34:48.1: E external/x.cc:1] Coordination agent is set to ERROR: UNAVAILABLE",
             "[b  ] tensorflow.python.framework.errors_impl.UnavailableError: failed to connect"]
    expected = ("[far] Coordination agent is set to ERROR: DEADLINE_EXCEEDED: Deadline Exceeded "
                "(calling /tensorflow.CoordinationService/Heartbeat)")
    assert first_error(lines) == expected
    assert first_error(lines[-1:]) == "[b  ] tensorflow.python.framework.errors_impl.UnavailableError: failed to connect"
    assert first_error(["[a] fine"]) is None
    assert first_error(["[a] 2026-11-29 12:00:00.1: F tensorflow/core/x.cc:9] Check failed: ok"]) == "[a] Check failed: ok"
    row = _failed("mwms exited 1", lines)
    assert row["first_error"] == expected and row["error"].startswith("mwms exited 1: [far] Additional")
    data = {"date": "2026-11-27", "machine": "x86_64", "cores": 2, "commit": "abc", "batch": 48, "steps": 15,
            "warmup": 5, "clusters": {"link": {"measured": {"hosts": [{"name": "a", "cpu_speed": 0.5}],
                                                            "links": [{"bandwidth_bps": 48e6}]},
                                               "models": {"cnn-wide": {"mwms": row, "plain": {"median_ms": 1400.0}}}}}}
    assert f"- mwms on cnn-wide stopped; the first error a host logged: `{expected}`" in render(data)
