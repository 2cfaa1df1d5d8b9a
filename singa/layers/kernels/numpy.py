"""numpy's kernels, the reference for the others of the same names and parameters
(`kernels.numba`, `kernels.cuda`): convolution's copies and direct loops, chosen on the CPU
where numba is not used (one numpy call per kernel tap where numba makes one pass); pooling,
the activations, SoftmaxLoss's gradient and LRN, the CPU's always. Each works on the chunk
of samples it is given; a padded input is copied into the interior of a buffer whose border
is 0 (-inf for MAX pooling). Working arrays are made at a shape's first call and kept by the
calling thread (`_kept`), as a layer keeps its blobs: no allocation on the hot path.

numba's loops and our CUDA kernels add in these functions' orders: the same float32 bits
(tests/unit/test_kernels.py, test_cuda_kernels.py).
"""
import threading

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from singa.layers.ops import pad_buffer, sigmoid

__all__ = ["COMPILED", "RELU", "SIGMOID", "TANH", "STANH", "im2col", "col2im", "group_conv",
           "group_conv_wgrad", "group_conv_xgrad", "argmax_dtype", "max_pool", "avg_pool",
           "max_pool_backward", "avg_pool_backward", "activation", "activation_grad",
           "normalise", "scale", "softmax_loss_grad", "lrn", "lrn_grad", "taps", "crop_mirror"]

#: whether im2col makes a col in one compiled pass (conv.py keeps fewer cols then)
COMPILED = False

#: the activations' cases, the same in every kernel module
RELU, SIGMOID, TANH, STANH = range(4)

#: working arrays a thread keeps at the most (shapes beyond are made afresh: all are dropped)
MAX_KEPT = 256
_local = threading.local()


def taps(kh, kw, sh, sw, oh, ow):
    """For every kernel offset (i, j): the strided (row, col) slices of the padded input it
    sees."""
    return [(i, j, slice(i, i + sh * (oh - 1) + 1, sh), slice(j, j + sw * (ow - 1) + 1, sw))
            for i in range(kh) for j in range(kw)]


def im2col(x, ph, pw, sh, sw, col, channels_first):
    """col[c, i, j, n, y, z] = x[n, c, y·sh + i − ph, z·sw + j − pw], 0 outside x; x is
    (b, C, H, W), or (C, b, H, W) if channels_first. Returns col."""
    kh, kw, oh, ow = col.shape[1], col.shape[2], col.shape[4], col.shape[5]
    xp = _padded(x, ph, pw)
    view = sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::sh, ::sw][:, :, :oh, :ow]
    np.copyto(col, view.transpose((0, 4, 5, 1, 2, 3) if channels_first
                                  else (1, 4, 5, 0, 2, 3)))
    return col


def col2im(col, ph, pw, sh, sw, gx):
    """gx = 0, then gx[n, c, y·sh + i − ph, z·sw + j − pw] += col[c, i, j, n, y, z], one add
    per tap (i, j) in scan order; cells outside gx are dropped. Returns gx."""
    _, kh, kw, _, oh, ow = col.shape
    gp = _padding(gx, ph, pw)
    gp[...] = 0
    for ti, tj, r, c in taps(kh, kw, sh, sw, oh, ow):
        gp[:, :, r, c] += col[:, ti, tj].transpose(1, 0, 2, 3)
    return _unpadded(gp, gx, ph, pw)


def group_conv(x, w, bias, ph, pw, sh, sw, y):
    """y[n, g·m + k] = Σ_{c, i, j} w[g, k, c, i, j]·xp[n, g·cg + c, i::sh, j::sw] + bias, one
    product per (c, tap) over the whole chunk, in (c, i, j) order; x (b, G·cg, H, W), xp its
    planes padded by zeros, w (G, m, cg, kh, kw), y (b, G·m, oh, ow). Returns y."""
    ng, m, cg, kh, kw = w.shape
    b, _, oh, ow = y.shape
    xp = _padded(x, ph, pw)
    y5, x5 = y.reshape(b, ng, m, oh, ow), xp.reshape(b, ng, cg, *xp.shape[2:])
    tmp = _buf("tmp", y5.shape)
    for c in range(cg):
        for i, j, r, s in taps(kh, kw, sh, sw, oh, ow):
            first = c == 0 and i == j == 0
            np.multiply(x5[:, :, c:c + 1, r, s], w[:, :, c, i, j, None, None],
                        out=y5 if first else tmp)
            if not first:
                y5 += tmp
    y += bias[:, None, None]
    return y


