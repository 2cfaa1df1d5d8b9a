"""singa.layers.kernels: numba's compiled copies give numpy's bits, every kernel module has
numpy's functions, and the choice is checked."""
import functools
import inspect
import logging
import sys

import numpy as np
import pytest

from gradcheck import BACKWARD, FORWARD, Source, make_layer
from singa.device import CPU
from singa.device import threads
from singa.errors import ConfigError
from singa.layers import kernels
from singa.layers.kernels import cuda
from singa.proto import job_pb2

numba = pytest.importorskip("singa.layers.kernels.numba")


def conv(num_filters, group=1, **window):
    fields = " ".join(f"{k}: {v}" for k, v in window.items())
    return (f'name: "conv" type: kCConvolution convolution_conf {{ num_filters: {num_filters} '
            f'group: {group} {fields} }} param {{ name: "w" }} param {{ name: "b" }}')


def step(monkeypatch, choice, conf, shape, nthreads):
    """A forward and a backward pass of the layer of `conf` on fixed random blobs: its output,
    the source's gradient and the params' gradients."""
    monkeypatch.setenv("SINGA_KERNELS", choice)
    rng = np.random.default_rng(0)
    src = Source(rng.standard_normal(shape))
    layer = make_layer(conf, [src])
    assert layer.kernels.__name__ == f"singa.layers.kernels.{choice}"
    layer.grad[...] = rng.standard_normal(layer.grad.shape)
    with threads.limit(nthreads):
        layer.compute_feature(FORWARD, [src])
        layer.compute_gradient(BACKWARD, [src])
    return [layer.data, src.grad] + [p.grad for p in layer.params]


@pytest.mark.parametrize("conf, shape", [
    (conv(32, kernel=5, pad=2), (12, 3, 16, 16)),           # cifar10's conv1: im2col, padded
    (conv(8, kernel=5, pad=2), (12, 16, 8, 8)),             # transposed convolution
    (conv(50, kernel=5), (12, 20, 12, 12)),                 # LeNet's conv2: col2im, stride 1
    (conv(6, kernel=3, pad=1, stride=2), (9, 4, 9, 9)),     # col2im, stride 2
    (conv(6, kernel_x=3, kernel_y=2, pad_x=2, pad_y=1, stride_x=3), (5, 2, 7, 9)),
    (conv(4, group=2, kernel=3, pad=1), (7, 6, 8, 8)),      # groups, transposed
    (conv(14, group=2, kernel=3, pad=1), (7, 6, 8, 8)),     # groups, col2im
    (conv(6, group=6, kernel=3, pad=1), (5, 6, 9, 8)),      # depthwise: direct, 3 × 3 pass
    (conv(6, group=6, kernel=3, pad=1, stride=2), (5, 6, 9, 8)),    # phase planes
    (conv(8, group=4, kernel_x=3, kernel_y=2, pad_x=2, stride_y=2), (3, 8, 6, 7)),
    (conv(8, group=4, kernel=5, pad=2, stride=3), (3, 4, 9, 9)),    # 2 filters per channel
])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_compiled_copies_give_numpys_bits(monkeypatch, conf, shape, nthreads):
    compiled = step(monkeypatch, "numba", conf, shape, nthreads)
    plain = step(monkeypatch, "numpy", conf, shape, 1)
    for a, b in zip(compiled, plain):
        assert a.tobytes() == b.tobytes()


def test_every_kernel_module_has_numpys_functions_with_their_parameters():
    for name in kernels.numpy.__all__:
        ours = getattr(kernels.numpy, name)
        for other in (numba, cuda):
            if name == "taps":
                continue        # numpy's own helper, which pooling's layer does not call
            theirs = getattr(other, name)
            if callable(ours):
                plain = getattr(theirs, "py_func", theirs)      # numba's compiled function
                assert list(inspect.signature(plain).parameters) == \
                    list(inspect.signature(ours).parameters), (other.__name__, name)
            else:
                assert type(theirs) is type(ours), (other.__name__, name)


def test_with_numba_lrn_stays_numpys_calls_and_pooling_is_compiled():
    for name in ("softmax_loss_grad", "lrn", "lrn_grad"):
        assert getattr(numba, name) is getattr(kernels.numpy, name)
    for name in ("max_pool", "avg_pool", "max_pool_backward", "avg_pool_backward"):
        assert getattr(numba, name) is not getattr(kernels.numpy, name)
        assert hasattr(getattr(numba, name), "py_func")


