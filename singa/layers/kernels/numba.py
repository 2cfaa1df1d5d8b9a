"""Convolution's copies compiled by numba (chosen by `kernels.choose` on the CPU): im2col,
padding as it copies, and col2im, one pass each where numpy makes one per kernel tap
(bench/README.md); the direct loops of small groups (depthwise convolution), forward and
backward; BatchNorm's normalisation by given statistics and Scale's per-channel product,
one pass where numpy makes two; ReLU both ways (np.maximum took 3.5x a copy's time on
MobileNet's 1.6 MB blobs, 238 against 67 us; its gradient was two passes and a buffer); and
pooling, one pass where numpy copies each tap (cifar10's
pools at batch 100, ms a call of one thread, numpy against ours: pool1's MAX 3 × 3 stride 2
on 32 × 32 × 32 30.8 against 5.3 forward, 9.3 against 4.6 backward; pool2's AVG on
32 × 16 × 16 2.2 against 1.5 and 4.4 against 1.9; pool3's on 64 × 8 × 8 1.5 against 1.4 and
2.5 against 1.3).

All release the GIL, so the compute threads run their chunks side by side, and all add in
the order of `kernels.numpy`'s functions of the same names: both give the same float32 bits
(tests/unit/test_kernels.py).
"""
import numba
import numpy as np

# the other activations, SoftmaxLoss's gradient and LRN: numpy's calls, fast on a CPU
from singa.layers.kernels import numpy as _numpy
from singa.layers.kernels.numpy import (  # noqa: F401
    RELU, SIGMOID, STANH, TANH, argmax_dtype, lrn, lrn_grad, softmax_loss_grad)

jit = numba.njit(nogil=True, cache=True)

#: whether im2col makes a col in one compiled pass (conv.py keeps fewer cols then)
COMPILED = True

# Indices are cast to unsigned where numba cannot prove them non-negative: a signed index
# costs a branch per element (Python's negative indices), which keeps LLVM from vectorising
# the loop (4-5x slower copies).
U = np.uint64


