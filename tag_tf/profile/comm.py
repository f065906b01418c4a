"""The communication model: seconds for transfers and all-reduces on a topology, analytical or
fitted to measurements (`tag_tf.measure.comm` takes them on real TensorFlow servers).

Model
-----
`CommModel(topology)` predicts seconds for a point-to-point transfer and a ring all-reduce: from the
topology analytically (latency + bytes/bandwidth; ring: 2(D-1)/D * bytes / bottleneck +
2(D-1) * latency), or from fitted `SegmentedLinear` models where measured ones are given.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

from tag_tf.errors import ProfileError
from tag_tf.profile.segmented import SegmentedLinear
from tag_tf.topology.parse import topology_from_dict
from tag_tf.topology.spec import Topology

__all__ = ["CommModel", "Sample", "SegmentedLinear"]

Sample = tuple[int, float]     # (bytes, seconds)


def _fit(samples: Sequence[Sample], max_segments: int) -> SegmentedLinear:
    return SegmentedLinear.fit([b for b, _ in samples], [t for _, t in samples], max_segments=max_segments)


def _scope(topology: Topology, devices: Sequence[int]) -> str:
    machines = {topology.device(d).machine for d in devices}
    return "intra" if len(machines) == 1 else "inter"


@dataclasses.dataclass(frozen=True, eq=False)
class CommModel:
    """Seconds for transfers and all-reduces on a topology.

    Fitted models override the analytical ones where present:
      p2p_fits["intra" | "inter"]: transfers within one machine / between machines;
      allreduce_fits[f"{scope}:{D}"]: all-reduce over D devices on one machine ("intra") or spanning
      machines ("inter").
    Anything without a fit is analytical: p2p = latency + bytes / bandwidth; ring all-reduce over D
    devices = 2(D-1)/D * bytes / ring_bandwidth + 2(D-1) * ring_latency. Same device or a single
    device: 0.

    host_message_s: of a transfer's fixed time between CPU devices of two processes, the part that
    is CPU work in both processes (gRPC request handling) rather than waiting; the simulator
    serialises it with their ops. Measured on local setups; 0 elsewhere (GPU transfers are copies
    on their own engines).
    """

    topology: Topology
    p2p_fits: Mapping[str, SegmentedLinear] = dataclasses.field(default_factory=dict)
    allreduce_fits: Mapping[str, SegmentedLinear] = dataclasses.field(default_factory=dict)
    host_message_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("p2p_fits", "allreduce_fits"):
            object.__setattr__(self, name, MappingProxyType(dict(getattr(self, name))))
        for key in self.p2p_fits:
            if key not in ("intra", "inter"):
                raise ProfileError(f"comm model: p2p fit key must be 'intra' or 'inter', got {key!r}")
        if not (math.isfinite(self.host_message_s) and self.host_message_s >= 0):
            raise ProfileError(f"comm model: host_message_s must be finite and >= 0, got {self.host_message_s}")
        for key in self.allreduce_fits:
            scope, _, d = key.partition(":")
            if scope not in ("intra", "inter") or not d.isdigit() or int(d) < 2:
                raise ProfileError(f"comm model: all-reduce fit key must look like 'intra:4', "
                                   f"got {key!r}")

    def p2p(self, nbytes: float, src: int, dst: int) -> float:
        if src == dst:
            self.topology.device(src)
            return 0.0
        fit = self.p2p_fits.get(_scope(self.topology, (src, dst)))
        if fit is not None:
            return float(fit.predict(nbytes))
        return self.topology.latency(src, dst) + nbytes / self.topology.bandwidth(src, dst)

    def allreduce(self, nbytes: float, devices: Sequence[int]) -> float:
        ring = self.topology.ring_order(devices)
        d = len(ring)
        if d == 1:
            return 0.0
        fit = self.allreduce_fits.get(f"{_scope(self.topology, ring)}:{d}")
        if fit is not None:
            return float(fit.predict(nbytes))
        bw = self.topology.ring_bandwidth(ring)
        return 2 * (d - 1) / d * nbytes / bw + 2 * (d - 1) * self.topology.ring_latency(ring)

    @classmethod
    def from_measurements(cls, topology: Topology, p2p: Sequence[Sample] | None = None,
                          allreduce: Mapping[int, Sequence[Sample]] | None = None,
                          scope: str = "intra", max_segments: int = 3) -> CommModel:
        """Fit SegmentedLinear models to measured (bytes, seconds) samples and file them under
        `scope` ("intra" for the local topology: all its devices are on one machine)."""
        if scope not in ("intra", "inter"):
            raise ProfileError(f"comm model: scope must be 'intra' or 'inter', got {scope!r}")
        p2p_fits, ar_fits = {}, {}
        if p2p:
            p2p_fits[scope] = _fit(p2p, max_segments)
        for d, samples in (allreduce or {}).items():
            ar_fits[f"{scope}:{int(d)}"] = _fit(samples, max_segments)
        return cls(topology, p2p_fits, ar_fits)

    def to_dict(self) -> dict:
        return {"fingerprint": self.topology.fingerprint, "topology": self.topology.to_dict(),
                "p2p": {k: f.to_dict() for k, f in self.p2p_fits.items()},
                "allreduce": {k: f.to_dict() for k, f in self.allreduce_fits.items()},
                "host_message_s": self.host_message_s}

    @classmethod
    def from_dict(cls, d: Mapping, topology: Topology | None = None) -> CommModel:
        """Rebuild; with `topology` given, the stored fingerprint must match it."""
        try:
            topo = topology if topology is not None else topology_from_dict(d["topology"])
            if d.get("fingerprint") not in (None, topo.fingerprint):
                raise ProfileError(f"comm model: profiled for topology {d['fingerprint']}, "
                                   f"not {topo.name!r} ({topo.fingerprint})")
            return cls(topo, {k: SegmentedLinear.from_dict(v) for k, v in d["p2p"].items()},
                       {k: SegmentedLinear.from_dict(v) for k, v in d["allreduce"].items()},
                       float(d.get("host_message_s", 0.0)))
        except (KeyError, TypeError, AttributeError, ValueError) as e:
            raise ProfileError(f"comm model: malformed dict ({e!r})") from None

