"""A job's test net with a snapshot's values as Caffe's deploy net (`deploy.prototxt`: an Input
layer, the layers, a Softmax) and weights (`model.caffemodel`: a binary NetParameter with V2
layers and blobs with `shape`), which `singa-import.sh caffe` reads back to the same values.

Each op of `deploy.read` becomes one Caffe layer of its name whose top is its name:
Convolution (weight (F, C/group, kh, kw), group), Pooling (round_mode CEIL with `ceil_mode`,
else FLOOR; Caffe's AVE divisor is ours: the window clipped at H + p), InnerProduct (with
`transpose` the K x N bytes as they are), LRN ACROSS_CHANNELS (both divide alpha by the
window), ReLU, Sigmoid, TanH, STanh as Power (scale B), TanH, Power (scale A), Dropout
(the identity in TEST), Softmax (after a Flatten for a blob of more than 2 axes: ours
normalises over all features; with softmax_conf.axis Caffe's own over that axis), Concat,
Pooling `global_pooling`, LRN WITHIN_CHANNEL (k 1 only, as Caffe fixes it), and Caffe's
kinds as themselves: BatchNorm (blobs: the two sums, the factor), Scale (γ, β; γ of Caffe's
shape () when num_axes is 0), Eltwise, Flatten, Deconvolution (weight (C, F/group, kh, kw)),
Crop. A 3-D input (N, H, W) read by a convolution or a pooling is declared (N, 1, H, W), as
our layers see it.
"""
import os

import numpy as np
from google.protobuf import text_format

from singa.errors import ConfigError
from singa.files import write_atomic
from singa.interop.caffe.netdef import copy_set
from singa.io.protowire import prefix
from singa.layers.base import type_name
from singa.layers.conv import window
from singa.layers.neuron import STANH_A, STANH_B
from singa.proto import caffe_pb2, job_pb2

__all__ = ["to_caffe", "write", "DEPLOY", "WEIGHTS"]

DEPLOY, WEIGHTS = "deploy.prototxt", "model.caffemodel"
C = caffe_pb2


def write(model, folder, batch=None):
    """Write `folder`/deploy.prototxt and `folder`/model.caffemodel (each by a temporary name,
    then renamed); their paths."""
    deploy, blobs = to_caffe(model, batch)
    os.makedirs(folder, exist_ok=True)
    paths = [os.path.join(folder, DEPLOY), os.path.join(folder, WEIGHTS)]
    write_atomic(paths[0], lambda f: f.write(text_format.MessageToString(deploy).encode()))
    write_atomic(paths[1], lambda f: write_caffemodel(f, deploy, blobs))
    return paths


def to_caffe(model, batch=None):
    """(the deploy NetParameter, {layer name: [its blobs as arrays of Caffe's shapes]})."""
    net = C.NetParameter(name=model.name or "singa")
    four_d = {i for op in model.ops if op.type in ("Convolution", "Deconvolution", "Pooling")
              for i in op.inputs}
    blobs = {}
    for op in model.ops:
        for layer, values in _LAYERS[op.type](op, model, batch, op.name in four_d):
            net.layer.append(layer)
            if values:
                blobs[layer.name] = values
    return net, blobs


def write_caffemodel(f, net, blobs):
    """The binary NetParameter of `net` with `blobs` written to file `f` layer by layer: each
    BlobProto's packed `data` goes out as the array's bytes, never as a message holding them
    (a VGG-16 is 138 M floats)."""
    header = C.NetParameter(name=net.name)
    f.write(header.SerializeToString())
    for layer in net.layer:
        head = layer.SerializeToString()
        parts = []          # (bytes before the values, values) per blob
        for values in blobs.get(layer.name, ()):
            data = np.ascontiguousarray(values, "<f4")     # 1-D at least: keep a 0-D shape
            shape = C.BlobShape(dim=np.shape(values)).SerializeToString()
            # BlobProto.shape (7), then .data (5) packed
            blob_head = prefix(7, len(shape)) + shape + prefix(5, data.nbytes)
            parts.append((blob_head, data))
        sizes = [len(h) + d.nbytes for h, d in parts]
        body = len(head) + sum(len(prefix(7, n)) + n for n in sizes)      # LayerParameter.blobs
        f.write(prefix(100, body) + head)                                   # NetParameter.layer
        for (blob_head, data), n in zip(parts, sizes):
            f.write(prefix(7, n) + blob_head)
            f.write(memoryview(data).cast("B"))


