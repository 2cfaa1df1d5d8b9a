"""A job's test net with a snapshot's values as an ONNX model (opset 17, standard ops only;
opset 22 for a ceil_mode pooling whose last window would start in the padding).

Each op of `deploy.read` becomes nodes whose outputs onnxruntime computes as our layers do:
Convolution → Conv (W as (F, C/group, kh, kw)); Pooling → MaxPool / AveragePool with our
output size (`ceil_mode`) and divisor (kPooling/kCPooling: the window clipped at H + p, i.e.
count_include_pad 1; kCudnnPool: the real pixels, count_include_pad 0); InnerProduct → Gemm
(transB unless `transpose`), a Flatten before it; LRN → LRN (both divide alpha by the window
size: the conf's alpha as is, bias = knorm); STanh → Mul, Tanh, Mul (A·tanh(B·x)); Dropout →
Identity; Softmax → Softmax over the flattened features, or with softmax_conf.axis Softmax
over that axis (opset 13's meaning: the one axis, not the flattened tail); Concat; Preprocess
(kImagePreprocess at test: the top-left crop, times scale) → Slice, Mul. Caffe's kinds:
BatchNorm → BatchNormalization (scale 1, bias 0, mean and variance the sums times
norm.sums_scale); Scale → Mul (, Add); Eltwise → Sum (coeffs by Mul), Mul, Max; global
pooling → GlobalMaxPool / GlobalAveragePool; Flatten → Flatten, or Reshape when it keeps
more than 2 axes; Deconvolution → ConvTranspose; Crop → Slice; LRN WITHIN_CHANNEL (ONNX's
LRN is across channels) → x·(knorm + alpha·AveragePool(x², n×n, padding counted))^(−beta).
Graph inputs are the input layers' data
(after their mean/std) with a symbolic batch `N` unless one is given; outputs are the ops
nothing reads (the loss layer's probabilities).
"""
import numpy as np

from singa.errors import ConfigError
from singa.files import write_atomic
from singa.layers.base import type_name
from singa.layers.conv import window
from singa.layers.neuron import STANH_A, STANH_B
from singa.layers.norm import sums_scale
from singa.proto import job_pb2

__all__ = ["OPSET", "to_onnx", "write"]

#: the opset written, or DROPPED_WINDOW_OPSET for a net that needs its pooling rule
OPSET = 17
#: from opset 22 on, MaxPool and AveragePool with ceil_mode ignore a last window that would
#: start in the right padding, as Caffe and our `ceil_mode` do; before, they pool it
DROPPED_WINDOW_OPSET = 22


def _onnx():
    try:
        import onnx
    except ImportError:
        raise ConfigError("ONNX export needs the onnx package: pip install 'singa[onnx]' "
                          "(or pip install onnx)") from None
    return onnx


def write(model, path, batch=None):
    """Write `model` (a deploy.Model) to `path` as .onnx, checked by onnx.checker."""
    onnx = _onnx()
    proto = to_onnx(model, batch)
    onnx.checker.check_model(proto, full_check=True)
    write_atomic(path, lambda f: f.write(proto.SerializeToString()))
    return proto


def to_onnx(model, batch=None, extra_outputs=()):
    """The ModelProto of `model`; `batch` fixes the batch size (default: symbolic `N`);
    `extra_outputs`: names of further ops to output (to compare layer by layer)."""
    onnx = _onnx()
    b = _Builder(onnx, model.conf_path)
    for op in model.ops:
        _OPS[op.type](b, op)
    n = batch if batch else "N"
    inputs = [onnx.helper.make_tensor_value_info(op.name, onnx.TensorProto.FLOAT,
                                                 [n] + list(op.shape[1:])) for op in model.inputs]
    shapes = {op.name: op.shape for op in model.ops}
    outputs = [onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT,
                                                  [n] + list(shapes[name][1:]))
               for name in list(model.outputs) + [x for x in extra_outputs
                                                  if x not in model.outputs]]
    graph = onnx.helper.make_graph(b.nodes, model.name or "singa", inputs, outputs,
                                   b.initializers)
    opset = DROPPED_WINDOW_OPSET if any(map(_drops_a_window, model.ops)) else OPSET
    proto = onnx.helper.make_model(graph, producer_name="singa", producer_version="0.3",
                                   opset_imports=[onnx.helper.make_opsetid("", opset)],
                                   doc_string=f"{model.conf_path}, snapshot step {model.step}")
    proto.ir_version = 8 if opset < 22 else 10      # the oldest that holds the opset
    return proto


