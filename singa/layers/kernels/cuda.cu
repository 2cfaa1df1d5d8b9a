// CUDA C of the layers' kernels, launched by singa/layers/kernels/cuda.py (compiled by NVRTC with --fmad=false;
// tests/cuda_shim.py builds it with g++ for the tests without a GPU).
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

// y[n, c, i, j] = x[n, c, h + i, w + j'] * scale, j' = t - 1 - j where f != 0 else j, for x
// (N, C, H, W), y (N, C, s, t) and at (3, N) holding each image's (h, w, f): ImagePreprocess.
template <typename I> __device__ void crop_mirror_(
        const float* x, const int* at, float scale, float* y, I nn, I nc, I h, I w, I s, I t) {
    EACH(e, nn * nc * s * t) {
        I j = e % t, u = e / t;
        I i = u % s; u /= s;
        I n = u / nc;
        I q = at[2 * nn + n] ? t - 1 - j : j;
        y[e] = x[(u * h + at[n] + i) * w + at[nn + n] + q] * scale;
    }
}

extern "C" __global__ void crop_mirror(
        const float* x, const int* at, float scale, float* y, long long nn, long long nc,
        long long h, long long w, long long s, long long t, long long thin) {
    BOTH(crop_mirror_, x, at, scale, y, nn, nc, h, w, s, t);
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
