"""A pipeline's transfers between machines, one after another in micro-batch order.

TensorFlow moves a tensor between tasks when its consumer's task asks for it (a RecvTensor call,
issued when the step starts) and its producer has it. Every micro-batch's activations are ready
within a moment of each other, so all of them cross a link at once, over one connection that
interleaves them: each arrives only when nearly all have, and the next stage starts micro-batch 0
when the last one is there. Measured on the emulated link cluster (cnn-wide, 2 stages, 16
micro-batches over a 50 Mbit/s port): the far stage idled 6 s, then ran every micro-batch, then the
first stage idled another 6 s for the gradients: 13.8 s a step where the simulator, which sends one
tensor after the other on a link, predicted 6.9 s.

`TransfersMixin._order_transfers` makes the graph send them as the simulator does: per receiving
machine and per direction of the pass (forward, backward), micro-batch m + 1's tensors leave their
machines once micro-batch m's have all arrived (an Identity on the sender waits, through control
edges, for Identities on the receiver reading the last transfers), and one source's tensors of a
micro-batch go one after another. With the ordering alone, the same plan ran 8.7 s: of two hosts
sending into the far one, one ran ahead and the far stage waited for the other's pieces. Only transfers that belong to one
micro-batch and carry rows of activations or gradients (rank 2 or more) are ordered; scalars and
shapes go when ready. The edges are kept only if the graph stays acyclic.
"""
from __future__ import annotations

from collections import defaultdict, deque
from typing import TYPE_CHECKING, NamedTuple

from tag_tf.compiler.base import BuilderBase
from tag_tf.ir import TensorRef

if TYPE_CHECKING:
    from tensorflow.core.framework.node_def_pb2 import NodeDef


class Transfer(NamedTuple):
    """One tensor TensorFlow sends from one machine to a device of another."""
    tensor: str                  # the sent tensor ("node:index")
    device: str                  # the receiving device
    ref: TensorRef               # the original graph's tensor it holds (its dtype)
    micro: int                   # its micro-batch
    forward: bool                # whether the forward pass sends it
    source: int = -1             # the sending machine


