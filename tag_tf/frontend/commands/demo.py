"""`tag-tf demo`: plan a built-in model for a heterogeneous cluster (simulated) and train it for real
on local virtual devices through tag_tf.distribute (the README's `make demo`)."""
from __future__ import annotations


def register(sub) -> None:
    p = sub.add_parser("demo", help="the main job end to end on a built-in model and cluster")
    p.add_argument("--out", default="demo_out", help="report folder (default: demo_out)")
    p.add_argument("--model", default="cnn", help="built-in model (default: cnn)")
    p.add_argument("--cluster", default="testbed", help="topology preset or file to plan for (default: testbed)")
    p.add_argument("--budget", type=float, default=40.0, help="planning budget in seconds (default: 40)")
    p.add_argument("--steps", type=int, default=5, help="real training steps (default: 5)")
    p.set_defaults(func=run)


def run(args) -> int:
    from tag_tf.frontend.demo import run_demo

    result = run_demo(args.out, model=args.model, cluster=args.cluster, budget_s=args.budget, steps=args.steps)
    return 0 if result.max_rel_loss_diff <= 1e-4 else 1
