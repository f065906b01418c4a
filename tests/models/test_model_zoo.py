"""Model zoo: every builder yields a trainable TF1 graph with the knobs other modules rely on."""
from __future__ import annotations

import functools
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import variable_pb2

from tag_tf.errors import ModelError
from tag_tf.models import MODEL_NAMES, OPTIMIZER_NAMES, PAPER_TABLE, ModelGraph, build_model, describe

pytestmark = pytest.mark.filterwarnings("ignore:`layer.apply` is deprecated")  # tf-slim's dropout

TRAINABLE = ("mlp", "cnn", "transformer", "bert-small")
RANDOM_OP_MARKERS = ("Random", "TruncatedNormal", "Multinomial")


@functools.cache
def tiny(name: str, **kwargs) -> ModelGraph:
    """Tiny builds are shared across tests: the tf-slim nets take seconds each."""
    return build_model(name, tiny=True, **kwargs)


def _node_name(tensor_or_input: str) -> str:
    return tensor_or_input.lstrip("^").split(":")[0]


def reachable(graph_def, start: str) -> list:
    """Nodes the op `start` depends on (data and control edges), itself included."""
    nodes = {n.name: n for n in graph_def.node}
    seen, stack = set(), [_node_name(start)]
    while stack:
        name = stack.pop()
        if name not in seen:
            seen.add(name)
            stack.extend(_node_name(i) for i in nodes[name].input)
    return [nodes[n] for n in seen]


def trainable_variable_ops(model: ModelGraph) -> set[str]:
    values = model.meta_graph_def.collection_def["trainable_variables"].bytes_list.value
    return {_node_name(variable_pb2.VariableDef.FromString(v).variable_name) for v in values}


