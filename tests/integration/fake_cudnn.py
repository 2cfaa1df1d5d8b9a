"""A stand-in for libcudnn.so.9 on the CuPy stand-in (strict_device), so that the CPU tests run
singa.layers.kernels.cudnn's calls as it makes them: the C functions it names, taking ctypes'
objects and pointers as ctypes would hand them over, computing with numpy on the memory at
the pointers (the stand-in's device arrays are host memory), through the stand-in's queue (a
capturing stream records them for its graphs).

It refuses what cuDNN would: a descriptor used before it is set, shapes that do not fit each
other, an algorithm that the pass's heuristics did not offer, a workspace smaller than the
algorithm's, a layout other than NCHW float32, and (strict, as the tests want) a call on a
stream other than the thread's current one. Its heuristics rank a faster non-deterministic
algorithm first and a tensor-op one (TF32) before the FMA ones, whatever math the descriptor
asks for, and leave the perf results' workspace size 0 (the engine asks for it). `runs` lists
(pass, algorithm, math type) of every pass run.
"""
import ctypes
import functools
import itertools
import threading

import numpy as np

import strict_device

FMA_MATH, DEFAULT_MATH, TENSOR_OP_MATH = 3, 0, 1
#: per pass: (algorithm, deterministic, math types it runs under, workspace bytes), in the
#: order the heuristics rank them
ALGOS = {"fwd": [(7, 0, (DEFAULT_MATH, FMA_MATH), 0),
                 (6, 1, (TENSOR_OP_MATH,), 4096),
                 (1, 1, (DEFAULT_MATH, FMA_MATH), 2048)],
         "data": [(0, 0, (DEFAULT_MATH, FMA_MATH), 0),
                  (1, 1, (DEFAULT_MATH, FMA_MATH, TENSOR_OP_MATH), 1024)],
         "filter": [(0, 0, (DEFAULT_MATH, FMA_MATH), 0),
                    (3, 0, (DEFAULT_MATH, FMA_MATH), 512),
                    (1, 1, (DEFAULT_MATH, FMA_MATH, TENSOR_OP_MATH), 8192)]}


def _value(arg):
    """The int of a handle or descriptor as ctypes would pass it (a c_void_p or an int)."""
    return arg.value if isinstance(arg, ctypes.c_void_p) else arg


def _out(ref):
    """The object a ctypes.byref(...) points to."""
    return ref._obj


def _array(ptr, shape):
    return np.ctypeslib.as_array(ctypes.cast(ptr, ctypes.POINTER(ctypes.c_float)), shape=shape)


