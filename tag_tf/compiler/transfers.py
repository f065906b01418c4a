"""A pipeline's transfers over slow links, in micro-batch order.

TensorFlow moves a tensor between tasks when its consumer's task asks for it (a RecvTensor call,
issued when the step starts) and its producer has it. Every micro-batch's activations are ready
within a moment of each other, so all of them cross a link at once, over one connection that
interleaves them: each arrives only when nearly all have, and the next stage starts micro-batch 0
when the last one is there. Measured on the emulated link cluster (cnn-wide, 2 stages, 16
micro-batches over a 50 Mbit/s port): the far stage idled 6 s, then ran every micro-batch, then the
first stage idled another 6 s for the gradients: 13.8 s a step where the simulator, which sends one
tensor after the other on a link, predicted 6.9 s (7.1 s measured with this ordering).

`TransfersMixin._order_transfers` makes the graph send them as the simulator does, on the links a
plan names (`Strategy.ordered_links`: the pipeline search names slow ones): per receiving machine
and per direction of the pass, micro-batch m + 1's tensors leave their machines once micro-batch
m's have all arrived there (Identities on the receiver read each transfer; a NoOp joins them; an
Identity on each sender of m + 1 waits for it). A micro-batch's own tensors go together. Waiting
costs a round trip per micro-batch, which on fast links cost more than it saved (the emulated
compute cluster's pipelines, every link ordered: 7-50 ms a step slower).

Ordered: transfers the training step makes, of one micro-batch, of ORDERED_MIN_BYTES or more, whose
tensor carries batch rows, produced and read in the same direction of the pass (forward activations
read forward, gradients read backward); a forward value read by another machine's backward pass goes
when ready (it is needed late, and ordered with the gradients it waited for them). Edges closing a
cycle are dropped (that chain sends when ready; its Identities stay, harmless).
"""
from __future__ import annotations

from collections import defaultdict, deque
from typing import TYPE_CHECKING, NamedTuple

from tag_tf.compiler.base import BuilderBase
from tag_tf.ir import TensorRef

if TYPE_CHECKING:
    from tensorflow.core.framework.node_def_pb2 import NodeDef


# Smaller transfers go when ready: they hardly load a link, and some are needed by every micro-batch
# (the transformer's target ids: its loss is normalised by the whole batch's token count, and
# ordered behind the activations they held its backward pass back to the last micro-batch's arrival).
ORDERED_MIN_BYTES = 16 << 10


class Transfer(NamedTuple):
    """One tensor TensorFlow sends from one machine to a device of another."""
    tensor: str                  # the sent tensor ("node:index")
    device: str                  # the receiving device
    ref: TensorRef               # the original graph's tensor it holds (its dtype)
    micro: int                   # its micro-batch
    forward: bool                # whether the forward pass sends and reads it


