"""The corpus: TF1 training programs written the way users write them, each trained STEPS steps plain
and through `tag_tf.distribute(strategy, topology="local:N")` from the same initial values on the same
batches; the trained variables must agree to within 10x the float32 reassociation noise floor (the
plain program trained on row-permuted batches), and at least 1e-5. BatchNorm programs run with
`exact_batch_stats=True`. Four programs also run over two server processes.

A program that cannot be distributed must fail with a clear error naming the op (README, Known limits);
none here does."""
from __future__ import annotations

import numpy as np
import pytest

from . import harness
from .programs import PROGRAMS

CONFIGS = [("dp", 2), ("dp", 4), ("auto", 2), ("auto", 4)]
AUTO_BUDGET_S = 2

# The noise floor of a program must be small enough for the comparison to mean something.
MAX_NOISE = 0.05

def _cases():
    for name in PROGRAMS:
        for strategy, devices in CONFIGS:
            yield pytest.param(name, strategy, devices, id=f"{name}-{strategy}-local:{devices}")


@pytest.mark.parametrize("name", list(PROGRAMS))
def test_program_is_well_formed(name):
    program = PROGRAMS[name]
    assert isinstance(program.BATCH_NORM, bool) and isinstance(program.STEPS, int)
    losses, values, _, noise = harness.reference(program, program.STEPS)
    assert len(losses) == program.STEPS and all(np.isfinite(losses))
    assert values, "no trainable variables"
    assert noise < MAX_NOISE, f"noise floor {noise:.3g} hides any error"


def _distribute_kwargs(name: str, strategy: str, tmp_path) -> dict:
    kwargs = dict(strategy=strategy, cache_dir=str(tmp_path))
    if strategy == "auto":
        kwargs["budget_s"] = AUTO_BUDGET_S
    if PROGRAMS[name].BATCH_NORM:
        # Per-replica statistics (the default, like MirroredStrategy) are another computation;
        # synchronized ones are the plain program's.
        kwargs["exact_batch_stats"] = True
    return kwargs


@pytest.mark.parametrize("name,strategy,devices", list(_cases()))
def test_distributed_trains_like_plain(name, strategy, devices, tmp_path):
    kwargs = _distribute_kwargs(name, strategy, tmp_path)
    diff, noise = harness.compare(PROGRAMS[name], topology=f"local:{devices}", **kwargs)
    assert harness.ok(diff, noise), (f"max_rel_diff {diff:.3g} > tolerance {harness.tolerance(noise):.3g} "
                                     f"(noise floor {noise:.3g})")


@pytest.mark.parametrize("name", [n for n, p in PROGRAMS.items() if p.BATCH_NORM])
def test_batch_norm_with_per_replica_statistics(name, tmp_path):
    """The default (each replica normalises with its own shard's statistics, like MirroredStrategy)
    trains to finite values, and measurably not like the plain program: the reason BatchNorm
    programs are compared with exact_batch_stats=True."""
    diff, noise = harness.compare(PROGRAMS[name], strategy="dp", topology="local:2", cache_dir=str(tmp_path))
    assert np.isfinite(diff) and diff > harness.tolerance(noise)


# One program of each family over two `tag-tf server`-style processes (task i = machine i).
CLUSTER_PROGRAMS = ["bert_classifier", "lstm_lm", "wide_and_deep", "layers_bn"]


@pytest.mark.parametrize("name", CLUSTER_PROGRAMS)
def test_distributed_over_two_server_processes(name, two_servers, tmp_path):
    diff, noise = harness.compare(PROGRAMS[name], cluster=two_servers, **_distribute_kwargs(name, "dp", tmp_path))
    assert harness.ok(diff, noise), (f"max_rel_diff {diff:.3g} > tolerance {harness.tolerance(noise):.3g} "
                                     f"(noise floor {noise:.3g})")
