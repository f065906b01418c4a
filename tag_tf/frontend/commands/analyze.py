"""`tag-tf analyze`: graph IR, batch dimensions, op categories and METIS groups of a model."""
from __future__ import annotations

import json
import sys

from tag_tf.frontend.loading import add_model_args, analysis_for, load


def register(sub) -> None:
    p = sub.add_parser("analyze", help="analyze a model's graph: categories, batch dims, op groups")
    add_model_args(p)
    p.add_argument("--groups", type=int, default=60, help="maximum number of op groups (default 60)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--ops", action="store_true", help="also list every training op's annotation")
    p.set_defaults(func=run)


def run(args) -> int:
    from tag_tf.context import Options, PassContext

    if args.groups < 1:
        from tag_tf.errors import TagError
        raise TagError(f"--groups must be at least 1, got {args.groups}")
    ctx = PassContext(Options(num_groups=args.groups))
    loaded = load(args)
    with ctx.timer("analyze"):
        analysis = analysis_for(loaded, args, ctx)
    report = {"model": loaded.source, **analysis.report(), "seconds": ctx.timing_report()}
    if args.ops:
        from tag_tf.analysis.simplify import training_ops

        train = training_ops(analysis.graph)
        report["annotations"] = {
            name: {"type": analysis.graph.op(name).type, "category": a.category.value, "rule": a.rule,
                   "inputs": [str(s) for s in a.requires], "outputs": [str(s) for s in a.outputs],
                   "group": analysis.grouping.group_of.get(name)}
            for name, a in analysis.annotations.items() if name in train}
    if args.json:
        json.dump(report, sys.stdout)
        print()
        return 0
    print(f"{loaded.source}: {report['ops']} ops, {report['training_ops']} in training, "
          f"{report['simplified_ops']} after simplification, batch {report['batch_size']}"
          f"{' (dynamic)' if report['dynamic_batch'] else ''}")
    cats = report["categories"]
    print(f"categories: concat {cats['concat']}, sum {cats['sum']}, other {cats['other']}; "
          f"unclassified: {', '.join(report['unclassified']) or 'none'}")
    print(f"groups: {report['groups']} (balance {report['group_balance']}: largest group compute / mean)")
    return 0
