"""SINGA's update rules as one CUDA kernel each (a CuPy RawKernel), the updater's path for a
slice on a GPU: one launch per slice and step where numpy's calls make 2 to 19, and one for
the slices of a bucket (`Bucket`).

Each thread updates one element with `singa.train.updater`'s prelude and rule, operation by
operation in numpy's order and float32 rounding (`--fmad=false`; IEEE division and square
root, NVRTC's defaults; np.clip's and np.maximum's NaN rules), so a GPU step gives the host's
bits. SOURCE is updater_cuda.cu beside this module; tests/unit/test_updater.py runs it compiled
by g++ (tests/cuda_shim.py) against the numpy path.
"""
import functools
from importlib.resources import files

import numpy as np

from singa.device import Uploader, address, module, on
from singa.layers.kernels.cuda import OPTIONS, grid

__all__ = ["SOURCE", "SGD", "MOMENTUM", "NESTEROV", "ADAGRAD", "RMSPROP", "ADADELTA", "ADAM",
           "ADAMMAX", "Bucket", "rule", "update"]

SGD, MOMENTUM, NESTEROV, ADAGRAD, RMSPROP, ADADELTA, ADAM, ADAMMAX = range(8)

SOURCE = (files(__package__) / "updater_cuda.cu").read_text()


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
