"""Convolution on a GPU through cuDNN (NVIDIA's runtime wheel nvidia-cudnn-cu12 or -cu13, in the
`gpu` extras; its C API through ctypes, on CuPy's arrays and the thread's current stream), as
SINGA's kCudnnConvolution and Caffe ran theirs and torch runs its own: forward, data and
filter gradients, groups, padding, stride, no-bias.

Each pass runs the algorithm that cuDNN's heuristics rank first among its **deterministic**
ones (`cudnnGetConvolution*Algorithm_v7`, whose perf results state each algorithm's
determinism; heuristics, not timed trials, so the choice is the same in every run on the same
kind of GPU): a GPU job resumes bit-exactly, as on the im2col path. float32 by default
(CUDNN_FMA_MATH: no tensor-core rounding); TF32 where the job asks for it (`gpu_tf32: true`,
`allow_tf32`), torch's default for its convolutions. A plan (descriptors, algorithms, one
workspace from the device's pool) is made once per batch size and kept, so a CUDA graph
captures the passes without an allocation.
"""
import ctypes
import functools
import glob
import importlib.util
import os
import threading

import numpy as np

__all__ = ["Conv", "CudnnError", "allow_tf32", "disagreement", "library", "tf32_allowed",
           "version"]

# cudnn_graph.h, cudnn_ops.h and cudnn_cnn.h of cuDNN 9
FLOAT = 0                       # CUDNN_DATA_FLOAT
NCHW = 0                        # CUDNN_TENSOR_NCHW
CROSS_CORRELATION = 1           # CUDNN_CROSS_CORRELATION (what SINGA and Caffe compute)
DETERMINISTIC = 1               # CUDNN_DETERMINISTIC
DEFAULT_MATH, TENSOR_OP_MATH, FMA_MATH = 0, 1, 3
MAX_ALGOS = 16                  # more than any pass has (8 forward, 6 data, 7 filter)

P = ctypes.c_void_p
I = ctypes.c_int
PI = ctypes.POINTER(ctypes.c_int)


class Perf(ctypes.Structure):
    """cudnnConvolution{Fwd,BwdData,BwdFilter}AlgoPerf_t (one layout for the three)."""
    _fields_ = [("algo", I), ("status", I), ("time", ctypes.c_float),
                ("memory", ctypes.c_size_t), ("determinism", I), ("mathType", I),
                ("reserved", I * 3)]


PPERF = ctypes.POINTER(Perf)
PSIZE = ctypes.POINTER(ctypes.c_size_t)
SIGNATURES = {
    "cudnnCreate": [ctypes.POINTER(P)],
    "cudnnSetStream": [P, P],
    "cudnnCreateTensorDescriptor": [ctypes.POINTER(P)],
    "cudnnSetTensor4dDescriptor": [P, I, I, I, I, I, I],
    "cudnnCreateFilterDescriptor": [ctypes.POINTER(P)],
    "cudnnSetFilter4dDescriptor": [P, I, I, I, I, I, I],
    "cudnnCreateConvolutionDescriptor": [ctypes.POINTER(P)],
    "cudnnSetConvolution2dDescriptor": [P, I, I, I, I, I, I, I, I],
    "cudnnSetConvolutionGroupCount": [P, I],
    "cudnnSetConvolutionMathType": [P, I],
    "cudnnGetConvolutionForwardAlgorithm_v7": [P, P, P, P, P, I, PI, PPERF],
    "cudnnGetConvolutionBackwardDataAlgorithm_v7": [P, P, P, P, P, I, PI, PPERF],
    "cudnnGetConvolutionBackwardFilterAlgorithm_v7": [P, P, P, P, P, I, PI, PPERF],
    "cudnnGetConvolutionForwardWorkspaceSize": [P, P, P, P, P, I, PSIZE],
    "cudnnGetConvolutionBackwardDataWorkspaceSize": [P, P, P, P, P, I, PSIZE],
    "cudnnGetConvolutionBackwardFilterWorkspaceSize": [P, P, P, P, P, I, PSIZE],
    "cudnnConvolutionForward": [P, P, P, P, P, P, P, I, P, ctypes.c_size_t, P, P, P],
    "cudnnConvolutionBackwardData": [P, P, P, P, P, P, P, I, P, ctypes.c_size_t, P, P, P],
    "cudnnConvolutionBackwardFilter": [P, P, P, P, P, P, P, I, P, ctypes.c_size_t, P, P, P],
    "cudnnAddTensor": [P, P, P, P, P, P, P],
    "cudnnGetErrorString": [I],
}
ONE, ZERO = ctypes.c_float(1.0), ctypes.c_float(0.0)


