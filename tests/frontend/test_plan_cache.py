"""The plan cache: keyed by everything a plan depends on, written whole, readable by the user."""
from __future__ import annotations

import os
import stat
from pathlib import Path

from conftest import analysis_of

from tag_tf.frontend.planning import PLANNER_VERSION, PlanCache, grouping_digest
from tag_tf.profile.db import ProfileDB, default_db_path
from tag_tf.strategy import Option, Strategy


def test_key_changes_with_grouping_and_planner(tmp_path, monkeypatch):
    _, a8 = analysis_of("cnn", num_groups=8)
    _, a6 = analysis_of("cnn", num_groups=6)
    assert grouping_digest(a8) != grouping_digest(a6) and grouping_digest(a8) == grouping_digest(a8)
    cache = PlanCache(str(tmp_path))
    base = ("g", "t", "dp", 8)
    assert cache.path(*base, grouping="x") != cache.path(*base, grouping="y")
    before = cache.path(*base, grouping="x")
    monkeypatch.setattr("tag_tf.frontend.planning.PLANNER_VERSION", PLANNER_VERSION + "+next")
    assert cache.path(*base, grouping="x") != before         # a new planner never reuses old plans


def test_entries_are_written_whole_and_readable(tmp_path):
    cache = PlanCache(str(tmp_path))
    path = cache.path("g", "t", "dp", 3, grouping="x")
    strategy = Strategy.uniform(3, (0, 1), Option.ALLREDUCE)
    cache.store(path, strategy, "dp")
    assert cache.load(path).groups == strategy.groups
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o644
    assert [f for f in os.listdir(os.path.dirname(path)) if f.endswith(".tmp")] == []


def test_profile_db_lives_in_the_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("TAG_TF_CACHE_DIR", str(tmp_path))
    assert default_db_path() == os.path.join(str(tmp_path), "profiles")
    assert ProfileDB().path == os.path.join(str(tmp_path), "profiles")
    monkeypatch.delenv("TAG_TF_CACHE_DIR")
    assert default_db_path() == os.path.join(os.path.expanduser("~"), ".cache", "tag_tf", "profiles")


def test_sfb_requests_are_planned_cached_and_checked(tmp_path):
    """"dp+sfb" resolves to DP with the cuts that simulate faster, from the cache the second time;
    an "auto" plan without SFB is another cache entry; a cached plan whose SFB ops no longer fit the
    graph is planned again."""
    import json

    from tag_tf.frontend.planning import resolve_strategy
    from tag_tf.topology.load import load_topology

    _, a = analysis_of("transformer", batch_size=4)
    topo = load_topology({"name": "2x1", "machines": [{"name": "a", "gpus": "1x V100-32GB"},
                                                       {"name": "b", "gpus": "1x V100-32GB"}],
                          "inter": {"switch": "10Gbps"}})
    first = resolve_strategy(a, topo, "dp+sfb", cache_dir=str(tmp_path))
    assert first.strategy.name == "dp+sfb" and first.strategy.sfb and not first.cache_hit
    again = resolve_strategy(a, topo, "dp+sfb", cache_dir=str(tmp_path))
    assert again.cache_hit and again.strategy == first.strategy
    entry = json.loads(Path(first.cache_path).read_text())
    entry["strategy"]["sfb"][0]["ops"] = ["no/such/op"]
    with open(first.cache_path, "w") as f:
        json.dump(entry, f)
    replanned = resolve_strategy(a, topo, "dp+sfb", cache_dir=str(tmp_path))
    assert not replanned.cache_hit and replanned.strategy == first.strategy
    on = resolve_strategy(a, topo, "auto", cache_dir=str(tmp_path), budget_s=2)
    off = resolve_strategy(a, topo, "auto", cache_dir=str(tmp_path), budget_s=2, sfb=False)
    assert on.cache_path != off.cache_path and not off.strategy.sfb


_PLAN_WRITER = """
import sys
from tag_tf.frontend.planning import PlanCache
from tag_tf.strategy import Option, Strategy
seed, root = int(sys.argv[1]), sys.argv[2]
cache = PlanCache(root)
path = cache.path("g", "t", "dp", 400, grouping="x")
devices = [(0, 1), (0, 1, 2), (1,), (2, 3)][seed]
mine = Strategy.uniform(400, devices, Option.ALLREDUCE)
for _ in range(30):
    cache.store(path, mine, "dp")
    got = cache.load(path)                  # a whole plan of some writer, never a torn file
    assert got is not None and len(got.groups) == 400, "torn read"
"""


def test_concurrent_writer_processes_leave_a_whole_plan(tmp_path):
    """Four processes store and read the same plan key at once (two runs planning one graph): every
    read and the final file are one writer's whole plan, and no temp file is left behind."""
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", _PLAN_WRITER, str(seed), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    cache = PlanCache(str(tmp_path))
    got = cache.load(cache.path("g", "t", "dp", 400, grouping="x"))
    assert got is not None and len(set(got.groups)) == 1
    assert got.groups[0].devices in [(0, 1), (0, 1, 2), (1,), (2, 3)]
    assert [f for f in os.listdir(os.path.join(str(tmp_path), "plans")) if f.endswith(".tmp")] == []
