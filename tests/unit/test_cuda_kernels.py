"""singa.layers.kernels.cuda without a GPU: its CUDA source (cuda.cu) built by the C++ compiler
(tests/cuda_shim.py), every (block, thread) of each launch run in turn, against numba's loops
(`singa.layers.kernels.numba`) and numpy's (`kernels.numpy`): the same float32 bits. Inputs sit
between NaN guards and outputs start as NaN, so a kernel that reads or writes past its arrays,
or leaves an element unwritten, fails. Each runs with int and with long long indices. nvcc,
where installed, builds the same source, and the updater's (singa/train/updater_cuda.cu), for
sm_80 and sm_90 (CUDA-only errors)."""
import os
import shutil
import subprocess
import types

import numpy as np
import pytest

import cuda_shim
from gradcheck import BACKWARD, FORWARD, Source, make_layer
from singa.layers import conv, kernels, neuron
from singa.layers.kernels import cuda
from singa.proto import job_pb2
from singa.train import updater_cuda

loops = pytest.importorskip("singa.layers.kernels.numba")

GUARD = 64


@pytest.fixture(params=["int", "long long"])
def shim(request, monkeypatch):
    """cuda's kernels on host arrays through the shim, with `request.param` indices."""
    if cuda_shim.compiler() is None:
        pytest.skip("no C++ compiler (g++, c++ or $CXX) to build the CUDA source with")
    monkeypatch.setattr(cuda, "module", lambda a: Host)
    if request.param == "long long":
        monkeypatch.setattr(cuda, "INT_INDEX_LIMIT", 0)
    return Guards()


class Host:
    """The array module the kernels see: cupy's RawKernel on host arrays."""
    RawKernel = cuda_shim.RawKernel
    ascontiguousarray = staticmethod(np.ascontiguousarray)


class Guards:
    """Arrays placed between guard cells (NaN, -77 for ints, 177 unsigned), checked by `intact`."""

    def __init__(self):
        self.made = []

    def new(self, a, dtype=np.float32):
        """A copy of `a` between guards (`a` a shape: filled with the guard value)."""
        fill = {"f": np.nan, "u": 177}.get(np.dtype(dtype).kind, -77)
        shape = a if isinstance(a, tuple) else np.shape(a)
        size = int(np.prod(shape))
        buf = np.full(size + 2 * GUARD, fill, dtype)
        view = buf[GUARD:GUARD + size].reshape(shape)
        if not isinstance(a, tuple):
            view[...] = a
        self.made.append((buf, size, fill))
        return view

    def intact(self):
        for buf, size, fill in self.made:
            for side in (buf[:GUARD], buf[GUARD + size:]):
                assert side.tobytes() == np.full_like(side, fill).tobytes(), \
                    "a kernel wrote past an array"
        return True


def same_bits(ours, theirs):
    assert ours.shape == theirs.shape
    assert ours.tobytes() == theirs.tobytes(), np.abs(ours - theirs).max()
    return True


# (b, C, H, W, kh, kw, ph, pw, sh, sw): same padding, strides, kernel larger and smaller
# than the stride, odd sizes, windows wholly in the padding
CONV = [(2, 3, 7, 9, 3, 3, 1, 1, 1, 1), (3, 2, 8, 7, 3, 2, 0, 1, 2, 2),
        (2, 3, 9, 9, 5, 5, 2, 2, 3, 3), (1, 2, 6, 5, 2, 3, 0, 2, 1, 3),
        (2, 1, 5, 5, 1, 1, 0, 0, 2, 2), (2, 2, 4, 6, 4, 4, 3, 3, 1, 2)]