class TransfersMixin(BuilderBase):
    def _order_transfers(self, forward_ops: set[str]) -> int:
        """Chain each pair of machines' micro-batched transfers (module docstring). Returns how many
        transfers wait for another."""
        nodes = {n.name: n for n in self.f.nodes}
        machine_of = {self.devices[d]: self.devices.machine(d) for d in range(len(self.devices))}
        owner = self._instance_owners()
        position = _topological_positions(nodes)
        if position is None:
            return 0
        transfers: dict[tuple[str, str], Transfer] = {}
        readers: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
        for node in self.f.nodes:
            dst = machine_of.get(node.device)
            for k, i in enumerate(node.input):
                if i.startswith("^"):
                    continue
                src_node = i.split(":")[0]
                src = machine_of.get(nodes[src_node].device) if src_node in nodes else None
                if src is None or dst is None or src == dst:
                    continue
                tensor = i if ":" in i else f"{i}:0"
                key = (tensor, node.device)
                readers[key].append((node.name, k))
                found = self._transfer_of(tensor, node.name, k, owner, forward_ops)
                if found is None:
                    continue
                old = transfers.get(key)
                transfers[key] = found if old is None or found.micro < old.micro else old
        chains: dict[tuple[int, bool], list[Transfer]] = defaultdict(list)
        for (tensor, device), t in transfers.items():
            src = machine_of[nodes[tensor.split(":")[0]].device]
            chains[(machine_of[device], t.forward)].append(t._replace(tensor=tensor, device=device, source=src))
        ordered = 0
        for chain in chains.values():
            if len({t.micro for t in chain}) < 2:
                continue
            chain.sort(key=lambda t: (t.micro, position[t.tensor.split(":")[0]]))
            added = self._chain(chain, nodes, readers)
            if _topological_positions(nodes) is None:      # it closed a cycle: this chain sends when ready
                for node, arrived in added:
                    node.input.remove(f"^{arrived}")
            else:
                ordered += len(added)
        return ordered

    def _chain(self, chain: list[Transfer], nodes: dict[str, NodeDef],
               readers: dict[tuple[str, str], list[tuple[str, int]]]) -> list[tuple[NodeDef, str]]:
        """Send `chain`'s transfers (into one machine) in its order: each source's transfers of one
        micro-batch one after another, the first of them once every source's last transfer of the
        micro-batch before has arrived (sources that ran ahead took the link's share that the one
        behind needed, and the receiving stage waits for both). Returns the control edges added."""
        added: list[tuple[NodeDef, str]] = []
        before: dict[int, str] = {}            # source -> its last arrival in the previous micro-batch
        now: dict[int, str] = {}               # the same in this one
        micro = chain[0].micro
        for t in chain:
            if t.micro != micro:
                before, now, micro = now, {}, t.micro
            dtype = self._dtype(t.ref)
            src_device = nodes[t.tensor.split(":")[0]].device
            sent = self.f.node(f"tag/order/send/{t.ref.op}", "Identity", [t.tensor], src_device, T=("type", dtype))
            sender = self.f.nodes[-1]
            got = self.f.node(f"tag/order/recv/{t.ref.op}", "Identity", [sent], t.device, T=("type", dtype))
            nodes[sent], nodes[got] = sender, self.f.nodes[-1]
            for arrived in [now[t.source]] if t.source in now else before.values():
                sender.input.append(f"^{arrived}")
                added.append((sender, arrived))
            for name, k in readers[(t.tensor, t.device)]:
                nodes[name].input[k] = got
            now[t.source] = got
        return added

    def _instance_owners(self) -> dict[str, tuple[str, int]]:
        """Node name of each emitted instance -> (original op, its micro-batch); -1: not micro-batched."""
        owners: dict[str, tuple[str, int]] = {}
        for op, names in self.instances.items():
            lay = self.placement.of(op)
            per = lay.size // lay.micro if lay.micro > 1 else 0
            for j, name in enumerate(names):
                owners[name] = (op, j // per if per else -1)
        return owners

    def _transfer_of(self, tensor: str, reader: str, k: int, owner: dict[str, tuple[str, int]],
                     forward_ops: set[str]) -> Transfer | None:
        """What `tensor`, read as input k of `reader`, holds, when one side is an instance of an op
        of one micro-batch and the tensor has rows worth ordering."""
        src_node, _, idx = tensor.partition(":")
        ref = None
        micro = -1
        if src_node in owner:
            op, micro = owner[src_node]
            ref = TensorRef(op, int(idx))
        if reader in owner:
            op, m = owner[reader]
            inputs = self.graph.op(op).inputs
            if ref is None and k < len(inputs):
                ref = inputs[k]
            if micro < 0:
                micro = m
        if ref is None or micro < 0:
            return None
        info = self.graph.tensor(ref)
        if info.shape is None or len(info.shape) < 2 or info.is_resource:
            return None
        return Transfer(tensor, "", ref, micro, ref.op in forward_ops)


def _topological_positions(nodes: dict[str, NodeDef]) -> dict[str, int] | None:
    """Each node's place in a topological order of data and control edges; None if there is a cycle."""
    indegree = {name: 0 for name in nodes}
    children: dict[str, list[str]] = defaultdict(list)
    for name, node in nodes.items():
        for i in node.input:
            src = i.lstrip("^").split(":")[0]
            if src in nodes:
                indegree[name] += 1
                children[src].append(name)
    ready = deque(name for name, d in indegree.items() if d == 0)
    position: dict[str, int] = {}
    while ready:
        name = ready.popleft()
        position[name] = len(position)
        for c in children[name]:
            indegree[c] -= 1
            if indegree[c] == 0:
                ready.append(c)
    return position if len(position) == len(nodes) else None
