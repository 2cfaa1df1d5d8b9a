"""Convolution's copies, its direct small-group loops, pooling and the activations as CUDA
kernels of our own (CuPy RawKernels in cuda.cu beside this module, `kernels.choose` on a
GPU): one launch each where numpy's calls make one per kernel tap (or per operation of an
activation), SoftmaxLoss's forward and its gradient, and an input layer's pixels to floats.

The convolution functions take numba's loops' arguments (`kernels.numba`) and compute their
sums in their order; the pooling functions compute numpy's (`kernels.numpy`) in its order: the same
float32 bits (`--fmad=false`: no fused multiply-adds); the activations' gradients do too,
and their forward passes differ from numpy's only in CUDA's exp and tanh. Every kernel is a
gather, one thread per output element summing its terms in a fixed order: no atomic adds, so
a run is deterministic. Each is compiled from SOURCE (cuda.cu) at its first call on a device,
then cached by CuPy (per device, and on disk). tests/unit/test_cuda_kernels.py runs cuda.cu
compiled by g++ (tests/cuda_shim.py).
"""
import functools
from importlib.resources import files

import numpy as np

from singa.device import module
# per-channel passes: numpy's calls, which CuPy's arrays take as one elementwise kernel each
from singa.layers.kernels.numpy import RELU, SIGMOID, STANH, TANH, normalise, scale

__all__ = ["SOURCE", "OPTIONS", "COMPILED", "im2col", "col2im", "group_conv", "group_conv_wgrad",
           "group_conv_xgrad", "argmax_dtype", "max_pool", "avg_pool", "max_pool_backward",
           "avg_pool_backward", "RELU", "SIGMOID", "TANH", "STANH", "activation",
           "activation_grad", "normalise", "scale", "normalize_pixels", "softmax_loss",
           "softmax_loss_grad", "lrn", "lrn_grad", "crop_mirror"]

OPTIONS = ("--fmad=false",)

#: whether im2col makes a col in one compiled pass (conv.py keeps fewer cols then)
COMPILED = True

THREADS = 256
MAX_BLOCKS = 1 << 16          # grid-stride loops beyond 16 M threads

# Each kernel's index arithmetic is instantiated for int and long long: int (argument `thin`)
# where every index, and t + the grid's stride, stays below INT_INDEX_LIMIT (int64 division
# costs a GPU several times int32's).
INT_INDEX_LIMIT = 2 ** 31
SOURCE = (files(__package__) / "cuda.cu").read_text()


def im2col(x, ph, pw, sh, sw, col, channels_first):
    """col[c, i, j, n, y, z] = x[n, c, y·sh + i − ph, z·sw + j − pw], 0 outside x; x is
    (b, C, H, W), or (C, b, H, W) if channels_first (loops.im2col). Returns col."""
    nc, kh, kw, b, oh, ow = col.shape
    x = _contiguous(x)
    d1, h, w = x.shape[1:]
    sn, sc = (h * w, d1 * h * w) if channels_first else (d1 * h * w, h * w)
    _launch("im2col", col.size, x, sn, sc, h, w, _out(col), nc, kh, kw, b, oh, ow,
            ph, pw, sh, sw)
    return col


def col2im(col, ph, pw, sh, sw, gx):
    """gx[n, c, r, q] = Σ col[c, i, j, n, y, z] over the taps (i, j), in scan order, with
    y·sh + i − ph = r, z·sw + j − pw = q (loops.col2im). Returns gx."""
    nc, kh, kw, b, oh, ow = col.shape
    h, w = gx.shape[2:]
    out = _into(gx)
    _launch("col2im", gx.size, _contiguous(col), out, nc, h, w, kh, kw, b, oh, ow,
            ph, pw, sh, sw)
    return _back(out, gx)


def group_conv(x, w, bias, ph, pw, sh, sw, y):
    """y[n, g·m + k] = Σ_{c, i, j} w[g, k, c, i, j]·xp[n, g·cg + c, i::sh, j::sw] + bias, the
    sum in (c, i, j) order from −0 (loops.group_conv). Returns y."""
    b, _, oh, ow = y.shape
    ng, m, cg, kh, kw = w.shape
    x = _contiguous(x)
    out = _into(y)
    _launch("group_conv", y.size, x, _contiguous(w), _contiguous(bias), out, b, ng,
            m, cg, *x.shape[2:], oh, ow, kh, kw, ph, pw, sh, sw)
    return _back(out, y)


