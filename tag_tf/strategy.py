"""A deployment strategy: for each op group, where it runs (placement P) and how (option O).

The paper's P is a groups x device-groups 0/1 matrix and O a one-hot option per group; we store the
devices explicitly so a group can be replicated on any subset of devices ("partial replication"),
and per-device batch shares so replicas can take uneven parts of the batch (e.g. by device speed).
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, TypedDict, Unpack

import numpy as np

from tag_tf.errors import StrategyError

if TYPE_CHECKING:
    from tag_tf.topology.spec import Topology


class Option(enum.Enum):
    ALLREDUCE = "allreduce"      # replicate, batch split; gradients synchronised with AllReduce
    PS = "ps"                    # replicate, batch split; variables on a parameter server (round-robin)
    DUPLICATE = "duplicate"      # copy to every device with the whole batch; no gradient sync needed
    MODEL_PARALLEL = "mp"        # split the group's ops across the devices (METIS), no replication

    @classmethod
    def parse(cls, value: str) -> Option:
        aliases = {"ar": "allreduce", "all-reduce": "allreduce", "dup": "duplicate",
                   "model-parallel": "mp", "model_parallel": "mp"}
        key = aliases.get(str(value).lower(), str(value).lower())
        try:
            return cls(key)
        except ValueError:
            raise StrategyError(f"unknown option {value!r} (expected one of "
                                f"{', '.join(o.value for o in cls)})") from None


@dataclasses.dataclass(frozen=True)
class GroupPlan:
    devices: tuple[int, ...]     # topology device ids, in replica order
    option: Option

    def to_dict(self) -> dict[str, object]:
        return {"devices": list(self.devices), "option": self.option.value}


@dataclasses.dataclass(frozen=True)
class SfbCut:
    """Sufficient factor broadcasting for one gradient (paper: "Sufficient Factor Broadcasting").

    Instead of synchronising `gradient` (AllReduce or PS), the planned ops `ops` -- the gradient's
    producer and the private subgraph feeding it -- run duplicated on every device of their
    replicated group, each on the whole batch: their inputs (the sufficient factors, e.g. the
    activations and back-propagated errors of a dense layer) are gathered to every device, and each
    device computes the full gradient itself.
    """
    gradient: str                 # the gradient tensor whose synchronisation this replaces
    ops: tuple[str, ...]          # planned ops run duplicated (producer of `gradient` included)
    saving_s: float = 0.0         # predicted saving per iteration (seconds): the SFB MILP's; in pieces, the simulator's
    # Partial sums the duplicated ops read, each all-reduced on its own where the backward pass
    # produces it: a gradient summed from several partial sums is then synchronised in pieces (a
    # tied embedding: the output layer's dense gradient all-reduced as soon as it is computed,
    # overlapping the rest of the backward pass, while the lookup's is rebuilt from its rows).
    # Only partial sums of a group replicated with allreduce on the devices of the duplicated ops
    # reading them (placement.layout.validated_duplicates). Empty: they read no partial sum.
    allreduced: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {"gradient": self.gradient, "ops": list(self.ops), "saving_s": self.saving_s,
                **({"allreduced": list(self.allreduced)} if self.allreduced else {})}


class StrategyOptions(TypedDict, total=False):
    """The fields of a Strategy besides its groups, shares and topology fingerprint (`Strategy.from_matrix`)."""

    graph: str | None
    name: str
    fusion_bytes: int | None
    sync_after_backward: bool
    op_groups: tuple[int, ...] | None
    sfb: tuple[SfbCut, ...]
    microbatches: int
    ordered_links: tuple[tuple[int, int], ...]


class UniformOptions(StrategyOptions, total=False):
    """`Strategy.uniform`'s: the topology fingerprint too."""

    topology: str | None


class JsonLayout(TypedDict, total=False):
    """How `Strategy.to_json` lays the file out (json.dumps's options of the same names)."""

    indent: int | str | None
    separators: tuple[str, str] | None
    sort_keys: bool
    ensure_ascii: bool


