"""Typed options (`DistributeOptions`) checked once, one error naming each bad field, and the typed,
versioned message the chief sends the other tasks (`PlanMessage`)."""
from __future__ import annotations

import dataclasses
import json

import pytest

import tag_tf
from tag_tf.errors import ClusterError, OptionsError, StrategyError
from tag_tf.frontend.options import DistributeOptions
from tag_tf.runtime.plan_message import BETWEEN, LOADED, VERSION, PlanMessage
from tag_tf.strategy import Option, Strategy
from tag_tf.topology import load_topology


@pytest.mark.parametrize("field, value, says", [
    ("strategy", 3, "expected a strategy name"),
    ("topology", 4.0, "expected a preset name"),
    ("cluster", 7, "expected 'tf_config', a cluster file"),
    ("cache_dir", 1, "expected a directory path"),
    ("budget_s", -1, "seconds >= 0"),
    ("budget_s", float("nan"), "seconds >= 0"),
    ("budget_s", True, "seconds >= 0"),
    ("verify", "yes", "expected True or False"),
    ("sfb", 1, "expected True or False"),
    ("fallback", "maybe", "expected one of 'error', 'single'"),
    ("calibration", "/no/such/calibration.json", "neither 'default', 'nominal' nor an existing"),
    ("calibration", 2, "expected 'default', 'nominal'"),
])
def test_each_bad_option_is_named_once(field, value, says):
    with pytest.raises(OptionsError, match=says) as caught:
        DistributeOptions(**{field: value})
    assert caught.value.field == field and f"({field}=...)" in str(caught.value)
    with pytest.raises(OptionsError, match=says):           # distribute and the Estimator wrapper: the same check
        tag_tf.distribute(**{field: value})
    with pytest.raises(OptionsError, match=says):
        tag_tf.estimator.distributed(object(), **{field: value})


def test_good_options_pass_and_replace_is_checked_again():
    opts = DistributeOptions(strategy="dp", topology="local:2", budget_s=5, calibration="nominal", sfb=False)
    assert opts.as_kwargs()["strategy"] == "dp" and tag_tf.distribute(**opts.as_kwargs()).options == opts
    with pytest.raises(OptionsError, match="budget_s"):
        dataclasses.replace(opts, budget_s=-2.0)
    with pytest.raises(StrategyError, match="nope"):         # an unknown name says which names there are
        DistributeOptions(strategy="nope")


def _plan_message() -> PlanMessage:
    topology = load_topology("local:2")
    strategy = Strategy.uniform(3, (0, 1), Option.ALLREDUCE, name="dp")
    return PlanMessage(BETWEEN, "g123", strategy, topology, ("loss:0",), ("train",), "d1", True, (0, 1))


def test_the_chiefs_message_round_trips_typed():
    message = _plan_message()
    back = PlanMessage.from_json(message.to_json())
    assert back == dataclasses.replace(message, topology=back.topology)
    assert back.topology is not None and back.topology.to_dict() == message.topology.to_dict()
    assert back.strategy == message.strategy and back.tasks == (0, 1) and back.as_written
    assert PlanMessage.from_json(PlanMessage.loaded("g123").to_json()).mode == LOADED


def test_a_message_of_another_version_or_shape_is_refused_in_one_line():
    data = json.loads(_plan_message().to_json())
    with pytest.raises(ClusterError, match=f"version 0, this task {VERSION}: run the same tag_tf"):
        PlanMessage.from_json(json.dumps({**data, "version": 0}))
    with pytest.raises(ClusterError, match="mode 'later' is not one of"):
        PlanMessage.from_json(json.dumps({**data, "mode": "later"}))
    with pytest.raises(ClusterError, match="carries no plan"):
        PlanMessage.from_json(json.dumps({k: v for k, v in data.items() if k != "strategy"}))
    with pytest.raises(ClusterError, match="cannot be read"):
        PlanMessage.from_json(json.dumps({k: v for k, v in data.items() if k != "graph"}))
    with pytest.raises(ClusterError, match="not JSON"):
        PlanMessage.from_json("{")