class CudnnError(RuntimeError):
    """A cuDNN call that did not return CUDNN_STATUS_SUCCESS, or no deterministic algorithm."""


def candidates():
    """Where libcudnn.so.9 may be: the nvidia-cudnn wheel's folder (nvidia/cudnn/lib, or
    another folder of the `nvidia` namespace's, as CUDA 13's wheels lay theirs out:
    nvidia/cu13/lib), then wherever the dynamic loader finds it."""
    spec = importlib.util.find_spec("nvidia")
    found = [path for root in (spec.submodule_search_locations if spec else [])
             for path in sorted(glob.glob(os.path.join(root, "*", "lib", "libcudnn.so.9")))]
    return sorted(found, key=lambda p: not p.endswith("/cudnn/lib/libcudnn.so.9")) + \
        ["libcudnn.so.9"]


@functools.cache
def library():
    """The loaded libcudnn of major version 9, or raises OSError: not installed, not loadable,
    or another major version."""
    for path in candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.cudnnGetVersion.restype = ctypes.c_size_t
        if lib.cudnnGetVersion() // 10000 != 9:
            continue
        for name, argtypes in SIGNATURES.items():
            getattr(lib, name).argtypes = argtypes
        lib.cudnnGetErrorString.restype = ctypes.c_char_p
        return lib
    raise OSError("cuDNN 9 (libcudnn.so.9) is not installed: pip install 'singa[gpu]'")


def version():
    """'9.28.0' of the loaded library."""
    v = library().cudnnGetVersion()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def check(status, what):
    if status:
        text = library().cudnnGetErrorString(status)
        raise CudnnError(f"cuDNN {what}: {text.decode() if text else status}")


_tf32 = [False]


def allow_tf32(flag):
    """Whether this process's plans made from now on may round products to TF32 (the job's
    `gpu_tf32`)."""
    _tf32[0] = bool(flag)


def tf32_allowed():
    return _tf32[0]


_local = threading.local()


def handle():
    """The calling thread's handle on its current device, bound to its current stream (a
    handle is not for several threads at once)."""
    cuda = _cupy().cuda
    handles = getattr(_local, "handles", None)
    if handles is None:
        handles = _local.handles = {}
    gpu = cuda.Device().id
    h = handles.get(gpu)
    if h is None:
        h = handles[gpu] = P()
        check(library().cudnnCreate(ctypes.byref(h)), "handle")
    check(library().cudnnSetStream(h, cuda.get_current_stream().ptr), "stream")
    return h


def _cupy():
    from singa import device
    return device.cupy()


def _made(kind, *settings):
    """A descriptor of `kind` ("Tensor", "Filter", "Convolution"): Create, then each
    (setter, args) of `settings` on it."""
    lib, desc = library(), P()
    check(getattr(lib, f"cudnnCreate{kind}Descriptor")(ctypes.byref(desc)), f"{kind} descriptor")
    for setter, args in settings:
        check(getattr(lib, setter)(desc, *args), f"{kind} descriptor")
    return desc


def _ptr(a):
    if not a.flags.c_contiguous:
        raise CudnnError("cuDNN reads C-contiguous arrays only")
    return a.data.ptr