@dataclasses.dataclass(frozen=True)
class Strategy:
    groups: tuple[GroupPlan, ...]
    shares: tuple[float, ...] | None = None   # per topology device; None = even split
    graph: str | None = None                   # fingerprint of the graph it was made for
    topology: str | None = None                # fingerprint of the topology it was made for
    name: str = ""
    # Gradient fusion: AllReduce partial sums over the same devices are packed into buckets of at
    # most this many bytes (Horovod's Tensor Fusion); None = one collective per tensor (the paper's
    # DP-NCCL). See tag_tf/placement/fusion.py.
    fusion_bytes: int | None = None
    # All-reduces of gradients start only once the backward pass has produced every gradient of
    # their sync level on the device (a barrier): DP-NCCL as the paper measured it, in-graph
    # replication whose batch all-reduce waits for the whole backward pass. False: each collective
    # starts as soon as its bucket is ready, overlapping the rest of the backward pass (Horovod, and
    # every plan the search makes).
    sync_after_backward: bool = False
    # The op groups this plan was made for, when not the analysis's METIS groups: the group id of
    # each planned op, in the planning graph's order (search/refine.py splits dominant groups).
    # None: the groups analysis makes.
    op_groups: tuple[int, ...] | None = None
    # Op-level duplication chosen by the SFB solver (tag_tf/search/sfb.py), one entry per gradient
    # whose synchronisation it replaces. Empty: none.
    sfb: tuple[SfbCut, ...] = ()
    # Pipelining (GPipe): each group's part of the batch runs as this many micro-batches, in order,
    # one after the other on each of its devices; groups on different devices are pipeline stages
    # (micro-batch m of a stage starts once the stage before has finished m, while that stage goes
    # on with m + 1). Gradients are summed over the micro-batches on each device, then synchronised
    # once per step as the group's option says. 1: the whole part at once (no pipelining).
    microbatches: int = 1
    # Pipelined plans: machine pairs (sender, receiver) whose micro-batched transfers go in
    # micro-batch order (compiler/transfers.py): micro-batch m + 1's leave once micro-batch m's
    # have arrived. The pipeline search names the links slow enough that sending every micro-batch
    # at once keeps the next stage waiting (search/stages.ordered_links). Empty: sent when ready.
    ordered_links: tuple[tuple[int, int], ...] = ()

    @property
    def duplicated_ops(self) -> frozenset[str]:
        """Planned ops that run duplicated on their group's devices (sufficient factor broadcasting)."""
        return frozenset(op for cut in self.sfb for op in cut.ops)

    @property
    def whole_replicas(self) -> bool:
        """Every group replicated with AllReduce on the same devices, no op duplicated (SFB): each of
        those devices holds a whole replica of the model and the replicas meet only in collectives.
        Only such a plan lets every task of a cluster drive its own part of each step
        (compiler/localize: between-graph execution); any other edge between tasks needs one driver."""
        first = self.groups[0].devices if self.groups else ()
        # (Pipelined plans, micro-batched whole replicas included, run with one driver for now.)
        return not self.sfb and self.microbatches == 1 and all(g.option is Option.ALLREDUCE and g.devices == first for g in self.groups)

    def machines(self, topology: Topology) -> frozenset[int]:
        """The machines (tasks of a cluster) this plan places work on."""
        return frozenset(topology.devices[d].machine for g in self.groups for d in g.devices)

    def with_sfb_cuts(self, cuts: Sequence[SfbCut]) -> Strategy:
        return dataclasses.replace(self, sfb=tuple(cuts))

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def uniform(cls, num_groups: int, devices: Sequence[int], option: Option = Option.ALLREDUCE,
                shares: Sequence[float] | None = None, **kw: Unpack[UniformOptions]) -> Strategy:
        plan = GroupPlan(tuple(devices), option)
        return cls(tuple(plan for _ in range(num_groups)), None if shares is None else tuple(shares), **kw)

    @classmethod
    def from_matrix(cls, placement: np.ndarray, options: Sequence[Option], topology: Topology,
                    shares: Sequence[float] | None = None, **kw: Unpack[StrategyOptions]) -> Strategy:
        """The paper's form: placement[i, j] = 1 if group i uses device group j."""
        placement = np.asarray(placement)
        groups = []
        for i, opt in enumerate(options):
            devices = tuple(d for j in np.flatnonzero(placement[i]) for d in topology.groups[j].devices)
            groups.append(GroupPlan(devices, opt))
        return cls(tuple(groups), None if shares is None else tuple(shares), **kw)

    # -- JSON ---------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        return {"format": "tag_tf.strategy/1", "name": self.name, "graph": self.graph,
                "topology": self.topology, "shares": None if self.shares is None else list(self.shares),
                "fusion_bytes": self.fusion_bytes, "sync_after_backward": self.sync_after_backward,
                "groups": [g.to_dict() for g in self.groups],
                **({} if self.op_groups is None else {"op_groups": list(self.op_groups)}),
                **({"sfb": [c.to_dict() for c in self.sfb]} if self.sfb else {}),
                **({"microbatches": self.microbatches} if self.microbatches != 1 else {}),
                **({"ordered_links": [list(p) for p in self.ordered_links]} if self.ordered_links else {})}

    def to_json(self, **kw: Unpack[JsonLayout]) -> str:
        return json.dumps(self.to_dict(), **kw)

    @classmethod
    def from_dict(cls, d: object, source: str = "strategy") -> Strategy:
        if not isinstance(d, dict) or "groups" not in d:
            raise StrategyError(f"{source}: not a strategy (expected an object with 'groups')")
        groups = []
        for i, g in enumerate(d["groups"]):
            if not isinstance(g, dict) or "devices" not in g or "option" not in g:
                raise StrategyError(f"{source}: group {i} needs 'devices' and 'option'")
            devices = g["devices"]
            if not isinstance(devices, list) or not all(isinstance(x, int) for x in devices):
                raise StrategyError(f"{source}: group {i}: 'devices' must be a list of device ids")
            try:
                option = Option.parse(g["option"])
            except StrategyError as e:
                raise StrategyError(f"{source}: group {i}: {e}") from None
            groups.append(GroupPlan(tuple(devices), option))
        shares = d.get("shares")
        if shares is not None and (not isinstance(shares, list) or
                                   not all(isinstance(x, (int, float)) for x in shares)):
            raise StrategyError(f"{source}: 'shares' must be a list of numbers")
        fusion = d.get("fusion_bytes")
        if fusion is not None and (isinstance(fusion, bool) or not isinstance(fusion, int) or fusion < 0):
            raise StrategyError(f"{source}: 'fusion_bytes' must be a non-negative integer or null, got {fusion!r}")
        barrier = d.get("sync_after_backward", False)       # absent in files older than the field
        if not isinstance(barrier, bool):
            raise StrategyError(f"{source}: 'sync_after_backward' must be true or false, got {barrier!r}")
        op_groups = d.get("op_groups")                      # absent unless groups were refined
        if op_groups is not None:
            if (not isinstance(op_groups, list) or not all(isinstance(x, int) and not isinstance(x, bool)
                                                           for x in op_groups)):
                raise StrategyError(f"{source}: 'op_groups' must be a list of group ids, one per planned op")
            op_groups = tuple(op_groups)
        sfb = _parse_sfb(d.get("sfb", []), source)           # absent in files older than SFB
        micro = d.get("microbatches", 1)                      # absent unless pipelined
        if isinstance(micro, bool) or not isinstance(micro, int) or micro < 1:
            raise StrategyError(f"{source}: 'microbatches' must be a positive integer, got {micro!r}")
        links = d.get("ordered_links", [])                    # absent unless a pipeline orders its transfers
        if not isinstance(links, list) or not all(
                isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0
                                                            for x in p) for p in links):
            raise StrategyError(f"{source}: 'ordered_links' must be a list of [sender, receiver] machine ids, "
                                f"got {links!r}")
        return cls(tuple(groups), None if shares is None else tuple(float(x) for x in shares),
                   d.get("graph"), d.get("topology"), d.get("name", ""), fusion, barrier, op_groups, sfb, micro,
                   tuple((int(a), int(b)) for a, b in links))

    @classmethod
    def load(cls, path: str) -> Strategy:
        from tag_tf.datafiles import PLAN_FILE_LIMIT, read_text

        text = read_text(path, "strategy", PLAN_FILE_LIMIT, StrategyError)
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise StrategyError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        return cls.from_dict(data, source=path)

    def save(self, path: str) -> None:
        with open(path, "w") as f:
            f.write(self.to_json(indent=1))

    @property
    def fingerprint(self) -> str:
        return hashlib.sha256(self.to_json(sort_keys=True).encode()).hexdigest()[:16]

    # -- checks -------------------------------------------------------------------------------
    def validate(self, num_groups: int, num_devices: int, graph: str | None = None,
                 topology: str | None = None) -> None:
        """Raise StrategyError naming the group/device when the strategy does not fit."""
        if graph and self.graph and graph != self.graph:
            raise StrategyError(f"strategy was made for graph {self.graph}, not this graph ({graph})")
        if topology and self.topology and topology != self.topology:
            raise StrategyError(f"strategy was made for topology {self.topology}, not this one ({topology})")
        if self.op_groups is not None:           # its own groups: checked against the graph by Analysis.for_strategy
            used = set(self.op_groups)
            if used != set(range(len(self.groups))):
                raise StrategyError(f"op_groups uses groups {sorted(used)[:5]}... but the strategy plans "
                                    f"groups 0..{len(self.groups) - 1}: every group needs ops and a plan")
        elif len(self.groups) != num_groups:
            raise StrategyError(f"strategy has {len(self.groups)} groups but the graph has {num_groups}")
        for i, g in enumerate(self.groups):
            if not g.devices:
                raise StrategyError(f"group {i}: no devices")
            if len(set(g.devices)) != len(g.devices):
                raise StrategyError(f"group {i}: a device appears twice in {list(g.devices)}")
            for d in g.devices:
                if not 0 <= d < num_devices:
                    raise StrategyError(f"group {i}: device {d} does not exist "
                                        f"(the topology has devices 0..{num_devices - 1})")
        _check_cuts(self.sfb)
        if isinstance(self.microbatches, bool) or not isinstance(self.microbatches, int) or self.microbatches < 1:
            raise StrategyError(f"microbatches must be a positive integer, got {self.microbatches!r}")
        if self.microbatches > 1 and self.sfb:
            raise StrategyError("a pipelined plan (microbatches > 1) cannot also duplicate ops (sfb): "
                                "sufficient factor broadcasting is not micro-batched yet")
        if self.shares is not None:
            if len(self.shares) != num_devices:
                raise StrategyError(f"shares has {len(self.shares)} entries but the topology has "
                                    f"{num_devices} devices")
            for d, s in enumerate(self.shares):
                if not s > 0:
                    raise StrategyError(f"device {d}: batch share must be positive, got {s}")

    def share_weights(self, devices: Iterable[int]) -> tuple[float, ...]:
        return tuple(1.0 if self.shares is None else float(self.shares[d]) for d in devices)


