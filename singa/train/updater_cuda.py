"""SINGA's update rules as one CUDA kernel each (a CuPy RawKernel), the updater's path for a
slice on a GPU: one launch per slice and step where numpy's calls make 2 to 19, and one for
the slices of a bucket (`Bucket`).

Each thread updates one element with `singa.train.updater`'s prelude and rule, operation by
operation in numpy's order and float32 rounding (`--fmad=false`; IEEE division and square
root, NVRTC's defaults; np.clip's and np.maximum's NaN rules), so a GPU step gives the host's
bits. tests/unit/test_updater.py runs SOURCE compiled by g++ against the numpy path.
"""
import functools

import numpy as np

from singa.device import Uploader, address, module, on
from singa.layers.cuda import OPTIONS, grid

__all__ = ["SOURCE", "SGD", "MOMENTUM", "NESTEROV", "ADAGRAD", "RMSPROP", "ADADELTA", "ADAM",
           "ADAMMAX", "Bucket", "rule", "update"]

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
    h, u = _rule_buffers(w, buffers)
    head, constants = launch
    f = np.float32
    _kernel(module(w))(*grid(n), (
        w, g, h, u, np.int64(n), *head,
        np.int32(scale is not None), f(scale or 0), np.int32(wd is not None), f(wd or 0),
        f(lr), *constants))


class Bucket:
    """The tables of one launch over fixed slices [(w, buffers, lr_scale, grad scale, weight
    decay)] of one GPU (float32, C-contiguous), which it holds: made once; the gradients'
    addresses go up again when they change, without the host waiting for the GPU."""

    def __init__(self, slices):
        self.slices = slices
        w0 = slices[0][0]
        sizes = np.array([w.size for w, *_ in slices], np.int64)
        self.total = int(sizes.sum())
        self.ptrs = np.zeros((len(slices), 4), np.int64)     # w, g, h, u of each slice
        for k, (w, buffers, *_) in enumerate(slices):
            h, u = _rule_buffers(w, buffers)
            self.ptrs[k, [0, 2, 3]] = address(w), address(h), address(u)
        self.grads = None           # the gradients' addresses in the table on the GPU
        scales = np.array([rest for _, _, *rest in slices], np.float32)
        self.upload = Uploader()
        xp = module(w0)
        with on(w0):
            self.tables = [xp.empty(a.shape, a.dtype) for a in (self.ptrs, sizes, scales)]
        self.upload(self.tables[1], np.cumsum(sizes))
        self.upload(self.tables[2], scales)

    def update(self, launch, grads, lr, linear):
        """The rule of `launch` (from `rule`) on every slice, its gradient in `grads` (left as
        they were), at learning rate lr*lr_scale (times the grad scale where `linear` and no
        weight decay, as `Updater.update` folds it), in one launch."""
        if self.total == 0:
            return
        addresses = [address(g) for g in grads]
        if addresses != self.grads:
            self.ptrs[:, 1] = self.grads = addresses
            self.upload(self.tables[0], self.ptrs)
        head, constants = launch
        w0 = self.slices[0][0]
        with on(w0):
            _kernel(module(w0), "update_many")(*grid(self.total), (
                *self.tables, np.int32(len(self.slices)), np.int64(self.total), *head,
                np.float32(lr), np.int32(linear), *constants))


def _rule_buffers(w, buffers):
    """The kernel's h and u of a slice `w`: its buffers, `w` for those its rule has not."""
    return (list(buffers) + [w, w])[:2]


@functools.cache
def _kernel(xp, name="update"):
    return xp.RawKernel(SOURCE, name, options=OPTIONS)
