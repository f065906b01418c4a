"""What the chief tells the other tasks of a TF_CONFIG cluster about each graph it compiles
(`roles.send_plan` / `roles.wait_for_plan`): one typed, versioned message, sent as JSON.

Modes: BETWEEN ("between-graph": every task drives its own part of each step), CHIEF (the chief
drives every step; the others serve) and LOADED (a later session of a between-graph program: the
chief has loaded its values into every copy). A task that reads a message of another version
(another tag_tf on the chief) fails with one ClusterError saying so.
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping

from tag_tf.errors import ClusterError, StrategyError, TopologyError
from tag_tf.strategy import Strategy
from tag_tf.topology.parse import topology_from_dict
from tag_tf.topology.spec import Topology

VERSION = 1
BETWEEN = "between-graph"
CHIEF = "chief"
LOADED = "loaded"
MODES = (BETWEEN, CHIEF, LOADED)


@dataclasses.dataclass(frozen=True)
class PlanMessage:
    """The chief's word on graph `graph` (its fingerprint). For BETWEEN and CHIEF: the plan
    (`strategy` on `topology`), the first run's fetches and ops, the compiled graph's digest (every
    task must compile the same one), whether TensorFlow's rewrites are off (`as_written`), the tasks
    with a part in the plan and, for CHIEF, why the chief drives every step (`reason`)."""

    mode: str
    graph: str
    strategy: Strategy | None = None
    topology: Topology | None = None
    fetches: tuple[str, ...] = ()
    run_ops: tuple[str, ...] = ()
    digest: str = ""
    as_written: bool = False
    tasks: tuple[int, ...] = ()
    reason: str = ""
    version: int = VERSION

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ClusterError(f"the chief's message: mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.mode != LOADED and (self.strategy is None or self.topology is None):
            raise ClusterError(f"the chief's {self.mode!r} message for graph {self.graph} carries no plan")

    @classmethod
    def loaded(cls, graph: str) -> PlanMessage:
        return cls(LOADED, graph)

    def to_json(self) -> str:
        data: dict[str, object] = {
            "version": self.version, "mode": self.mode, "graph": self.graph, "reason": self.reason,
            "fetches": list(self.fetches), "run_ops": list(self.run_ops), "digest": self.digest,
            "as_written": self.as_written, "tasks": list(self.tasks)}
        if self.strategy is not None:
            data["strategy"] = self.strategy.to_dict()
        if self.topology is not None:
            data["topology"] = self.topology.to_dict()
        return json.dumps(data)

    @classmethod
    def from_json(cls, text: str) -> PlanMessage:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise ClusterError(f"the chief's message is not JSON: {e}") from None
        if not isinstance(data, Mapping):
            raise ClusterError("the chief's message is not a JSON object")
        version = data.get("version")
        if version != VERSION:
            raise ClusterError(f"the chief speaks plan message version {version!r}, this task {VERSION}: run the same "
                               f"tag_tf version on every task")
        try:
            return cls(
                mode=str(data["mode"]), graph=str(data["graph"]), reason=str(data.get("reason", "")),
                strategy=(Strategy.from_dict(data["strategy"], source="the chief's plan")
                          if "strategy" in data else None),
                topology=(topology_from_dict(data["topology"], source="the chief's plan")
                          if "topology" in data else None),
                fetches=tuple(map(str, data.get("fetches", ()))), run_ops=tuple(map(str, data.get("run_ops", ()))),
                digest=str(data.get("digest", "")), as_written=bool(data.get("as_written", False)),
                tasks=tuple(int(t) for t in data.get("tasks", ())))
        except (KeyError, TypeError, ValueError, StrategyError, TopologyError) as e:
            raise ClusterError(f"the chief's message cannot be read: {type(e).__name__}: {e}") from None


__all__ = ["BETWEEN", "CHIEF", "LOADED", "MODES", "PlanMessage", "VERSION"]
