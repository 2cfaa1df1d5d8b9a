"""Convolution's copies compiled by numba (chosen by `kernels.compiled`): im2col, padding as
it copies, and col2im, one pass each where numpy makes one per kernel tap (bench/README.md).

Both release the GIL, so the compute threads run their chunks side by side, and col2im adds in
the order of the layer's numpy path: both paths give the same float32 bits
(tests/unit/test_kernels.py).
"""
import numba
import numpy as np

jit = numba.njit(nogil=True, cache=True)


@jit
def im2col(x, ph, pw, sh, sw, col, channels_first):
    """col[c, i, j, n, y, z] = x[n, c, y·sh + i − ph, z·sw + j − pw], 0 outside x; x is
    (b, C, H, W), or (C, b, H, W) if channels_first."""
    nc, kh, kw, b, oh, ow = col.shape
    h, w = x.shape[2], x.shape[3]
    zero = np.float32(0)
    for c in range(nc):
        for i in range(kh):
            for j in range(kw):
                for n in range(b):
                    plane = x[c, n] if channels_first else x[n, c]
                    for y in range(oh):
                        r = y * sh + i - ph
                        if r < 0 or r >= h:
                            for z in range(ow):
                                col[c, i, j, n, y, z] = zero
                            continue
                        for z in range(ow):     # branch-free: LLVM vectorises it
                            q = z * sw + j - pw
                            col[c, i, j, n, y, z] = plane[r, q] if 0 <= q < w else zero
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
                for n in range(b):
                    for y in range(oh):
                        r = y * sh + i - ph
                        if r < 0 or r >= h:
                            continue
                        for z in range(ow):
                            q = z * sw + j - pw
                            if 0 <= q < w:
                                gx[n, c, r, q] += col[c, i, j, n, y, z]
    return gx
