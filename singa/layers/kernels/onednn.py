"""Convolution and matrix products on oneDNN, the CPU engine of torch and of SINGA >= 1.0
(`kernels.onednn_engine` picks it where the `onednn` extra, Intel's `onednn-cpu-gomp` wheel, is
installed): its C API (v3) through ctypes, forward, data gradient and weight gradient of a
plain or grouped convolution with padding and stride (`Conv`), and its sgemm (`gemm`) for the
pieces of `threads.matmul`. The other kernels stay numba's (or numpy's).

oneDNN runs inside our compute threads at one OpenMP thread each, on a chunk of samples per
call, like the im2col path: the chunks depend on the shapes only, the weight gradient sums
the chunks' in chunk order, so the results do not depend on the thread count, and a job
resumes bit-exactly on this engine. They are not the bits of numba's/numpy's products
(another order of additions; tests/unit/test_onednn.py bounds the difference per pass).
Each primitive chooses its own memory layout (blocked, e.g. nChw8c); reorders copy our
(N, C, H, W) arrays in and out of it; all are built once per chunk size and kept, one at a
time in the process (`_MAKING`), and each thread executes on a stream of its own (`stream`).
"""
import contextlib
import ctypes
import functools
import glob
import logging
import os
import site
import sys
import threading
import weakref

import numpy as np

log = logging.getLogger("singa")

P = ctypes.c_void_p
Dims = ctypes.c_int64 * 12          # dnnl_dims_t: DNNL_MAX_NDIMS int64s
F32, CPU, ANY = 3, 1, 1              # dnnl_f32, dnnl_cpu, dnnl_format_tag_any
FORWARD_TRAINING, DIRECT = 64, 1     # dnnl_forward_training, dnnl_convolution_direct
SCRATCHPAD_USER = 1                  # dnnl_scratchpad_mode_user
ALLOCATE = P(2**64 - 1)              # DNNL_MEMORY_ALLOCATE: the library allocates
# dnnl_query_*: the implementation's name, then the memory descriptors of the arguments
IMPL_INFO = 8
Q_SRC, Q_DIFF_SRC, Q_WEIGHTS, Q_DIFF_WEIGHTS, Q_DST, Q_DIFF_DST, Q_SCRATCHPAD = \
    129, 130, 131, 132, 133, 134, 136
# DNNL_ARG_*
SRC, DST, WEIGHTS, BIAS, SCRATCHPAD = 1, 17, 33, 41, 80
DIFF_SRC, DIFF_DST, DIFF_WEIGHTS = 129, 145, 161
# the C API's functions this module calls, with their argument types (status is an int)
SIGNATURES = {
    "dnnl_engine_create": [P, ctypes.c_int, ctypes.c_size_t],
    "dnnl_stream_create": [P, P, ctypes.c_uint],
    "dnnl_stream_wait": [P],
    "dnnl_stream_destroy": [P],
    "dnnl_primitive_attr_create": [P],
    "dnnl_primitive_attr_set_scratchpad_mode": [P, ctypes.c_int],
    "dnnl_memory_desc_create_with_tag": [P, ctypes.c_int, Dims, ctypes.c_int, ctypes.c_int],
    "dnnl_memory_desc_create_with_strides": [P, ctypes.c_int, Dims, ctypes.c_int, Dims],
    "dnnl_memory_desc_equal": [P, P],
    "dnnl_memory_create": [P, P, P, P],
    "dnnl_memory_set_data_handle": [P, P],
    "dnnl_memory_desc_get_size": [P],
    "dnnl_convolution_forward_primitive_desc_create":
        [P, P, ctypes.c_int, ctypes.c_int, P, P, P, P, Dims, Dims, Dims, Dims, P],
    "dnnl_convolution_backward_data_primitive_desc_create":
        [P, P, ctypes.c_int, P, P, P, Dims, Dims, Dims, Dims, P, P],
    "dnnl_convolution_backward_weights_primitive_desc_create":
        [P, P, ctypes.c_int, P, P, P, P, Dims, Dims, Dims, Dims, P, P],
    "dnnl_reorder_primitive_desc_create": [P, P, P, P, P, P],
    "dnnl_primitive_desc_query": [P, ctypes.c_int, ctypes.c_int, P],
    "dnnl_primitive_desc_query_md": [P, ctypes.c_int, ctypes.c_int],
    "dnnl_primitive_create": [P, P],
    "dnnl_primitive_execute": [P, P, ctypes.c_int, P],
    "dnnl_sgemm": [ctypes.c_char, ctypes.c_char] + [ctypes.c_int64] * 3 + [ctypes.c_float]
                  + [P, ctypes.c_int64] * 2 + [ctypes.c_float, P, ctypes.c_int64],
}