@pytest.mark.parametrize("f", [kernels.numpy.RELU, kernels.numpy.SIGMOID, kernels.numpy.TANH])
def test_compiled_relu_gives_numpys_bits_both_ways(f):
    """ReLU is numba's loop, the others numpy's calls: numpy's bits for ±0, NaNs of either
    sign and ±inf, in place too; a strided array takes numpy's path."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 7)).astype(np.float32)
    x.flat[:8] = [-0.0, 0.0, np.nan, -np.nan, -1, 1, np.inf, -np.inf]
    g = rng.standard_normal(x.shape).astype(np.float32)
    g.flat[8:16] = [np.nan, -1, 1, -0.0, 0, np.inf, -np.inf, -np.nan]
    outs = []
    for k in (numba, kernels.numpy):
        y, gx, gin = np.empty_like(x), np.empty_like(x), g.copy()
        k.activation(f, x, y)
        k.activation_grad(f, y, g, gx)
        k.activation_grad(f, x, gin, gin)                   # gx is g
        strided = np.empty((3, 5, 14), np.float32)[..., ::2]
        k.activation(f, x, strided)
        outs.append([y.tobytes(), gx.tobytes(), gin.tobytes(), strided.copy().tobytes()])
    assert outs[0] == outs[1]


def pool(kind, kernel, stride=1, pad=0, ceil=False, cudnn=False):
    return (f'name: "pool" type: {"kCudnnPool" if cudnn else "kCPooling"} pooling_conf {{ '
            f'pool: {kind} kernel: {kernel} stride: {stride} pad: {pad} '
            f'ceil_mode: {str(ceil).lower()} }}')


def pool_step(monkeypatch, choice, conf, x, g, train):
    """A forward (in training or not) and a backward pass of the pooling layer of `conf` on x
    with gradient g: its output, its argmax (MAX) and the source's gradient."""
    monkeypatch.setenv("SINGA_KERNELS", choice)
    src = Source(x)
    layer = make_layer(conf, [src])
    assert layer.kernels.__name__ == f"singa.layers.kernels.{choice}"
    layer.grad[...] = g(layer.grad.shape)
    layer.compute_feature(FORWARD if train else job_pb2.kTest | job_pb2.kForward, [src])
    out = [layer.data.copy()]
    if train:
        layer.compute_gradient(BACKWARD, [src])
        out += [src.grad] + ([layer._argmax] if layer.is_max else [])
    return out


@pytest.mark.parametrize("kind", ["MAX", "AVG"])
@pytest.mark.parametrize("kernel, stride, pad", [
    (3, 2, 0), (2, 2, 0), (3, 1, 1), (2, 1, 1), (3, 3, 2), (3, 2, 1), (2, 3, 1)])
@pytest.mark.parametrize("ceil", [False, True])
@pytest.mark.parametrize("values", ["normal", "constant", "few", "signed zeros"])
def test_compiled_pooling_gives_numpys_bits(monkeypatch, kind, kernel, stride, pad, ceil,
                                            values):
    rng = np.random.default_rng(kernel * 100 + stride * 10 + pad)
    shape = (4, 3, 9, 8)        # the last ceil-mode window overhangs the padded input
    x = {"normal": lambda s: rng.standard_normal(s),
         "constant": lambda s: np.full(s, 1.5),                     # every tap ties
         "few": lambda s: rng.integers(-2, 3, s),                   # some taps tie
         "signed zeros": lambda s: rng.choice([0.0, -0.0], s)}[values]
    xs = x(shape).astype(np.float32)
    grad = {"normal": rng.standard_normal, "signed zeros": lambda s: rng.choice(
        [0.0, -0.0, 1.0], s)}.get(values, rng.standard_normal)
    gs = grad((4, 3, 12, 12)).astype(np.float32)

    def g(s):
        return gs[:, :, :s[2], :s[3]]
    for cudnn in ([False, True] if kind == "AVG" and pad else [False]):
        conf = pool(kind, kernel, stride, pad, ceil, cudnn)
        for train in (True, False):
            compiled = pool_step(monkeypatch, "numba", conf, xs, g, train)
            plain = pool_step(monkeypatch, "numpy", conf, xs, g, train)
            for a, b in zip(compiled, plain):
                assert a.tobytes() == b.tobytes()


def test_compiled_pooling_of_rectangular_windows_gives_numpys_bits():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 10, 7)).astype(np.float32)
    for kh, kw, ph, pw, sh, sw, oh, ow in ((3, 2, 1, 0, 2, 1, 6, 6), (2, 3, 0, 2, 3, 2, 3, 5)):
        gy = rng.standard_normal((2, 3, oh, ow)).astype(np.float32)
        size = rng.integers(1, 7, (oh, ow)).astype(np.float32)
        outs = []
        for k in (numba, kernels.numpy):
            y, gx = np.empty((2, 3, oh, ow), np.float32), np.empty_like(x)
            am = np.empty(y.shape, k.argmax_dtype(kh, kw))
            k.max_pool(x, kh, kw, ph, pw, sh, sw, y, am, True)
            k.max_pool_backward(gy, am, kh, kw, ph, pw, sh, sw, gx)
            outs += [y.tobytes(), am.tobytes(), gx.tobytes()]
            k.avg_pool(x, kh, kw, ph, pw, sh, sw, size, y)
            k.avg_pool_backward(gy, size, kh, kw, ph, pw, sh, sw, gx)
            outs += [y.tobytes(), gx.tobytes()]
        assert outs[:5] == outs[5:]
    assert numba.im2col is not kernels.numpy.im2col