class FakeCudnn:
    """`flip`: compute convolution (the kernel flipped) instead of cross-correlation, as a
    broken library might: the engine's check must notice."""

    def __init__(self, flip=False):
        self.flip = flip
        self.ids = itertools.count(1)
        self.descs, self.handles, self.runs = {}, {}, []

    # ---- library ----
    def cudnnGetVersion(self):
        return 92800

    def cudnnGetErrorString(self, status):
        return b"CUDNN_STATUS_BAD_PARAM"

    def cudnnCreate(self, ref):
        _out(ref).value = h = next(self.ids)
        self.handles[h] = None
        return 0

    def cudnnSetStream(self, h, stream):
        assert _value(h) in self.handles
        self.handles[_value(h)] = _value(stream) or 0
        return 0

    # ---- descriptors ----
    def _create(self, ref, kind):
        _out(ref).value = d = next(self.ids)
        self.descs[d] = {"kind": kind}
        return 0

    def cudnnCreateTensorDescriptor(self, ref):
        return self._create(ref, "tensor")

    def cudnnCreateFilterDescriptor(self, ref):
        return self._create(ref, "filter")

    def cudnnCreateConvolutionDescriptor(self, ref):
        return self._create(ref, "conv")

    def _desc(self, d, kind, *fields):
        desc = self.descs[_value(d)]
        assert desc["kind"] == kind, (desc, kind)
        for f in fields:
            assert f in desc, f"{kind} descriptor used before its {f} was set"
        return desc

    def cudnnSetTensor4dDescriptor(self, d, fmt, dtype, n, c, h, w):
        assert (fmt, dtype) == (0, 0), "NCHW float32 only"
        self._desc(d, "tensor")["shape"] = (n, c, h, w)
        return 0

    def cudnnSetFilter4dDescriptor(self, d, dtype, fmt, k, c, h, w):
        assert (fmt, dtype) == (0, 0), "NCHW float32 only"
        self._desc(d, "filter")["shape"] = (k, c, h, w)
        return 0

    def cudnnSetConvolution2dDescriptor(self, d, ph, pw, u, v, dh, dw, mode, compute):
        assert (dh, dw, compute) == (1, 1, 0) and mode in (0, 1)
        self._desc(d, "conv").update(pad=(ph, pw), stride=(u, v), mode=mode, groups=1,
                                     math=DEFAULT_MATH)
        return 0

    def cudnnSetConvolutionGroupCount(self, d, g):
        self._desc(d, "conv", "pad")["groups"] = g
        return 0

    def cudnnSetConvolutionMathType(self, d, math):
        self._desc(d, "conv", "pad")["math"] = math
        return 0

    # ---- algorithms ----
    def _check_shapes(self, x, w, conv, y):
        (n, c, h, wd), (f, cg, kh, kw) = x["shape"], w["shape"]
        (ph, pw), (sh, sw), g = conv["pad"], conv["stride"], conv["groups"]
        assert c == cg * g and f % g == 0, (x, w, conv)
        assert y["shape"] == (n, f, (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1), \
            (x, w, conv, y)

    def _query(self, name, h, conv, n_req, ref_n, perfs, shapes):
        assert _value(h) in self.handles
        conv = self._desc(conv, "conv", "pad")
        self._check_shapes(*shapes[:2], conv, shapes[2])
        offered = ALGOS[name]
        for i, (algo, det, maths, _) in enumerate(offered[:n_req]):
            p = perfs[i]
            p.algo, p.status, p.time, p.memory, p.determinism = algo, 0, -1.0, 0, det
            p.mathType = conv["math"] if conv["math"] in maths else maths[0]
        _out(ref_n).value = min(len(offered), n_req)
        return 0

    def cudnnGetConvolutionForwardAlgorithm_v7(self, h, x, w, conv, y, n, ref_n, perfs):
        return self._query("fwd", h, conv, n, ref_n, perfs, (
            self._desc(x, "tensor", "shape"), self._desc(w, "filter", "shape"),
            self._desc(y, "tensor", "shape")))

    def cudnnGetConvolutionBackwardDataAlgorithm_v7(self, h, w, dy, conv, dx, n, ref_n, perfs):
        return self._query("data", h, conv, n, ref_n, perfs, (
            self._desc(dx, "tensor", "shape"), self._desc(w, "filter", "shape"),
            self._desc(dy, "tensor", "shape")))

    def cudnnGetConvolutionBackwardFilterAlgorithm_v7(self, h, x, dy, conv, dw, n, ref_n, perfs):
        return self._query("filter", h, conv, n, ref_n, perfs, (
            self._desc(x, "tensor", "shape"), self._desc(dw, "filter", "shape"),
            self._desc(dy, "tensor", "shape")))

    def _workspace(self, name, h, conv, algo, ref):
        assert _value(h) in self.handles
        conv = self._desc(conv, "conv", "pad")
        match = [a for a in ALGOS[name] if a[0] == algo]
        assert match, (name, algo)
        _out(ref).value = match[0][3]
        return 0

    def cudnnGetConvolutionForwardWorkspaceSize(self, h, x, w, conv, y, algo, ref):
        return self._workspace("fwd", h, conv, algo, ref)

    def cudnnGetConvolutionBackwardDataWorkspaceSize(self, h, w, dy, conv, dx, algo, ref):
        return self._workspace("data", h, conv, algo, ref)

    def cudnnGetConvolutionBackwardFilterWorkspaceSize(self, h, x, dy, conv, dw, algo, ref):
        return self._workspace("filter", h, conv, algo, ref)

    # ---- passes ----
    def _pass(self, name, h, conv, algo, ws_size, alpha, beta):
        assert _value(h) in self.handles
        assert self.handles[_value(h)] == strict_device.get_current_stream().ptr, \
            "the handle's stream is not the thread's current one"
        conv = self._desc(conv, "conv", "pad")
        match = [a for a in ALGOS[name] if a[0] == algo]
        assert match and conv["math"] in match[0][2] + ((DEFAULT_MATH,) if TENSOR_OP_MATH in
                                                        match[0][2] else ()), (name, algo, conv)
        assert ws_size >= match[0][3], f"workspace {ws_size} B for {match[0][3]}"
        assert (_out(alpha).value, _out(beta).value) == (1.0, 0.0)
        self.runs.append((name, algo, conv["math"]))
        return conv

    def _taps(self, x, xs, wsh, conv, oh, ow):
        """(n, G, C/G, kh, kw, oh, ow) float64: x (at address x, shape xs) padded, at each tap
        of filters of shape wsh."""
        (ph, pw), (sh, sw), (kh, kw) = conv["pad"], conv["stride"], wsh[2:]
        xp = np.pad(_array(x, xs).astype(np.float64), ((0, 0), (0, 0), (ph, ph), (pw, pw)))
        taps = np.stack([np.stack([xp[:, :, a:a + sh * oh:sh, b:b + sw * ow:sw]
                                   for b in range(kw)], 2) for a in range(kh)], 2)
        g = conv["groups"]
        return taps.reshape(xs[0], g, xs[1] // g, kh, kw, oh, ow)

    def _w(self, w, conv):
        return w[:, :, ::-1, ::-1] if self.flip and conv["mode"] == 1 else w

    def cudnnConvolutionForward(self, h, alpha, xd, x, wd, w, conv, algo, ws, ws_size, beta,
                                yd, y):
        conv = self._pass("fwd", h, conv, algo, ws_size, alpha, beta)
        xs, wsh, ys = (self._desc(d, k, "shape")["shape"] for d, k in
                       ((xd, "tensor"), (wd, "filter"), (yd, "tensor")))
        out = _array(y, ys)

        def run():
            g, (_, f, oh, ow) = conv["groups"], ys
            taps = self._taps(x, xs, wsh, conv, oh, ow)
            wg = self._w(_array(w, wsh), conv).astype(np.float64).reshape(g, f // g, *wsh[1:])
            out[...] = np.einsum("ngcabij,gocab->ngoij", taps, wg).reshape(ys)
        strict_device._run(run, writes=[out])
        return 0

    def cudnnAddTensor(self, h, alpha, bd, b, beta, yd, y):
        bs, ys = self._desc(bd, "tensor", "shape")["shape"], self._desc(yd, "tensor",
                                                                         "shape")["shape"]
        assert bs == (1, ys[1], 1, 1) and (_out(alpha).value, _out(beta).value) == (1.0, 1.0)
        out = _array(y, ys)
        strict_device._run(lambda: out.__iadd__(_array(b, bs)), writes=[out])
        return 0

    def cudnnConvolutionBackwardData(self, h, alpha, wd, w, dyd, dy, conv, algo, ws, ws_size,
                                     beta, dxd, dx):
        conv = self._pass("data", h, conv, algo, ws_size, alpha, beta)
        wsh, gs, xs = (self._desc(d, k, "shape")["shape"] for d, k in
                       ((wd, "filter"), (dyd, "tensor"), (dxd, "tensor")))
        out = _array(dx, xs)

        def run():
            g, (n, f, oh, ow), (kh, kw) = conv["groups"], gs, wsh[2:]
            (ph, pw), (sh, sw) = conv["pad"], conv["stride"]
            wg = self._w(_array(w, wsh), conv).astype(np.float64).reshape(g, f // g, *wsh[1:])
            gy = _array(dy, gs).astype(np.float64).reshape(n, g, f // g, oh, ow)
            t = np.einsum("gocab,ngoij->ngcabij", wg, gy).reshape(n, xs[1], kh, kw, oh, ow)
            acc = np.zeros((n, xs[1], xs[2] + 2 * ph, xs[3] + 2 * pw))
            for a in range(kh):
                for b in range(kw):
                    acc[:, :, a:a + sh * oh:sh, b:b + sw * ow:sw] += t[:, :, a, b]
            out[...] = acc[:, :, ph:ph + xs[2], pw:pw + xs[3]]
        strict_device._run(run, writes=[out])
        return 0

    def cudnnConvolutionBackwardFilter(self, h, alpha, xd, x, dyd, dy, conv, algo, ws, ws_size,
                                       beta, dwd, dw):
        conv = self._pass("filter", h, conv, algo, ws_size, alpha, beta)
        xs, gs, wsh = (self._desc(d, k, "shape")["shape"] for d, k in
                       ((xd, "tensor"), (dyd, "tensor"), (dwd, "filter")))
        out = _array(dw, wsh)

        def run():
            g, (n, f, oh, ow) = conv["groups"], gs
            taps = self._taps(x, xs, wsh, conv, oh, ow)
            gy = _array(dy, gs).astype(np.float64).reshape(n, g, f // g, oh, ow)
            gw = np.einsum("ngcabij,ngoij->gocab", taps, gy).reshape(wsh)
            out[...] = gw[:, :, ::-1, ::-1] if self.flip and conv["mode"] == 1 else gw
        strict_device._run(run, writes=[out])
        return 0


def installed(monkeypatch, **kw):
    """singa.layers.kernels.cudnn on a FakeCudnn(**kw), the engine's choice made afresh."""
    from singa.layers import kernels
    from singa.layers.kernels import cudnn
    fake = FakeCudnn(**kw)
    monkeypatch.setattr(cudnn, "library", lambda: fake)
    monkeypatch.setattr(kernels, "gpu_engine", functools.cache(kernels.gpu_engine.__wrapped__))
    monkeypatch.setattr(cudnn, "_local", threading.local())
    return fake
