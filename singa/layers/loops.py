"""Convolution's copies compiled by numba (chosen by `kernels.compiled`): im2col, padding as
it copies, and col2im, one pass each where numpy makes one per kernel tap (bench/README.md).

Both release the GIL, so the compute threads run their chunks side by side, and col2im adds in
the order of the layer's numpy path: both paths give the same float32 bits
(tests/unit/test_kernels.py).
"""
import numba
import numpy as np

jit = numba.njit(nogil=True, cache=True)

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