SCALE = 'name: "scale" type: kScale param { name: "g" } param { name: "b" } scale_conf { %s }'
BATCH_NORM = ('name: "bn" type: kCaffeBatchNorm param { name: "m" } param { name: "v" } '
              'param { name: "f" }')


@pytest.mark.parametrize("conf, shape", [
    (SCALE % "bias_term: true", (6, 5, 4, 3)),
    (SCALE.replace(' param { name: "b" }', "") % "", (6, 5, 4, 3)),
    (SCALE % "axis: 0 num_axes: 2 bias_term: true", (6, 5, 4, 3)),    # γ spans the samples
    (SCALE % "axis: 2 bias_term: true", (6, 5, 4, 3)),
    (SCALE % "num_axes: 0 bias_term: true", (6, 5, 4, 3)),            # one number
    (SCALE % "bias_term: true", (6, 7)),
    (BATCH_NORM, (6, 5, 4, 3)), (BATCH_NORM, (6, 7))])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_compiled_per_channel_passes_give_numpys_bits(monkeypatch, conf, shape, nthreads):
    """Scale's forward and BatchNorm's by global statistics, by chunks on the threads."""
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)
    outs = []
    for choice in ("numba", "numpy"):
        monkeypatch.setenv("SINGA_KERNELS", choice)
        src = Source(np.random.default_rng(0).standard_normal(shape))
        layer = make_layer(conf, [src])
        assert layer.kernels.__name__ == f"singa.layers.kernels.{choice}"
        if conf == BATCH_NORM:
            layer.variance.data[...] = np.abs(layer.variance.data) + 0.1
            layer.factor.data[...] = 3
        with threads.limit(nthreads):
            layer.compute_feature(job_pb2.kTest, [src])
        outs.append(layer.data.tobytes())
    assert outs[0] == outs[1]


@pytest.mark.parametrize("conf", ["cropsize: 5 mirror: true scale: 0.017",
                                  "cropsize: 4 mirror: true", "scale: 3", "cropsize: 5"])
def test_compiled_crop_mirror_gives_numpys_bits(monkeypatch, conf):
    """ImagePreprocess's training crops (random offsets and flips) and its test crop."""
    outs = []
    for choice in ("numba", "numpy"):
        monkeypatch.setenv("SINGA_KERNELS", choice)
        src = Source(np.random.default_rng(0).normal(0, 90, (6, 3, 7, 9)), grad=False)
        layer = make_layer(f'name: "pre" type: kImagePreprocess rgbimage_conf {{ {conf} }}',
                           [src], seed=4)
        assert layer.kernels.__name__ == f"singa.layers.kernels.{choice}"
        for flag in (job_pb2.kTrain, job_pb2.kTest):
            layer.compute_feature(flag, [src])
            outs.append(layer.data.tobytes())
    assert outs[:2] == outs[2:]


def test_numpy_is_chosen_by_the_environment(monkeypatch):
    monkeypatch.setenv("SINGA_KERNELS", "numpy")
    assert kernels.choose(CPU) is kernels.numpy
    monkeypatch.delenv("SINGA_KERNELS")
    assert kernels.choose(CPU) is numba


def test_a_numba_that_does_not_load_leaves_numpys_copies(monkeypatch, caplog):
    monkeypatch.delenv("SINGA_KERNELS", raising=False)       # numba's chosen, then
    monkeypatch.setitem(sys.modules, "singa.layers.kernels.numba", None)    # its import fails
    monkeypatch.setattr(kernels, "_numba", functools.cache(kernels._numba.__wrapped__))
    monkeypatch.setattr(logging.getLogger("singa"), "propagate", True)
    assert kernels.choose(CPU) is kernels.numpy and kernels.choose(CPU) is kernels.numpy
    assert caplog.text.count("numba does not load") == 1


def test_an_unknown_choice_is_refused(monkeypatch):
    monkeypatch.setenv("SINGA_KERNELS", "fortran")
    with pytest.raises(ConfigError,
                       match="SINGA_KERNELS=fortran: must be one of onednn, numba, numpy"):
        kernels.choose(CPU)