class Arg(ctypes.Structure):
    """dnnl_exec_arg_t: an argument's index (DNNL_ARG_*) and its memory."""
    _fields_ = [("arg", ctypes.c_int), ("memory", P)]


class Version(ctypes.Structure):
    """dnnl_version_t."""
    _fields_ = [("major", ctypes.c_int), ("minor", ctypes.c_int), ("patch", ctypes.c_int),
                ("hash", ctypes.c_char_p), ("cpu_runtime", ctypes.c_uint),
                ("gpu_runtime", ctypes.c_uint)]


class OneDNNError(RuntimeError):
    """A oneDNN call that did not return dnnl_success."""


def candidates():
    """Where libdnnl.so.3 may be: the wheel's (in this environment's lib/, or the user's
    after pip install --user), then wherever the dynamic loader finds it (no ldconfig or
    compiler run, as ctypes.util.find_library would)."""
    return [path for prefix in (sys.prefix, site.getuserbase())
            for path in sorted(glob.glob(os.path.join(prefix, "lib", "libdnnl.so.3*")),
                               key=len)] + ["libdnnl.so.3"]


@functools.cache
def library():
    """(the loaded libdnnl of major version 3, libgomp) or raises OSError: not installed, not
    loadable, or another major version."""
    for path in candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        lib.dnnl_version.restype = ctypes.POINTER(Version)
        if lib.dnnl_version().contents.major != 3:
            continue
        for name, argtypes in SIGNATURES.items():
            getattr(lib, name).argtypes = argtypes
        lib.dnnl_primitive_desc_query_md.restype = P
        lib.dnnl_memory_desc_get_size.restype = ctypes.c_size_t
        lib.dnnl_memory_desc_equal.restype = ctypes.c_int
        # the process's one libgomp, loaded with libdnnl (torch's where torch came first:
        # the same soname)
        gomp = ctypes.CDLL("libgomp.so.1")
        return lib, gomp
    raise OSError("oneDNN 3 (libdnnl.so.3) is not installed: pip install 'singa[onednn]'")


def version():
    """'3.2.0' of the loaded library."""
    v = library()[0].dnnl_version().contents
    return f"{v.major}.{v.minor}.{v.patch}"


def check(status, what):
    if status:
        raise OneDNNError(f"oneDNN {what}: status {status}")


@functools.cache
def engine():
    """(the CPU engine, the primitives' attributes: user scratchpads, so that one primitive
    runs in several threads at once with a scratchpad each)."""
    lib = library()[0]
    eng, attr = P(), P()
    check(lib.dnnl_engine_create(ctypes.byref(eng), CPU, 0), "engine")
    check(lib.dnnl_primitive_attr_create(ctypes.byref(attr)), "attributes")
    check(lib.dnnl_primitive_attr_set_scratchpad_mode(attr, SCRATCHPAD_USER), "attributes")
    return eng, attr


class _Stream:
    """An in-order stream on the engine, destroyed with its holder (a thread's end)."""

    def __init__(self):
        lib = library()[0]
        self.handle = P()
        check(lib.dnnl_stream_create(ctypes.byref(self.handle), engine()[0], 1), "stream")
        weakref.finalize(self, lib.dnnl_stream_destroy, self.handle)


_local = threading.local()
#: held while a primitive, a thread's memory objects or its stream are made: made in several
#: threads at once (two layers' first calls), one of them now and then failed at its execution
#: (invalid arguments)
_MAKING = threading.RLock()


def stream():
    """The calling thread's stream: a stream is not for several threads at once (two
    threads executing on one stream failed now and then with invalid arguments), and streams
    are made one at a time, with the primitives (made at once in several new threads, a
    reorder on one of them failed now and then: 4 in 6,600 rounds of four, none in 9,200)."""
    held = getattr(_local, "stream", None)
    if held is None:
        with _MAKING:
            held = _local.stream = _Stream()
    return held.handle


ALIGN = 64