def _refuse(model, op, why):
    raise ConfigError(f"{model.conf_path}: layer '{op.name}' ({type_name(op.conf)}) {why}")


def _layer(op, kind, bottoms=None, name=None, top=None):
    layer = C.LayerParameter(name=name or op.name, type=kind)
    layer.bottom.extend(op.inputs if bottoms is None else bottoms)
    layer.top.append(top or name or op.name)
    return layer


def _input(op, model, batch, four_d):
    layer = _layer(op, "Input", [])
    shape = list(op.shape)
    if four_d and len(shape) == 3:
        shape = shape[:1] + [1] + shape[1:]
    layer.input_param.shape.add().dim.extend([batch or shape[0]] + shape[1:])
    return [(layer, None)]


def _window(p, conf, repeated):
    """Caffe's kernel/pad/stride of our conf: the plain field when square (repeated in a
    ConvolutionParameter), else the _h/_w pair."""
    kh, kw, ph, pw, sh, sw = window(conf)
    for name, (y, x) in (("kernel", (kh, kw)), ("pad", (ph, pw)), ("stride", (sh, sw))):
        plain = "kernel_size" if name == "kernel" else name
        if y != x:
            setattr(p, f"{name}_h", y)
            setattr(p, f"{name}_w", x)
        elif repeated:
            getattr(p, plain).append(y)
        else:
            setattr(p, plain, y)


def _convolution(op, model, batch, four_d):
    """Convolution and Deconvolution (whose weight is Caffe's blob as it is)."""
    layer = _layer(op, op.type)
    p = layer.convolution_param
    cc = op.conf.convolution_conf
    kh, kw = window(cc)[:2]
    w, *b = op.params     # no b: a conv without a bias (use_bias=False)
    p.num_output = cc.num_filters
    if not b:
        p.bias_term = False
    if cc.group != 1:
        p.group = cc.group
    _window(p, cc, repeated=True)
    if op.type == "Convolution":
        w = w.reshape(w.shape[0], -1, kh, kw)
    return [(layer, [w] + b)]


def _pooling(op, model, batch, four_d):
    pc = op.conf.pooling_conf
    kh, kw, ph, pw, sh, sw = window(pc)
    avg = pc.pool == job_pb2.PoolingProto.AVG
    if avg and op.conf.type == job_pb2.kCudnnPool and (ph or pw):
        _refuse(model, op, "divides by the real pixels of a padded window (cuDNN); Caffe's "
                "AVE counts the padding")
    layer = _layer(op, "Pooling")
    p = layer.pooling_param
    p.pool = C.PoolingParameter.AVE if avg else C.PoolingParameter.MAX
    if pc.global_pooling:
        p.global_pooling = True
        return [(layer, None)]
    _window(p, pc, repeated=False)
    p.round_mode = C.PoolingParameter.CEIL if pc.ceil_mode else C.PoolingParameter.FLOOR
    return [(layer, None)]


def _inner_product(op, model, batch, four_d):
    layer = _layer(op, "InnerProduct")
    w, *b = op.params     # no b: bias_term false
    transpose = op.conf.innerproduct_conf.transpose
    layer.inner_product_param.num_output = w.shape[1] if transpose else w.shape[0]
    if transpose:
        layer.inner_product_param.transpose = True
    if not b:
        layer.inner_product_param.bias_term = False
    return [(layer, [w] + b)]


def _plain(kind):
    def build(op, model, batch, four_d):
        return [(_layer(op, kind), None)]
    return build


def _stanh(op, model, batch, four_d):
    """A·tanh(B·x) as Power (scale B), TanH, Power (scale A)."""
    first = _layer(op, "Power", name=f"{op.name}_Bx")
    first.power_param.scale = float(STANH_B)
    tanh = _layer(op, "TanH", [first.name], name=f"{op.name}_tanh")
    last = _layer(op, "Power", [tanh.name])
    last.power_param.scale = float(STANH_A)
    return [(first, None), (tanh, None), (last, None)]


