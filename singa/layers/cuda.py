"""Convolution's copies, its direct small-group loops, pooling and the activations as CUDA
kernels of our own (CuPy RawKernels, chosen by `kernels.compiled` and `kernels.gpu` on a
GPU): one launch each where numpy's calls make one per kernel tap (or per operation of an
activation), SoftmaxLoss's forward and its gradient, and an input layer's pixels to floats.

The convolution functions take `singa.layers.loops`' arguments and compute its sums in its
order; the pooling functions compute `conv.PoolingLayer`'s numpy path in its order: the same
float32 bits (`--fmad=false`: no fused multiply-adds); the activations' gradients do too,
and their forward passes differ from numpy's only in CUDA's exp and tanh. Every kernel is a
gather, one thread per output element summing its terms in a fixed order: no atomic adds, so
a run is deterministic. Each is compiled from SOURCE at its first call on a device, then cached by
CuPy (per device, and on disk). tests/unit/test_cuda_kernels.py runs SOURCE compiled by g++.
"""
import functools

import numpy as np

from singa.device import module

__all__ = ["SOURCE", "OPTIONS", "im2col", "col2im", "group_conv", "group_conv_wgrad",
           "group_conv_xgrad", "max_pool", "avg_pool", "max_pool_backward",
           "avg_pool_backward", "RELU", "SIGMOID", "TANH", "STANH", "activation",
           "activation_grad", "normalize_pixels", "softmax_loss", "softmax_loss_grad", "lrn",
           "lrn_grad"]

OPTIONS = ("--fmad=false",)

RELU, SIGMOID, TANH, STANH = range(4)

THREADS = 256
MAX_BLOCKS = 1 << 16          # grid-stride loops beyond 16 M threads

