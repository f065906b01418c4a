"""Training the strategy creator's GNN (the paper's "GNN Training"): MCTS teaches the prior.

The loop, as in the paper: pick a model and a random training topology, run MCTS guided by the
current GNN, and at every well-visited vertex (search/mcts.py `VisitRecord`) take the visit
distribution softmax(ln N) = N / sum(N) as the target; minimise the cross-entropy between the GNN's
prior there and that target, over a replay buffer of recent vertices. Searches run without the
polish (it is not part of the tree) and without HeteroG's baseline search (the reward's reference is
the best fixed baseline), so each costs only its iterations; and with the network's prior as it is
(no uniform share mixed in, no root sweep: MctsOptions.prior_mix / sweep_root are for planning), so
the visit counts it learns from are its own search's, as in the paper.

What is saved under the output directory:
  weights.pt        the trained network (tag_tf.search.gnn.save_weights; torch.load(weights_only=True))
  weights.json      how it was made: command, seed, models, topology seeds, searches, samples, losses
  loss.jsonl        one line per search (model, topology, vertices recorded, mean loss, time)
  loss.png          the loss curve
  checkpoint.pt/.json  network + optimizer state, search count and sampler state: a run started again
                    with the same --out resumes (the replay buffer is rebuilt by the next searches)

Topologies: training uses `random:SEED` for SEED in [0, topologies); evaluation holds out
[HELD_OUT_BASE, HELD_OUT_BASE + 100), which training never draws.
"""
from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, NotRequired, TypedDict

import numpy as np
import torch

from tag_tf.search.gnn import GnnPrior, GraphFeatures, StrategyGNN, save_weights, untrained
from tag_tf.search.mcts import MctsOptions, VisitRecord, candidate_actions, decision_order, mcts_search

if TYPE_CHECKING:
    from tag_tf.analysis import Analysis
    from tag_tf.models.base import ModelGraph
    from tag_tf.sim.simulator import SimReport

PAPER_MODELS = ("vgg19", "resnet101", "inceptionv3", "transformer", "bert-small", "bert-large")
SMALL_MODELS = ("mlp", "cnn")
HELD_OUT_BASE = 10_000


@dataclasses.dataclass(frozen=True)
class TrainOptions:
    models: tuple[str, ...] = PAPER_MODELS + SMALL_MODELS
    topologies: int = 100               # training topologies random:0 .. random:N-1
    hours: float = 2.0                  # wall-clock budget of this run (a resumed run gets its own)
    seed: int = 0
    held_out_model: str | None = None   # "TAG--": never trained on this model
    tiny: bool = False                  # tiny model variants (smoke runs, tests)
    iterations: int = 48                # MCTS iterations per search
    search_budget_s: float = 30.0       # ... and a time cap per search
    steps_per_search: int = 4           # gradient steps after each search
    batch_samples: int = 32             # vertices per gradient step
    buffer: int = 4096                  # replay buffer (most recent vertices)
    lr: float = 1e-3
    max_searches: int | None = None     # stop after this many searches in total (smoke runs)

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("train-gnn: no models to train on")
        if self.held_out_model is not None and self.held_out_model not in self.models:
            raise ValueError(f"train-gnn: held-out model {self.held_out_model!r} is not among {list(self.models)}")
        if self.topologies < 1 or self.iterations < 1 or self.hours <= 0:
            raise ValueError("train-gnn: --topologies and --iterations must be >= 1 and --hours > 0")

    @property
    def training_models(self) -> tuple[str, ...]:
        return tuple(m for m in self.models if m != self.held_out_model)


@dataclasses.dataclass
class Sample:
    """One vertex's input (graph features, decisions, leaf feedback) and its visit distribution."""
    features: GraphFeatures
    prefix: tuple[int, ...]
    group: int
    report: SimReport | None
    target: np.ndarray


def samples_of(records: Sequence[VisitRecord], features: GraphFeatures) -> list[Sample]:
    return [Sample(features, r.prefix, r.group, r.report, r.visits / r.visits.sum()) for r in records]