def group_conv_wgrad(x, gy, ph, pw, sh, sw, acc):
    """acc[g·m + k, c, i, j] (oh, ow) = Σ_n gy[n, g·m + k]·xp[n, g·cg + c, i::sh, j::sw], the
    samples in order (loops.group_conv_wgrad). Returns acc."""
    b, nf, oh, ow = gy.shape
    cg, kh, kw = acc.shape[1:4]
    x = _contiguous(x)
    ng = x.shape[1] // cg
    _launch("group_conv_wgrad", acc.size, x, _contiguous(gy), _out(acc), b, ng,
            nf // ng, cg, *x.shape[2:], oh, ow, kh, kw, ph, pw, sh, sw)
    return acc


def group_conv_xgrad(gy, w, ph, pw, sh, sw, gx):
    """gx = gxp without its padding, gxp[n, g·cg + c, i::sh, j::sw] += w[g, k, c, i, j]·
    gy[n, g·m + k] over (i, j) in scan order, then k, from 0 (loops.group_conv_xgrad).
    Returns gx."""
    b, _, oh, ow = gy.shape
    ng, m, cg, kh, kw = w.shape
    out = _into(gx)
    _launch("group_conv_xgrad", gx.size, _contiguous(gy), _contiguous(w), out, b,
            ng, m, cg, *gx.shape[2:], oh, ow, kh, kw, ph, pw, sh, sw)
    return _back(out, gx)


def argmax_dtype(kh, kw):
    """The integer type of max_pool's argmax: int32, as the kernels read it."""
    return np.int32


def max_pool(x, kh, kw, ph, pw, sh, sw, y, argmax, train):
    """y[n, c, oy, z] = max of the window (kh, kw) at (oy·sh − ph, z·sw − pw) of x (padding
    never wins); with `train`, argmax (int32, y's shape) = the window's first maximal tap
    i·kw + j."""
    x = _contiguous(x)
    n, c, h, w = x.shape
    oh, ow = y.shape[2:]
    _launch("max_pool", y.size, x, _out(y), _out(argmax), n * c, h, w, oh, ow, kh, kw,
            ph, pw, sh, sw, int(bool(train)))


def avg_pool(x, kh, kw, ph, pw, sh, sw, size, y):
    """y = the sum of each window of x (padding 0), over its rows then its columns, / size
    (oh, ow)."""
    x = _contiguous(x)
    n, c, h, w = x.shape
    oh, ow = y.shape[2:]
    _launch("avg_pool", y.size, x, _contiguous(size), _out(y), n * c, h, w, oh, ow,
            kh, kw, ph, pw, sh, sw)


def max_pool_backward(gy, argmax, kh, kw, ph, pw, sh, sw, gx):
    """gx[n, c, r, q] = Σ gy over the windows, in scan order, whose argmax is (r, q)."""
    n, c, h, w = gx.shape
    oh, ow = gy.shape[2:]
    out = _into(gx)
    _launch("max_pool_backward", gx.size, _contiguous(gy), _contiguous(argmax), out,
            n * c, h, w, oh, ow, kh, kw, ph, pw, sh, sw)
    _back(out, gx)


def avg_pool_backward(gy, size, kh, kw, ph, pw, sh, sw, gx):
    """gx[n, c, r, q] = Σ_i Σ_j gy/size at the window whose tap (i, j) is (r, q), in order."""
    n, c, h, w = gx.shape
    oh, ow = gy.shape[2:]
    out = _into(gx)
    _launch("avg_pool_backward", gx.size, _contiguous(gy), _contiguous(size), out,
            n * c, h, w, oh, ow, kh, kw, ph, pw, sh, sw)
    _back(out, gx)


def activation(f, x, y, a=0.0, b=0.0):
    """y = f(x) elementwise for f in RELU, SIGMOID, TANH, STANH (a·tanh(b·x)); y may be x."""
    out = _into(y)
    _launch("activation", y.size, _contiguous(x), out, y.size, f, np.float32(a), np.float32(b))
    _back(out, y)


def activation_grad(f, y, g, gx, a=0.0, b=0.0):
    """gx = g·f'(y) elementwise, f' computed from y (STanh: y²·a + b); gx may be g."""
    out = _into(gx)
    _launch("activation_grad", gx.size, _contiguous(y), _contiguous(g), out, gx.size, f,
            np.float32(a), np.float32(b))
    _back(out, gx)


def normalize_pixels(pixels, mean, std, y):
    """y (N, dim) float32 = (pixels − mean) / std for pixels (N, dim) uint8 and mean, std
    (dim,) float32: the host's float32 subtraction and division."""
    _launch("normalize_pixels", y.size, _contiguous(pixels), _contiguous(mean), _contiguous(std),
            _out(y), y.size, y.shape[1])


def crop_mirror(x, at, scale, y):
    """y[n] = scale·x[n, :, h:h + s, w:w + t], flipped left-right where f ≠ 0, for x
    (N, C, H, W), y (N, C, s, t) and at (3, N) int32 holding each image's (h, w, f): one
    launch; numpy's values (its copy, then the same float32 product)."""
    nn, nc, s, t = y.shape
    _launch("crop_mirror", y.size, _contiguous(x), _contiguous(at), np.float32(scale), _out(y),
            nn, nc, *x.shape[2:], s, t)


def softmax_loss(x, labels, topk, scale, p, loss, hit, out):
    """SoftmaxLossLayer's forward on x (N, D) in two launches: p = softmax(x) per row, and
    out (3,) float64 += [scale·mean_n −log(max(p[n, labels[n]], FLT_MIN)),
    scale·mean_n [labels[n] in the top k of p[n]], 1] (the sums of the batches since the
    last display, and their count); `loss` (N,) float64 and `hit` (N,) int32 are scratch.
    Returns out."""
    n, d = p.shape
    labels = _labels(labels)
    _launch("softmax_loss", n, _contiguous(x), labels, _out(p), _out(loss), _out(hit), n, d,
            topk)
    _kernel(module(out), "softmax_loss_sums")((1,), (1,), (loss, hit, _out(out), np.int64(n),
                                                          np.float64(scale)))
    return out


def lrn(x, size, within, salpha, knorm, beta, y, norm, scale):
    """LRNLayer's forward (norm.py): norm = knorm + salpha·Σ_window x², scale =
    norm^−beta, y = x·scale, windows across channels or `within` them; y, norm, scale
    C-contiguous."""
    nn, nc, h, w = y.shape
    _launch("lrn", y.size, _contiguous(x), _out(y), _out(norm), _out(scale), nn, nc, h, w,
            size, int(within), np.float32(salpha), np.float32(knorm), np.float32(beta))


def lrn_grad(x, y, g, norm, scale, size, within, coef, inner, gx):
    """LRNLayer's gradient: gx = g·scale + coef·x·Σ_window(g·y/norm), `inner` (x's shape,
    C-contiguous) holding g·y/norm on the way."""
    nn, nc, h, w = gx.shape
    _launch("lrn_inner", gx.size, _contiguous(g), _contiguous(y), _contiguous(norm),
            _out(inner), gx.size)
    out = _into(gx)
    _launch("lrn_grad", gx.size, _contiguous(x), _contiguous(g), _contiguous(scale), inner,
            out, nn, nc, h, w, size, int(within), np.float32(coef))
    _back(out, gx)


def softmax_loss_grad(p, labels, scale, g):
    """g = (p − onehot(labels))·scale for p (N, D) and float32 `scale`; g may be p."""
    n, d = p.shape
    out = _into(g)
    _launch("softmax_loss_grad", p.size, _contiguous(p), _labels(labels), out, n, d,
            np.float32(scale))
    _back(out, g)


def grid(total):
    """(blocks, threads) of a grid-stride launch over `total` elements."""
    return (max(1, min(-(-total // THREADS), MAX_BLOCKS)),), (THREADS,)


@functools.cache
def _kernel(xp, name):
    return xp.RawKernel(SOURCE, name, options=OPTIONS)


def _launch(name, total, *args):
    """Kernel `name` over `total` elements, grid-stride, on the device of its first argument;
    integer args as int64, then `thin` (see INT_INDEX_LIMIT)."""
    if total == 0:
        return
    dims = grid(total)
    arrays = [a for a in args if not isinstance(a, (int, np.integer))]
    thin = max(total, *(a.size for a in arrays)) + dims[0][0] * THREADS < INT_INDEX_LIMIT
    _kernel(module(arrays[0]), name)(
        *dims,
        tuple(np.int64(a) if isinstance(a, (int, np.integer)) else a for a in args + (thin,)))


def _labels(labels):
    """Class labels as the kernels read them: C-contiguous int32."""
    return _contiguous(labels.astype(np.int32, copy=False))


def _contiguous(a):
    return module(a).ascontiguousarray(a)     # numpy's would copy a device array to the host


def _out(a):
    """An output written in place: C-contiguous, as the kernels index it."""
    if not a.flags.c_contiguous:
        raise ValueError(f"a kernel's output of shape {a.shape} must be C-contiguous")
    return a


def _into(a):
    """`a`, or a contiguous array to compute a non-contiguous `a` into (see _back)."""
    return a if a.flags.c_contiguous else np.empty_like(a, order="C")


def _back(out, a):
    """`a`, with out copied in where it was computed elsewhere (_into)."""
    if out is not a:
        a[...] = out
    return a
