"""The vocabulary of replication semantics shared by the analyzer, compiler and simulator.

When an op is replicated over several devices, each replica processes a share of the batch. Each of
its output tensors then holds, on each replica, one of:

- FULL:    the whole original value (identical copies: weights, hyper-parameters, aggregated grads);
- SPLIT:   a shard of the original value along the batch axis (`axis`, `mult` rows per sample),
           recovered by concatenating the shards in replica order;
- PARTIAL: a summand of the original value (weight gradients), recovered by summing the replicas;
- LOCAL:   the value the original op would compute if the graph were run on the shard alone —
           batch-size-dependent integers such as Shape/Range of a batch tensor, local row indices.
           It is never concatenated or summed: the compiler recomputes it for the layout at hand.

`OpAnnotation.requires` gives, per input, the state the op needs when it is replicated; a compiler
inserts a conversion wherever a producer's state differs (Split, Concat, AddN, AllReduce, recompute).
"""
from __future__ import annotations

import dataclasses
import enum


class Kind(enum.Enum):
    FULL = "full"
    SPLIT = "split"
    PARTIAL = "partial"
    LOCAL = "local"


class Category(enum.Enum):
    """The paper's three categories."""

    CONCAT = "concat"    # splittable with concatenation
    SUM = "sum"          # splittable with element-wise summation
    OTHER = "other"      # needs full tensors (or does not touch the batch at all)


@dataclasses.dataclass(frozen=True, slots=True)
class State:
    kind: Kind
    axis: int = -1     # batch axis (SPLIT, and LOCAL tensors that have one)
    mult: int = 1      # rows per sample along `axis`

    def __str__(self) -> str:
        if self.kind is Kind.SPLIT or (self.kind is Kind.LOCAL and self.axis >= 0):
            k = f"x{self.mult}" if self.mult != 1 else ""
            return f"{self.kind.value}@{self.axis}{k}"
        return self.kind.value


FULL = State(Kind.FULL)
PARTIAL = State(Kind.PARTIAL)
LOCAL = State(Kind.LOCAL)


def split(axis: int, mult: int = 1) -> State:
    return State(Kind.SPLIT, axis, mult)


def local(axis: int = -1, mult: int = 1) -> State:
    return State(Kind.LOCAL, axis, mult)


class Flag(str, enum.Enum):
    SOURCE = "source"              # batch input (Placeholder/iterator): fed once, split downstream
    MEAN_SCALE = "mean_scale"      # Mean over the batch axis: replica result is scaled by n_i/N
    BATCH_STATS = "batch_stats"    # BatchNorm with per-replica statistics (data-parallel convention)
    SLICE_CONST = "slice_const"    # a Const whose value has a batch dim: each replica gets its rows
    LOCAL_CONST = "local_const"    # an int Const holding the batch size: rewritten per replica
    RANDOM = "random"              # replicas draw different random numbers than the original
    UNCLASSIFIED = "unclassified"  # no rule knew this op: treated conservatively (needs full inputs)


@dataclasses.dataclass(frozen=True, slots=True)
class OpAnnotation:
    category: Category
    outputs: tuple[State, ...]     # state of each output when the op is replicated (data parallel)
    requires: tuple[State, ...]    # state each input must be in when the op is replicated
    rule: str                      # the rule that decided (for explanations and reports)
    flags: frozenset[Flag] = frozenset()

    @property
    def split_axis(self) -> int | None:
        """The batch axis of the first split output (the paper's 'which axis' for concat ops)."""
        for s in self.outputs:
            if s.kind is Kind.SPLIT:
                return s.axis
        return None
