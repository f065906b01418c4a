"""What the profile database knows about a graph: the measured op profiles and calibrated cost-model
constants that planning and simulation use instead of datasheet estimates.

    stored = stored_costs(ProfileDB(), device_types, [graph.fingerprint], rebuild=fingerprint_at)
    Simulator(analysis, topology, profile=stored.profiles, cost_model=stored.model)

An op profile is keyed by the fingerprint of the graph built at the smallest profiled batch size
(`tag-tf profile`), so the graph a plan is made for, built at its own batch size, rarely has the
same fingerprint: `rebuild(batch)` gives the fingerprint of the same program at another batch size,
which is how a zoo model finds the profile measured for it at batch sizes 2..16.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence

from tag_tf.profile.costmodel import CostModel
from tag_tf.profile.costs import canonical_device_type
from tag_tf.profile.db import OpProfileKey, ProfileDB
from tag_tf.profile.op_profile import OpProfile, RuntimeFit


@dataclasses.dataclass(frozen=True)
class StoredCosts:
    """Measured profiles (at most one per device type) and the database's cost-model constants.

    A profile that also measured whole steps with and without TensorFlow's graph rewrites
    (`OpProfile.runtime_fit`) is here with its op times scaled to what they take inside whole
    steps of the runtime chosen for it (`runtimes`, per device type; `as_written`)."""

    profiles: tuple[OpProfile, ...] = ()
    model: CostModel = dataclasses.field(default_factory=CostModel)
    files: Mapping[str, str] = dataclasses.field(default_factory=dict)   # device type -> profile file
    runtimes: Mapping[str, RuntimeFit] = dataclasses.field(default_factory=dict)   # device type -> fit

    @property
    def as_written(self) -> bool:
        """Compiled graphs of this program run as written (TensorFlow's graph rewrites off): every
        profile that measured both runtimes found the rewrites slower."""
        return bool(self.runtimes) and all(fit.as_written for fit in self.runtimes.values())

    @property
    def digest(self) -> str:
        """Changes whenever what planning would use changes (a plan cache key part)."""
        doc = {"profiles": sorted(self.files.values()), "as_written": self.as_written,
               "fits": [p.fixed.sum() + p.per_sample.sum() for p in self.profiles],
               "constants": sorted(json.dumps(c.to_dict(), sort_keys=True, default=str) for c in self.model.constants)}
        return hashlib.sha256(json.dumps(doc, sort_keys=True, default=float).encode()).hexdigest()[:12]

    @property
    def empty(self) -> bool:
        return not self.profiles and not self.model.constants


def stored_costs(db: ProfileDB, device_types: Sequence[str], fingerprints: Iterable[str],
                 rebuild: Callable[[int], str] | None = None) -> StoredCosts:
    """The profiles in `db` of this graph for these device types: a stored profile matches when its
    fingerprint is one of `fingerprints`, or `rebuild(b)` (the program's fingerprint at batch size b)
    equals it at the profile's smallest batch size. Among several, the one with the most batch sizes."""
    wanted = {canonical_device_type(t) for t in device_types}
    known = set(fingerprints)
    rebuilt: dict[int, str | None] = {}

    def matches(key: OpProfileKey) -> bool:
        if key["fingerprint"] in known:
            return True
        if rebuild is None:
            return False
        b = min(key["batch_sizes"])
        if b not in rebuilt:
            try:
                rebuilt[b] = rebuild(b)
            except Exception:          # a program that cannot be built at that size has no profile there
                rebuilt[b] = None
        return rebuilt[b] == key["fingerprint"]

    best: dict[str, OpProfileKey] = {}
    for key in db.list_op_profiles():
        dt = canonical_device_type(key.get("device_type", ""))
        if dt not in wanted or not key.get("batch_sizes"):
            continue
        rank = (len(key["batch_sizes"]), max(key["batch_sizes"]))
        if dt in best and rank <= (len(best[dt]["batch_sizes"]), max(best[dt]["batch_sizes"])):
            continue
        if matches(key):
            best[dt] = key
    profiles, files, runtimes = [], {}, {}
    for dt, key in sorted(best.items()):
        prof = db.get_op_profile(key["fingerprint"], key["device_type"], key["batch_sizes"])
        if prof is not None:
            fit = prof.runtime_fit()
            if fit is not None:
                runtimes[dt] = fit
                prof = prof.scaled(fit.scale, fit.op_overhead_s)
            profiles.append(prof)
            files[dt] = db.op_profile_path(key["fingerprint"], key["device_type"], key["batch_sizes"])
    return StoredCosts(tuple(profiles), db.cost_model(), files, runtimes)


__all__ = ["StoredCosts", "stored_costs"]