def loss_on(net: StrategyGNN, samples: Sequence[Sample]) -> torch.Tensor:
    """Mean cross-entropy between the network's prior and the visit distributions."""
    total = torch.zeros(())
    for s in samples:
        f = s.features
        logp = net(f.data(s.prefix, s.report), s.group, f.action_mask, f.action_option)
        total = total - (torch.as_tensor(s.target, dtype=torch.float32) * logp).sum()
    return total / max(len(samples), 1)


def train_step(net: StrategyGNN, optimizer: torch.optim.Optimizer, samples: Sequence[Sample]) -> float:
    net.train()
    optimizer.zero_grad()
    loss = loss_on(net, samples)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
    optimizer.step()
    return float(loss.detach())


class SearchRow(TypedDict):
    """One search of the training loop: a line of loss.jsonl."""

    search: int
    model: str
    topology: str
    devices: int
    vertices: int
    buffer: int
    loss: float | None          # mean over the search's gradient steps; None: none taken
    search_s: float
    train_s: float
    elapsed_s: NotRequired[float]


class Trainer:
    """The training loop of `tag-tf train-gnn` (see the module doc)."""

    def __init__(self, options: TrainOptions, out_dir: str, *, command: str = "",
                 say: Callable[[str], None] = lambda line: None):
        self.o = options
        self.out = out_dir
        self.command = command
        self.say = say
        os.makedirs(out_dir, exist_ok=True)
        self.net = untrained(options.seed)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=options.lr)
        self.rng = np.random.default_rng(options.seed)
        self.searches = 0
        self.samples_seen = 0
        self.buffer: list[Sample] = []
        self._analyses: dict[str, Analysis] = {}
        self._resume()

    # -- state --------------------------------------------------------------------------------
    def _path(self, name: str) -> str:
        return os.path.join(self.out, name)

    def _resume(self) -> None:
        ckpt, meta = self._path("checkpoint.pt"), self._path("checkpoint.json")
        if not (os.path.exists(ckpt) and os.path.exists(meta)):
            return
        state = torch.load(ckpt, map_location="cpu", weights_only=True)
        with open(meta) as f:
            info = json.load(f)
        if info.get("options", {}).get("seed") != self.o.seed:
            raise ValueError(f"{self.out}: a checkpoint of another run (seed {info.get('options', {}).get('seed')}) "
                             f"is there; use another --out")
        self.net.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.searches, self.samples_seen = int(info["searches"]), int(info["samples_seen"])
        self.rng.bit_generator.state = info["rng"]
        self.say(f"resumed from {ckpt} after {self.searches} searches")

    def checkpoint(self) -> None:
        tmp = self._path("checkpoint.pt.tmp")
        torch.save({"model": self.net.state_dict(), "optimizer": self.optimizer.state_dict()}, tmp)
        os.replace(tmp, self._path("checkpoint.pt"))
        info = {"searches": self.searches, "samples_seen": self.samples_seen, "rng": self.rng.bit_generator.state,
                "options": dataclasses.asdict(self.o)}
        with open(self._path("checkpoint.json.tmp"), "w") as f:
            json.dump(info, f)
        os.replace(self._path("checkpoint.json.tmp"), self._path("checkpoint.json"))

    # -- data ---------------------------------------------------------------------------------
    def analysis(self, model: str) -> Analysis:
        if model not in self._analyses:
            self._analyses[model] = zoo_analysis(model, self.o.tiny)
        return self._analyses[model]

    def search_once(self) -> SearchRow:
        from tag_tf.sim.simulator import Simulator
        from tag_tf.topology.random_gen import random_topology

        models = self.o.training_models
        model = models[int(self.rng.integers(len(models)))]
        seed = int(self.rng.integers(self.o.topologies))
        topology = random_topology(seed)
        analysis = self.analysis(model)
        sim = Simulator(analysis, topology)
        features = GraphFeatures(sim, topology, candidate_actions(topology), decision_order(analysis))
        prior = GnnPrior(self.net, features)
        records: list[VisitRecord] = []
        start = time.perf_counter()
        mcts_search(sim, topology, MctsOptions(budget_s=self.o.search_budget_s, iterations=self.o.iterations,
                                               seed=self.searches, polish=False, refine=False, heterog=False,
                                               prior_mix=0.0, sweep_root=False),
                    prior=prior, record=records)
        search_s = time.perf_counter() - start
        new = samples_of(records, features)
        self.buffer = (self.buffer + new)[-self.o.buffer:]
        self.samples_seen += len(new)
        losses = []
        for _ in range(self.o.steps_per_search if self.buffer else 0):
            picks = self.rng.choice(len(self.buffer), size=min(self.o.batch_samples, len(self.buffer)), replace=False)
            losses.append(train_step(self.net, self.optimizer, [self.buffer[i] for i in picks]))
        self.searches += 1
        return {"search": self.searches, "model": model, "topology": f"random:{seed}",
                "devices": topology.num_devices, "vertices": len(new), "buffer": len(self.buffer),
                "loss": float(np.mean(losses)) if losses else None, "search_s": round(search_s, 3),
                "train_s": round(time.perf_counter() - start - search_s, 3)}

    # -- the loop -----------------------------------------------------------------------------
    def run(self) -> dict[str, object]:
        end = time.perf_counter() + self.o.hours * 3600
        started = time.perf_counter()
        last_checkpoint = started
        with open(self._path("loss.jsonl"), "a") as log:
            while time.perf_counter() < end and (self.o.max_searches is None or self.searches < self.o.max_searches):
                row = self.search_once()
                row["elapsed_s"] = round(time.perf_counter() - started, 2)
                log.write(json.dumps(row) + "\n")
                log.flush()
                self.say(f"search {row['search']}: {row['model']} on {row['topology']} ({row['devices']} devices), "
                         f"{row['vertices']} vertices, loss {row['loss'] if row['loss'] is None else round(row['loss'], 4)}")
                if time.perf_counter() - last_checkpoint > 60:
                    self.checkpoint()
                    last_checkpoint = time.perf_counter()
        self.checkpoint()
        return self.finish()

    def finish(self) -> dict[str, object]:
        rows = read_log(self._path("loss.jsonl"))
        losses = [r["loss"] for r in rows if r.get("loss") is not None]
        meta = {"command": self.command, "seed": self.o.seed, "models": list(self.o.training_models),
                "held_out_model": self.o.held_out_model, "tiny": self.o.tiny,
                "topologies": f"random:0..{self.o.topologies - 1}", "held_out_topologies":
                f"random:{HELD_OUT_BASE}..{HELD_OUT_BASE + 99}", "searches": self.searches,
                "samples_seen": self.samples_seen, "mcts_iterations": self.o.iterations,
                "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
                "parameters": sum(p.numel() for p in self.net.parameters()), "torch": str(torch.__version__),
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        save_weights(self.net, self._path("weights.pt"), meta)
        with open(self._path("weights.json"), "w") as f:
            json.dump(meta, f, indent=1)
        plot_losses(rows, self._path("loss.png"))
        return meta


def zoo_analysis(model: str, tiny: bool = False, batch_size: int | None = None) -> Analysis:
    """The analysis of a zoo model at its default batch size, or `batch_size` (dropout off: searches
    compare plans)."""
    from tag_tf.analysis import analyze
    from tag_tf.context import PassContext
    from tag_tf.models import build_model
    from tag_tf.profile.weights import reference_weights

    def build(batch: int | None = None) -> ModelGraph:
        return build_model(model, batch_size=batch, tiny=tiny, dropout=0.0)
    built = build(batch_size)
    return analyze(PassContext(), built.ir(), rebuild=lambda b: build(b).ir(), batch_size=built.batch_size,
                   weight_fn=reference_weights)


def read_log(path: str) -> list[SearchRow]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def plot_losses(rows: Sequence[SearchRow], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [(r["search"], r["loss"]) for r in rows if r.get("loss") is not None]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if points:
        x, y = zip(*points)
        ax.plot(x, y, lw=0.8, alpha=0.5, label="per search")
        k = max(1, len(y) // 20)
        smooth = np.convolve(y, np.ones(k) / k, mode="valid")
        ax.plot(x[k - 1:], smooth, lw=1.5, label=f"mean of {k}")
        ax.legend()
    ax.set_xlabel("search")
    ax.set_ylabel("cross-entropy (prior vs visits)")
    ax.set_title("GNN training loss")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


__all__ = ["HELD_OUT_BASE", "PAPER_MODELS", "Sample", "TrainOptions", "Trainer", "loss_on",
           "plot_losses", "read_log", "samples_of", "train_step", "zoo_analysis"]