def _dropout(op, model, batch, four_d):
    layer = _layer(op, "Dropout")
    layer.dropout_param.dropout_ratio = op.conf.dropout_conf.dropout_ratio
    return [(layer, None)]


def _lrn(op, model, batch, four_d):
    layer = _layer(op, "LRN")
    lc, p = op.conf.lrn_conf, layer.lrn_param
    p.local_size, p.alpha, p.beta = lc.local_size, lc.alpha, lc.beta
    if lc.norm_region != job_pb2.LRNProto.WITHIN_CHANNEL:
        p.k = lc.knorm
    elif lc.knorm != 1:
        _refuse(model, op, f"normalises WITHIN_CHANNEL with knorm {lc.knorm:g}; Caffe's "
                f"WITHIN_CHANNEL fixes k at 1")
    else:
        p.norm_region = C.LRNParameter.WITHIN_CHANNEL
    return [(layer, None)]


def _softmax(op, model, batch, four_d):
    sc = op.conf.softmax_conf
    if len(op.in_shapes[0]) == 2 or sc.HasField("axis"):
        layer = _layer(op, "Softmax")
        if sc.HasField("axis") and sc.axis != 1:
            layer.softmax_param.axis = sc.axis
        return [(layer, None)]
    flat = _layer(op, "Flatten", name=f"{op.name}_flat")
    return [(flat, None), (_layer(op, "Softmax", [flat.name]), None)]


def _concat(op, model, batch, four_d):
    layer = _layer(op, "Concat")
    layer.concat_param.axis = op.conf.concate_conf.concate_dim
    return [(layer, None)]


def _preprocess(op, model, batch, four_d):
    if op.shape[2:] != op.in_shapes[0][2:]:
        _refuse(model, op, "crops the top-left corner; Caffe's test-time crop is the centre")
    layer = _layer(op, "Power")
    layer.power_param.scale = op.conf.rgbimage_conf.scale
    return [(layer, None)]


def _batch_norm(op, model, batch, four_d):
    layer = _layer(op, "BatchNorm")
    copy_set(op.conf.batch_norm_conf, layer.batch_norm_param,
            ("use_global_stats", "moving_average_fraction", "eps"))
    return [(layer, list(op.params))]


def _scale(op, model, batch, four_d):
    layer = _layer(op, "Scale")
    sc = op.conf.scale_conf
    copy_set(sc, layer.scale_param, ("axis", "num_axes"))
    gamma, *beta = op.params
    if beta:
        layer.scale_param.bias_term = True
    return [(layer, [gamma.reshape(()) if sc.num_axes == 0 else gamma] + beta)]


def _eltwise(op, model, batch, four_d):
    layer = _layer(op, "Eltwise")
    ec = op.conf.eltwise_conf
    copy_set(ec, layer.eltwise_param, ("operation",))      # the same numbers
    layer.eltwise_param.coeff.extend(ec.coeff)
    return [(layer, None)]


def _flatten(op, model, batch, four_d):
    layer = _layer(op, "Flatten")
    copy_set(op.conf.flatten_conf, layer.flatten_param, ("axis", "end_axis"))
    return [(layer, None)]


def _crop(op, model, batch, four_d):
    layer = _layer(op, "Crop")
    copy_set(op.conf.crop_conf, layer.crop_param, ("axis",))
    layer.crop_param.offset.extend(op.conf.crop_conf.offset)
    return [(layer, None)]


_LAYERS = {"Input": _input, "Convolution": _convolution, "Pooling": _pooling,
           "InnerProduct": _inner_product, "ReLU": _plain("ReLU"),
           "Sigmoid": _plain("Sigmoid"), "Tanh": _plain("TanH"), "STanh": _stanh,
           "Dropout": _dropout, "LRN": _lrn, "Softmax": _softmax, "Concat": _concat,
           "Preprocess": _preprocess, "BatchNorm": _batch_norm, "Scale": _scale,
           "Eltwise": _eltwise, "Flatten": _flatten, "Deconvolution": _convolution,
           "Crop": _crop}
