"""Our model zoo next to the TAG paper's "Benchmark DNN models" table.

Builds each paper model at the paper's batch size and our default input size (graph only, no
variable initialization), prints a table and writes benchmarks/results/models.json.

    .venv/bin/python benchmarks/models_table.py [--out PATH] [--models vgg19,resnet101]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf  # noqa: E402

from tag_tf.models import PAPER_TABLE, build_model, describe, model_spec  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks.markdown import measured_when, stamp  # noqa: E402

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "models.json")

NOTES = {
    "paper_param_unit": (
        "We read the paper's 'parameter size' column as MiB of float32 parameters (params * 4 / 2**20): "
        "VGG19's 143.67M parameters give 548.05 MiB against the paper's 548, ResNet-101's 44.55M give 169.94 "
        "against 169, Inception-v3's 23.82M give 90.86 against 90: the paper seems to truncate to whole MiB."),
    "ops": "Node count of the exported GraphDef: forward, loss, gradients, optimizer, plus variable "
           "initializers and the init op (everything build_model returns).",
    "train_path_ops": "Nodes reachable from the train op (data and control edges): what one training step "
                      "runs, without the initializers.",
    "ops_ref_variables": "The same count when built with resource_variables=False (ref variables, the TF1.x "
                         "default the paper's graphs were most likely built with): a resource variable adds "
                         "VarHandleOp, VarIsInitializedOp and ReadVariableOp nodes that a ref variable does not.",
    "paper_ops": "The paper does not say how it counted ops; none of our counts is expected to match exactly.",
    "param_gaps": (
        "transformer: the paper gives no vocabulary; our 40k untied vocabularies land at 402.9 MiB against 407. "
        "bert-small: L=4/H=512/A=8/I=2048 with vocab 30522 is 29.06M parameters (110.8 MiB) against the paper's "
        "98; the same net with L=3 would be 25.91M = 98.8 MiB, so the paper's BERT-Small may have had 3 layers "
        "(a guess). bert-large: the standard L=24/H=1024 config is 336.2M parameters (1282.6 MiB); the paper's "
        "2313 MiB (~606M float32 parameters) matches no standard BERT-Large size, and we did not try to reach it."),
    "build_seconds": "Wall-clock seconds of build_model (graph construction + export, no initialization) on a "
                     "shared 2-core CPU machine; noisy under load.",
    "models": "vgg19/resnet101/inceptionv3 are tf_slim.nets (vgg_19, resnet_v1_101, inception_v3 without the "
              "auxiliary head: 23.8M parameters = 90.9 MiB matches the paper's 90, with it 27.1M = 103.5 MiB) "
              "in their arg_scopes with L2 weight decay; transformer is our "
              "encoder-decoder base model (6+6 layers, d_model 512, untied 40k source/target/softmax "
              "vocabularies, sequence length 64); bert-small/bert-large are our BERT pre-training graphs "
              "(L=4/H=512 and L=24/H=1024, vocab 30522, sequence length 128, masked LM + next sentence).",
}


def _train_path_ops(graph_def, train_op: str) -> int:
    nodes = {n.name: n for n in graph_def.node}
    seen, stack = set(), [train_op]
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(i.lstrip("^").split(":")[0] for i in nodes[name].input)
    return len(seen)


def measure(name: str) -> dict:
    paper = PAPER_TABLE[name]
    start = time.perf_counter()
    model = build_model(name, batch_size=paper["batch_size"])
    seconds = time.perf_counter() - start
    info = describe(model)
    ref = build_model(name, batch_size=paper["batch_size"], resource_variables=False)
    return {
        "batch_size": model.batch_size,
        "input_size": model.input_size,
        "input_meaning": model_spec(name).input_meaning,
        "ops": info["ops"],
        "train_path_ops": _train_path_ops(model.graph_def, model.train_op),
        "ops_ref_variables": len(ref.graph_def.node),
        "train_path_ops_ref_variables": _train_path_ops(ref.graph_def, ref.train_op),
        "paper_ops": paper["ops"],
        "params": info["params"],
        "param_mib": round(info["param_mib"], 2),
        "paper_param_mib": paper["param_mib"],
        "paper_batch_size": paper["batch_size"],
        "build_seconds": round(seconds, 2),
        "config": dict(model.config),
    }



def render(data: dict) -> str:
    """RESULTS.md's models section (benchmarks/report.py)."""
    lines = [f"Our builders at the paper's batch sizes and default input sizes, next to the paper's table "
             f"(TensorFlow {data['tensorflow']}; {measured_when(data)}). Op counts include initializers; "
             "\"train-path\" counts what one step runs.", "",
             "| model | batch | ops | train-path ops | paper ops | params | MiB | paper MiB |",
             "|---|---|---|---|---|---|---|---|"]
    for name, r in data["models"].items():
        lines.append(f"| {name} | {r['batch_size']} | {r['ops']} | {r['train_path_ops']} | {r['paper_ops']} | "
                     f"{r['params'] / 1e6:.1f}M | {r['param_mib']:.1f} | {r['paper_param_mib']} |")
    notes = data.get("notes", {})
    lines += [""] + [f"- {notes[k]}" for k in ("paper_param_unit", "param_gaps") if k in notes]
    return "\n".join(lines) + "\n"

def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="JSON file to write")
    parser.add_argument("--models", default=",".join(PAPER_TABLE), help="comma-separated paper model names")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    tf.get_logger().setLevel("ERROR")

    rows = {}
    header = (f"{'model':<12} {'batch':>5} {'input':>5} {'ops':>7} {'train':>7} {'ref ops':>7} {'paper':>7} "
              f"{'params':>12} {'MiB':>8} {'paper':>6} {'build s':>7}")
    print(header)
    print("-" * len(header))
    for name in args.models.split(","):
        row = rows[name] = measure(name)
        print(f"{name:<12} {row['batch_size']:>5} {row['input_size']:>5} {row['ops']:>7} {row['train_path_ops']:>7} "
              f"{row['ops_ref_variables']:>7} {row['paper_ops']:>7} {row['params']:>12,} {row['param_mib']:>8.1f} "
              f"{row['paper_param_mib']:>6} {row['build_seconds']:>7.1f}", flush=True)

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(stamp({"tensorflow": tf.__version__, "notes": NOTES, "models": rows}), f, indent=2, sort_keys=False)
        f.write("\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