def _drops_a_window(op):
    """Whether a ceil_mode pooling op has fewer outputs than ceil((H + 2p − k)/s) + 1 on an
    axis: Caffe's rule left out a last window starting in the padding."""
    if op.type != "Pooling" or not op.conf.pooling_conf.ceil_mode:
        return False
    kh, kw, ph, pw, sh, sw = window(op.conf.pooling_conf)
    h, w = op.in_shapes[0][-2:]
    return any(o < -(-(n + 2 * p - k) // s) + 1
               for o, n, k, p, s in ((op.shape[2], h, kh, ph, sh), (op.shape[3], w, kw, pw, sw)))


class _Builder:
    """Nodes and initializers under construction; names unique per op."""

    def __init__(self, onnx, conf_path):
        self.onnx, self.conf_path = onnx, conf_path
        self.nodes, self.initializers, self._names = [], [], set()

    def const(self, name, array):
        name = self._unique(name)
        self.initializers.append(self.onnx.numpy_helper.from_array(np.asarray(array), name))
        return name

    def node(self, kind, inputs, output, **attrs):
        self.nodes.append(self.onnx.helper.make_node(kind, inputs, [output],
                                                     name=self._unique(output), **attrs))
        return output

    def _unique(self, name):
        base, i = name, 1
        while name in self._names:
            name, i = f"{base}_{i}", i + 1
        self._names.add(name)
        return name

    def refuse(self, op, why):
        raise ConfigError(f"{self.conf_path}: layer '{op.name}' ({type_name(op.conf)}): {why}")


def _params(b, op):
    return [b.const(n, a) for n, a in zip(op.param_names, op.params)]


def _four_d(b, op):
    """The op's source as (N, C, H, W): a 3-D (N, H, W) source gets C = 1 (our layers')."""
    x, shape = op.inputs[0], op.in_shapes[0]
    if len(shape) == 4:
        return x
    shape4 = b.const(f"{op.name}_in_shape", np.array([0, 1] + list(shape[1:]), np.int64))
    return b.node("Reshape", [x, shape4], f"{op.name}_in")


def _convolution(b, op):
    kh, kw, ph, pw, sh, sw = window(op.conf.convolution_conf)
    w, *bias = op.params      # no bias: a conv without one (use_bias=False)
    f, group = w.shape[0], op.conf.convolution_conf.group
    c = op.in_shapes[0][1] if len(op.in_shapes[0]) == 4 else 1
    names = [b.const(op.param_names[0], w.reshape(f, c // group, kh, kw))] + \
        [b.const(name, a) for name, a in zip(op.param_names[1:], bias)]
    b.node("Conv", [_four_d(b, op)] + names, op.name, kernel_shape=[kh, kw],
           pads=[ph, pw, ph, pw], strides=[sh, sw], group=group)


def _pooling(b, op):
    pc = op.conf.pooling_conf
    if pc.global_pooling:
        kind = "GlobalMaxPool" if pc.pool == job_pb2.PoolingProto.MAX else "GlobalAveragePool"
        b.node(kind, [_four_d(b, op)], op.name)
        return
    kh, kw, ph, pw, sh, sw = window(pc)
    attrs = dict(kernel_shape=[kh, kw], pads=[ph, pw, ph, pw], strides=[sh, sw],
                 ceil_mode=int(pc.ceil_mode))
    if pc.pool == job_pb2.PoolingProto.MAX:
        b.node("MaxPool", [_four_d(b, op)], op.name, **attrs)
    else:
        # ours: the window clipped at H + p (k·k in floor mode), or for kCudnnPool the real
        # pixels alone: count_include_pad 1 and 0 (onnxruntime clips at H + p as Caffe does)
        b.node("AveragePool", [_four_d(b, op)], op.name,
               count_include_pad=int(op.conf.type != job_pb2.kCudnnPool), **attrs)


def _inner_product(b, op):
    x = op.inputs[0]
    if len(op.in_shapes[0]) != 2:
        x = b.node("Flatten", [x], f"{op.name}_in", axis=1)
    b.node("Gemm", [x] + _params(b, op), op.name,
           transB=int(not op.conf.innerproduct_conf.transpose))


def _elementwise(kind):
    def build(b, op):
        b.node(kind, op.inputs, op.name)
    return build


def _stanh(b, op):
    """A·tanh(B·x), SINGA's scaled tanh, with our float32 A and B."""
    scaled = b.node("Mul", [op.inputs[0], b.const(f"{op.name}_B", np.array(STANH_B))],
                    f"{op.name}_Bx")
    t = b.node("Tanh", [scaled], f"{op.name}_tanh")
    b.node("Mul", [t, b.const(f"{op.name}_A", np.array(STANH_A))], op.name)


def _lrn(b, op):
    lc = op.conf.lrn_conf
    if len(op.in_shapes[0]) != 4:
        b.refuse(op, "LRN needs a 4-D source")
    if lc.norm_region == job_pb2.LRNProto.WITHIN_CHANNEL:
        _lrn_within(b, op, lc)
        return
    # both: y = x·(knorm + (alpha/n)·Σ_window x²)^(−beta), window of n centred on c
    b.node("LRN", op.inputs, op.name, size=lc.local_size, alpha=lc.alpha, beta=lc.beta,
           bias=lc.knorm)


def _lrn_within(b, op, lc):
    """x·(knorm + alpha·mean of x² over the n×n window)^(−beta), padding counted (ours and
    Caffe's: alpha/n² times the window's sum)."""
    x, n, name = op.inputs[0], lc.local_size, op.name
    sq = b.node("Mul", [x, x], f"{name}_sq")
    avg = b.node("AveragePool", [sq], f"{name}_avg", kernel_shape=[n, n], pads=[n // 2] * 4,
                 strides=[1, 1], count_include_pad=1)
    norm = b.node("Mul", [avg, b.const(f"{name}_alpha", np.array(lc.alpha, np.float32))],
                  f"{name}_scaled")
    norm = b.node("Add", [norm, b.const(f"{name}_k", np.array(lc.knorm, np.float32))],
                  f"{name}_norm")
    p = b.node("Pow", [norm, b.const(f"{name}_beta", np.array(-lc.beta, np.float32))],
               f"{name}_pow")
    b.node("Mul", [x, p], name)


def _softmax(b, op):
    shape = op.in_shapes[0]
    if op.conf.softmax_conf.HasField("axis"):
        b.node("Softmax", op.inputs, op.name, axis=op.conf.softmax_conf.axis)
        return
    if len(shape) == 2:
        b.node("Softmax", op.inputs, op.name, axis=1)
        return
    flat = b.node("Flatten", op.inputs, f"{op.name}_in", axis=1)
    if len(op.shape) == 2:          # a loss layer's probabilities are (N, D)
        b.node("Softmax", [flat], op.name, axis=1)
        return
    p = b.node("Softmax", [flat], f"{op.name}_flat", axis=1)
    back = b.const(f"{op.name}_shape", np.array([0] + list(op.shape[1:]), np.int64))
    b.node("Reshape", [p, back], op.name)


def _concat(b, op):
    b.node("Concat", op.inputs, op.name, axis=op.conf.concate_conf.concate_dim)


def _preprocess(b, op):
    """kImagePreprocess outside training: the top-left crop (or the centre), times scale."""
    rc = op.conf.rgbimage_conf
    crop, scale = np.array(op.shape[2:4], np.int64), np.float32(rc.scale)
    start = (np.array(op.in_shapes[0][2:4], np.int64) - crop) // 2 * rc.center_crop
    out = op.name if scale == 1 else f"{op.name}_crop"
    b.node("Slice", [op.inputs[0], b.const(f"{op.name}_starts", start),
                     b.const(f"{op.name}_ends", start + crop),
                     b.const(f"{op.name}_axes", np.array([2, 3], np.int64))], out)
    if scale != 1:
        b.node("Mul", [out, b.const(f"{op.name}_scale", np.array(scale))], op.name)


def _batch_norm(b, op):
    """y = (x − S_μ·s)/√(S_σ²·s + ε) with our float32 products (s = norm.sums_scale)."""
    bc = op.conf.batch_norm_conf
    if bc.HasField("use_global_stats") and not bc.use_global_stats:
        b.refuse(op, "normalises by batch statistics at test (use_global_stats: false); "
                 "ONNX's BatchNormalization takes given statistics")
    mean, var, factor = op.params
    s = sums_scale(factor[0])
    ones, zeros = np.ones_like(mean), np.zeros_like(mean)
    b.node("BatchNormalization",
           [op.inputs[0], b.const(f"{op.name}_gamma", ones), b.const(f"{op.name}_beta", zeros),
            b.const(op.param_names[0], mean * s), b.const(op.param_names[1], var * s)],
           op.name, epsilon=bc.eps)


def _scale(b, op):
    """x·γ (+ β), γ and β in the layer's broadcasting view."""
    view = op.layer.view
    out = op.name if len(op.params) == 1 else f"{op.name}_scaled"
    b.node("Mul", [op.inputs[0], b.const(op.param_names[0], op.params[0].reshape(view))], out)
    if len(op.params) > 1:
        b.node("Add", [out, b.const(op.param_names[1], op.params[1].reshape(view))], op.name)


def _eltwise(b, op):
    """SUM: Sum of the sources, each times its coeff (Mul) where it is not 1; PROD: Mul,
    one source after another; MAX: Max."""
    ec, xs, name = op.conf.eltwise_conf, op.inputs, op.name
    if ec.operation == job_pb2.EltwiseProto.MAX:
        b.node("Max", xs, name)
    elif ec.operation == job_pb2.EltwiseProto.PROD:
        acc = xs[0]
        for i, x in enumerate(xs[1:], 1):
            acc = b.node("Mul", [acc, x], name if i == len(xs) - 1 else f"{name}_prod{i}")
    else:
        terms = [x if c == 1 else b.node(
            "Mul", [x, b.const(f"{name}_coeff{i}", np.array(c, np.float32))], f"{name}_x{i}")
            for i, (x, c) in enumerate(zip(xs, op.layer.coeff))]
        b.node("Sum", terms, name)


def _flatten(b, op):
    if op.conf.flatten_conf.axis % len(op.in_shapes[0]) == 0:
        b.refuse(op, "flattens the batch axis")
    if len(op.shape) == 2:
        b.node("Flatten", op.inputs, op.name, axis=1)
        return
    shape = b.const(f"{op.name}_shape", np.array([0] + list(op.shape[1:]), np.int64))
    b.node("Reshape", [op.inputs[0], shape], op.name)


def _deconvolution(b, op):
    """ConvTranspose: W is (C, F/group, kh, kw) in both."""
    cc = op.conf.convolution_conf
    kh, kw, ph, pw, sh, sw = window(cc)
    b.node("ConvTranspose", [_four_d(b, op)] + _params(b, op), op.name, kernel_shape=[kh, kw],
           pads=[ph, pw, ph, pw], strides=[sh, sw], group=cc.group)


def _crop(b, op):
    """Caffe's Crop: a Slice of the first source at the layer's window."""
    cut = [(a, s) for a, s in enumerate(op.layer.window) if s.start is not None]

    def ints(name, values):
        return b.const(f"{op.name}_{name}", np.array(values, np.int64))
    b.node("Slice", [op.inputs[0], ints("starts", [s.start for _, s in cut]),
                     ints("ends", [s.stop for _, s in cut]), ints("axes", [a for a, _ in cut])],
           op.name)


def _input(b, op):
    pass


_OPS = {"Input": _input, "Convolution": _convolution, "Pooling": _pooling,
        "InnerProduct": _inner_product, "ReLU": _elementwise("Relu"),
        "Sigmoid": _elementwise("Sigmoid"), "Tanh": _elementwise("Tanh"), "STanh": _stanh,
        "Dropout": _elementwise("Identity"), "LRN": _lrn, "Softmax": _softmax,
        "Concat": _concat, "Preprocess": _preprocess, "BatchNorm": _batch_norm,
        "Scale": _scale, "Eltwise": _eltwise, "Flatten": _flatten,
        "Deconvolution": _deconvolution, "Crop": _crop}
