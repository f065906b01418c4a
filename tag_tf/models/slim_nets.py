"""ImageNet CNNs from tf_slim.nets (the paper's source): VGG19, ResNet-101 (v1) and Inception-v3.

Each net is built the way slim's train_image_classifier builds it: inside the net's arg_scope
(weight decay, batch norm in training mode), softmax cross-entropy on 1000 classes plus the
L2 regularization losses. Inception-v3 drops its auxiliary head by default (the paper's parameter
size matches the net without it); aux_logits=True adds it with slim's loss weight 0.4.
"""
from __future__ import annotations

import contextlib
import dataclasses

import tensorflow as tf
import tf_slim
from tf_slim.nets import inception_v3, resnet_v1, vgg

from tag_tf.errors import ModelError
from tag_tf.models.training import BuildOptions, ForwardFn, Inputs, ModelSpec, check_positive, resolve_config


@dataclasses.dataclass(frozen=True)
class SlimConfig:
    num_classes: int = 1000
    weight_decay: float | None = None   # None: the net's arg_scope default (VGG 5e-4, ResNet 1e-4, Inception 4e-5)
    # Inception-v3 only. Off by default: without the auxiliary head the net has 23.8M parameters
    # (90.9 MiB), the paper's 90 MiB row; with it 27.1M (103.5 MiB).
    aux_logits: bool = False


def _xent(labels: tf.Tensor, logits: tf.Tensor) -> tf.Tensor:
    logits = tf.cast(logits, tf.float32)  # keep the loss in float32 even for float16 nets
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits))


def fused_batch_norm(inputs: tf.Tensor, decay: float = 0.999, center: bool = True, scale: bool = False,
                     epsilon: float = 0.001, is_training: bool = True, activation_fn=None,
                     variables_collections: dict | None = None, scope: str | None = None,
                     **_unused: object) -> tf.Tensor:
    """Stand-in for tf_slim.batch_norm in training mode: same variables, FusedBatchNormV3, UPDATE_OPS.

    tf-slim 1.1.0's batch_norm cannot run on TF 2.15: its default path builds the Keras-backed core
    layer (imports tf_keras, not installed) and its fused path calls tf_slim.layers.utils.constant_value,
    which touches the removed `ops.Tensor`. The nets only use batch norm through conv2d's
    normalizer_fn, so swapping it in the arg_scope keeps slim's variable names and semantics.
    """
    if not is_training:
        raise ModelError("tag_tf.models builds training graphs only: batch norm needs is_training=True")
    collections = variables_collections if isinstance(variables_collections, dict) else {}
    with tf.compat.v1.variable_scope(scope, "BatchNorm", [inputs]):
        shape = [int(inputs.shape[-1])]

        def var(name: str, init, trainable: bool = True) -> tf.Variable:
            extra = collections.get(name) or []
            return tf.compat.v1.get_variable(
                name, shape, dtype=tf.float32, initializer=init, trainable=trainable,
                collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.MODEL_VARIABLES,
                             *extra] + ([tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES] if trainable else []))

        # float32 statistics and affine parameters, also for float16 activations (as slim does).
        beta = var("beta", tf.compat.v1.zeros_initializer()) if center else tf.zeros(shape)
        gamma = var("gamma", tf.compat.v1.ones_initializer()) if scale else tf.ones(shape)
        moving_mean = var("moving_mean", tf.compat.v1.zeros_initializer(), trainable=False)
        moving_variance = var("moving_variance", tf.compat.v1.ones_initializer(), trainable=False)
        outputs, mean, variance = tf.compat.v1.nn.fused_batch_norm(inputs, gamma, beta, epsilon=epsilon,
                                                                   is_training=True)
        for moving, value, name in ((moving_mean, mean, "AssignMovingAvg"),
                                    (moving_variance, variance, "AssignMovingAvg_1")):
            with tf.compat.v1.name_scope(name):
                update = moving.assign_sub((moving - value) * (1.0 - decay))
            tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, update)
        return activation_fn(outputs) if activation_fn is not None else outputs


def _net_scope(net_scope: dict) -> dict:
    """The net's arg_scope with slim's batch_norm normalizer replaced by fused_batch_norm."""
    out = {}
    for key, kwargs in net_scope.items():
        kwargs = dict(kwargs)
        if getattr(kwargs.get("normalizer_fn"), "__name__", "") == "batch_norm":
            kwargs["normalizer_fn"] = fused_batch_norm
        out[key] = kwargs
    return out


def _batch_norm_scope(batch_norm: bool | None) -> contextlib.AbstractContextManager:
    """Forces batch norm on or off for every conv layer that does not pin its normalizer."""
    if batch_norm is None:
        return contextlib.nullcontext()
    if batch_norm:
        return tf_slim.arg_scope([tf_slim.conv2d], normalizer_fn=fused_batch_norm, normalizer_params={})
    return tf_slim.arg_scope([tf_slim.conv2d], normalizer_fn=None)


