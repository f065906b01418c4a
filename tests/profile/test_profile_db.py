"""Profile database: round trips, re-use without re-profiling, concurrent writer processes; the `profile` CLI."""
from __future__ import annotations

import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from tag_tf.errors import ProfileError
from tag_tf.frontend.cli import main
from tag_tf.profile.costmodel import DEFAULT_GPU_CONSTANTS, CostModelConstants
from tag_tf.profile.db import ProfileDB
from tag_tf.profile.op_profile import OpProfile


def _profile(device="cpu", sizes=(2, 4, 8), n=5, seed=0) -> OpProfile:
    rng = np.random.default_rng(seed)
    fixed = rng.uniform(1e-6, 1e-4, n)
    per = rng.uniform(0, 1e-5, n)
    times = fixed[:, None] + per[:, None] * np.array(sizes)[None, :]
    raw = np.repeat(times.T[:, None, :], 2, axis=1)
    raw[0, 1, 0] = np.nan
    return OpProfile(device_type=device, op_names=tuple(f"op{i}" for i in range(n)), fixed=fixed, per_sample=per,
                     batch_sizes=tuple(sizes), times=times, raw=raw, op_types=("MatMul",) * n,
                     step_times=times.sum(axis=0), repeats=2, fingerprint="abc123", info={"model": "x"})


def test_op_profile_round_trip(tmp_path):
    db = ProfileDB(tmp_path / "db")
    assert db.get_op_profile("abc123", "cpu", (2, 4, 8)) is None
    p = _profile()
    path = db.put_op_profile(p)
    assert os.path.isfile(path) and path.endswith(".json")
    q = db.get_op_profile("abc123", "cpu", (8, 4, 2))               # batch-size order does not matter
    assert q is not None and q.op_names == p.op_names and q.batch_sizes == p.batch_sizes
    np.testing.assert_allclose(q.fixed, p.fixed)
    np.testing.assert_allclose(q.per_sample, p.per_sample)
    np.testing.assert_allclose(q.raw, p.raw, atol=1e-9)
    assert np.isnan(q.raw[0, 1, 0]) and q.info["model"] == "x"
    # Other keys miss.
    assert db.get_op_profile("abc123", "V100-32GB", (2, 4, 8)) is None
    assert db.get_op_profile("abc123", "cpu", (2, 4)) is None
    assert db.get_op_profile("other", "cpu", (2, 4, 8)) is None
    assert db.list_op_profiles() == [{"fingerprint": "abc123", "device_type": "cpu", "batch_sizes": [2, 4, 8]}]
    # Re-opened database (a later run) sees it.
    assert ProfileDB(tmp_path / "db").get_op_profile("abc123", "cpu", (2, 4, 8)) is not None


def test_reuse_does_not_reprofile(tmp_path):
    db = ProfileDB(tmp_path)
    calls = []

    def compute():
        calls.append(1)
        return _profile()

    first, hit1 = db.op_profile("abc123", "cpu", (2, 4, 8), compute)
    second, hit2 = db.op_profile("abc123", "cpu", (2, 4, 8), compute)
    assert (hit1, hit2) == (False, True) and len(calls) == 1
    np.testing.assert_allclose(first.fixed, second.fixed)


def test_corrupt_or_foreign_entries_read_as_misses(tmp_path):
    db = ProfileDB(tmp_path)
    path = db.put_op_profile(_profile())
    with open(path, "w") as fh:
        fh.write("{not json")
    assert db.get_op_profile("abc123", "cpu", (2, 4, 8)) is None
    with open(path, "w") as fh:
        json.dump({"format": 1, "key": {"fingerprint": "zzz"}, "value": {}}, fh)
    assert db.get_op_profile("abc123", "cpu", (2, 4, 8)) is None
    db.put_op_profile(_profile())                                      # the next run replaces it
    assert db.get_op_profile("abc123", "cpu", (2, 4, 8)) is not None
    (tmp_path / "file").write_text("x")
    with pytest.raises(ProfileError):
        ProfileDB(tmp_path / "file")