class Plan:
    """The descriptors of one batch size b, each pass's chosen algorithm and conv descriptor,
    and the workspace they share."""

    def __init__(self, conv, b):
        (c, h, w), f, (kh, kw), g = conv.chw, conv.filters, conv.kernel, conv.groups
        self.x = _made("Tensor", ("cudnnSetTensor4dDescriptor", (NCHW, FLOAT, b, c, h, w)))
        self.y = _made("Tensor", ("cudnnSetTensor4dDescriptor", (NCHW, FLOAT) + conv.yshape(b)))
        self.w = _made("Filter", ("cudnnSetFilter4dDescriptor", (FLOAT, NCHW, f, c // g, kh, kw)))
        self.b = _made("Tensor", ("cudnnSetTensor4dDescriptor", (NCHW, FLOAT, 1, f, 1, 1))) \
            if conv.bias else None
        math = DEFAULT_MATH if conv.tf32 else FMA_MATH
        lib, hd = library(), handle()
        self.algo, self.conv, memory = {}, {}, 0
        for name, kind, descs in (("fwd", "Forward", (self.x, self.w, self.y)),
                                  ("data", "BackwardData", (self.w, self.y, self.x)),
                                  ("filter", "BackwardFilter", (self.x, self.y, self.w))):
            cd = _made("Convolution",
                       ("cudnnSetConvolution2dDescriptor",
                        (*conv.pad, *conv.stride, 1, 1, CROSS_CORRELATION, FLOAT)),
                       ("cudnnSetConvolutionGroupCount", (g,)),
                       ("cudnnSetConvolutionMathType", (math,)))
            perfs, n = (Perf * MAX_ALGOS)(), ctypes.c_int(0)
            check(getattr(lib, f"cudnnGetConvolution{kind}Algorithm_v7")(
                hd, descs[0], descs[1], cd, descs[2], MAX_ALGOS, ctypes.byref(n), perfs),
                f"{name} algorithms")
            # float32: no algorithm that runs on the tensor cores (TF32), FMA math set
            ok = [p for p in perfs[:n.value] if p.status == 0 and p.determinism == DETERMINISTIC
                  and (conv.tf32 or p.mathType in (DEFAULT_MATH, FMA_MATH))]
            if not ok:
                raise CudnnError(f"cuDNN has no deterministic {name} algorithm for x {(b, c, h, w)}"
                                 f", W {(f, c // g, kh, kw)}, group {g}")
            check(lib.cudnnSetConvolutionMathType(cd, ok[0].mathType if conv.tf32 else FMA_MATH),
                  "math type")
            size = ctypes.c_size_t(0)
            check(getattr(lib, f"cudnnGetConvolution{kind}WorkspaceSize")(
                hd, descs[0], descs[1], cd, descs[2], ok[0].algo, ctypes.byref(size)),
                f"{name} workspace")
            self.algo[name], self.conv[name] = ok[0].algo, cd
            memory = max(memory, size.value)
        self.workspace = _cupy().empty(max(memory, 1), np.uint8)


class Conv:
    """One convolution on cuDNN for batches of b samples of x (b, C, H, W) with W
    (F, C/G·kh·kw) and b (F,) or none: y = conv(x, W) + b, gx = conv_data_grad(g, W),
    gW = conv_filter_grad(x, g). The interface of `kernels.onednn.Conv`: `slot` is unused (a
    GPU runs the batch at once) and `weights` does nothing (cuDNN reads W as it is)."""

    def __init__(self, chw, filters, kernel, pad, stride, groups, bias, sizes):
        self.chw, self.filters, self.kernel = chw, filters, kernel
        self.pad, self.stride, self.groups, self.bias = pad, stride, groups, bias
        self.tf32 = _tf32[0]        # as the job asked when the layer was set up
        self.plans = {}

    def yshape(self, b):
        (_, h, w), (kh, kw), (ph, pw), (sh, sw) = self.chw, self.kernel, self.pad, self.stride
        return (b, self.filters, (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1)

    def _plan(self, b):
        plan = self.plans.get(b)
        if plan is None:
            plan = self.plans[b] = Plan(self, b)
        return plan

    def weights(self, w, name):
        """Nothing: cuDNN's passes read W in its own layout."""

    def _pass(self, name, n, a, b, out):
        """Pass `name` on n samples: (plan's descriptor, array) pairs a and b in, out written."""
        plan, kind = self._plan(n), {"fwd": "Forward", "data": "BackwardData",
                                     "filter": "BackwardFilter"}[name]
        ws = plan.workspace
        check(getattr(library(), f"cudnnConvolution{kind}")(
            handle(), ctypes.byref(ONE), getattr(plan, a[0]), _ptr(a[1]), getattr(plan, b[0]),
            _ptr(b[1]), plan.conv[name], plan.algo[name], _ptr(ws), ws.nbytes,
            ctypes.byref(ZERO), getattr(plan, out[0]), _ptr(out[1])), f"convolution {name}")
        return plan

    def forward(self, x, w, b, y, slot):
        plan = self._pass("fwd", len(x), ("x", x), ("w", w), ("y", y))
        if b is not None:
            check(library().cudnnAddTensor(handle(), ctypes.byref(ONE), plan.b, _ptr(b),
                                           ctypes.byref(ONE), plan.y, _ptr(y)), "bias")

    def backward_data(self, gy, w, gx, slot):
        self._pass("data", len(gy), ("w", w), ("y", gy), ("x", gx))

    def backward_weights(self, x, gy, gw, slot):
        self._pass("filter", len(x), ("x", x), ("y", gy), ("w", gw))


def disagreement():
    """None where cuDNN's three passes on the current device agree with numpy's (float64) on a
    small convolution of two groups, stride 2, padding 1, within float32 rounding; else what
    differs (a line): checked once per device before a layer runs on cuDNN."""
    cupy = _cupy()
    rng = np.random.default_rng(0)
    n, c, h, w, f, g, k, p, s = 2, 4, 7, 6, 6, 2, 3, 1, 2
    x = rng.standard_normal((n, c, h, w)).astype(np.float32)
    wt = rng.standard_normal((f, c // g, k, k)).astype(np.float32)
    bias = rng.standard_normal(f).astype(np.float32)
    conv = Conv((c, h, w), f, (k, k), (p, p), (s, s), g, True, [n])
    conv.tf32 = False           # float32's bound
    oh, ow = conv.yshape(n)[2:]
    gy = rng.standard_normal((n, f, oh, ow)).astype(np.float32)
    # numpy: y[n, o, i, j] = Σ_{ci, a, b} W[o, ci, a, b]·xpad[n, grp·C/G + ci, i·s + a, j·s + b]
    xp = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (p, p), (p, p)))
    taps = np.stack([xp[:, :, a:a + s * oh:s, b:b + s * ow:s] for a in range(k)
                     for b in range(k)], axis=2).reshape(n, g, c // g, k, k, oh, ow)
    wg = wt.astype(np.float64).reshape(g, f // g, c // g, k, k)
    want_y = np.einsum("ngcabij,gocab->ngoij", taps, wg).reshape(n, f, oh, ow) + bias[:, None,
                                                                                    None]
    want_gw = np.einsum("ngcabij,ngoij->gocab", taps,
                        gy.astype(np.float64).reshape(n, g, f // g, oh, ow)).reshape(wt.shape)
    gtaps = np.einsum("gocab,ngoij->ngcabij", wg, gy.astype(np.float64).reshape(n, g, f // g,
                                                                                 oh, ow))
    want_gx = np.zeros_like(xp)
    for a in range(k):
        for b in range(k):
            want_gx[:, :, a:a + s * oh:s, b:b + s * ow:s] += \
                gtaps[:, :, :, a, b].reshape(n, c, oh, ow)
    want_gx = want_gx[:, :, p:p + h, p:p + w]
    dx, dw, db, dgy = (cupy.asarray(a) for a in (x, wt.reshape(f, -1), bias, gy))
    y, gx, gw = (cupy.empty(shape, np.float32) for shape in ((n, f, oh, ow), x.shape,
                                                             (f, wt[0].size)))
    conv.forward(dx, dw, db, y, 0)
    conv.backward_data(dgy, dw, gx, 0)
    conv.backward_weights(dx, dgy, gw, 0)
    for name, got, want in (("forward", y, want_y), ("data gradient", gx, want_gx),
                            ("filter gradient", gw, want_gw.reshape(f, -1))):
        got = got.get()
        err = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
        if not err <= 1e-4:
            return f"cuDNN's {name} differs from numpy's by {err:.3g} of its largest value"
    return None