def _vgg19_logits(images: tf.Tensor, cfg: SlimConfig, opts: BuildOptions) -> tuple[tf.Tensor, tf.Tensor | None]:
    # fc6 is a 7x7 VALID conv on the pool5 map, so pool5 must be >= 7: side >= 224. Larger sides
    # give a spatial logits map (fully-convolutional VGG), which we average.
    pool5 = opts.input_size
    for _ in range(5):
        pool5 //= 2
    squeeze = pool5 == 7
    wd = {} if cfg.weight_decay is None else {"weight_decay": cfg.weight_decay}
    with tf_slim.arg_scope(_net_scope(vgg.vgg_arg_scope(**wd))), _batch_norm_scope(opts.batch_norm):
        logits, _ = vgg.vgg_19(images, num_classes=cfg.num_classes, is_training=True,
                               dropout_keep_prob=1.0 - opts.dropout, spatial_squeeze=squeeze)
    if not squeeze:
        logits = tf.reduce_mean(logits, axis=[1, 2])
    return logits, None


def _resnet101_logits(images: tf.Tensor, cfg: SlimConfig, opts: BuildOptions) -> tuple[tf.Tensor, tf.Tensor | None]:
    wd = {} if cfg.weight_decay is None else {"weight_decay": cfg.weight_decay}
    with tf_slim.arg_scope(_net_scope(resnet_v1.resnet_arg_scope(**wd))), _batch_norm_scope(opts.batch_norm):
        logits, _ = resnet_v1.resnet_v1_101(images, num_classes=cfg.num_classes, is_training=True,
                                            global_pool=True)
    return tf.squeeze(logits, axis=[1, 2], name="SpatialSqueeze"), None


def _inception_v3_logits(images: tf.Tensor, cfg: SlimConfig, opts: BuildOptions) -> tuple[tf.Tensor, tf.Tensor | None]:
    wd = {} if cfg.weight_decay is None else {"weight_decay": cfg.weight_decay}
    with tf_slim.arg_scope(_net_scope(inception_v3.inception_v3_arg_scope(**wd))), _batch_norm_scope(opts.batch_norm):
        logits, end_points = inception_v3.inception_v3(
            images, num_classes=cfg.num_classes, is_training=True, dropout_keep_prob=1.0 - opts.dropout,
            create_aux_logits=cfg.aux_logits)
    return logits, end_points.get("AuxLogits")


_NETS = {
    "vgg19": _vgg19_logits,
    "resnet101": _resnet101_logits,
    "inceptionv3": _inception_v3_logits,
}


def _builder(name: str):
    def make_forward(opts: BuildOptions, tiny: bool, overrides: dict[str, object]) -> tuple[ForwardFn, dict]:
        # tiny only shrinks the input side (chosen by the registry); the nets keep their real widths.
        cfg = resolve_config(name, SlimConfig(), overrides)
        check_positive(name, num_classes=cfg.num_classes)
        if opts.dtype == "float64":
            raise ModelError(f"model {name!r}: dtype float64 is not supported (fused batch norm has no float64 kernel)")
        if name != "inceptionv3" and cfg.aux_logits:
            raise ModelError(f"model {name!r}: aux_logits applies to inceptionv3 only")
        if name == "inceptionv3" and cfg.aux_logits and opts.input_size < INCEPTION_AUX_MIN_SIZE:
            raise ModelError(f"model {name!r}: input_size must be >= {INCEPTION_AUX_MIN_SIZE} with the auxiliary "
                             f"head (its 5x5 VALID pool needs a 5x5 Mixed_6e map), got {opts.input_size}")
        if name == "resnet101" and opts.dropout > 0:
            raise ModelError(f"model {name!r}: dropout must be 0 (ResNet has no dropout layer), got {opts.dropout}")

        def forward(inputs: Inputs) -> tf.Tensor:
            images = inputs.add("images", opts.dtype, [opts.input_size, opts.input_size, 3])
            labels = inputs.add("labels", "int32", [], 0, cfg.num_classes)
            logits, aux = _NETS[name](images, cfg, opts)
            loss = _xent(labels, logits)
            if aux is not None:
                loss += 0.4 * _xent(labels, aux)
            regularization = tf.compat.v1.losses.get_regularization_losses()
            if regularization:
                loss += tf.cast(tf.add_n(regularization), tf.float32)
            return loss

        return forward, dataclasses.asdict(cfg)

    return make_forward


# Smallest sides that still build: VGG needs pool5 >= 7 (224); Inception-v3's VALID stem needs 75,
# 107 with the auxiliary head; ResNet's SAME padding builds at any side (a 1x1 map after conv1).
INCEPTION_AUX_MIN_SIZE = 107
VGG19 = ModelSpec("vgg19", batch_size=96, input_size=224, tiny_input_size=224, min_input_size=224,
                  default_dropout=0.5, make_forward=_builder("vgg19"), input_meaning="image side")
RESNET101 = ModelSpec("resnet101", batch_size=96, input_size=224, tiny_input_size=32, min_input_size=1,
                      default_dropout=0.0, make_forward=_builder("resnet101"), input_meaning="image side")
INCEPTIONV3 = ModelSpec("inceptionv3", batch_size=96, input_size=299, tiny_input_size=75, min_input_size=75,
                        default_dropout=0.2, make_forward=_builder("inceptionv3"), input_meaning="image side")