def train(model: ModelGraph, steps: int, batch_sizes=(None,)) -> list[float]:
    """Runs `steps` train steps per batch size on one fixed synthetic batch; returns the losses."""
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(model.graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(model.init_op)
            losses = []
            for batch_size in batch_sizes:
                feed = model.feed(np.random.default_rng(0), batch_size)
                for _ in range(steps):
                    loss, _ = sess.run([model.loss, model.train_op], feed)
                    losses.append(float(loss))
    return losses


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_builds_a_training_graph(name: str) -> None:
    model = tiny(name)
    nodes = {n.name: n for n in model.graph_def.node}
    assert model.train_op in nodes and model.init_op in nodes
    assert model.meta_graph_def.collection_def["train_op"].node_list.value == [model.train_op]
    loss = nodes[_node_name(model.loss)]
    assert tf.as_dtype(loss.attr["T"].type).is_floating
    # One Apply*-type update per trainable variable (first input is the variable / its handle).
    applied = {_node_name(n.input[0]) for n in model.graph_def.node if "Apply" in n.op}
    assert trainable_variable_ops(model) <= applied
    placeholders = [n.name for n in model.graph_def.node if n.op == "Placeholder"]
    assert sorted(placeholders) == sorted(spec.name for spec in model.inputs)
    info = describe(model)
    assert info["ops"] == len(model.graph_def.node) > 100
    assert info["params"] == model.num_params > 0
    assert info["param_mib"] == pytest.approx(model.num_params * 4 / 2**20)


@pytest.mark.parametrize("name", TRAINABLE)
def test_tiny_models_train_in_a_session(name: str) -> None:
    losses = train(tiny(name), steps=3)
    assert all(np.isfinite(losses))


def test_mlp_loss_goes_down() -> None:
    losses = train(tiny("mlp", learning_rate=0.01), steps=10)
    assert losses[-1] < 0.8 * losses[0]


def test_loss_is_a_scalar_float() -> None:
    model = tiny("bert-small")
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(model.graph_def, name="")
        loss = graph.get_tensor_by_name(model.loss)
    assert loss.shape.rank == 0 and loss.dtype.is_floating


@pytest.mark.parametrize("name", ["cnn", "vgg19", "transformer", "bert-small"])  # vgg19: tf-slim dropout
def test_dropout_zero_leaves_no_random_ops_in_the_train_path(name: str) -> None:
    def random_ops(model: ModelGraph) -> list[str]:
        return [n.op for n in reachable(model.graph_def, model.train_op)
                if any(marker in n.op for marker in RANDOM_OP_MARKERS)]

    assert random_ops(tiny(name))  # the default has dropout
    assert random_ops(tiny(name, dropout=0.0)) == []


@pytest.mark.parametrize("name", ["mlp", "cnn", "transformer", "bert-small"])
def test_dynamic_batch_trains_with_two_batch_sizes(name: str) -> None:
    small = {"num_layers": 1} if name in ("transformer", "bert-small") else {}  # keep the build short
    model = tiny(name, dynamic_batch=True, **small)
    for node in model.graph_def.node:
        if node.op == "Placeholder":
            assert node.attr["shape"].shape.dim[0].size == -1, node.name
    losses = train(model, steps=1, batch_sizes=(3, 5))
    assert len(losses) == 2 and all(np.isfinite(losses))


def test_static_batch_placeholders() -> None:
    model = tiny("bert-small")
    for node in model.graph_def.node:
        if node.op == "Placeholder":
            assert node.attr["shape"].shape.dim[0].size == model.batch_size


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_mlp_dtypes(dtype: str) -> None:
    model = tiny("mlp", dtype=dtype)
    kernels = [n for n in model.graph_def.node if n.op == "VarHandleOp" and n.name.endswith("kernel")]
    assert kernels and all(tf.as_dtype(n.attr["dtype"].type).name == dtype for n in kernels)
    assert all(np.isfinite(train(model, steps=3)))


@pytest.mark.parametrize("dtype", ["float16", "float64"])
def test_cnn_dtypes_with_batch_norm(dtype: str) -> None:
    model = tiny("cnn", dtype=dtype, batch_norm=True)
    assert all(np.isfinite(train(model, steps=2)))


@pytest.mark.parametrize("resource, variable_op, apply_op", [
    (True, "VarHandleOp", "ResourceApplyAdam"),
    (False, "VariableV2", "ApplyAdam"),
])
def test_resource_and_ref_variables(resource: bool, variable_op: str, apply_op: str) -> None:
    model = tiny("mlp", resource_variables=resource)
    ops = describe(model)["op_types"]
    assert ops.get(variable_op) and ops.get(apply_op)
    other = {"VarHandleOp": "VariableV2", "VariableV2": "VarHandleOp"}[variable_op]
    assert other not in ops
    assert all(np.isfinite(train(model, steps=2)))


@pytest.mark.parametrize("optimizer", OPTIMIZER_NAMES)
def test_each_optimizer_builds(optimizer: str) -> None:
    model = tiny("mlp", optimizer=optimizer)
    applies = [op for op in describe(model)["op_types"] if op.startswith("ResourceApply")]
    assert len(applies) == 1, applies


def test_saver_def_on_request() -> None:
    assert not tiny("mlp").meta_graph_def.saver_def.save_tensor_name
    assert tiny("mlp", with_saver=True).meta_graph_def.saver_def.save_tensor_name


def test_bert_gathers_with_dynamic_batch_offsets() -> None:
    ops = describe(tiny("bert-small"))["op_types"]
    assert ops.get("Shape") and ops.get("Range") and ops.get("GatherV2")


def test_paper_table_and_names() -> None:
    assert MODEL_NAMES == ("mlp", "cnn", "vgg19", "resnet101", "inceptionv3", "transformer", "bert-small",
                           "bert-large")
    assert set(PAPER_TABLE) == set(MODEL_NAMES[2:])
    assert all(set(row) == {"batch_size", "ops", "param_mib"} for row in PAPER_TABLE.values())


@pytest.mark.parametrize("name, kwargs, needle", [
    ("resnet50", {}, "known models"),
    ("mlp", {"batch_size": 0}, "batch_size"),
    ("mlp", {"batch_size": -4}, "batch_size"),
    ("vgg19", {"input_size": 64}, "input_size"),
    ("inceptionv3", {"input_size": 74}, "input_size"),
    ("inceptionv3", {"input_size": 90, "aux_logits": True}, "input_size"),   # aux head needs 107
    ("cnn", {"input_size": 3}, "input_size"),
    ("bert-small", {"input_size": 1024}, "input_size"),
    ("mlp", {"optimizer": "lamb"}, "optimizer"),
    ("mlp", {"dtype": "int8"}, "dtype"),
    ("mlp", {"dropout": 1.0}, "dropout"),
    ("mlp", {"widht": 3}, "widht"),
])
def test_bad_arguments_raise_model_error(name: str, kwargs: dict, needle: str) -> None:
    with pytest.raises(ModelError, match=needle):
        build_model(name, tiny=True, **kwargs)
