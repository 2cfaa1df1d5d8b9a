// CUDA C of the update rules, launched by singa/train/updater_cuda.py (compiled by NVRTC with --fmad=false;
// tests/cuda_shim.py builds it with g++ for the tests without a GPU).
// numpy's float32 clip and maximum: a NaN operand wins; on a tie (zeros of both signs) clip
// keeps x and maximum takes b.
__device__ __forceinline__ float clip_(float x, float lo, float hi) {
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
}
__device__ __forceinline__ float max_(float a, float b) {
    return isnan(a) ? a : (a > b ? a : b);
}

// Element i of a slice w, its buffers h, u (unused by rules without them) and its gradient g.
// Prelude: [clip] g = clip(g, lo, hi); [scale_on] g = g*scale; [wd_on] g = g + w*wd.
// c0 ... c4: the rule's constants, as named in each case.
__device__ __forceinline__ void step_(
        float* w, const float* g, float* h, float* u, long long i, int rule, int clip,
        float lo, float hi, int scale_on, float scale, int wd_on, float wd, float lr,
        float c0, float c1, float c2, float c3, float c4) {
    float gi = g[i], t;
    if (clip) gi = clip_(gi, lo, hi);
    if (scale_on) gi = gi * scale;
    if (wd_on) { t = w[i] * wd; gi = gi + t; }
    switch (rule) {
    case 0:     // SGD: w = w - lr*g
        gi = gi * lr; w[i] = w[i] - gi; break;
    case 1:     // SGD, c0 = momentum: h = momentum*h - lr*g; w = w + h
        gi = gi * lr; h[i] = h[i] * c0; h[i] = h[i] - gi; w[i] = w[i] + h[i]; break;
    case 2: {   // Nesterov, c0 = momentum, c1 = 1 + momentum
        gi = gi * lr; float hm = h[i] * c0; gi = gi + hm;
        t = gi * c1; t = t - hm; w[i] = w[i] - t; h[i] = gi; break; }
    case 3:     // AdaGrad, c0 = delta: h = h + g^2; w = w - lr*g / sqrt(h + delta)
        t = gi * gi; h[i] = h[i] + t;
        gi = gi * lr; t = h[i] + c0; t = sqrtf(t); gi = gi / t; w[i] = w[i] - gi; break;
    case 4:     // RMSProp, c0 = delta, c1 = rho, c2 = 1 - rho
        t = gi * gi; t = t * c2; h[i] = h[i] * c1; h[i] = h[i] + t;
        gi = gi * lr; t = h[i] + c0; t = sqrtf(t); gi = gi / t; w[i] = w[i] - gi; break;
    case 5:     // AdaDelta, c0 = delta, c1 = rho, c2 = 1 - rho
        t = gi * gi; t = t * c2; h[i] = h[i] * c1; h[i] = h[i] + t;
        t = u[i] + c0; t = sqrtf(t); gi = gi * t;
        t = h[i] + c0; t = sqrtf(t); gi = gi / t;
        t = gi * gi; t = t * c2; u[i] = u[i] * c1; u[i] = u[i] + t;
        gi = gi * lr; w[i] = w[i] - gi; break;
    case 6:     // Adam, c0 = delta, c1 = 1 - beta1, c2 = 1 - beta2, c3 = beta1, c4 = beta2
        t = gi * c1; h[i] = h[i] * c3; h[i] = h[i] + t;
        t = gi * gi; t = t * c2; u[i] = u[i] * c4; u[i] = u[i] + t;
        gi = h[i] * lr; t = u[i] + c0; t = sqrtf(t); gi = gi / t; w[i] = w[i] - gi; break;
    case 7:     // AdamMax, c0 = delta, c1 = 1 - beta1, c2 = beta2, c3 = beta1
        t = gi * c1; h[i] = h[i] * c3; h[i] = h[i] + t;
        u[i] = u[i] * c2; u[i] = max_(u[i], fabsf(gi)); u[i] = u[i] + c0;
        gi = h[i] * lr; gi = gi / u[i]; w[i] = w[i] - gi; break;
    }
}

extern "C" __global__ void update(
        float* w, const float* g, float* h, float* u, long long n, int rule, int clip,
        float lo, float hi, int scale_on, float scale, int wd_on, float wd, float lr,
        float c0, float c1, float c2, float c3, float c4) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x)
        step_(w, g, h, u, i, rule, clip, lo, hi, scale_on, scale, wd_on, wd, lr,
              c0, c1, c2, c3, c4);
}

// The slices of a bucket in one launch: slice k's w, g, h, u at ptrs[4k ... 4k+3], its
// elements ending at ends[k] of the bucket's, its lr_scale, grad scale and weight decay at
// f[3k ... 3k+2]. As `update` with lr*lr_scale; a linear rule without weight decay folds the
// scale into it: (lr*lr_scale)*scale, the host's order.
extern "C" __global__ void update_many(
        const long long* ptrs, const long long* ends, const float* f, int nslices,
        long long total, int rule, int clip, float lo, float hi, float lr, int linear,
        float c0, float c1, float c2, float c3, float c4) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total;
         i += (long long)blockDim.x * gridDim.x) {
        int k = 0, last = nslices - 1;
        while (k < last) {
            int mid = (k + last) / 2;
            if (i < ends[mid]) last = mid; else k = mid + 1;
        }
        float lr_k = lr * f[3 * k], scale = f[3 * k + 1], wd = f[3 * k + 2];
        int fold = linear && !(wd > 0.0f);
        if (fold) lr_k = lr_k * scale;
        step_((float*)ptrs[4 * k], (const float*)ptrs[4 * k + 1], (float*)ptrs[4 * k + 2],
              (float*)ptrs[4 * k + 3], i - (k ? ends[k - 1] : 0), rule, clip, lo, hi,
              !fold && scale != 1.0f, scale, !fold && wd > 0.0f, wd, lr_k,
              c0, c1, c2, c3, c4);
    }
}
