"""The strategy creator's heterogeneous GNN (the paper's "Heterogeneous GNN"): priors for MCTS.

One graph joins the op groups and the device groups (homogeneous GPUs of a machine):

    op  --flow-->   op     tensor bytes between the groups per iteration
    dev --link-->   dev    bandwidth between the device groups
    op  --placed--> dev    the decided groups' placements (and dev --hosts--> op back)

Features (the paper's table): op group — compute time, parameter bytes, decided / next flags, the
chosen option, the share of devices used, and runtime feedback from the simulation of the vertex's
leaf plan (makespan, idle time before output transfer); device group — GPU count, memory, intra-group
bandwidth, peak FLOP/s, and feedback (idle fraction, peak memory fraction).

Linear encoders lift both node types to WIDTH; LAYERS attention layers (GATv2 with edge features
and HEADS heads per edge type) each sum the messages of every edge type into a node with weight
gamma = 1 for edges from the same node type and 0.1 across; a thin decoder scores every candidate
action of the next group from [next group, mean of the action's device groups, option], softmax ->
priors. Nothing depends on the number of groups or devices: one set of weights serves any graph
and topology.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from torch import nn
from torch_geometric.data import HeteroData
from torch_geometric.nn import GATv2Conv

from tag_tf.strategy import GroupPlan, Option

if TYPE_CHECKING:
    from tag_tf.sim.simulator import SimReport, Simulator
    from tag_tf.topology.spec import Topology

WIDTH = 64
HEADS = 4
LAYERS = 4
OPTIONS = (Option.ALLREDUCE, Option.PS, Option.DUPLICATE, Option.MODEL_PARALLEL)
OP_FEATURES = 11
DEV_FEATURES = 6
EDGE_TYPES = (("op", "flow", "op"), ("dev", "link", "dev"), ("op", "placed", "dev"), ("dev", "hosts", "op"))


def gamma(edge_type: tuple[str, str, str]) -> float:
    """Weight of an edge type's messages: 1 between nodes of one type, 0.1 across types."""
    return 1.0 if edge_type[0] == edge_type[2] else 0.1