# Each kernel's index arithmetic is instantiated for int and long long: int (argument `thin`)
# where every index, and t + the grid's stride, stays below INT_INDEX_LIMIT (int64 division
# costs a GPU several times int32's).
INT_INDEX_LIMIT = 2 ** 31
SOURCE = r"""
#define INSIDE(r, q, h, w) ((r) >= 0 && (r) < (h) && (q) >= 0 && (q) < (w))
#define EACH(t, total) \
    for (I t = (I)blockIdx.x * (I)blockDim.x + (I)threadIdx.x; t < (I)(total); \
         t += (I)blockDim.x * (I)gridDim.x)
#define BOTH(f, ...) if (thin) f<int>(__VA_ARGS__); else f<long long>(__VA_ARGS__)

// col[c, i, j, n, y, z] = x[n, c, y*sh + i - ph, z*sw + j - pw], 0 outside x; x is
// (b, ., h, w) with strides (sn, sc) of its first two axes in elements.
template <typename I> __device__ void im2col_(
        const float* x, I sn, I sc, I h, I w, float* col, I nc, I kh, I kw, I b, I oh, I ow,
        I ph, I pw, I sh, I sw) {
    EACH(t, nc * kh * kw * b * oh * ow) {
        I z = t % ow, u = t / ow;
        I y = u % oh; u /= oh;
        I n = u % b; u /= b;
        I j = u % kw; u /= kw;
        I i = u % kh, c = u / kh;
        I r = y * sh + i - ph, q = z * sw + j - pw;
        col[t] = INSIDE(r, q, h, w) ? x[n * sn + c * sc + r * w + q] : 0.0f;
    }
}

extern "C" __global__ void im2col(
        const float* x, long long sn, long long sc, long long h, long long w, float* col,
        long long nc, long long kh, long long kw, long long b, long long oh, long long ow,
        long long ph, long long pw, long long sh, long long sw, long long thin) {
    BOTH(im2col_, x, sn, sc, h, w, col, nc, kh, kw, b, oh, ow, ph, pw, sh, sw);
}

// gx[n, c, r, q] = sum over taps (i, j) in scan order of col[c, i, j, n, y, z] where
// y*sh + i - ph = r and z*sw + j - pw = q, from 0 (loops.col2im's order).
template <typename I> __device__ void col2im_(
        const float* col, float* gx, I nc, I h, I w, I kh, I kw, I b, I oh, I ow,
        I ph, I pw, I sh, I sw) {
    EACH(t, b * nc * h * w) {
        I q = t % w, u = t / w;
        I r = u % h; u /= h;
        I c = u % nc, n = u / nc;
        float s = 0.0f;
        for (I i = 0; i < kh; ++i) {
            I a = r + ph - i;
            if (a < 0 || a % sh || a / sh >= oh) continue;
            for (I j = 0; j < kw; ++j) {
                I e = q + pw - j;
                if (e < 0 || e % sw || e / sw >= ow) continue;
                s += col[((((c * kh + i) * kw + j) * b + n) * oh + a / sh) * ow + e / sw];
            }
        }
        gx[t] = s;
    }
}

extern "C" __global__ void col2im(
        const float* col, float* gx, long long nc, long long h, long long w, long long kh,
        long long kw, long long b, long long oh, long long ow, long long ph, long long pw,
        long long sh, long long sw, long long thin) {
    BOTH(col2im_, col, gx, nc, h, w, kh, kw, b, oh, ow, ph, pw, sh, sw);
}

// y[n, g*m + k] = sum over (c, i, j) in order of w[g, k, c, i, j] * xp[n, g*cg + c, i::sh,
// j::sw], from -0, plus bias (loops.group_conv); xp is x padded by zeros.
template <typename I> __device__ void group_conv_(
        const float* x, const float* wt, const float* bias, float* y, I b, I ng, I m, I cg,
        I h, I w, I oh, I ow, I kh, I kw, I ph, I pw, I sh, I sw) {
    EACH(t, b * ng * m * oh * ow) {
        I z = t % ow, u = t / ow;
        I oy = u % oh; u /= oh;
        I f = u % (ng * m), n = u / (ng * m);
        I g = f / m;
        float s = -0.0f;
        for (I c = 0; c < cg; ++c) {
            const float* plane = x + ((n * ng + g) * cg + c) * h * w;
            const float* taps = wt + (f * cg + c) * kh * kw;
            for (I i = 0; i < kh; ++i)
                for (I j = 0; j < kw; ++j) {
                    I r = oy * sh + i - ph, q = z * sw + j - pw;
                    s += taps[i * kw + j] * (INSIDE(r, q, h, w) ? plane[r * w + q] : 0.0f);
                }
        }
        y[t] = s + bias[f];
    }
}

extern "C" __global__ void group_conv(
        const float* x, const float* wt, const float* bias, float* y, long long b,
        long long ng, long long m, long long cg, long long h, long long w, long long oh,
        long long ow, long long kh, long long kw, long long ph, long long pw, long long sh,
        long long sw, long long thin) {
    BOTH(group_conv_, x, wt, bias, y, b, ng, m, cg, h, w, oh, ow, kh, kw, ph, pw, sh, sw);
}

// acc[g*m + k, c, i, j, oy, z] = sum over the samples n in order of
// gy[n, g*m + k, oy, z] * xp[n, g*cg + c, oy*sh + i, z*sw + j] (loops.group_conv_wgrad).
template <typename I> __device__ void group_conv_wgrad_(
        const float* x, const float* gy, float* acc, I b, I ng, I m, I cg, I h, I w, I oh,
        I ow, I kh, I kw, I ph, I pw, I sh, I sw) {
    EACH(t, ng * m * cg * kh * kw * oh * ow) {
        I z = t % ow, u = t / ow;
        I oy = u % oh; u /= oh;
        I j = u % kw; u /= kw;
        I i = u % kh; u /= kh;
        I c = u % cg, f = u / cg;
        I r = oy * sh + i - ph, q = z * sw + j - pw;
        bool inside = INSIDE(r, q, h, w);
        const float* xs = x + ((f / m) * cg + c) * h * w + (inside ? r * w + q : 0);
        const float* gs = gy + (f * oh + oy) * ow + z;
        float s = 0.0f;
        for (I n = 0; n < b; ++n) {
            float p = gs[n * ng * m * oh * ow] * (inside ? xs[n * ng * cg * h * w] : 0.0f);
            s = n == 0 ? p : s + p;
        }
        acc[t] = s;
    }
}

extern "C" __global__ void group_conv_wgrad(
        const float* x, const float* gy, float* acc, long long b, long long ng, long long m,
        long long cg, long long h, long long w, long long oh, long long ow, long long kh,
        long long kw, long long ph, long long pw, long long sh, long long sw, long long thin) {
    BOTH(group_conv_wgrad_, x, gy, acc, b, ng, m, cg, h, w, oh, ow, kh, kw, ph, pw, sh, sw);
}

// gx[n, g*cg + c, r, q] = sum over taps (i, j) in scan order, then k, of
// w[g, k, c, i, j] * gy[n, g*m + k, y, z] where y*sh + i - ph = r, z*sw + j - pw = q, from 0
// (loops.group_conv_xgrad).
template <typename I> __device__ void group_conv_xgrad_(
        const float* gy, const float* wt, float* gx, I b, I ng, I m, I cg, I h, I w, I oh,
        I ow, I kh, I kw, I ph, I pw, I sh, I sw) {
    EACH(t, b * ng * cg * h * w) {
        I q = t % w, u = t / w;
        I r = u % h; u /= h;
        I ch = u % (ng * cg), n = u / (ng * cg);
        I g = ch / cg, c = ch % cg;
        float s = 0.0f;
        for (I i = 0; i < kh; ++i) {
            I a = r + ph - i;
            if (a < 0 || a % sh || a / sh >= oh) continue;
            for (I j = 0; j < kw; ++j) {
                I e = q + pw - j;
                if (e < 0 || e % sw || e / sw >= ow) continue;
                for (I k = 0; k < m; ++k)
                    s += wt[(((g * m + k) * cg + c) * kh + i) * kw + j]
                         * gy[((n * ng + g) * m + k) * oh * ow + (a / sh) * ow + e / sw];
            }
        }
        gx[t] = s;
    }
}

extern "C" __global__ void group_conv_xgrad(
        const float* gy, const float* wt, float* gx, long long b, long long ng, long long m,
        long long cg, long long h, long long w, long long oh, long long ow, long long kh,
        long long kw, long long ph, long long pw, long long sh, long long sw, long long thin) {
    BOTH(group_conv_xgrad_, gy, wt, gx, b, ng, m, cg, h, w, oh, ow, kh, kw, ph, pw, sh, sw);
}

// y[p, oy, z] = max over taps t = i*kw + j of xp[p, oy*sh + i, z*sw + j], xp padded by -inf
// (NaN wins, as numpy's max); with train, argmax = the first tap equal to y (0 if none).
template <typename I> __device__ void max_pool_(
        const float* x, float* y, int* argmax, I planes, I h, I w, I oh, I ow, I kh, I kw,
        I ph, I pw, I sh, I sw, I train) {
    const float ninf = __int_as_float(0xff800000);
    EACH(t, planes * oh * ow) {
        I z = t % ow, u = t / ow;
        I oy = u % oh, p = u / oh;
        const float* plane = x + p * h * w;
        float best = 0.0f;
        for (I i = 0; i < kh; ++i)
            for (I j = 0; j < kw; ++j) {
                I r = oy * sh + i - ph, q = z * sw + j - pw;
                float v = INSIDE(r, q, h, w) ? plane[r * w + q] : ninf;
                // !(v <= best): v is larger, or NaN; once NaN, best stays NaN
                if ((i == 0 && j == 0) || (best == best && !(v <= best))) best = v;
            }
        y[t] = best;
        if (!train) continue;
        int first = 0;
        for (I k = kh * kw - 1; k >= 0; --k) {
            I r = oy * sh + k / kw - ph, q = z * sw + k % kw - pw;
            if ((INSIDE(r, q, h, w) ? plane[r * w + q] : ninf) == best) first = (int)k;
        }
        argmax[t] = first;
    }
}

extern "C" __global__ void max_pool(
        const float* x, float* y, int* argmax, long long planes, long long h, long long w,
        long long oh, long long ow, long long kh, long long kw, long long ph, long long pw,
        long long sh, long long sw, long long train, long long thin) {
    BOTH(max_pool_, x, y, argmax, planes, h, w, oh, ow, kh, kw, ph, pw, sh, sw, train);
}

// y[p, oy, z] = (sum over j of (sum over i of xp[p, oy*sh + i, z*sw + j])) / size[oy, z],
// xp padded by zeros: the layer's separable sums, rows then columns, in order.
template <typename I> __device__ void avg_pool_(
        const float* x, const float* size, float* y, I planes, I h, I w, I oh, I ow, I kh,
        I kw, I ph, I pw, I sh, I sw) {
    EACH(t, planes * oh * ow) {
        I z = t % ow, u = t / ow;
        I oy = u % oh, p = u / oh;
        const float* plane = x + p * h * w;
        float s = 0.0f;
        for (I j = 0; j < kw; ++j) {
            float col = 0.0f;
            for (I i = 0; i < kh; ++i) {
                I r = oy * sh + i - ph, q = z * sw + j - pw;
                float v = INSIDE(r, q, h, w) ? plane[r * w + q] : 0.0f;
                col = i == 0 ? v : col + v;
            }
            s = j == 0 ? col : s + col;
        }
        y[t] = s / size[oy * ow + z];
    }
}

extern "C" __global__ void avg_pool(
        const float* x, const float* size, float* y, long long planes, long long h,
        long long w, long long oh, long long ow, long long kh, long long kw, long long ph,
        long long pw, long long sh, long long sw, long long thin) {
    BOTH(avg_pool_, x, size, y, planes, h, w, oh, ow, kh, kw, ph, pw, sh, sw);
}

// gx[p, r, q] = sum over the windows (oy, z) in scan order whose argmax is the tap at
// (r, q) of gy[p, oy, z], from 0 (the layer's add.at at the argmaxes, in window order).
template <typename I> __device__ void max_pool_backward_(
        const float* gy, const int* argmax, float* gx, I planes, I h, I w, I oh, I ow, I kh,
        I kw, I ph, I pw, I sh, I sw) {
    EACH(t, planes * h * w) {
        I q = t % w, u = t / w;
        I r = u % h, p = u / h;
        I a = r + ph, e = q + pw;
        I ylo = a >= kh ? (a - kh) / sh + 1 : 0, zlo = e >= kw ? (e - kw) / sw + 1 : 0;
        I yhi = a / sh < oh - 1 ? a / sh : oh - 1, zhi = e / sw < ow - 1 ? e / sw : ow - 1;
        float s = 0.0f;
        for (I oy = ylo; oy <= yhi; ++oy)
            for (I z = zlo; z <= zhi; ++z) {
                I k = p * oh * ow + oy * ow + z;
                if (argmax[k] == (int)((a - oy * sh) * kw + e - z * sw)) s += gy[k];
            }
        gx[t] = s;
    }
}

extern "C" __global__ void max_pool_backward(
        const float* gy, const int* argmax, float* gx, long long planes, long long h,
        long long w, long long oh, long long ow, long long kh, long long kw, long long ph,
        long long pw, long long sh, long long sw, long long thin) {
    BOTH(max_pool_backward_, gy, argmax, gx, planes, h, w, oh, ow, kh, kw, ph, pw, sh, sw);
}

// gx[p, r, q] = sum over taps i in order of (sum over taps j in order of gy / size at the
// window (oy, z) whose tap (i, j) is (r, q)), from 0: the layer's transposed separable sums.
template <typename I> __device__ void avg_pool_backward_(
        const float* gy, const float* size, float* gx, I planes, I h, I w, I oh, I ow, I kh,
        I kw, I ph, I pw, I sh, I sw) {
    EACH(t, planes * h * w) {
        I q = t % w, u = t / w;
        I r = u % h, p = u / h;
        float s = 0.0f;
        for (I i = 0; i < kh; ++i) {
            I a = r + ph - i;
            if (a < 0 || a % sh || a / sh >= oh) continue;
            float part = 0.0f;
            for (I j = 0; j < kw; ++j) {
                I e = q + pw - j;
                if (e < 0 || e % sw || e / sw >= ow) continue;
                I k = (a / sh) * ow + e / sw;
                part += gy[p * oh * ow + k] / size[k];
            }
            s += part;
        }
        gx[t] = s;
    }
}

extern "C" __global__ void avg_pool_backward(
        const float* gy, const float* size, float* gx, long long planes, long long h,
        long long w, long long oh, long long ow, long long kh, long long kw, long long ph,
        long long pw, long long sh, long long sw, long long thin) {
    BOTH(avg_pool_backward_, gy, size, gx, planes, h, w, oh, ow, kh, kw, ph, pw, sh, sw);
}

// y[t] = ((float)u[t] − mean[j]) / std[j], j = t % dim: StoreInputLayer's pixels, exact.
template <typename I> __device__ void normalize_pixels_(
        const unsigned char* u, const float* mean, const float* std, float* y, I total, I dim) {
    EACH(t, total) y[t] = ((float)u[t] - mean[t % dim]) / std[t % dim];
}

extern "C" __global__ void normalize_pixels(
        const unsigned char* u, const float* mean, const float* std, float* y,
        long long total, long long dim, long long thin) {
    BOTH(normalize_pixels_, u, mean, std, y, total, dim);
}

// SoftmaxLoss's forward on x (N, D), row n by thread n: p[n] = exp(x[n] − max) / Σ_j (in
// index order; max NaN if any x[n, j] is), loss[n] = −log(max(p[n, label], FLT_MIN)) in
// double (np.maximum: NaN wins), hit[n] = [fewer than topk entries of p[n] rank above
// p[n, label]], (p, index) pairs ranking descending: among equal p the higher index first
// (SINGA's).
template <typename I> __device__ void softmax_loss_(
        const float* x, const int* label, float* p, double* loss, int* hit, I nrows, I d,
        I topk) {
    EACH(n, nrows) {
        const float* in = x + n * d;
        float* row = p + n * d;
        float m = in[0];
        for (I j = 1; j < d; ++j)
            if (in[j] > m || isnan(in[j])) m = isnan(m) ? m : in[j];
        float s = 0.0f;
        for (I j = 0; j < d; ++j) {
            row[j] = expf(in[j] - m);
            s += row[j];
        }
        for (I j = 0; j < d; ++j) row[j] = row[j] / s;
        I k = label[n], above = 0;
        float t = row[k];
        for (I j = 0; j < d; ++j)
            above += row[j] > t || (row[j] == t && j > k);
        hit[n] = above < topk;
        loss[n] = -log((double)(isnan(t) || t > 1.17549435e-38f ? t : 1.17549435e-38f));
    }
}

extern "C" __global__ void softmax_loss(
        const float* x, const int* label, float* p, double* loss, int* hit, long long nrows,
        long long d, long long topk, long long thin) {
    BOTH(softmax_loss_, x, label, p, loss, hit, nrows, d, topk);
}

// out += [scale·Σ loss / N, scale·Σ hit / N, 1], summed in index order by one thread.
extern "C" __global__ void softmax_loss_sums(
        const double* loss, const int* hit, double* out, long long nrows, double scale) {
    if (blockIdx.x || threadIdx.x) return;
    double l = 0.0, h = 0.0;
    for (long long n = 0; n < nrows; ++n) {
        l += loss[n];
        h += hit[n];
    }
    out[0] += scale * l / nrows;
    out[1] += scale * h / nrows;
    out[2] += 1.0;
}

// LRN over the window of `size` channels centred on c (across), or of size × size pixels
// centred on (r, q) (within: the sum over rows, then over columns), terms outside being 0,
// added in norm.py's order: w[0] + w[1], then + w[2], ... (in[] of the whole sample).
template <typename I> __device__ float window_(
        const float* in, bool square, I n, I c, I r, I q, I nc, I h, I w, I size, I within) {
    I half = size / 2;
    #define TERM(cc, rr, qq) (INSIDE(rr, qq, h, w) && (cc) >= 0 && (cc) < nc ? \
        (square ? in[((n * nc + (cc)) * h + (rr)) * w + (qq)] * \
                  in[((n * nc + (cc)) * h + (rr)) * w + (qq)] \
                : in[((n * nc + (cc)) * h + (rr)) * w + (qq)]) : 0.0f)
    if (!within) {
        float s = TERM(c - half, r, q);
        if (size == 1) return s;
        s = s + TERM(c - half + 1, r, q);
        for (I k = 2; k < size; ++k) s += TERM(c - half + k, r, q);
        return s;
    }
    float s = 0.0f;
    for (I j = 0; j < size; ++j) {
        float col = TERM(c, r - half, q - half + j);
        if (size > 1) col = col + TERM(c, r - half + 1, q - half + j);
        for (I k = 2; k < size; ++k) col += TERM(c, r - half + k, q - half + j);
        if (j == 0) s = col; else if (j == 1) s = s + col; else s += col;
    }
    return s;
    #undef TERM
}

// norm = k + salpha·Σ_window x²; scale = norm^(−beta) (1/(√norm·√√norm) for 0.75); y = x·scale.
template <typename I> __device__ void lrn_(
        const float* x, float* y, float* norm, float* scale, I nn, I nc, I h, I w, I size,
        I within, float salpha, float knorm, float beta) {
    EACH(t, nn * nc * h * w) {
        I q = t % w, u = t / w;
        I r = u % h; u /= h;
        I c = u % nc, n = u / nc;
        float v = window_(x, true, n, c, r, q, nc, h, w, size, within);
        v = v * salpha; v = v + knorm;
        norm[t] = v;
        float e;
        if (beta == 0.75f) { e = sqrtf(v); float f = sqrtf(e); e = e * f; e = 1.0f / e; }
        else { e = logf(v); e = e * -beta; e = expf(e); }
        scale[t] = e;
        y[t] = x[t] * e;
    }
}

extern "C" __global__ void lrn(
        const float* x, float* y, float* norm, float* scale, long long nn, long long nc,
        long long h, long long w, long long size, long long within, float salpha, float knorm,
        float beta, long long thin) {
    BOTH(lrn_, x, y, norm, scale, nn, nc, h, w, size, within, salpha, knorm, beta);
}

// LRN's gradient: gx = g·scale + coef·x·Σ_window(g·y/norm), coef = −2·beta·salpha; `inner`
// (scratch) holds g·y/norm, written by lrn_inner first.
template <typename I> __device__ void lrn_inner_(
        const float* g, const float* y, const float* norm, float* inner, I total) {
    EACH(t, total) { float v = g[t] * y[t]; inner[t] = v / norm[t]; }
}

extern "C" __global__ void lrn_inner(
        const float* g, const float* y, const float* norm, float* inner, long long total,
        long long thin) {
    BOTH(lrn_inner_, g, y, norm, inner, total);
}

template <typename I> __device__ void lrn_grad_(
        const float* x, const float* g, const float* scale, const float* inner, float* gx,
        I nn, I nc, I h, I w, I size, I within, float coef) {
    EACH(t, nn * nc * h * w) {
        I q = t % w, u = t / w;
        I r = u % h; u /= h;
        I c = u % nc, n = u / nc;
        float a = window_(inner, false, n, c, r, q, nc, h, w, size, within);
        a = a * x[t]; a = a * coef;
        float v = g[t] * scale[t];
        gx[t] = v + a;
    }
}

extern "C" __global__ void lrn_grad(
        const float* x, const float* g, const float* scale, const float* inner, float* gx,
        long long nn, long long nc, long long h, long long w, long long size, long long within,
        float coef, long long thin) {
    BOTH(lrn_grad_, x, g, scale, inner, gx, nn, nc, h, w, size, within, coef);
}

// g[n, j] = (p[n, j] − [j = label[n]])·scale: SoftmaxLoss's gradient (p − onehot)·scale/N.
template <typename I> __device__ void softmax_loss_grad_(
        const float* p, const int* label, float* g, I nrows, I d, float scale) {
    EACH(t, nrows * d) {
        float v = p[t];
        if (t % d == label[t / d]) v = v - 1.0f;
        g[t] = v * scale;
    }
}

extern "C" __global__ void softmax_loss_grad(
        const float* p, const int* label, float* g, long long nrows, long long d,
        float scale, long long thin) {
    BOTH(softmax_loss_grad_, p, label, g, nrows, d, scale);
}

// y = f(x): 0 ReLU max(x, 0) (np.maximum: NaN wins, a tie gives +0); 1 sigmoid
// 1/(1 + e^-x); 2 tanh; 3 STanh a·tanh(b·x). y may be x.
template <typename I> __device__ void activation_(
        const float* x, float* y, I n, I f, float a, float b) {
    EACH(t, n) {
        float v = x[t];
        switch (f) {
        case 0: y[t] = isnan(v) ? v : (v > 0.0f ? v : 0.0f); break;
        case 1: v = -v; v = expf(v); v = v + 1.0f; y[t] = 1.0f / v; break;
        case 2: y[t] = tanhf(v); break;
        case 3: v = v * b; v = tanhf(v); y[t] = v * a; break;
        }
    }
}

extern "C" __global__ void activation(
        const float* x, float* y, long long n, long long f, float a, float b,
        long long thin) {
    BOTH(activation_, x, y, n, f, a, b);
}

// gx = g·f'(y), f' from y: 0 ReLU [y > 0]; 1 sigmoid (1 − y)·y; 2 tanh 1 − y²;
// 3 STanh y²·a + b (a = −B/A, b = A·B). gx may be g.
template <typename I> __device__ void activation_grad_(
        const float* y, const float* g, float* gx, I n, I f, float a, float b) {
    EACH(t, n) {
        float v = y[t], d;
        switch (f) {
        case 0: d = v > 0.0f ? 1.0f : 0.0f; break;
        case 1: d = 1.0f - v; d = d * v; break;
        case 2: d = v * v; d = 1.0f - d; break;
        default: d = v * v; d = d * a; d = d + b; break;
        }
        gx[t] = g[t] * d;
    }
}

extern "C" __global__ void activation_grad(
        const float* y, const float* g, float* gx, long long n, long long f, float a, float b,
        long long thin) {
    BOTH(activation_grad_, y, g, gx, n, f, a, b);
}
"""


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