def col_shape(b, c, h, w, kh, kw, ph, pw, sh, sw):
    return (c, kh, kw, b, (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1)


@pytest.mark.parametrize("case", CONV)
@pytest.mark.parametrize("channels_first", [False, True])
def test_im2col_copies_as_numbas_loops(shim, case, channels_first):
    b, c, h, w, kh, kw, ph, pw, sh, sw = case
    x = np.random.default_rng(0).standard_normal((c, b, h, w) if channels_first
                                                 else (b, c, h, w)).astype(np.float32)
    want = loops.im2col(x, ph, pw, sh, sw, np.empty(col_shape(*case), np.float32),
                        channels_first)
    col = shim.new(col_shape(*case))
    assert cuda.im2col(shim.new(x), ph, pw, sh, sw, col, channels_first) is col
    assert same_bits(col, want) and shim.intact()


@pytest.mark.parametrize("case", CONV)
def test_col2im_adds_the_taps_in_numbas_order(shim, case):
    b, c, h, w, kh, kw, ph, pw, sh, sw = case
    col = np.random.default_rng(1).standard_normal(col_shape(*case)).astype(np.float32)
    want = loops.col2im(col, ph, pw, sh, sw, np.empty((b, c, h, w), np.float32))
    gx = shim.new((b, c, h, w))
    assert cuda.col2im(shim.new(col), ph, pw, sh, sw, gx) is gx
    assert same_bits(gx, want) and shim.intact()


def test_col2im_writes_a_channel_slice_of_a_larger_gradient(shim):
    """A cut grouped convolution's gx is a channel slice: not contiguous."""
    case = CONV[1]
    b, c, h, w, kh, kw, ph, pw, sh, sw = case
    col = np.random.default_rng(1).standard_normal(col_shape(*case)).astype(np.float32)
    whole = shim.new((b, c + 2, h, w))
    cuda.col2im(shim.new(col), ph, pw, sh, sw, whole[:, 1:c + 1])
    want = loops.col2im(col, ph, pw, sh, sw, np.empty((b, c, h, w), np.float32))
    assert same_bits(whole[:, 1:c + 1], want) and np.isnan(whole[:, [0, c + 1]]).all()


# (b, G, m, cg, H, W, kh, kw, ph, pw, sh, sw): depthwise 3 × 3 (numba's unrolled taps), small
# groups, strides above and below the kernel
GROUPS = [(2, 3, 1, 1, 7, 7, 3, 3, 1, 1, 1, 1), (2, 2, 2, 2, 6, 5, 3, 3, 1, 0, 2, 2),
          (3, 4, 1, 1, 9, 8, 5, 5, 2, 2, 3, 3), (1, 2, 4, 1, 5, 5, 2, 2, 1, 1, 3, 3),
          (2, 2, 1, 3, 6, 7, 3, 2, 2, 1, 2, 1)]


def group_arrays(case, seed=2):
    b, ng, m, cg, h, w, kh, kw, ph, pw, sh, sw = case
    rng = np.random.default_rng(seed)
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    x = rng.standard_normal((b, ng * cg, h, w)).astype(np.float32)
    wt = rng.standard_normal((ng, m, cg, kh, kw)).astype(np.float32)
    bias = rng.standard_normal(ng * m).astype(np.float32)
    gy = rng.standard_normal((b, ng * m, oh, ow)).astype(np.float32)
    return x, wt, bias, gy


@pytest.mark.parametrize("case", GROUPS)
def test_group_conv_sums_as_numbas_loops(shim, case):
    ph, pw, sh, sw = case[-4:]
    x, wt, bias, gy = group_arrays(case)
    want = loops.group_conv(x, wt, bias, ph, pw, sh, sw, np.empty(gy.shape, np.float32))
    y = shim.new(gy.shape)
    cuda.group_conv(shim.new(x), shim.new(wt), shim.new(bias), ph, pw, sh, sw, y)
    assert same_bits(y, want) and shim.intact()


@pytest.mark.parametrize("case", GROUPS)
def test_group_conv_gradients_sum_as_numbas_loops(shim, case):
    b, ng, m, cg, h, w, kh, kw, ph, pw, sh, sw = case
    x, wt, _, gy = group_arrays(case)
    shape = (ng * m, cg, kh, kw) + gy.shape[2:]
    want = loops.group_conv_wgrad(x, gy, ph, pw, sh, sw, np.empty(shape, np.float32))
    acc = shim.new(shape)
    cuda.group_conv_wgrad(shim.new(x), shim.new(gy), ph, pw, sh, sw, acc)
    assert same_bits(acc, want)
    want = loops.group_conv_xgrad(gy, wt, ph, pw, sh, sw, np.empty(x.shape, np.float32))
    gx = shim.new(x.shape)
    cuda.group_conv_xgrad(shim.new(gy), shim.new(wt), ph, pw, sh, sw, gx)
    assert same_bits(gx, want) and shim.intact()


POOLS = [dict(kernel=2, stride=2), dict(kernel=3, stride=2, pad=1),
         dict(kernel_x=2, kernel_y=3, stride_x=1, stride_y=2, pad_x=1),
         dict(kernel=3, stride=2, pad=1, ceil_mode="true"), dict(kernel=3, stride=2,
                                                                 ceil_mode="true"),
         dict(kernel=2, stride=3), dict(kernel=4, stride=1, pad=3)]


@pytest.mark.parametrize("layer_type", ["kCPooling", "kCudnnPool"])
@pytest.mark.parametrize("pool", ["MAX", "AVG"])
@pytest.mark.parametrize("window", POOLS)
@pytest.mark.parametrize("shape", [(2, 3, 7, 8), (1, 2, 6, 6)])
def test_pooling_kernels_give_the_layers_bits(shim, layer_type, pool, window, shape):
    """Forward and backward against the layer's numpy path; small integers, so windows tie
    (MAX: the first maximum wins, Caffe's rule)."""
    rng = np.random.default_rng(4)
    src = Source(rng.integers(-3, 4, shape).astype(np.float32))
    layer = make_layer(f'name: "pool" type: {layer_type} pooling_conf {{ pool: {pool} '
                       + " ".join(f"{k}: {v}" for k, v in window.items()) + " }", [src])
    layer.compute_feature(FORWARD, [src])
    layer.grad[...] = rng.standard_normal(layer.grad.shape)
    layer.compute_gradient(BACKWARD, [src])
    kh, kw, ph, pw, sh, sw = conv.window(layer.conf.pooling_conf)
    y, gx = shim.new(layer.data.shape), shim.new(shape)
    g, x = shim.new(layer.grad), shim.new(src.data)
    if pool == "MAX":
        argmax = shim.new(layer.data.shape, np.int32)
        cuda.max_pool(x, kh, kw, ph, pw, sh, sw, y, argmax, True)
        assert np.array_equal(argmax, layer._argmax)
        cuda.max_pool_backward(g, argmax, kh, kw, ph, pw, sh, sw, gx)
    else:
        size = shim.new(layer._size)
        cuda.avg_pool(x, kh, kw, ph, pw, sh, sw, size, y)
        cuda.avg_pool_backward(g, size, kh, kw, ph, pw, sh, sw, gx)
    assert same_bits(y, layer.data) and same_bits(gx, src.grad) and shim.intact()


@pytest.mark.parametrize("lrn", [
    "local_size: 3 alpha: 5e-05 beta: 0.75", "local_size: 5 alpha: 0.001 beta: 0.75 knorm: 2",
    "local_size: 1 alpha: 0.1 beta: 0.75", "local_size: 3 alpha: 0.1 beta: 0.75 "
    "norm_region: WITHIN_CHANNEL", "local_size: 5 alpha: 0.01 beta: 0.5"])
def test_lrn_kernels_give_the_layers_bits(shim, lrn):
    """Forward and backward against the layer's numpy path, across and within channels:
    bit for bit, but for beta other than 0.75 (then norm^−β is CUDA's exp and log)."""
    rng = np.random.default_rng(6)
    src = Source(rng.standard_normal((3, 7, 6, 5)).astype(np.float32))
    layer = make_layer(f'name: "lrn" type: kLRN lrn_conf {{ {lrn} }}', [src])
    layer.compute_feature(FORWARD, [src])
    layer.grad[...] = rng.standard_normal(layer.grad.shape)
    layer.compute_gradient(BACKWARD, [src])
    y, norm, scale = (shim.new(layer.data.shape) for _ in range(3))
    x, g = shim.new(src.data), shim.new(layer.grad)
    cuda.lrn(x, layer.size, layer.within, layer.salpha, layer.knorm, layer.beta, y, norm, scale)
    gx, inner = shim.new(src.data.shape), shim.new(src.data.shape)
    cuda.lrn_grad(x, shim.new(layer.data), g, shim.new(layer.norm), shim.new(layer.scale),
                  layer.size, layer.within, layer._coef, inner, gx)
    assert same_bits(norm, layer.norm) and shim.intact()
    if layer.beta == 0.75:
        assert same_bits(y, layer.data) and same_bits(gx, src.grad)
    else:
        np.testing.assert_allclose(y, layer.data, rtol=1e-6)
        np.testing.assert_allclose(gx, src.grad, rtol=1e-5, atol=1e-6)


def test_max_pooling_keeps_nan_and_leaves_argmax_alone_out_of_training(shim):
    x = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4)
    x[0, 0, 0, 1] = np.nan
    y, argmax = np.empty((1, 1, 2, 2), np.float32), np.full((1, 1, 2, 2), 9, np.int32)
    cuda.max_pool(x, 2, 2, 0, 0, 2, 2, y, argmax, False)
    assert np.isnan(y[0, 0, 0, 0]) and y[0, 0].ravel()[1:].tolist() == [7, 13, 15]
    assert (argmax == 9).all()
    cuda.max_pool(x, 2, 2, 0, 0, 2, 2, y, argmax, True)
    assert argmax.ravel().tolist() == [0, 3, 3, 3]     # NaN equals nothing: tap 0, as numpy's