def group_conv_wgrad(x, gy, ph, pw, sh, sw, acc):
    """acc[g·m + k, c, i, j] (oh, ow) = Σ_n gy[n, g·m + k]·xp[n, g·cg + c, i::sh, j::sw], the
    samples summed in order. Returns acc."""
    b, f, oh, ow = gy.shape
    cg, kh, kw = acc.shape[1:4]
    xp = _padded(x, ph, pw)
    ng = xp.shape[1] // cg
    g5, x5 = gy.reshape(b, ng, f // ng, oh, ow), xp.reshape(b, ng, cg, *xp.shape[2:])
    a = acc.reshape(ng, f // ng, *acc.shape[1:])
    tmp = _buf("tmp", g5.shape[1:])
    for c in range(cg):
        for i, j, r, s in taps(kh, kw, sh, sw, oh, ow):
            dst = a[:, :, c, i, j]
            np.multiply(g5[0], x5[0, :, c:c + 1, r, s], out=dst)
            for n in range(1, b):
                np.multiply(g5[n], x5[n, :, c:c + 1, r, s], out=tmp)
                dst += tmp
    return acc


def group_conv_xgrad(gy, w, ph, pw, sh, sw, gx):
    """gx = gxp without its padding, gxp = 0, then gxp[:, g·cg + c, i::sh, j::sw] +=
    w[g, k, c, i, j]·gy[:, g·m + k] for each c, tap (i, j) in scan order, then k. Returns
    gx."""
    ng, m, cg, kh, kw = w.shape
    b, _, oh, ow = gy.shape
    gp = _padding(gx, ph, pw)
    g5, p5 = gy.reshape(b, ng, m, oh, ow), gp.reshape(b, ng, cg, *gp.shape[2:])
    tmp = _buf("tmp", (b, ng, oh, ow))
    gp[...] = 0
    for c in range(cg):
        for i, j, r, s in taps(kh, kw, sh, sw, oh, ow):
            for k in range(m):
                np.multiply(g5[:, :, k], w[:, k, c, i, j, None, None], out=tmp)
                p5[:, :, c, r, s] += tmp
    return _unpadded(gp, gx, ph, pw)


def argmax_dtype(kh, kw):
    """The integer type of max_pool's argmax: the smallest that holds kh·kw (the updates of
    the argmax in its loop over the taps move fewer bytes)."""
    return np.min_scalar_type(kh * kw)


def max_pool(x, kh, kw, ph, pw, sh, sw, y, argmax, train):
    """y[n, c, oy, z] = max of the window (kh, kw) at (oy·sh − ph, z·sw − pw) of x (padding
    never wins); with `train`, argmax (y's shape, `argmax_dtype`) = the window's first maximal
    tap i·kw + j. The taps are copied into one (kh·kw, ·) array, reduced over its first axis."""
    xp = _pool_padded(x, kh, kw, ph, pw, sh, sw, y.shape[2:], -np.inf)
    tp = taps(kh, kw, sh, sw, *y.shape[2:])
    win = _buf("win", (len(tp),) + y.shape)
    for t, (_, _, r, c) in enumerate(tp):
        np.copyto(win[t], xp[:, :, r, c])
    np.max(win, axis=0, out=y)
    if not train:
        return
    # Taps in reverse scan order, so the first maximum's index is written last (Caffe);
    # argmax += hit·(t − argmax) in wrapping unsigned ints has no data-dependent branch.
    step, hit = _buf("step", argmax.shape, argmax.dtype), _buf("hit", y.shape, bool)
    last = len(tp) - 1
    np.equal(win[last], y, out=hit)
    np.multiply(hit, argmax.dtype.type(last), out=argmax)
    for t in range(last - 1, -1, -1):
        np.equal(win[t], y, out=hit)
        np.subtract(argmax.dtype.type(t), argmax, out=step)
        np.multiply(step, hit, out=step)
        argmax += step


def avg_pool(x, kh, kw, ph, pw, sh, sw, size, y):
    """y = the sum of each window of x (padding 0), over its rows then its columns, / size
    (oh, ow): separably, into (·, ·, oh, W + 2p), then over the columns."""
    oh, ow = y.shape[2:]
    xp = _pool_padded(x, kh, kw, ph, pw, sh, sw, (oh, ow), 0)
    rows, cols = _pool_slices(kh, kw, sh, sw, oh, ow)
    part = _buf("part", y.shape[:3] + xp.shape[3:])
    np.copyto(part, xp[:, :, rows[0]])
    for r in rows[1:]:
        part += xp[:, :, r]
    np.copyto(y, part[:, :, :, cols[0]])
    for c in cols[1:]:
        y += part[:, :, :, c]
    y /= size


def max_pool_backward(gy, argmax, kh, kw, ph, pw, sh, sw, gx):
    """gx = 0, then gx[n, c, r, q] += gy at each window whose argmax is (r, q) (np.add.at:
    overlapping windows may share one), in scan order. gx C-contiguous."""
    (oh, ow), (hp, wp) = gy.shape[2:], _pool_size(gx.shape[2:], kh, kw, ph, pw, sh, sw,
                                                 gy.shape[2:])
    gp = _pool_padding(gx, hp, wp)
    gp[...] = 0
    # flat indices of the argmaxes in the padded chunk (its first sample at 0)
    base = _kept(("base", gy.shape, hp, wp, sh, sw), lambda: (
        np.arange(gy.shape[0] * gy.shape[1]).reshape(gy.shape[:2] + (1, 1)) * (hp * wp)
        + (np.arange(oh) * sh * wp)[:, None] + np.arange(ow) * sw))
    offsets = _kept(("offsets", kh, kw, wp), lambda: np.array(
        [i * wp + j for i, j, _, _ in taps(kh, kw, sh, sw, oh, ow)], np.intp))
    index = _buf("index", argmax.shape, np.intp)
    np.copyto(index, argmax)
    np.take(offsets, index, out=index)    # out is buffered (mode "raise")
    index += base
    np.add.at(gp.reshape(-1), index.reshape(-1), gy.reshape(-1))
    _unpadded(gp, gx, ph, pw)


def avg_pool_backward(gy, size, kh, kw, ph, pw, sh, sw, gx):
    """gx = avg_pool's separable sums transposed: gy/size spread over the windows' columns,
    then their rows."""
    oh, ow = gy.shape[2:]
    hp, wp = _pool_size(gx.shape[2:], kh, kw, ph, pw, sh, sw, (oh, ow))
    gp = _pool_padding(gx, hp, wp)
    gp[...] = 0
    rows, cols = _pool_slices(kh, kw, sh, sw, oh, ow)
    tmp = np.divide(gy, size, out=_buf("tmp", gy.shape))
    part = _buf("part", gy.shape[:3] + (wp,))
    part[...] = 0
    for c in cols:
        part[:, :, :, c] += tmp
    for r in rows:
        gp[:, :, r] += part
    _unpadded(gp, gx, ph, pw)


def activation(f, x, y, a=0.0, b=0.0):
    """y = f(x) elementwise for f in RELU max(x, 0), SIGMOID 1/(1 + e^−x), TANH, STANH
    a·tanh(b·x); y may be x."""
    if f == RELU:
        np.maximum(x, 0, out=y)
    elif f == SIGMOID:
        sigmoid(x, y)
    elif f == TANH:
        np.tanh(x, out=y)
    else:
        np.multiply(x, b, out=y)
        np.tanh(y, out=y)
        y *= a


def activation_grad(f, y, g, gx, a=0.0, b=0.0):
    """gx = g·f'(y) elementwise, f' computed from y: RELU [y > 0], SIGMOID (1 − y)·y, TANH
    1 − y², STANH y²·a + b; gx may be g."""
    d = _buf("d", y.shape)
    if f == RELU:
        np.greater(y, 0, out=d)
    elif f == SIGMOID:
        np.subtract(1, y, out=d)
        d *= y
    elif f == TANH:
        np.multiply(y, y, out=d)
        np.subtract(1, d, out=d)
    else:
        np.multiply(y, y, out=d)
        d *= a
        d += b
    np.multiply(g, d, out=gx)


def normalise(x, mean, inv_std, y):
    """y[a, c, b] = (x[a, c, b] − mean[c])·inv_std[c] for x, y (A, C, B) and mean, inv_std (C,):
    normalisation by given statistics (BatchNorm's global ones)."""
    np.subtract(x, mean.reshape(1, -1, 1), out=y)
    y *= inv_std.reshape(1, -1, 1)


def scale(x, gamma, beta, y):
    """y[a, c, b] = x[a, c, b]·gamma[c] (+ beta[c] unless beta is None) for x, y (A, C, B)."""
    np.multiply(x, gamma.reshape(1, -1, 1), out=y)
    if beta is not None:
        y += beta.reshape(1, -1, 1)


def crop_mirror(x, at, scale, y):
    """y[n] = scale·x[n, :, h:h + s, w:w + t], flipped left-right where f ≠ 0, for x
    (N, C, H, W), y (N, C, s, t) and at (3, N) int32 holding each image's (h, w, f): a copy
    per image (a fancy-indexed gather of all was 2.3x slower), then the product unless
    scale is 1."""
    s, t = y.shape[-2:]
    for i, (h, w, flip) in enumerate(at.T):
        window = x[i, :, h:h + s, w:w + t]
        np.copyto(y[i], window[..., ::-1] if flip else window)
    if scale != 1:
        y *= scale


def softmax_loss_grad(p, labels, scale, g):
    """g = (p − onehot(labels))·scale for p (N, D) and float32 `scale`; g may be p."""
    np.copyto(g, p)
    g[np.arange(len(g)), labels] -= 1
    g *= scale


def lrn(x, size, within, salpha, knorm, beta, y, norm, scale):
    """LRNLayer's forward (norm.py) on a chunk: norm = knorm + salpha·Σ_window x², scale =
    norm^−beta, y = x·scale, windows of `size` across channels or `within` them (the sum
    over rows, then over columns). norm^−β is exp(−β·ln norm), or 1/(√norm·√√norm) for
    β = 0.75 (y, not x, holds √√norm on the way)."""
    buf, inner = _lrn_padded(x.shape, size, within)
    np.square(x, out=inner)
    _window_sum(buf, size, within, norm)
    norm *= salpha
    norm += knorm
    if beta == 0.75:
        np.sqrt(norm, out=scale)
        root4 = np.sqrt(scale, out=y)       # y is written last
        scale *= root4
        np.reciprocal(scale, out=scale)
    else:
        np.log(norm, out=scale)
        scale *= -beta
        np.exp(scale, out=scale)
    np.multiply(x, scale, out=y)


def lrn_grad(x, y, g, norm, scale, size, within, coef, inner, gx):
    """LRNLayer's gradient on a chunk: gx = g·scale + coef·x·Σ_window(g·y/norm), `inner`
    (x's shape) holding the window sums on the way."""
    buf, mid = _lrn_padded(x.shape, size, within)
    np.multiply(g, y, out=mid)
    mid /= norm
    _window_sum(buf, size, within, inner)
    inner *= x
    inner *= coef
    np.multiply(g, scale, out=gx)
    gx += inner


def _lrn_padded(shape, size, within):
    """(buf, inner) of `pad_buffer`: zeros around the channels (or rows and columns) so that
    every window is a slice."""
    half = size // 2
    return _pad_buffer(shape, ((0, 0), (0, 0), (half, half), (half, half)) if within
                       else ((0, 0), (half, half)))


def _window_sum(p, size, within, out):
    """out[:, c] = Σ of the padded blob's channels c .. c+size−1 (the window centred on c);
    within channels, the sum over rows then over columns."""
    if size == 1:
        np.copyto(out, p)
    elif within:
        h, w = out.shape[2:]
        rows = _buf("rows", out.shape[:3] + (p.shape[3],))
        _sum(p, size, rows, 2, h)
        _sum(rows, size, out, 3, w)
    else:
        _sum(p, size, out, 1, out.shape[1])


def _sum(p, size, out, axis, n):
    """out = Σ_{k < size} p[k:k + n] along `axis`."""
    def part(k):
        return p[(slice(None),) * axis + (slice(k, k + n),)]
    np.add(part(0), part(1), out=out)
    for k in range(2, size):
        out += part(k)


def _pool_size(hw, kh, kw, ph, pw, sh, sw, ohw):
    """(Hp, Wp): the padded plane, reaching the end of the last window (past H + 2p in ceil
    mode)."""
    (h, w), (oh, ow) = hw, ohw
    return (ph + h + max(ph, (oh - 1) * sh + kh - ph - h),
            pw + w + max(pw, (ow - 1) * sw + kw - pw - w))


def _pool_padded(x, kh, kw, ph, pw, sh, sw, ohw, fill):
    """x in a plane of `_pool_size`, the cells outside x = fill (x itself if it is that
    size)."""
    h, w = x.shape[2:]
    hp, wp = _pool_size((h, w), kh, kw, ph, pw, sh, sw, ohw)
    if (hp, wp) == (h, w):
        return x
    buf, inner = _pad_buffer(x.shape, ((0, 0), (0, 0), (ph, hp - h - ph), (pw, wp - w - pw)),
                             fill)
    inner[...] = x
    return buf


def _pool_padding(gx, hp, wp):
    """Where a scatter into gx adds: gx itself, or a (·, ·, hp, wp) array (_unpadded)."""
    if gx.shape[2:] == (hp, wp):
        return gx
    return _buf("gpad", gx.shape[:2] + (hp, wp))


def _pool_slices(kh, kw, sh, sw, oh, ow):
    """The strided row slices of the kh window rows, and the column slices of the kw."""
    return ([slice(i, i + sh * (oh - 1) + 1, sh) for i in range(kh)],
            [slice(j, j + sw * (ow - 1) + 1, sw) for j in range(kw)])


def _padded(x, ph, pw):
    """x (·, ·, H, W) with ph rows and pw columns of zeros around each plane (x itself if
    none)."""
    if not (ph or pw):
        return x
    buf, inner = _pad_buffer(x.shape, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    inner[...] = x
    return buf


def _padding(gx, ph, pw):
    """Where a scatter into gx (·, ·, H, W) adds: gx itself, or a padded array (_unpadded)."""
    if not (ph or pw):
        return gx
    return _buf("gpad", gx.shape[:2] + (gx.shape[2] + 2 * ph, gx.shape[3] + 2 * pw))


def _unpadded(gp, gx, ph, pw):
    """gx, with gp's interior copied in where gp is a padded array (_padding)."""
    if gp is not gx:
        gx[...] = gp[:, :, ph:ph + gx.shape[2], pw:pw + gx.shape[3]]
    return gx


def _kept(key, make):
    """This thread's array for `key`, made by make() at the key's first call and kept (at
    most MAX_KEPT of them): a compute thread works on one chunk at a time, so no two users
    of a key overlap."""
    kept = _local.__dict__.setdefault("kept", {})
    a = kept.get(key)
    if a is None:
        if len(kept) >= MAX_KEPT:
            kept.clear()
        a = kept[key] = make()
    return a


def _buf(name, shape, dtype=np.float32):
    """A kept working array of `shape` (its cells whatever the last user left)."""
    return _kept((name, tuple(shape), np.dtype(dtype)), lambda: np.empty(shape, dtype))


def _pad_buffer(shape, pads, fill=0):
    """A kept `ops.pad_buffer` (buf, inner): its border = fill since it was made, as callers
    write only the interior."""
    return _kept(("pad", tuple(shape), tuple(pads), float(fill)),
                 lambda: pad_buffer(shape, pads, fill))
