"""SINGA's update rules as one CUDA kernel each (a CuPy RawKernel), the updater's path for a
slice on a GPU: one launch per slice and step where numpy's calls make 2 to 19.

Each thread updates one element with `singa.updater`'s prelude and rule, operation by
operation in numpy's order and float32 rounding (`--fmad=false`; IEEE division and square
root, NVRTC's defaults; np.clip's and np.maximum's NaN rules), so a GPU step gives the host's
bits. tests/unit/test_updater.py runs SOURCE compiled by g++ against the numpy path.
"""
import functools

import numpy as np

from singa.device import module
from singa.layers.cuda import OPTIONS, grid

__all__ = ["SOURCE", "SGD", "MOMENTUM", "NESTEROV", "ADAGRAD", "RMSPROP", "ADADELTA", "ADAM",
           "ADAMMAX", "rule", "update"]

SGD, MOMENTUM, NESTEROV, ADAGRAD, RMSPROP, ADADELTA, ADAM, ADAMMAX = range(8)

SOURCE = r"""
// numpy's float32 clip and maximum: a NaN operand wins; on a tie (zeros of both signs) clip
// keeps x and maximum takes b.
__device__ __forceinline__ float clip_(float x, float lo, float hi) {
    x = x < lo ? lo : x;
    return x > hi ? hi : x;
}
__device__ __forceinline__ float max_(float a, float b) {
    return isnan(a) ? a : (a > b ? a : b);
}

// w, h, u: the slice and its buffers (h, u unused by rules without them); g: its gradient.
// Prelude: [clip] g = clip(g, lo, hi); [scale_on] g = g*scale; [wd_on] g = g + w*wd.
// c0 ... c4: the rule's constants, as named in each case.
extern "C" __global__ void update(
        float* w, const float* g, float* h, float* u, long long n, int rule, int clip,
        float lo, float hi, int scale_on, float scale, int wd_on, float wd, float lr,
        float c0, float c1, float c2, float c3, float c4) {
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (long long)blockDim.x * gridDim.x) {
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
}
"""


def rule(case, constants, clip=None):
    """The kernel's arguments for rule `case` (SGD ... ADAMMAX) with its `constants`, g
    clipped to `clip` (lo, hi) if given: what stays from one `update` to the next, made once.
    """
    lo, hi = (0.0, 0.0) if clip is None else clip
    c = (list(constants) + [0.0] * 5)[:5]
    f = np.float32
    return (np.int32(case), np.int32(clip is not None), f(lo), f(hi)), tuple(map(f, c))


def update(launch, w, g, buffers, lr, scale=None, wd=None):
    """The rule of `launch` (from `rule`) on slice `w` (float32, C-contiguous, on a GPU), its
    gradient `g` and `buffers`, in one launch: g clipped, scaled by `scale` and decayed by
    `wd` where not None, then the rule at learning rate `lr`. `g` is left as it was."""
    n = w.size
    if n == 0:
        return
    h, u = (list(buffers) + [w, w])[:2]
    head, constants = launch
    f = np.float32
    _kernel(module(w))(*grid(n), (
        w, g, h, u, np.int64(n), *head,
        np.int32(scale is not None), f(scale or 0), np.int32(wd is not None), f(wd or 0),
        f(lr), *constants))


@functools.cache
def _kernel(xp):
    return xp.RawKernel(SOURCE, "update", options=OPTIONS)