@pytest.mark.parametrize("kind", ["relu", "sigmoid", "tanh", "stanh"])
def test_each_activation_is_one_kernel_each_way(shim, kind):
    """The CUDA kernels against numpy's: the gradient bit for bit (gx aliasing g
    too, as share_src_blobs computes it); the forward bit for bit for ReLU, else to the
    rounding of the C library's exp and tanh (numpy has its own)."""
    rng = np.random.default_rng(2)
    x = rng.normal(0, 2, (37, 29)).astype(np.float32)
    x.flat[:6] = [0.0, -0.0, 1e-30, 40.0, -40.0, np.nan]
    g = rng.normal(0, 1, x.shape).astype(np.float32)
    case, consts_f, consts_b = neuron._ACTIVATIONS[getattr(job_pb2, kind.upper())]
    want_y, want_gx = np.empty_like(x), np.empty_like(x)
    kernels.numpy.activation(case, x, want_y, *consts_f)
    kernels.numpy.activation_grad(case, want_y, g, want_gx, *consts_b)
    y = shim.new(x.shape)
    cuda.activation(case, shim.new(x), y, *consts_f)
    if kind == "relu":
        assert same_bits(y, want_y)
    else:
        np.testing.assert_allclose(y, want_y, rtol=3e-7, atol=1e-7)
    gx = shim.new(x.shape)
    cuda.activation_grad(case, shim.new(want_y), shim.new(g), gx, *consts_b)
    assert same_bits(gx, want_gx)
    inplace = shim.new(g)
    cuda.activation_grad(case, shim.new(want_y), inplace, inplace, *consts_b)
    assert same_bits(inplace, want_gx) and shim.intact()