def _parse_sfb(items: object, source: str) -> tuple[SfbCut, ...]:
    if not isinstance(items, list):
        raise StrategyError(f"{source}: 'sfb' must be a list of {{gradient, ops, saving_s}} objects")
    cuts = []
    for i, item in enumerate(items):
        if not isinstance(item, dict) or not isinstance(item.get("gradient"), str) or not item["gradient"]:
            raise StrategyError(f"{source}: sfb[{i}] needs a 'gradient' tensor name")
        ops = item.get("ops")
        if not isinstance(ops, list) or not ops or not all(isinstance(o, str) and o for o in ops):
            raise StrategyError(f"{source}: sfb[{i}] ({item['gradient']}): 'ops' must be a non-empty list "
                                "of op names")
        saving = item.get("saving_s", 0.0)
        if isinstance(saving, bool) or not isinstance(saving, (int, float)) or not math.isfinite(saving):
            raise StrategyError(f"{source}: sfb[{i}] ({item['gradient']}): 'saving_s' must be a finite number")
        if len(set(ops)) != len(ops):
            raise StrategyError(f"{source}: sfb[{i}] ({item['gradient']}): an op is listed twice in 'ops'")
        synced = item.get("allreduced", [])                # absent unless the gradient is synced in pieces
        if not isinstance(synced, list) or not all(isinstance(t, str) and t for t in synced):
            raise StrategyError(f"{source}: sfb[{i}] ({item['gradient']}): 'allreduced' must be a list of "
                                "tensor names")
        if len(set(synced)) != len(synced):
            raise StrategyError(f"{source}: sfb[{i}] ({item['gradient']}): a tensor is listed twice in 'allreduced'")
        cuts.append(SfbCut(item["gradient"], tuple(ops), float(saving), tuple(synced)))
    try:
        _check_cuts(cuts)
    except StrategyError as e:
        raise StrategyError(f"{source}: {e}") from None
    return tuple(cuts)


def _check_cuts(cuts: Sequence[SfbCut]) -> None:
    """Each op is duplicated for one gradient only."""
    seen: dict[str, str] = {}
    for cut in cuts:
        for op in cut.ops:
            if op in seen and seen[op] != cut.gradient:
                raise StrategyError(f"op {op!r} is duplicated for two gradients ({seen[op]} and {cut.gradient})")
            seen[op] = cut.gradient


def split_counts(total: int, weights: Sequence[float]) -> tuple[int, ...]:
    """Split `total` samples by `weights` (largest remainder), every part at least 1."""
    n = len(weights)
    if total < n:
        raise StrategyError(f"batch size {total} is smaller than the {n} replicas it is split over")
    w = np.asarray(weights, dtype=float)
    w = w / w.sum()
    spare = total - n                        # one sample each first, the rest by weight
    raw = w * spare
    counts = np.floor(raw).astype(int)
    order = np.argsort(-(raw - counts), kind="stable")
    counts[order[: spare - counts.sum()]] += 1
    return tuple(int(c) + 1 for c in counts)
