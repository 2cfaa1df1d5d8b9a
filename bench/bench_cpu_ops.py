"""Bench: oneDNN's pooling, LRN and batch normalisation against our kernels, one chunk at one
thread on our (N, C, H, W) arrays (issue 48: "oneDNN where it is faster").

    python bench/bench_cpu_ops.py [--repeats 20]

Each oneDNN primitive is built on plain NCHW memory, as our blobs are (a blocked layout would
need a reorder in and out of every call, each a pass over the blob), and run through its C
API (`singa.layers.kernels.onednn`); ours are the kernels the layers call (`kernels.numba`'s
max pooling and normalise, numpy's LRN). Shapes: cifar10's pool1 and norm1 in a chunk of 13
samples, AlexNet's norm1 and a MobileNet-sized plane in chunks of 2. Median ms per call; the
outputs are compared (equal bits, or the largest difference). Needs the `onednn` extra.
"""
import argparse
import ctypes

import singa  # noqa: F401  (before numpy: its OpenBLAS kernel choice holds here too)
import numpy as np

from mlp_reference import median_seconds
from singa.layers.kernels import numba as nb
from singa.layers.kernels import numpy as knp
from singa.layers.kernels import onednn as o

P, Dims = o.P, o.Dims
INFERENCE = 96                      # dnnl_forward_inference
MAX_POOL, LRN_ACROSS = 0x1ff, 0xaff     # dnnl_pooling_max, dnnl_lrn_across_channels
GLOBAL_STATS = 1                    # dnnl_use_global_stats
MEAN, VARIANCE = 49, 50             # DNNL_ARG_MEAN, DNNL_ARG_VARIANCE


def declare(lib):
    lib.dnnl_pooling_forward_primitive_desc_create.argtypes = \
        [P, P, ctypes.c_int, ctypes.c_int, P, P, Dims, Dims, Dims, Dims, Dims, P]
    lib.dnnl_lrn_forward_primitive_desc_create.argtypes = \
        [P, P, ctypes.c_int, ctypes.c_int, P, P, ctypes.c_int64, ctypes.c_float,
         ctypes.c_float, ctypes.c_float, P]
    lib.dnnl_batch_normalization_forward_primitive_desc_create.argtypes = \
        [P, P, ctypes.c_int, P, P, ctypes.c_float, ctypes.c_uint, P]


def median_ms(fn, repeats):
    return median_seconds(fn, repeats, warmup=1) * 1e3