@jit
def _columns(ow, j, pw, sw, w):
    """[lo, hi): the output columns z whose input column z·sw + j − pw lies in [0, w)."""
    lo = min(ow, max(0, (pw - j + sw - 1) // sw))
    return lo, max(lo, min(ow, (w - 1 + pw - j) // sw + 1))


@jit
def im2col(x, ph, pw, sh, sw, col, channels_first):
    """col[c, i, j, n, y, z] = x[n, c, y·sh + i − ph, z·sw + j − pw], 0 outside x; x is
    (b, C, H, W), or (C, b, H, W) if channels_first. With stride 1 and ow = W (as with
    "same" padding) each (c, i, j, n) block is one run of the flat plane, shifted, with the
    cells whose column falls outside the row set to 0; else row by row."""
    nc, kh, kw, b, oh, ow = col.shape
    h, w = x.shape[2], x.shape[3]
    zero = np.float32(0)
    xf = x.reshape(x.shape[0], x.shape[1], h * w)
    if sh == 1 and sw == 1 and ow == w:
        m = oh * ow
        cf = col.reshape(nc, kh, kw, b, m)
        inside = np.empty((kw, m), np.bool_)       # column t % ow + j − pw lies in the row
        for j in range(kw):
            for t in range(m):
                inside[j, t] = 0 <= t % ow + j - pw < w
        for c in range(nc):
            for i in range(kh):
                for j in range(kw):
                    shift = (i - ph) * w + j - pw
                    tlo = min(m, max(0, (ph - i) * w, -shift))      # rows inside x
                    thi = max(tlo, min(m, (h + ph - i) * w, h * w - shift))
                    ok = inside[j]
                    for n in range(b):
                        src = xf[c, n] if channels_first else xf[n, c]
                        dst = cf[c, i, j, n]
                        for t in range(tlo):
                            dst[t] = zero
                        for u in range(thi - tlo):
                            v = src[U(tlo + u + shift)]
                            dst[U(tlo + u)] = v if ok[U(tlo + u)] else zero
                        for u in range(m - thi):
                            dst[U(thi + u)] = zero
        return col
    for c in range(nc):
        for i in range(kh):
            for j in range(kw):
                zlo, zhi = _columns(ow, j, pw, sw, w)
                for n in range(b):
                    src = xf[c, n] if channels_first else xf[n, c]
                    for y in range(oh):
                        row = col[c, i, j, n, y]
                        r = y * sh + i - ph
                        if r < 0 or r >= h:
                            for z in range(ow):
                                row[z] = zero
                            continue
                        start = r * w + j - pw
                        for z in range(zlo):
                            row[z] = zero
                        for u in range(zhi - zlo):
                            row[U(zlo + u)] = src[U(start + (zlo + u) * sw)]
                        for u in range(ow - zhi):
                            row[U(zhi + u)] = zero
    return col


@jit
def col2im(col, ph, pw, sh, sw, gx):
    """gx = 0, then gx[n, c, y·sh + i − ph, z·sw + j − pw] += col[c, i, j, n, y, z], taps (i, j)
    in scan order; cells outside gx are dropped."""
    nc, kh, kw, b, oh, ow = col.shape
    h, w = gx.shape[2], gx.shape[3]
    gx[...] = 0
    for c in range(nc):
        for i in range(kh):
            for j in range(kw):
                zlo, zhi = _columns(ow, j, pw, sw, w)
                for n in range(b):
                    for y in range(oh):
                        r = y * sh + i - ph
                        if r < 0 or r >= h:
                            continue
                        dst, src = gx[n, c, r], col[c, i, j, n, y]
                        start = j - pw
                        for u in range(zhi - zlo):
                            dst[U(start + (zlo + u) * sw)] += src[U(zlo + u)]
    return gx



@jit
def _phases(x, ph, pw, sh, sw, out):
    """out[a, b, r, q] = xp[r·sh + a, q·sw + b], xp the plane x padded by zeros: tap (i, j) of
    a strided window reads phase (i % sh, j % sw) at (oy + i // sh, z + j // sw), a stride-1
    run. out's cells outside x must be 0 already: only those inside are written."""
    h, w = x.shape
    for r in range(h):
        a, rq = (r + ph) % sh, (r + ph) // sh
        src = x[r]
        for b in range(sw):      # columns col = q·sw + b − pw of x
            qlo = (pw - b + sw - 1) // sw if pw > b else 0
            start = qlo * sw + b - pw
            dst = out[a, b, rq, qlo:(w - 1 + pw - b) // sw + 1]
            for q in range(dst.shape[0]):
                dst[U(q)] = src[U(start + q * sw)]


@jit
def group_conv(x, w, bias, ph, pw, sh, sw, y):
    """y[n, g·m + k] = Σ_{c, i, j} w[g, k, c, i, j]·xp[n, g·cg + c, i::sh, j::sw] + bias, the
    sum in (c, i, j) order from −0 (numpy's `group_conv`: the same bits); x is
    (b, G·cg, H, W), xp its planes padded by zeros, w (G, m, cg, kh, kw), y (b, G·m, oh, ow).
    Each tap is one run over the flat phase plane (`_phases`) into rows of its pitch; the
    cells past ow in each row are dropped."""
    b, nf, oh, ow = y.shape
    ng, m, cg, kh, kw = w.shape
    h, wd = x.shape[2], x.shape[3]
    hq, wq = -(-(h + 2 * ph) // sh), -(-(wd + 2 * pw) // sw)
    phases = np.zeros((sh, sw, hq, wq), np.float32)
    flat, planes = phases.reshape(sh * sw * hq * wq), phases.reshape(sh, sw, hq * wq)
    run = (oh - 1) * wq + ow
    acc = np.empty((m, oh * wq), np.float32)
    for n in range(b):
        for g in range(ng):
            acc[...] = -0.0
            for c in range(cg):
                _phases(x[n, g * cg + c], ph, pw, sh, sw, phases)
                for k in range(m):
                    if kh == 3 and kw == 3:
                        _taps3x3(flat, w[g, k, c], sh, sw, hq, wq, acc[k], run)
                        continue
                    dst = acc[k]
                    for i in range(kh):
                        for j in range(kw):
                            wt = w[g, k, c, i, j]
                            src = planes[i % sh, j % sw]
                            off = (i // sh) * wq + j // sw
                            for u in range(run):
                                dst[U(u)] += wt * src[U(u + off)]
            for k in range(m):
                f = g * m + k
                out, bf = y[n, f], bias[f]
                for oy in range(oh):
                    for z in range(ow):
                        out[oy, z] = acc[k, U(oy * wq + z)] + bf
    return y


@jit
def _taps3x3(flat, w, sh, sw, hq, wq, dst, run):
    """dst[u] += Σ_{i, j} w[i, j]·(tap (i, j)'s run)[u] for a 3 × 3 kernel, the taps added in
    scan order: `group_conv`'s loop over taps in one pass over dst. flat is the phase planes
    as one C-contiguous run (indexed flat, LLVM vectorises the loop)."""
    r0, r1, r2 = (0 % sh) * sw * hq * wq, (1 % sh) * sw * hq * wq + (1 // sh) * wq, \
        (2 % sh) * sw * hq * wq + (2 // sh) * wq
    c0, c1, c2 = 0, (1 % sw) * hq * wq + 1 // sw, (2 % sw) * hq * wq + 2 // sw
    o0, o1, o2, o3, o4, o5, o6, o7, o8 = (U(r0 + c0), U(r0 + c1), U(r0 + c2), U(r1 + c0),
                                          U(r1 + c1), U(r1 + c2), U(r2 + c0), U(r2 + c1),
                                          U(r2 + c2))
    w00, w01, w02, w10, w11, w12, w20, w21, w22 = (w[0, 0], w[0, 1], w[0, 2], w[1, 0],
                                                   w[1, 1], w[1, 2], w[2, 0], w[2, 1], w[2, 2])
    for t in range(run):
        u = U(t)
        v = dst[u] + w00 * flat[o0 + u]
        v = v + w01 * flat[o1 + u]
        v = v + w02 * flat[o2 + u]
        v = v + w10 * flat[o3 + u]
        v = v + w11 * flat[o4 + u]
        v = v + w12 * flat[o5 + u]
        v = v + w20 * flat[o6 + u]
        v = v + w21 * flat[o7 + u]
        dst[u] = v + w22 * flat[o8 + u]


@jit
def group_conv_wgrad(x, gy, ph, pw, sh, sw, acc):
    """acc[g·m + k, c, i, j] (oh, ow) = Σ_n gy[n, g·m + k]·xp[n, g·cg + c, i::sh, j::sw],
    the sum over the b samples in order (numpy's `group_conv_wgrad`: the same bits)."""
    b, nf, oh, ow = gy.shape
    cg, kh, kw = acc.shape[1], acc.shape[2], acc.shape[3]
    ng = x.shape[1] // cg
    m = nf // ng
    h, wd = x.shape[2], x.shape[3]
    hq, wq = -(-(h + 2 * ph) // sh), -(-(wd + 2 * pw) // sw)
    phases = np.zeros((sh, sw, hq, wq), np.float32)
    for n in range(b):
        for g in range(ng):
            for c in range(cg):
                _phases(x[n, g * cg + c], ph, pw, sh, sw, phases)
                for k in range(m):
                    grad = gy[n, g * m + k]
                    for i in range(kh):
                        for j in range(kw):
                            a = acc[g * m + k, c, i, j]
                            p = phases[i % sh, j % sw]
                            for oy in range(oh):
                                src = p[U(oy + i // sh), j // sw:]
                                gr, dst = grad[oy], a[oy]
                                if n == 0:
                                    for z in range(ow):
                                        dst[z] = gr[z] * src[z]
                                else:
                                    for z in range(ow):
                                        dst[z] += gr[z] * src[z]
    return acc


@jit
def group_conv_xgrad(gy, w, ph, pw, sh, sw, gx):
    """gxp[n, g·cg + c, i::sh, j::sw] += w[g, k, c, i, j]·gy[n, g·m + k] over (i, j) in scan
    order, then k, from 0; gx is gxp without its padding (numpy's `group_conv_xgrad`:
    the same bits). Accumulated in phase planes (`_phases`), stride-1 runs."""
    b, nf, oh, ow = gy.shape
    ng, m, cg, kh, kw = w.shape
    h, wd = gx.shape[2], gx.shape[3]
    hq, wq = -(-(h + 2 * ph) // sh), -(-(wd + 2 * pw) // sw)
    phases = np.empty((sh, sw, hq, wq), np.float32)
    for n in range(b):
        for g in range(ng):
            for c in range(cg):
                phases[...] = 0
                for i in range(kh):
                    for j in range(kw):
                        p = phases[i % sh, j % sw]
                        for k in range(m):
                            wt, grad = w[g, k, c, i, j], gy[n, g * m + k]
                            for oy in range(oh):
                                src, dst = grad[oy], p[U(oy + i // sh), j // sw:]
                                for z in range(ow):
                                    dst[z] += wt * src[z]
                out = gx[n, g * cg + c]
                for r in range(h):
                    a, rq = (r + ph) % sh, (r + ph) // sh
                    for col in range(wd):
                        out[r, col] = phases[a, (col + pw) % sw, rq, (col + pw) // sw]
    return gx


@jit
def max_pool(x, kh, kw, ph, pw, sh, sw, y, argmax, train):
    """y[n, c, oy, z] = max of the window (kh, kw) at (oy·sh − ph, z·sw − pw) of x (padding
    never wins); with `train`, argmax = the window's first maximal tap i·kw + j (numpy's
    `max_pool`: the same bits). Each tap is one run over the flat phase plane (`_phases`,
    padded by −inf), as in `group_conv`; of maxima equal but for zero's sign y keeps the
    last tap's, as numpy's maximum does on x86."""
    b, nc, oh, ow = y.shape
    h, w = x.shape[2], x.shape[3]
    hq = max(-(-(h + ph) // sh), oh + (kh - 1) // sh)
    wq = max(-(-(w + pw) // sw), ow + (kw - 1) // sw)
    phases = np.full((sh, sw, hq, wq), -np.inf, np.float32)
    planes = phases.reshape(sh, sw, hq * wq)
    run = (oh - 1) * wq + ow
    m = np.empty(run, np.float32)
    a = np.empty(run, np.int32)
    low = np.float32(-np.inf)
    for n in range(b):
        for c in range(nc):
            _phases(x[n, c], ph, pw, sh, sw, phases)
            m[...] = low
            a[...] = 0
            for i in range(kh):
                for j in range(kw):
                    src = planes[i % sh, j % sw]
                    off = (i // sh) * wq + j // sw
                    t = np.int32(i * kw + j)     # also without `train`: LLVM vectorises
                    for k in range(run):            # this loop, not the one without a
                        u = U(k)
                        v, mu = src[u + U(off)], m[u]
                        a[u] = t if v > mu else a[u]
                        m[u] = v if v >= mu else mu
            for oy in range(oh):
                yr, ar = y[n, c, oy], argmax[n, c, oy]
                for z in range(ow):
                    yr[z] = m[U(oy * wq + z)]
                if train:
                    for z in range(ow):
                        ar[z] = a[U(oy * wq + z)]


@jit
def max_pool_backward(gy, argmax, kh, kw, ph, pw, sh, sw, gx):
    """gx = 0, then gx[n, c, r, q] += gy at each window whose argmax is (r, q), the windows in
    scan order (numpy's `max_pool_backward`: the same bits); an argmax outside x is dropped."""
    b, nc, oh, ow = gy.shape
    h, w = gx.shape[2], gx.shape[3]
    for n in range(b):
        for c in range(nc):
            dst = gx[n, c]
            dst[...] = 0
            for oy in range(oh):
                g, a = gy[n, c, oy], argmax[n, c, oy]
                for z in range(ow):
                    t = np.intp(a[z])
                    r, q = oy * sh + t // kw - ph, z * sw + t % kw - pw
                    if 0 <= r < h and 0 <= q < w:
                        dst[r, q] += g[z]


@jit
def avg_pool(x, kh, kw, ph, pw, sh, sw, size, y):
    """y = the sum of each window of x (padding 0), over its rows then its columns, / size
    (numpy's `avg_pool`: the same bits, the padding's zeros added too, as they turn −0 into
    0): each output row's window rows summed into one padded row, then its columns."""
    b, nc, oh, ow = y.shape
    h, w = x.shape[2], x.shape[3]
    wn = (ow - 1) * sw + kw                 # the padded columns the windows reach
    qlo, qhi = min(wn, pw), min(wn, pw + w)     # those inside x
    part = np.empty(wn, np.float32)
    zero = np.float32(0)
    for n in range(b):
        for c in range(nc):
            src = x[n, c]
            for oy in range(oh):
                part[...] = zero
                for i in range(kh):
                    r = oy * sh + i - ph
                    if r < 0 or r >= h:
                        if i:
                            for q in range(wn):
                                part[q] += zero
                        continue
                    row = src[r]
                    for q in range(qlo):
                        part[q] += zero
                    if i:
                        for k in range(qhi - qlo):
                            part[U(qlo + k)] += row[U(qlo + k - pw)]
                    else:
                        for k in range(qhi - qlo):
                            part[U(qlo + k)] = row[U(qlo + k - pw)]
                    for q in range(qhi, wn):
                        part[q] += zero
                yr, sr = y[n, c, oy], size[oy]
                for z in range(ow):
                    s = part[z * sw]
                    for j in range(1, kw):
                        s += part[z * sw + j]
                    yr[z] = s / sr[z]


@jit
def avg_pool_backward(gy, size, kh, kw, ph, pw, sh, sw, gx):
    """gx = avg_pool's separable sums transposed (numpy's `avg_pool_backward`: the same
    bits): gy/size spread over the windows' columns, the taps j in order, into a padded row
    per output row; each row of gx then adds the rows of the windows it lies in, in the
    order of their rows i, from 0."""
    b, nc, oh, ow = gy.shape
    h, w = gx.shape[2], gx.shape[3]
    wn = max((ow - 1) * sw + kw, pw + w)
    part = np.empty((oh, wn), np.float32)
    for n in range(b):
        for c in range(nc):
            g = gy[n, c]
            part[...] = 0
            for j in range(kw):
                for oy in range(oh):
                    dst, gr, sr = part[oy], g[oy], size[oy]
                    for z in range(ow):
                        dst[z * sw + j] += gr[z] / sr[z]
            out = gx[n, c]
            for r in range(h):
                dst = out[r]
                dst[...] = 0
                for i in range(kh):
                    oy = r + ph - i
                    if oy < 0 or oy % sh or oy // sh >= oh:
                        continue
                    src = part[oy // sh]
                    for k in range(w):
                        dst[U(k)] += src[U(k + pw)]
    return gx


@jit
def _relu(x, y):
    """numpy's maximum(x, 0): x where it is > 0 or NaN, else +0 (−0 gives +0)."""
    for i in range(x.size):
        v = x[i]
        y[i] = v if not v <= 0 else np.float32(0)


@jit
def _relu_grad(y, g, gx):
    """numpy's g·(y > 0) as float32: g·1 or g·0 (−0 for a negative g, NaN for a NaN g)."""
    for i in range(y.size):
        gx[i] = g[i] * (np.float32(1) if y[i] > 0 else np.float32(0))


def _flat(*arrays):
    """The arrays as 1-D views, or None where one is not contiguous."""
    if all(a.flags.c_contiguous for a in arrays):
        return [a.reshape(-1) for a in arrays]
    return None


def activation(f, x, y, a=0.0, b=0.0):
    """numpy's `activation`; RELU compiled."""
    flat = _flat(x, y) if f == RELU else None
    if flat is None:
        _numpy.activation(f, x, y, a, b)
    else:
        _relu(*flat)


def activation_grad(f, y, g, gx, a=0.0, b=0.0):
    """numpy's `activation_grad`; RELU compiled."""
    flat = _flat(y, g, gx) if f == RELU else None
    if flat is None:
        _numpy.activation_grad(f, y, g, gx, a, b)
    else:
        _relu_grad(*flat)


@jit
def normalise(x, mean, inv_std, y):
    """numpy's normalise in one pass (numpy's makes two): the same two roundings per value."""
    for a in range(x.shape[0]):
        for c in range(x.shape[1]):
            m, s = mean[c], inv_std[c]
            for b in range(x.shape[2]):
                y[a, c, b] = (x[a, c, b] - m) * s


@jit
def scale(x, gamma, beta, y):
    """numpy's scale in one pass (numpy's makes two with beta): the same roundings per value."""
    for a in range(x.shape[0]):
        for c in range(x.shape[1]):
            g = gamma[c]
            if beta is None:
                for b in range(x.shape[2]):
                    y[a, c, b] = x[a, c, b] * g
            else:
                t = beta[c]
                for b in range(x.shape[2]):
                    y[a, c, b] = x[a, c, b] * g + t


@jit
def crop_mirror(x, at, scale, y):
    """numpy's crop_mirror in one pass: the same product per value (x·1 is x)."""
    s, t = y.shape[2], y.shape[3]
    for n in range(y.shape[0]):
        h, w, flip = U(at[0, n]), U(at[1, n]), at[2, n] != 0
        for c in range(y.shape[1]):
            for i in range(s):
                row = x[n, c, h + U(i)]
                if flip:
                    for j in range(t):
                        y[n, c, i, j] = row[w + U(t - 1 - j)] * scale
                else:
                    for j in range(t):
                        y[n, c, i, j] = row[w + U(j)] * scale