def test_normalize_pixels_gives_the_input_layers_bits(shim):
    """(pixels − mean) / std in float32, as StoreInputLayer computes it on the host."""
    rng = np.random.default_rng(6)
    pixels = rng.integers(0, 256, (9, 37)).astype(np.uint8)
    mean = (rng.random(37) * 255).astype(np.float32)
    std = (rng.random(37) * 3 + 0.1).astype(np.float32)
    want = pixels.astype(np.float32)
    want -= mean
    want /= std
    y = shim.new((9, 37))
    cuda.normalize_pixels(shim.new(pixels, np.uint8), shim.new(mean), shim.new(std), y)
    assert same_bits(y, want) and shim.intact()


@pytest.mark.parametrize("scale", [1.0, 0.017])
def test_crop_mirror_gives_numpys_bits(shim, scale):
    """ImagePreprocess's crop, flip and scale of every image in one launch: numpy's copies
    and product, crops at the corners and the middle of non-square images."""
    rng = np.random.default_rng(8)
    x = rng.normal(0, 50, (5, 3, 9, 11)).astype(np.float32)
    at = np.array([[0, 4, 2, 1, 4], [0, 5, 3, 0, 2], [0, 1, 1, 0, 7]], np.int32)
    want = np.empty((5, 3, 5, 6), np.float32)
    kernels.numpy.crop_mirror(x, at, np.float32(scale), want)
    y = shim.new(want.shape)
    cuda.crop_mirror(shim.new(x), shim.new(at, np.int32), np.float32(scale), y)
    assert same_bits(y, want) and shim.intact()
    s = np.float32(scale)       # numpy's, written out: image 0 as it is, image 1 flipped
    assert same_bits(want[0], x[0, :, :5, :6] * s if scale != 1 else x[0, :, :5, :6])
    assert same_bits(want[1], x[1, :, 4:9, 5:11][..., ::-1] * s)