def primitive(pd, arrays):
    """A call of the primitive of `pd` on `arrays` ({DNNL_ARG: (array, its descriptor)}) and
    the implementation's name."""
    lib, stream = o.library()[0], o.stream()
    mems = {}
    for arg, (a, md) in arrays.items():
        mems[arg] = o.memory(md, None)
        o.check(lib.dnnl_memory_set_data_handle(mems[arg], a.ctypes.data), "data handle")
    mems[o.SCRATCHPAD] = o.memory(P(lib.dnnl_primitive_desc_query_md(pd, o.Q_SCRATCHPAD, 0)))
    args = (o.Arg * len(mems))(*(o.Arg(k, m) for k, m in mems.items()))
    prim = o.primitive(pd)

    def call():
        o.check(lib.dnnl_primitive_execute(prim, stream, len(mems), args), "execute")
        o.check(lib.dnnl_stream_wait(stream), "wait")
    return call, o.implementation(pd)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=20)
    args = ap.parse_args(argv)
    lib = o.library()[0]
    declare(lib)
    eng, attr = o.engine()
    rng = np.random.default_rng(0)
    rows = []
    with o.one_thread():
        for n, c, h, k, s, oh in ((13, 32, 32, 3, 2, 16), (2, 64, 112, 3, 2, 56)):
            x = rng.standard_normal((n, c, h, h), dtype=np.float32)
            y, ours = np.empty((n, c, oh, oh), np.float32), np.empty((n, c, oh, oh), np.float32)
            right = (oh - 1) * s + k - h        # Caffe's ceil mode: the last window overhangs
            pd = P()
            o.check(lib.dnnl_pooling_forward_primitive_desc_create(
                ctypes.byref(pd), eng, INFERENCE, MAX_POOL, o.plain(x.shape), o.plain(y.shape),
                Dims(s, s), Dims(k, k), Dims(0, 0), Dims(0, 0), Dims(right, right), attr),
                "pooling")
            call, impl = primitive(pd, {o.SRC: (x, o.plain(x.shape)), o.DST: (y, o.plain(y.shape))})
            argmax = np.empty(y.shape, nb.argmax_dtype(k, k))
            rows.append((f"max pool {k}x{k}/{s} {x.shape}", median_ms(call, args.repeats), impl,
                         median_ms(lambda: nb.max_pool(x, k, k, 0, 0, s, s, ours, argmax, False),
                                   args.repeats), "numba", y, ours))
        for shape in ((13, 32, 16, 16), (2, 96, 55, 55)):
            x = rng.standard_normal(shape, dtype=np.float32)
            y, ours, norm, scale = (np.empty_like(x) for _ in range(4))
            pd = P()
            o.check(lib.dnnl_lrn_forward_primitive_desc_create(
                ctypes.byref(pd), eng, INFERENCE, LRN_ACROSS, o.plain(shape), o.plain(shape), 3,
                5e-5, 0.75, 1.0, attr), "lrn")
            call, impl = primitive(pd, {o.SRC: (x, o.plain(shape)), o.DST: (y, o.plain(shape))})
            salpha, one, beta = np.float32(5e-5 / 3), np.float32(1), np.float32(0.75)
            rows.append((f"LRN across 3 {shape}", median_ms(call, args.repeats), impl,
                         median_ms(lambda: knp.lrn(x, 3, False, salpha, one, beta, ours, norm,
                                                   scale), args.repeats), "numpy", y, ours))
        shape = (2, 64, 112, 112)
        x = rng.standard_normal(shape, dtype=np.float32)
        y, ours = np.empty_like(x), np.empty_like(x)
        mean = rng.random(64, dtype=np.float32)
        var = rng.random(64, dtype=np.float32) + np.float32(0.5)
        inv_std = (1 / np.sqrt(var + np.float32(1e-5))).astype(np.float32)
        pd = P()
        o.check(lib.dnnl_batch_normalization_forward_primitive_desc_create(
            ctypes.byref(pd), eng, INFERENCE, o.plain(shape), o.plain(shape), 1e-5,
            GLOBAL_STATS, attr), "batch normalisation")
        stats = {arg: P(lib.dnnl_primitive_desc_query_md(pd, o.Q_SRC, i))
                 for arg, i in ((MEAN, 1), (VARIANCE, 2))}
        call, impl = primitive(pd, {o.SRC: (x, o.plain(shape)), o.DST: (y, o.plain(shape)),
                                    MEAN: (mean, stats[MEAN]), VARIANCE: (var, stats[VARIANCE])})
        rows.append((f"BatchNorm, global statistics {shape}", median_ms(call, args.repeats), impl,
                     median_ms(lambda: nb.normalise(x.reshape(2, 64, -1), mean, inv_std,
                                                    ours.reshape(2, 64, -1)), args.repeats),
                     "numba", y, ours))
    print(f"oneDNN {o.version()} against ours, one thread, median ms a call of {args.repeats}")
    print(f"{'op':44s} {'oneDNN':>8s} {'impl':16s} {'ours':>8s} {'kernel':8s} oneDNN/ours  "
          "outputs")
    for name, t_dnnl, impl, t_ours, kernel, y, ours in rows:
        same = "same bits" if y.tobytes() == ours.tobytes() else \
            f"max diff {np.abs(y - ours).max():.1e}"
        print(f"{name:44s} {t_dnnl:8.2f} {impl:16s} {t_ours:8.2f} {kernel:8s} "
              f"{t_dnnl / t_ours:11.1f}  {same}")


if __name__ == "__main__":
    main()
