"""`python -m benchmarks run EXPERIMENT|all [--quick]`: the paper's evaluation (see benchmarks/paper.py);
`python -m benchmarks report [--check]`: RESULTS.md's generated sections from their JSON (benchmarks/report.py)."""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks import paper  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=paper.__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run experiments and regenerate RESULTS.md's paper section")
    run.add_argument("experiment", choices=(*paper.EXPERIMENTS, "all"))
    run.add_argument("--quick", action="store_true", help="tiny models, 1 s budgets: a smoke test")
    run.add_argument("--budget", type=float, help="planning budget per plan in seconds (default 30; quick 1)")
    run.add_argument("--results", default=os.path.join(paper.HERE, "results"), help="where the JSON goes")
    run.add_argument("--markdown", default=os.path.join(paper.HERE, "RESULTS.md"),
                     help="the RESULTS.md whose paper section is regenerated ('' to skip)")
    rep = sub.add_parser("report", help="regenerate every generated section of RESULTS.md from its results JSON")
    rep.add_argument("--check", action="store_true",
                     help="write nothing; exit 1 naming each section that differs from what its JSON renders")
    rep.add_argument("--markdown", default=os.path.join(paper.HERE, "RESULTS.md"))
    rep.add_argument("--results", default=os.path.join(paper.HERE, "results"))
    args = ap.parse_args(argv)
    if args.command == "report":
        from benchmarks.report import report

        differ = report(args.markdown, args.results, check=args.check)
        if args.check:
            print(f"RESULTS.md: {len(differ)} section(s) differ from their JSON" + (f": {', '.join(differ)}"
                                                                                   if differ else ""))
            return 1 if differ else 0
        print(f"RESULTS.md: {len(differ)} section(s) regenerated" + (f": {', '.join(differ)}" if differ else ""))
        return 0
    names = list(paper.EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    paper.run(names, quick=args.quick, budget=args.budget, results_dir=args.results, markdown=args.markdown or None)
    return 0


if __name__ == "__main__":
    sys.exit(main())
