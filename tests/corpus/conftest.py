"""Fixtures shared by the corpus tests."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def two_servers():
    """Two local `tag-tf server`-style processes (task i = machine i), one per test module."""
    from tag_tf.runtime.cluster import local_cluster

    with local_cluster(2, 1) as (spec, _):
        yield spec
