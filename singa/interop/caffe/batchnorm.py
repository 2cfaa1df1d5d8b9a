"""Caffe's BatchNorm and Scale → SINGA's kCaffeBatchNorm and kScale, and with -fold-bn a
BatchNorm of global statistics (and the per-channel Scale after it) folded into the
Convolution before it: w' = w·k, b' = (b − mean·s)·k + β, k = γ / √(var·s + ε), s Caffe's
scale factor of its running sums, made in float64. Functions of the translator `t`
(`translate._Translator`) and a layer, as the other layer types'."""
import numpy as np

from singa.errors import ConfigError
from singa.interop.caffe.netdef import copy_set, in_net_state, strip_legacy
from singa.layers.norm import sums_scale
from singa.proto import caffe_pb2, job_pb2

__all__ = ["batch_norm", "scale_layer", "fold_values"]

C = caffe_pb2


def fold_values(t):
    """The folded Convolutions' weight and bias values (see translate), made in float64
    from the weights of each Convolution, BatchNorm and Scale; values that are not finite
    (a variance below -eps, beyond float32) stop the import."""
    for bn, (conv, scale, eps) in t.folds.items():
        if conv not in t.weights:
            raise ConfigError(f"{t.weights_path}: no weights for layer '{conv}', which "
                              f"-fold-bn would fold BatchNorm '{bn}' into")
        w, b = t.params[f"{conv}_weight"], t.params[f"{conv}_bias"]
        f = w.shape[0]
        mean, var, factor = blob_values(t, bn, "BatchNorm", [f, f, 1])
        s = sums_scale(factor[0])
        with np.errstate(all="ignore"):
            k = 1 / np.sqrt(var * s + eps)
            beta = 0
            if scale is not None:
                gamma, *bias = blob_values(t, scale, "Scale", [f], [f, f])
                k, beta = k * gamma, (bias[0] if bias else 0)
            bias = b.values if b.blob is None else t.weights[conv][1].values
            w.values = (t.weights[conv][0].values.reshape(f, -1) * k[:, None]) \
                .astype(np.float32).reshape(w.shape)
            b.values = ((bias - mean * s) * k + beta).astype(np.float32)
        if not (np.isfinite(w.values).all() and np.isfinite(b.values).all()):
            raise ConfigError(f"{t.weights_path}: folding BatchNorm '{bn}' into '{conv}' "
                              f"gives values that are not finite (a variance below -eps, or "
                              f"beyond float32)")
        w.blob = b.blob = None
    t.notes.append(f"-fold-bn: {len(t.folds)} BatchNorm layers folded into the "
                      f"Convolution before them ("
                      f"{sum(s is not None for _, s, _ in t.folds.values())} with "
                      f"their Scale); the job computes inference statistics only")

def blob_values(t, name, kind, *wants):
    """Layer `name`'s blobs as float64 vectors whose sizes are one of `wants`, or a
    one-line ConfigError."""
    sizes = [b.values.size for b in t.weights.get(name, [])]
    if sizes not in wants:
        raise ConfigError(f"{t.weights_path}: layer '{name}' has blobs of {sizes} "
                          f"values, the folded {kind} needs "
                          f"{' or '.join(map(str, wants))}")
    return [b.values.astype(np.float64) for b in t.weights[name]]

def batch_norm(t, layer):
    """kCaffeBatchNorm, Caffe's three blobs (the running sums of the mean and the variance,
    the factor) as params `_mean`, `_variance`, `_factor`; with -fold-bn folded into the
    Convolution before it where _fold can."""
    if t.fold_bn and _fold(t, layer):
        return t.rename(layer)
    p = layer.batch_norm_param
    conf = t.new(layer, job_pb2.kCaffeBatchNorm, t.src(layer, 1))
    copy_set(p, conf.batch_norm_conf, ("use_global_stats", "moving_average_fraction", "eps"))
    zero = C.FillerParameter()      # Caffe starts the sums at 0
    t.add_params(layer, conf, [("mean", _vector, 0, zero), ("variance", _vector, 1, zero),
                               ("factor", (1,), 2, zero)])
    return t.one_top(layer, conf)


def _fold(t, layer):
    """Whether BatchNorm `layer` folds: it has global statistics (use_global_stats true, or
    unset in a net without a loss, which nothing trains) and alone reads the top of a
    Convolution. A per-channel Scale (axis 1, num_axes 1) that alone reads its top folds
    with it. Records the fold in t.folds (values: fold_values); a note says why
    a BatchNorm is kept."""
    p = layer.batch_norm_param
    src = next((i for i in range(t.at - 1, -1, -1) if in_net_state(t.net.layer[i], t.phase)
                and layer.bottom[0] in t.net.layer[i].top), None)
    conv = t.net.layer[src] if src is not None else None
    if not (p.use_global_stats if p.HasField("use_global_stats") else not t.has_loss):
        why = "it normalises by batch statistics in training"
    elif conv is None or conv.type != "Convolution" or len(layer.bottom) != 1:
        why = "it does not read a Convolution's top"
    elif t.readers(layer.bottom[0], src) != [t.at]:
        why = f"another layer reads the top of Convolution '{conv.name}'"
    else:
        readers = t.readers(layer.top[0], t.at) if len(layer.top) == 1 else []
        scale = t.net.layer[readers[0]] if len(readers) == 1 else None
        if scale is None or scale.type != "Scale" or len(scale.bottom) != 1 or \
                scale.scale_param.axis != 1 or scale.scale_param.num_axes != 1:
            scale = None
        else:
            t.fold_scale.add(readers[0])
        t.folds[layer.name] = (conv.name, scale and scale.name, p.eps)
        return True
    t.notes.append(f"-fold-bn: BatchNorm '{layer.name}' is kept: {why}")
    return False


def scale_layer(t, layer):
    """kScale (axis, num_axes, bias_term): params `_scale` (Caffe's filler default: 1) and
    `_bias`; a Scale folded with its BatchNorm (_fold) is renamed."""
    if t.at in t.fold_scale:
        return t.rename(layer)
    p = layer.scale_param
    if len(layer.bottom) != 1:
        t.refuse(layer, "takes its scale from a second bottom (not supported)")
    conf = t.new(layer, job_pb2.kScale, t.src(layer, 1))
    copy_set(p, conf.scale_conf, ("axis", "num_axes"))
    shapes = [("scale", _any_shape, 0, p.filler if p.HasField("filler") else
               C.FillerParameter(type="constant", value=1))]
    if p.bias_term:
        conf.scale_conf.bias_term = True
        shapes.append(("bias", _any_shape, 1, p.bias_filler))
    t.add_params(layer, conf, shapes)
    return t.one_top(layer, conf)


def _vector(shape):
    """A (C,) blob's SINGA shape (legacy 1x1x1xC too)."""
    s = strip_legacy(shape, 1)
    return s if len(s) == 1 else "C"


def _any_shape(shape):
    """A Scale blob's SINGA shape: Caffe's, () (one number) as (1,)."""
    return tuple(shape) or (1,)