@pytest.mark.parametrize("topk", [1, 3])
def test_softmax_loss_gives_the_layers_probabilities_loss_and_ranking(shim, topk):
    """p, the mean loss and the top-k accuracy of SoftmaxLoss's numpy path, added to the sums
    given (and 1 to their count): rows with ties at and around the label (ranked by the
    higher index first), a label whose p underflows (its loss is −log FLT_MIN), and a row
    holding NaN (the loss is NaN)."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 4, (200, 7)).astype(np.float32) / 4     # many ties
    labels = rng.integers(0, 7, 200).astype(np.int32)
    x[7], labels[7] = [0, 0, -200, 0, 0, 0, 0], 2
    p = np.exp(x - x.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    t = p[np.arange(200), labels][:, None]
    above = (p > t) | ((p == t) & (np.arange(7) > labels[:, None]))
    hits = (above.sum(axis=1) < topk).sum()
    loss = -np.log(np.maximum(t, np.finfo(np.float32).tiny), dtype=np.float64).sum()
    got_p, out = shim.new((200, 7)), shim.new(np.array([0.25, 1.0, 3.0]), np.float64)
    sums = cuda.softmax_loss(shim.new(x), shim.new(labels, np.int32), topk, 0.5, got_p,
                             shim.new((200,), np.float64), shim.new((200,), np.int32), out)
    assert sums is out and 0 < hits < 200 and p[7, 2] == 0
    np.testing.assert_allclose(got_p, p, rtol=1e-6)
    # added to what out held (the sums since the last display, and their count)
    assert out[1] == 1.0 + 0.5 * hits / 200 and out[2] == 4.0
    assert out[0] == pytest.approx(0.25 + 0.5 * loss / 200, rel=1e-6)
    x[3, 5] = np.nan
    cuda.softmax_loss(shim.new(x), shim.new(labels, np.int32), topk, 0.5, got_p,
                      shim.new((200,), np.float64), shim.new((200,), np.int32), out)
    assert np.isnan(got_p[3]).all() and np.isnan(out[0]) and shim.intact()


def test_softmax_loss_grad_gives_the_layers_bits(shim):
    rng = np.random.default_rng(5)
    p = rng.random((33, 10), np.float32)
    labels = rng.integers(0, 10, 33).astype(np.int32)
    scale = np.float32(0.5) / np.float32(33)
    want = p.copy()
    want[np.arange(33), labels] -= 1
    want *= scale
    g = shim.new((33, 10))
    cuda.softmax_loss_grad(shim.new(p), shim.new(labels, np.int32), scale, g)
    assert same_bits(g, want) and shim.intact()


def test_the_shim_refuses_an_argument_a_gpu_would_misread(shim):
    x, col = np.zeros((1, 1, 3, 3), np.float32), np.zeros((1, 1, 1, 1, 3, 3), np.float32)
    run = cuda_shim.RawKernel(cuda_shim.source(cuda_shim.LAYERS), "im2col")
    args = [x, np.int64(9), np.int64(9), np.int64(3), np.int64(3), col] + [np.int64(1)] * 11
    run((1,), (32,), args)
    with pytest.raises(TypeError, match="parameter long long sn: needs a numpy int64 scalar"):
        run((1,), (32,), [x, np.int32(9)] + args[2:])
    with pytest.raises(TypeError, match="parameter float\\* col: needs a C-contiguous array"):
        run((1,), (32,), args[:5] + [col.astype(np.float64)] + args[6:])


def test_on_a_gpu_the_layers_choose_the_cuda_kernels():
    gpu, cpu = types.SimpleNamespace(gpu=0), types.SimpleNamespace(gpu=None)
    assert kernels.choose(gpu) is cuda and kernels.choose(cpu) is not cuda


@pytest.mark.parametrize("module, path", [(cuda, cuda_shim.LAYERS),
                                          (updater_cuda, cuda_shim.UPDATER)])
def test_the_modules_launch_the_cu_files_package_data(module, path):
    assert module.SOURCE == cuda_shim.source(path) and "__global__" in module.SOURCE


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("path", [cuda_shim.LAYERS, cuda_shim.UPDATER], ids=["layers", "updater"])
def test_nvcc_builds_the_source(tmp_path, arch, path):
    src = cuda_shim.SINGA / path
    out = subprocess.run(["nvcc", f"-arch={arch}", "-cubin", *cuda.OPTIONS, "-o",
                          os.fspath(tmp_path / "k.cubin"), os.fspath(src)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "k.cubin").stat().st_size > 0