class TransfersMixin(BuilderBase):
    def _order_transfers(self, forward_ops: set[str], links: frozenset[tuple[int, int]]) -> int:
        """Order the micro-batched transfers over `links` (module docstring). Returns how many
        transfers wait for the micro-batch before theirs."""
        nodes = {n.name: n for n in self.f.nodes}
        machine_of = {self.devices[d]: self.devices.machine(d) for d in range(len(self.devices))}
        owner = self._instance_owners()
        micro_batches = max(lay.micro for lay in self.placement.layouts.values())
        position = _topological_positions(nodes)
        if position is None:
            return 0
        train_op = self.graph.meta.train_op
        step = _ancestors(nodes, self.instances.get(train_op, []) if train_op else [])
        transfers: dict[tuple[str, str], Transfer] = {}
        readers: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
        mixed: set[tuple[str, str]] = set()
        for node in self.f.nodes:
            if node.name not in step:          # not run by the training step (a fetch's gather, ...)
                continue
            dst = machine_of.get(node.device)
            for k, i in enumerate(node.input):
                if i.startswith("^"):
                    continue
                src_node = i.split(":")[0]
                src = machine_of.get(nodes[src_node].device) if src_node in nodes else None
                if src is None or dst is None or (src, dst) not in links:
                    continue
                tensor = i if ":" in i else f"{i}:0"
                key = (tensor, node.device)
                readers[key].append((node.name, k))
                found = self._transfer_of(tensor, node.name, k, owner, forward_ops, micro_batches)
                old = transfers.get(key)
                if found is None or (old is not None and old.forward != found.forward):
                    mixed.add(key)
                elif old is None or found.micro < old.micro:
                    transfers[key] = found
        chains: dict[tuple[int, bool], list[Transfer]] = defaultdict(list)
        for key, t in transfers.items():
            if key not in mixed:
                chains[(machine_of[key[1]], t.forward)].append(t._replace(tensor=key[0], device=key[1]))
        ordered = 0
        for chain in chains.values():
            if len({t.micro for t in chain}) < 2:
                continue
            chain.sort(key=lambda t: (t.micro, position[t.tensor.split(":")[0]]))
            added = self._chain(chain, nodes, readers)
            if _topological_positions(nodes) is None:      # it closed a cycle: this chain sends when ready
                for node, gate in added:
                    node.input.remove(f"^{gate}")
            else:
                ordered += len(added)
        return ordered

    def _chain(self, chain: list[Transfer], nodes: dict[str, NodeDef],
               readers: dict[tuple[str, str], list[tuple[str, int]]]) -> list[tuple[NodeDef, str]]:
        """Send `chain`'s transfers (into one machine), micro-batch after micro-batch. Returns the
        control edges added (sender Identity, the NoOp it waits for)."""
        added: list[tuple[NodeDef, str]] = []
        arrived: list[str] = []            # this micro-batch's receiving Identities
        gate: str | None = None            # the NoOp joining the previous micro-batch's
        micro = chain[0].micro
        for t in chain:
            if t.micro != micro:
                gate = self.f.no_op("tag/order/arrived", arrived, t.device)
                nodes[gate] = self.f.nodes[-1]
                arrived, micro = [], t.micro
            dtype = self._dtype(t.ref)
            src_device = nodes[t.tensor.split(":")[0]].device
            sent = self.f.node(f"tag/order/send/{t.ref.op}", "Identity", [t.tensor], src_device, T=("type", dtype))
            sender = self.f.nodes[-1]
            got = self.f.node(f"tag/order/recv/{t.ref.op}", "Identity", [sent], t.device, T=("type", dtype))
            nodes[sent], nodes[got] = sender, self.f.nodes[-1]
            if gate is not None:
                sender.input.append(f"^{gate}")
                added.append((sender, gate))
            for name, k in readers[(t.tensor, t.device)]:
                nodes[name].input[k] = got
            arrived.append(got)
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

    def _sample_bytes(self, ref: TensorRef) -> float | None:
        """Bytes of `ref` per sample of the batch (None: not known statically)."""
        tb = self.a.batch.of(ref)
        for graph in (self.graph, self.a.graph_b1):
            info = graph.tensor(ref)
            if tb.axis is not None and info.nbytes is not None and info.shape and info.shape[tb.axis] > 0:
                return info.nbytes * tb.mult / info.shape[tb.axis]
        return None

    def _transfer_of(self, tensor: str, reader: str, k: int, owner: dict[str, tuple[str, int]],
                     forward_ops: set[str], micro_batches: int) -> Transfer | None:
        """What `tensor`, read as input k of `reader`, holds, when it belongs to one micro-batch,
        carries batch rows and is produced and read in the same direction of the pass; else None."""
        src_node, _, idx = tensor.partition(":")
        ref = None
        micro = -1
        if src_node in owner:
            op, micro = owner[src_node]
            ref = TensorRef(op, int(idx))
        read_forward = None
        if reader in owner:
            op, m = owner[reader]
            read_forward = op in forward_ops
            inputs = self.graph.op(op).inputs
            if ref is None and k < len(inputs):
                ref = inputs[k]
            if micro < 0:
                micro = m
        if ref is None or micro < 0 or self.a.batch.of(ref).axis is None or self.graph.tensor(ref).is_resource:
            return None
        sample = self._sample_bytes(ref)
        if sample is None or sample * self.a.batch_size / micro_batches < ORDERED_MIN_BYTES:
            return None
        forward = ref.op in forward_ops
        if read_forward is not None and read_forward != forward:
            return None
        return Transfer(tensor, "", ref, micro, forward)


def _ancestors(nodes: dict[str, NodeDef], names: list[str]) -> set[str]:
    """`names` and every node they depend on (data or control)."""
    seen: set[str] = set()
    stack = list(names)
    while stack:
        name = stack.pop()
        if name not in seen and name in nodes:
            seen.add(name)
            stack += [i.lstrip("^").split(":")[0] for i in nodes[name].input]
    return seen


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