class StrategyGNN(nn.Module):
    def __init__(self, width: int = WIDTH, heads: int = HEADS, layers: int = LAYERS):
        super().__init__()
        self.encode = nn.ModuleDict({"op": nn.Linear(OP_FEATURES, width), "dev": nn.Linear(DEV_FEATURES, width)})
        self.layers = nn.ModuleList()
        for _ in range(layers):
            self.layers.append(nn.ModuleDict({
                "__".join(et): GATv2Conv(width, width // heads, heads=heads, edge_dim=1, add_self_loops=False)
                for et in EDGE_TYPES}))
        self.norms = nn.ModuleList(nn.ModuleDict({t: nn.LayerNorm(width) for t in ("op", "dev")})
                                   for _ in range(layers))
        # Decoder input: next group, the action's device groups, option one-hot, share of all devices.
        self.decode = nn.Sequential(nn.Linear(2 * width + len(OPTIONS) + 1, width), nn.ReLU(), nn.Linear(width, 1))

    def embed(self, data: HeteroData) -> dict[str, torch.Tensor]:
        h = {t: torch.relu(self.encode[t](data[t].x)) for t in ("op", "dev")}
        for convs, norms in zip(cast("list[nn.ModuleDict]", self.layers), cast("list[nn.ModuleDict]", self.norms)):
            out = {t: torch.zeros_like(h[t]) for t in h}
            for et in EDGE_TYPES:
                store = data[et]
                if store.edge_index.shape[1] == 0:
                    continue
                src, _, dst = et
                msg = convs["__".join(et)]((h[src], h[dst]), store.edge_index, store.edge_attr)
                out[dst] = out[dst] + gamma(et) * msg
            h = {t: norms[t](h[t] + torch.relu(out[t])) for t in h}
        return h

    def forward(self, data: HeteroData, next_group: int, action_mask: torch.Tensor,
                action_option: torch.Tensor) -> torch.Tensor:
        """Log-priors of the actions: `action_mask` [A, device groups] (the share of each device
        group an action uses), `action_option` [A, len(OPTIONS) + 1]: option one-hot and the share
        of all devices the action uses (the mask's mean embedding alone cannot tell one GPU of a
        group from all of them)."""
        h = self.embed(data)
        weights = action_mask / action_mask.sum(dim=1, keepdim=True).clamp_min(1e-9)
        devs = weights @ h["dev"]
        group = h["op"][next_group].expand(len(action_mask), -1)
        scores = self.decode(torch.cat([group, devs, action_option], dim=1)).squeeze(1)
        return torch.log_softmax(scores, dim=0)


class GraphFeatures:
    """The static parts of the heterogeneous graph of one analysis on one topology, built once per
    search; `data(prefix, leaf_report)` adds the decisions and the runtime feedback."""

    def __init__(self, sim: Simulator, topology: Topology, actions: Sequence[GroupPlan], order: Sequence[int]):
        self.topology = topology
        self.actions = list(actions)
        self.order = list(order)
        groups = sim.analysis.grouping.groups
        self.num_groups = len(groups)
        compute = np.array([g.compute for g in groups], dtype=np.float64)
        self.compute = compute
        self.params = np.array([g.param_bytes for g in groups], dtype=np.float64)
        grouping = sim.analysis.grouping
        edges = np.asarray(grouping.edges, dtype=np.int64).reshape(-1, 2)
        keep = edges[:, 0] != edges[:, 1] if len(edges) else np.zeros(0, dtype=bool)
        self.flow_index = torch.as_tensor(edges[keep].T.copy(), dtype=torch.long).reshape(2, -1)
        self.flow_attr = torch.as_tensor(np.log1p(np.asarray(grouping.edge_bytes, dtype=np.float64)[keep] / 2**20),
                                         dtype=torch.float32).reshape(-1, 1)
        dgroups = topology.groups
        self.dev_group_of = np.array([topology.group_of(d.id).id for d in topology.devices])
        dev_x = []
        for g in dgroups:
            t = topology.gpu_type(g.type)
            intra = _intra_bandwidth(topology, g.devices)
            dev_x.append([len(g.devices) / 8.0, topology.devices[g.devices[0]].memory_bytes / 2**35,
                          math.log1p(intra / 1e9), t.peak_flops / 1e13])
        self.dev_static = np.array(dev_x, dtype=np.float64)
        src, dst, attr = [], [], []
        for a in dgroups:
            for b in dgroups:
                if a.id != b.id:
                    src.append(a.id)
                    dst.append(b.id)
                    attr.append(math.log1p(_bandwidth(topology, a.devices[0], b.devices[0]) / 1e9))
        self.link_index = torch.tensor([src, dst], dtype=torch.long).reshape(2, -1)
        self.link_attr = torch.tensor(attr, dtype=torch.float32).reshape(-1, 1)
        mask = np.zeros((len(self.actions), len(dgroups)))
        option = np.zeros((len(self.actions), len(OPTIONS) + 1))
        for i, act in enumerate(self.actions):
            for d in act.devices:
                mask[i, self.dev_group_of[d]] += 1.0 / len(dgroups[self.dev_group_of[d]].devices)
            option[i, OPTIONS.index(act.option)] = 1.0
            option[i, -1] = len(act.devices) / topology.num_devices
        self.action_mask = torch.as_tensor(mask, dtype=torch.float32)
        self.action_option = torch.as_tensor(option, dtype=torch.float32)

    def data(self, prefix: Sequence[int], report: SimReport | None = None) -> HeteroData:
        n, ndev = self.num_groups, len(self.topology.groups)
        total = max(self.compute.sum(), 1e-12)
        x = np.zeros((n, OP_FEATURES))
        x[:, 0] = np.log1p(self.compute / total * n)
        x[:, 1] = np.log1p(self.params / 2**20)
        placed_src, placed_dst = [], []
        for depth, a in enumerate(prefix):
            g = self.order[depth]
            act = self.actions[a]
            x[g, 2] = 1.0
            x[g, 4 + OPTIONS.index(act.option)] = 1.0
            x[g, 8] = len(act.devices) / self.topology.num_devices
            for dg in sorted({int(self.dev_group_of[d]) for d in act.devices}):
                placed_src.append(g)
                placed_dst.append(dg)
        if len(prefix) < n:
            x[self.order[len(prefix)], 3] = 1.0
        dev = np.zeros((ndev, DEV_FEATURES))
        dev[:, :4] = self.dev_static
        if report is not None:
            t = max(report.iteration_time_s, 1e-12)
            x[:, 9] = np.asarray(report.group_makespan, dtype=np.float64)[:n] / t
            x[:, 10] = np.asarray(report.group_out_wait, dtype=np.float64)[:n] / t
            idle = np.asarray(report.device_idle, dtype=np.float64)
            peak = np.asarray(report.peak_memory_bytes, dtype=np.float64) / np.maximum(
                np.asarray(report.capacity_bytes, dtype=np.float64), 1.0)
            for gid in range(ndev):
                members = self.dev_group_of == gid
                dev[gid, 4] = idle[members].mean()
                dev[gid, 5] = peak[members].max()
        data = HeteroData()
        data["op"].x = torch.as_tensor(x, dtype=torch.float32)
        data["dev"].x = torch.as_tensor(dev, dtype=torch.float32)
        data["op", "flow", "op"].edge_index = self.flow_index
        data["op", "flow", "op"].edge_attr = self.flow_attr
        data["dev", "link", "dev"].edge_index = self.link_index
        data["dev", "link", "dev"].edge_attr = self.link_attr
        placed = torch.tensor([placed_src, placed_dst], dtype=torch.long).reshape(2, -1)
        ones = torch.ones((placed.shape[1], 1), dtype=torch.float32)
        data["op", "placed", "dev"].edge_index = placed
        data["op", "placed", "dev"].edge_attr = ones
        data["dev", "hosts", "op"].edge_index = placed.flip(0)
        data["dev", "hosts", "op"].edge_attr = ones
        return data


class GnnPrior:
    """MCTS's prior callback: the GNN's action probabilities for the next group."""

    name = "gnn"          # how MCTS results name this prior

    def __init__(self, model: StrategyGNN, features: GraphFeatures):
        self.model = model.eval()
        self.features = features

    def __call__(self, prefix: tuple[int, ...], group: int, leaf_report: SimReport | None) -> np.ndarray:
        with torch.inference_mode():
            logp = self.model(self.features.data(prefix, leaf_report), group, self.features.action_mask,
                              self.features.action_option)
        return logp.exp().double().numpy()


WEIGHTS_FORMAT = "tag_tf.gnn/1"
ENV_WEIGHTS = "TAG_TF_GNN_WEIGHTS"      # a weights file planning uses instead of the shipped one


def architecture() -> dict[str, int]:
    """What a weights file must have been trained for (checked on load)."""
    return {"width": WIDTH, "heads": HEADS, "layers": LAYERS, "op_features": OP_FEATURES,
            "dev_features": DEV_FEATURES, "options": len(OPTIONS)}


def save_weights(model: StrategyGNN, path: str, meta: dict[str, object] | None = None) -> None:
    """Tensors and plain metadata only (loadable with torch.load(weights_only=True)); written whole."""
    import os

    meta = json.loads(json.dumps(meta or {}))        # plain JSON values only: weights_only must load them
    blob = {"format": WEIGHTS_FORMAT, "architecture": architecture(), "meta": meta,
            "state_dict": {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}}
    tmp = f"{path}.tmp"
    torch.save(blob, tmp)
    os.replace(tmp, path)


def load_weights(path: str) -> tuple[StrategyGNN, dict[str, object]]:
    """(network, metadata) from `path`; WeightsError naming the file and the problem otherwise."""
    from tag_tf.errors import WeightsError

    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise WeightsError(f"{path}: no such GNN weights file") from None
    except Exception as e:      # torch raises several types for truncated or foreign files
        raise WeightsError(f"{path}: not a GNN weights file ({type(e).__name__}: {str(e).splitlines()[0][:120]})") from None
    if not isinstance(blob, dict) or blob.get("format") != WEIGHTS_FORMAT:
        raise WeightsError(f"{path}: not a {WEIGHTS_FORMAT} weights file")
    if blob.get("architecture") != architecture():
        raise WeightsError(f"{path}: weights for architecture {blob.get('architecture')}, but this tag_tf's GNN "
                           f"is {architecture()}")
    model = StrategyGNN()
    try:
        model.load_state_dict(blob["state_dict"])
    except (RuntimeError, KeyError, TypeError) as e:
        raise WeightsError(f"{path}: weights do not fit the network ({str(e).splitlines()[0][:160]})") from None
    return model.eval(), dict(blob.get("meta") or {})


def shipped_weights() -> str | None:
    """The weights planning uses by default: $TAG_TF_GNN_WEIGHTS, else the package's, else None."""
    import os
    from importlib import resources

    env = os.environ.get(ENV_WEIGHTS)
    if env:
        return env
    path = resources.files("tag_tf.search").joinpath("weights", "gnn.pt")
    return str(path) if path.is_file() else None


_NETWORKS: dict[tuple[str, int, int], StrategyGNN] = {}


def default_network(weights: str | None = None, seed: int = 0) -> StrategyGNN:
    """The network `--prior gnn` uses: `weights`, else the shipped weights, else an untrained one
    (logged: its priors are only as good as chance)."""
    import logging

    path = weights or shipped_weights()
    if path is not None:
        stat = os.stat(path)
        key = (os.path.abspath(path), stat.st_mtime_ns, stat.st_size)
        if key not in _NETWORKS:          # one load per process and file: every search reuses it (inference only)
            _NETWORKS[key] = load_weights(path)[0].eval()
        return _NETWORKS[key]
    logging.getLogger("tag_tf.gnn").warning("no trained GNN weights (tag-tf train-gnn, or %s): the GNN prior is "
                                            "an untrained network", ENV_WEIGHTS)
    return untrained(seed)


def untrained(seed: int = 0) -> StrategyGNN:
    """A freshly initialised network (deterministic for a seed): where training starts."""
    gen = torch.random.fork_rng()
    with gen:
        torch.manual_seed(seed)
        return StrategyGNN()


def _bandwidth(topology: Topology, a: int, b: int) -> float:
    return float(topology.bandwidth(a, b))


def _intra_bandwidth(topology: Topology, devices: Sequence[int]) -> float:
    return _bandwidth(topology, devices[0], devices[1]) if len(devices) > 1 else 0.0


__all__ = ["GnnPrior", "GraphFeatures", "StrategyGNN", "WEIGHTS_FORMAT", "default_network", "gamma", "load_weights",
           "save_weights", "shipped_weights", "untrained"]