_WRITER = """
import sys
import numpy as np
from tag_tf.profile.db import ProfileDB
from tag_tf.profile.op_profile import OpProfile
seed, root = int(sys.argv[1]), sys.argv[2]
rng = np.random.default_rng(seed)
n, sizes = 2000, (2, 4, 8)
fixed, per = rng.uniform(1e-6, 1e-4, n), rng.uniform(0, 1e-5, n)
times = fixed[:, None] + per[:, None] * np.array(sizes)[None, :]
raw = np.repeat(times.T[:, None, :], 2, axis=1)
profile = OpProfile(device_type="cpu", op_names=tuple(f"op{i}" for i in range(n)), fixed=fixed, per_sample=per,
                    batch_sizes=sizes, times=times, raw=raw, op_types=("MatMul",) * n, step_times=times.sum(axis=0),
                    repeats=2, fingerprint="abc123", info={"writer": seed})
db = ProfileDB(root)
for _ in range(20):
    db.put_op_profile(profile)
    got = db.get_op_profile("abc123", "cpu", sizes)      # every read sees one writer's whole file
    assert got is not None and got.num_ops == n, "torn read"
"""


def test_concurrent_writer_processes_leave_a_whole_file(tmp_path):
    """Four processes write and read the same key at once: every read and the final file are one
    writer's whole profile, and no temp file is left behind."""
    import subprocess
    import sys

    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(seed), str(tmp_path)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for seed in range(4)]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err[-2000:]
    got = ProfileDB(tmp_path).get_op_profile("abc123", "cpu", (2, 4, 8))
    assert got is not None and got.num_ops == 2000 and got.info["writer"] in range(4)
    rng = np.random.default_rng(got.info["writer"])
    np.testing.assert_allclose(got.fixed, rng.uniform(1e-6, 1e-4, 2000))
    leftovers = [f for f in os.listdir(tmp_path / "ops") if f.startswith(".tmp-")]
    assert leftovers == []


def test_comm_models_and_constants(tmp_path):
    db = ProfileDB(tmp_path)
    assert db.get_comm("topo1") is None

    class FakeComm:
        def to_dict(self):
            return {"links": {"a-b": {"alpha": 1e-5, "beta": 1e-9}}, "groups": (1, 2)}

    db.put_comm("topo1", FakeComm())
    assert db.get_comm("topo1") == {"links": {"a-b": {"alpha": 1e-5, "beta": 1e-9}}, "groups": [1, 2]}
    db.put_comm("topo1", {"version": 2})                               # replaced
    assert db.get_comm("topo1") == {"version": 2}
    with pytest.raises(ProfileError):
        db.put_comm("topo2", 42)
    cpu = CostModelConstants("cpu", DEFAULT_GPU_CONSTANTS.compute_eff, DEFAULT_GPU_CONSTANTS.mem_eff,
                             launch_overhead_s=3e-6, class_overhead_s={"conv": 1e-4}, calibrated=True)
    db.put_constants(cpu)
    assert db.get_constants("cpu").to_dict() == cpu.to_dict()
    assert db.get_constants("T4") is None
    assert db.cost_model().constants_for("cpu").class_overhead_s["conv"] == 1e-4


# ---------------------------------------------------------------------------------------------
# CLI
# ---------------------------------------------------------------------------------------------
def test_cli_profiles_tiny_model_and_reuses_db(tmp_path, capsys):
    db = str(tmp_path / "db")
    argv = ["profile", "--model", "mlp", "--tiny", "--batch-sizes", "2,4", "--repeats", "1", "--warmup", "0",
            "--device", "cpu", "--db", db, "--top", "3", "--json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "mlp" and out["device_type"] == "cpu" and out["cached"] is False
    assert out["ops_profiled"] > 20 and len(out["top_ops"]) == 3
    assert set(out["total_fitted_s"]) == {"2", "4"} and all(v > 0 for v in out["total_fitted_s"].values())
    assert os.path.isfile(out["db"]) and out["db"].startswith(db)
    assert main(argv) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["cached"] is True and again["total_fitted_s"] == out["total_fitted_s"]


def test_cli_errors_are_one_line(capsys):
    assert main(["profile", "--model", "mlp", "--device", "V100", "--json"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("tag-tf profile: error:") and "only devices of this machine" in err
    assert len(err.splitlines()) == 1
    assert main(["profile", "--model", "mlp", "--batch-sizes", "4"]) == 2
    assert "at least two" in capsys.readouterr().err
    assert main(["profile", "--model", "nosuchmodel", "--device", "cpu"]) == 2
    assert "unknown model" in capsys.readouterr().err