def arena(nbytes):
    """The address (ALIGN-aligned) of the calling thread's arena of at least `nbytes`: the
    blocked copies and scratchpads of the call it runs, which every convolution's calls in
    this thread share (one at a time): MobileNet's 28 convolutions kept 115 MB of them each
    for themselves."""
    buf = getattr(_local, "arena", None)
    if buf is None or buf.nbytes < nbytes + ALIGN:
        buf = _local.arena = np.empty(max(nbytes, 1) + ALIGN, np.uint8)
    return -(-buf.ctypes.data // ALIGN) * ALIGN


def plain(shape):
    """A memory descriptor of a C-contiguous float32 array of `shape`."""
    strides = [int(np.prod(shape[i + 1:], dtype=np.int64)) for i in range(len(shape))]
    md = P()
    check(library()[0].dnnl_memory_desc_create_with_strides(
        ctypes.byref(md), len(shape), Dims(*shape), F32, Dims(*strides)), "memory descriptor")
    return md


def chosen(shape):
    """A memory descriptor of `shape` whose layout the primitive chooses."""
    md = P()
    check(library()[0].dnnl_memory_desc_create_with_tag(
        ctypes.byref(md), len(shape), Dims(*shape), F32, ANY), "memory descriptor")
    return md


def memory(md, handle=ALLOCATE):
    """A memory object of descriptor md: the library's buffer, or `handle` (None: set later)."""
    mem = P()
    check(library()[0].dnnl_memory_create(ctypes.byref(mem), md, engine()[0], handle),
          "memory")
    return mem


def primitive(pd):
    prim = P()
    check(library()[0].dnnl_primitive_create(ctypes.byref(prim), pd), "primitive")
    return prim


def implementation(pd):
    """The implementation oneDNN chose for a primitive descriptor, e.g. 'jit:avx2'."""
    name = ctypes.c_char_p()
    check(library()[0].dnnl_primitive_desc_query(pd, IMPL_INFO, 0, ctypes.byref(name)),
          "query")
    return name.value.decode()


def _operand(a):
    """(b"N" or b"T", its leading dimension) of a float32 2-D array whose rows or columns are
    contiguous, as row-major sgemm reads it; None otherwise."""
    s0, s1 = (s // 4 for s in a.strides)
    if a.strides[1] == 4 and s0 >= max(1, a.shape[1]):
        return b"N", s0
    if a.strides[0] == 4 and s1 >= max(1, a.shape[0]):
        return b"T", s1
    return None


def gemm(a, b, out):
    """out = a·b by oneDNN's sgemm at one thread, for float32 2-D arrays with contiguous rows
    or columns (a transposed view is read as one) and out's rows contiguous; False where it
    cannot (the caller multiplies)."""
    m, k = a.shape
    n = b.shape[1]
    if not (a.dtype == b.dtype == out.dtype == np.float32 and m and n and k
            and out.strides[1] == 4 and out.strides[0] // 4 >= max(1, n)):
        return False
    ta, tb = _operand(a), _operand(b)
    if ta is None or tb is None:
        return False
    with one_thread():
        check(library()[0].dnnl_sgemm(ta[0], tb[0], m, n, k, 1.0, a.ctypes.data, ta[1],
                                      b.ctypes.data, tb[1], 0.0, out.ctypes.data,
                                      out.strides[0] // 4), "sgemm")
    return True


@contextlib.contextmanager
def one_thread():
    """Within the block: one OpenMP thread in the calling thread, set before a primitive is
    built (its work is cut for it); the thread's own setting after (torch's, where torch
    shares the process's libgomp and the thread)."""
    gomp = library()[1]
    before = gomp.omp_get_max_threads()
    gomp.omp_set_num_threads(1)
    try:
        yield
    finally:
        gomp.omp_set_num_threads(before)


class Conv:
    """One convolution's primitives for chunks of b samples of x (b, C, H, W) with W
    (G, F/G, C/G, kh, kw) (G = 1: (F, C, kh, kw)) and b (F,) or none: y = conv(x, W) + b,
    gx = conv_data_grad(g, W), gW = conv_weight_grad(x, g), oneDNN's direct algorithm.
    `forward`, `backward_data` and `backward_weights` run one chunk in the calling thread;
    `slot` names the thread, which owns its buffers for the chunk. Before the chunks of a
    forward or data pass, `weights(W, pass)` copies W into that pass's layout once for them
    all (ResNet-50's 100 MB of weights, not once a chunk)."""

    def __init__(self, chw, filters, kernel, pad, stride, groups, bias, sizes):
        self.chw, self.filters, self.kernel = chw, filters, kernel
        self.pad, self.stride, self.groups, self.bias = pad, stride, groups, bias
        self.sizes = sorted(set(sizes))     # the chunks' numbers of samples
        self.built = {}                 # b -> the primitives and descriptors for b samples
        self.buffers = {}               # (slot, b) -> the memory objects of one thread
        self.logged = False

    def wshape(self):
        (c, _, _), f, (kh, kw), g = self.chw, self.filters, self.kernel, self.groups
        return (f, c, kh, kw) if g == 1 else (g, f // g, c // g, kh, kw)

    def yshape(self, b):
        (_, h, w), (kh, kw), (ph, pw), (sh, sw) = self.chw, self.kernel, self.pad, self.stride
        return (b, self.filters, (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1)

    def _build(self, b):
        """The three passes' primitive descriptors and primitives for chunks of b samples."""
        lib = library()[0]
        eng, attr = engine()
        xs, ys, ws = (b,) + tuple(self.chw), self.yshape(b), self.wshape()
        x, y, w = chosen(xs), chosen(ys), chosen(ws)
        bias = plain((self.filters,)) if self.bias else None
        s, d, p = Dims(*self.stride), Dims(0, 0), Dims(*self.pad)
        fwd, bwd_d, bwd_w = P(), P(), P()
        check(lib.dnnl_convolution_forward_primitive_desc_create(
            ctypes.byref(fwd), eng, FORWARD_TRAINING, DIRECT, x, w, bias, y, s, d, p, p, attr),
            "convolution forward")
        check(lib.dnnl_convolution_backward_data_primitive_desc_create(
            ctypes.byref(bwd_d), eng, DIRECT, x, w, y, s, d, p, p, fwd, attr),
            "convolution backward data")
        check(lib.dnnl_convolution_backward_weights_primitive_desc_create(
            ctypes.byref(bwd_w), eng, DIRECT, x, w, None, y, s, d, p, p, fwd, attr),
            "convolution backward weights")
        if not self.logged:
            self.logged = True
            log.debug("oneDNN convolution %s -> %s: %s, %s, %s", xs, ys, implementation(fwd),
                      implementation(bwd_d), implementation(bwd_w))
        pds = {"fwd": fwd, "data": bwd_d, "weights": bwd_w}
        built = {"pd": pds, "prim": {k: primitive(v) for k, v in pds.items()},
                 "plain": {"x": plain(xs), "y": plain(ys), "w": plain(ws), "b": bias},
                 "reorders": {}, "w_in": {}}
        for name in ("fwd", "data"):    # W in a pass's own layout: (W's memory, the reorder
            md = P(lib.dnnl_primitive_desc_query_md(pds[name], Q_WEIGHTS, 0))  # into it, it)
            if not lib.dnnl_memory_desc_equal(md, built["plain"]["w"]):
                built["w_in"][name] = (memory(built["plain"]["w"], None),
                                       self._reorder(built, built["plain"]["w"], md),
                                       memory(md))
        return built

    def _built(self, b):
        with _MAKING:
            return self.built.get(b) or self.built.setdefault(b, self._build(b))

    def weights(self, w, name):
        """W (C-contiguous float32) into the layout of pass `name` ("fwd" or "data") for the
        chunks to come."""
        lib, mine = library()[0], stream()
        with one_thread():
            for b in self.sizes:
                into = self._built(b)["w_in"].get(name)
                if into is None:        # the pass reads W as it is
                    continue
                user, reorder, mem = into
                check(lib.dnnl_memory_set_data_handle(user, w.ctypes.data), "data handle")
                args = (Arg * 2)(Arg(SRC, user), Arg(DST, mem))
                check(lib.dnnl_primitive_execute(reorder, mine, 2, args), "reorder")
                check(lib.dnnl_stream_wait(mine), "reorder")

    def _reorder(self, built, src, dst):
        """A kept reorder primitive from memory descriptor src to dst."""
        key = (src.value, dst.value)
        with _MAKING:
            if key not in built["reorders"]:
                pd = P()
                eng = engine()[0]
                check(library()[0].dnnl_reorder_primitive_desc_create(
                    ctypes.byref(pd), src, eng, dst, eng, None), "reorder")
                built["reorders"][key] = primitive(pd)
            return built["reorders"][key]

    def _steps(self, b):
        """This thread's memory objects and the steps of each pass for b samples: per pass,
        the user arrays it binds and a list of (primitive, args) to execute in order."""
        built = self._built(b)
        lib = library()[0]
        passes = {}

        def temporary(md, parts):
            """A memory object of md whose buffer is a part of the thread's arena."""
            mem = memory(md, None)
            parts.append((mem, -(-lib.dnnl_memory_desc_get_size(md) // ALIGN) * ALIGN))
            return mem
        for name, args in (("fwd", ((SRC, "x", Q_SRC), (WEIGHTS, "w", Q_WEIGHTS),
                                    (BIAS, "b", None), (DST, "y", Q_DST))),
                           ("data", ((DIFF_DST, "gy", Q_DIFF_DST), (WEIGHTS, "w", Q_WEIGHTS),
                                     (DIFF_SRC, "gx", Q_DIFF_SRC))),
                           ("weights", ((SRC, "x", Q_SRC), (DIFF_DST, "gy", Q_DIFF_DST),
                                        (DIFF_WEIGHTS, "gw", Q_DIFF_WEIGHTS)))):
            pd, before, after, bound, mems, parts = built["pd"][name], [], [], {}, {}, []
            for arg, array, query in args:
                kind = array[-1]                    # x, y, w or b: its plain descriptor
                if built["plain"][kind] is None:    # no bias
                    continue
                if arg == WEIGHTS and name in built["w_in"]:    # `weights` put W there
                    mems[arg] = built["w_in"][name][2]
                    continue
                mem = bound[array] = memory(built["plain"][kind], None)
                if query is not None:
                    md = P(lib.dnnl_primitive_desc_query_md(pd, query, 0))
                    if not lib.dnnl_memory_desc_equal(md, built["plain"][kind]):
                        inner = temporary(md, parts)
                        if arg in (DST, DIFF_SRC, DIFF_WEIGHTS):    # outputs: out of it after
                            after.append((self._reorder(built, md, built["plain"][kind]),
                                          {SRC: inner, DST: mem}))
                        else:
                            before.append((self._reorder(built, built["plain"][kind], md),
                                           {SRC: mem, DST: inner}))
                        mem = inner
                mems[arg] = mem
            scratch = P(lib.dnnl_primitive_desc_query_md(pd, Q_SCRATCHPAD, 0))
            mems[SCRATCHPAD] = temporary(scratch, parts)
            steps = before + [(built["prim"][name], mems)] + after
            passes[name] = (bound, [(prim, len(a), (Arg * len(a))(*(Arg(k, m) for k, m in
                                                                        a.items())))
                                    for prim, a in steps], parts, sum(n for _, n in parts))
        return passes

    def _run(self, name, slot, arrays):
        lib = library()[0]
        with one_thread():
            b = len(arrays["x"] if "x" in arrays else arrays["gy"])
            key = (slot, b)
            if key not in self.buffers:
                with _MAKING:       # memory objects made beside others' primitives: see there
                    self.buffers[key] = self._steps(b)
            bound, steps, parts, total = self.buffers[key][name]
            for array, mem in bound.items():
                a = arrays[array]
                assert a.flags.c_contiguous and a.dtype == np.float32, array
                check(lib.dnnl_memory_set_data_handle(mem, a.ctypes.data), "data handle")
            at = arena(total)
            for mem, size in parts:
                check(lib.dnnl_memory_set_data_handle(mem, at), "data handle")
                at += size
            mine = stream()
            for prim, n, args in steps:
                check(lib.dnnl_primitive_execute(prim, mine, n, args), name)
            check(lib.dnnl_stream_wait(mine), name)

    def forward(self, x, w, b, y, slot):
        """y = conv(x, w) + b for a chunk (b None: no bias)."""
        self._run("fwd", slot, {"x": x, "w": w, "b": b, "y": y})

    def backward_data(self, gy, w, gx, slot):
        """gx = the gradient of a chunk's x given its gy."""
        self._run("data", slot, {"gy": gy, "w": w, "gx": gx})

    def backward_weights(self, x, gy, gw, slot):
        """gw = a chunk's gradient of W (the layer sums b's itself)."""
        self._run("weights", slot, {"x": x, "gy": gy, "gw": gw})
