"""`tag-tf train-gnn`: train the strategy creator's GNN by MCTS (see tag_tf/search/gnn_training.py)."""
from __future__ import annotations

import json
import shlex
import sys

from tag_tf.errors import TagError


def register(sub) -> None:
    from tag_tf.search.gnn_training import PAPER_MODELS, SMALL_MODELS

    p = sub.add_parser("train-gnn", help="train the GNN prior of the MCTS strategy creator (simulated clusters)")
    p.add_argument("--models", default=",".join(PAPER_MODELS + SMALL_MODELS),
                   help="comma-separated zoo models to train on (default: the six paper models, mlp, cnn)")
    p.add_argument("--topologies", type=int, default=100, help="training topologies random:0..N-1 (default 100)")
    p.add_argument("--hours", type=float, default=2.0, help="wall-clock budget of this run (default 2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, help="directory: weights.pt, weights.json, loss.jsonl, loss.png, checkpoint")
    p.add_argument("--hold-out", dest="hold_out", help="a model of --models never trained on (the paper's TAG--)")
    p.add_argument("--iterations", type=int, default=48, help="MCTS iterations per search (default 48)")
    p.add_argument("--max-searches", type=int, help="stop after this many searches in total (smoke runs)")
    p.add_argument("--tiny", action="store_true", help="tiny model variants (smoke runs)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args) -> int:
    from tag_tf.models import MODEL_NAMES
    from tag_tf.search.gnn_training import Trainer, TrainOptions

    models = tuple(m.strip() for m in args.models.split(",") if m.strip())
    unknown = [m for m in models if m not in MODEL_NAMES]
    if unknown:
        raise TagError(f"--models: unknown model {unknown[0]!r} (known: {', '.join(MODEL_NAMES)})")
    try:
        options = TrainOptions(models=models, topologies=args.topologies, hours=args.hours, seed=args.seed,
                               held_out_model=args.hold_out, tiny=args.tiny, iterations=args.iterations,
                               max_searches=args.max_searches)
    except ValueError as e:
        raise TagError(str(e)) from None
    command = "tag-tf train-gnn " + " ".join(shlex.quote(a) for a in sys.argv[2:]) if sys.argv[1:2] == ["train-gnn"] \
        else "tag-tf train-gnn " + f"--models {args.models} --topologies {args.topologies} --seed {args.seed}"
    say = (lambda line: None) if args.json else (lambda line: print(line, flush=True))
    meta = Trainer(options, args.out, command=command, say=say).run()
    if args.json:
        json.dump({"out": args.out, **meta}, sys.stdout)
        print()
    else:
        print(f"weights written to {args.out}/weights.pt after {meta['searches']} searches "
              f"(loss {meta['first_loss']} -> {meta['last_loss']})")
    return 0
