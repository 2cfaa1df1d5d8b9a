"""The job's compute threads: `num_openblas_threads` of them (SINGA's field, default 1).

Within `limit(n)` BLAS runs at one thread and the layers share their work out over a pool of
n threads (the calling thread and n − 1 others): convolution, pooling, LRN and the
elementwise and per-channel passes (`by_samples`) by chunks of samples, products by
`matmul`'s pieces. One pool, not numpy's copies beside BLAS's own threads: those spin for a
while after each product and slow the copies down (bench/bench_conv.py). Chunks and pieces
depend on the shapes only, never on the thread count: neither do the results.
"""
import contextlib
import math
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from threadpoolctl import ThreadpoolController

from singa.device import is_host
from singa.layers import kernels

__all__ = ["Scratch", "blas_threads", "by_samples", "chunks", "limit", "matmul", "run"]

_pool = None    # process-wide, like BLAS's own thread setting
_nthreads = 1

# A layer's chunk of samples is one task. Its working set is about MIN_CHUNK_BYTES to
# CHUNK_BYTES: enough work to be worth a hand-off, little enough to stay in a core's share of
# the cache; the batch is cut in about MIN_CHUNKS chunks within those bounds, at least 2 and
# at most MAX_CHUNKS.
MIN_CHUNK_BYTES, CHUNK_BYTES = 1 << 21, 1 << 23
MIN_CHUNKS, MAX_CHUNKS = 8, 16
# `matmul` cuts a product into pieces of at least PIECE_FLOPS, at most MAX_PIECES of them.
PIECE_FLOPS = 1 << 22
MAX_PIECES = 8
ROW_CUT = 256


@contextlib.contextmanager
def blas_threads(n):
    """Within the block: BLAS at `n` threads; its previous setting after."""
    blas = ThreadpoolController().select(user_api="blas").lib_controllers
    before = [c.get_num_threads() for c in blas]
    for c in blas:
        c.set_num_threads(n)
    try:
        yield
    finally:
        for c, k in zip(blas, before):
            c.set_num_threads(k)


@contextlib.contextmanager
def limit(n):
    """Within the block: `n` compute threads, BLAS at one; the previous setting after."""
    global _pool, _nthreads
    n = max(1, int(n))
    previous = _pool, _nthreads
    pool = ThreadPoolExecutor(n - 1, thread_name_prefix="compute") if n > 1 else None
    _pool, _nthreads = pool, n
    try:
        with blas_threads(1):
            yield
    finally:
        _pool, _nthreads = previous
        if pool is not None:
            pool.shutdown()


def run(fn, nitems):
    """fn(item, slot) for every item in range(nitems), shared out over the compute threads:
    each takes the next item when it is done with one; `slot` < the thread count names the
    thread (0 is the caller's) for its scratch. Exceptions propagate."""
    pool, n = _pool, min(_nthreads, nitems)
    if pool is None or n < 2:
        for i in range(nitems):
            fn(i, 0)
        return
    items = iter(range(nitems))     # its next() is atomic under the GIL

    def share(slot):
        for i in items:
            fn(i, slot)

    others = [pool.submit(share, slot) for slot in range(1, n)]
    try:
        share(0)
    finally:
        for f in others:
            f.result()


def chunks(n, sample_bytes, on_host=True):
    """Consecutive slices of range(n), b samples each (the last may have fewer), where a
    sample's working set is `sample_bytes`. Fewer than MAX_CHUNKS chunks are made a power of
    two of them, and b is evened out over the chunks so that the last is not much smaller: the
    threads get as many each (8 samples of 0.7 MB: 4 of 2, not 3, 3 and 2, which left one of
    two threads idle for a third of ResNet-50's conv3 layers; 100 samples: 7 of 13 and one of
    9, not 9 of 11 and one of 1). Not `on_host`: one slice of all n (a GPU runs the batch at
    once, in the calling thread)."""
    if not on_host:
        return [slice(0, n)]
    sample_bytes = max(1, sample_bytes)
    b = max(-(-n // MIN_CHUNKS), -(-MIN_CHUNK_BYTES // sample_bytes))
    b = min(b, max(1, CHUNK_BYTES // sample_bytes), -(-n // 2))
    b = max(b, -(-n // MAX_CHUNKS), 1)
    k = -(-n // b)
    if k < MAX_CHUNKS:      # a power of two of chunks: as many for each of 2, 4 or 8 threads
        k = min(1 << (k - 1).bit_length(), MAX_CHUNKS, n)
    b = -(-n // k)
    return [slice(i, min(i + b, n)) for i in range(0, n, b)]


def by_samples(fn, y):
    """fn(rows) for the `chunks` of y's first axis (a sample's working set: twice y[0]'s bytes,
    an input and an output), shared out over the compute threads: an elementwise or
    per-channel pass over a blob, each chunk's steps while it is in the cache. A blob of less
    than MIN_CHUNK_BYTES is one call on the calling thread: a hand-off would cost more than
    it saves (GoogLeNet's ReLUs of 0.1-1 MB, in CPU time: 18 ms a forward at once, 30 in
    chunks)."""
    if y.nbytes < MIN_CHUNK_BYTES:
        fn(slice(0, len(y)))
        return
    rows = chunks(len(y), 2 * y[0].nbytes, is_host(y))
    run(lambda i, _: fn(rows[i]), len(rows))


def matmul(a, b, out):
    """out = a·b for 2-D arrays, cut into pieces of out's rows when it has ROW_CUT of them or
    more (or more rows than columns), else of its columns. Pieces of rows run faster: a
    weight gradient gᵀ·x of (2000, 2500) at 97 against 85 GFLOP/s a core in column pieces.
    Each piece is oneDNN's sgemm on an Intel CPU where oneDNN is the engine
    (`kernels.products`), else BLAS's. On a GPU (CuPy arrays): one cuBLAS product."""
    if not is_host(out):
        return np.matmul(a, b, out=out)
    engine = kernels.products()

    def product(a, b, out):
        if engine is None or not engine.gemm(a, b, out):
            np.matmul(a, b, out=out)
    m, n = out.shape
    by_rows = m >= n or m >= ROW_CUT
    pieces = int(min(MAX_PIECES, m if by_rows else n,
                     max(1, 2 * m * n * a.shape[1] // PIECE_FLOPS)))
    if pieces == 1:
        product(a, b, out)
        return out
    length = m if by_rows else n
    cuts = [k * length // pieces for k in range(pieces + 1)]
    if by_rows:
        run(lambda i, _: product(a[cuts[i]:cuts[i + 1]], b, out[cuts[i]:cuts[i + 1]]), pieces)
    else:
        run(lambda i, _: product(a, b[:, cuts[i]:cuts[i + 1]], out[:, cuts[i]:cuts[i + 1]]),
            pieces)
    return out


_local = threading.local()


def workspace(name, shape):
    """A float32 array of `shape` in the calling thread's workspace `name`, which grows to the
    largest asked for: for buffers a pass needs only while it runs, shared by every layer's
    pass in the thread, one at a time (a view given before is not valid after the next)."""
    size = math.prod(shape)
    spaces = _local.__dict__.setdefault("spaces", {})
    buf = spaces.get(name)
    if buf is None or buf.size < size:
        buf = spaces[name] = np.empty(size, np.float32)
    return buf[:size].reshape(shape)


class Scratch(dict):
    """Buffers made on first use: scratch[key] = make(key), e.g. key = (slot, chunk size)."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def __missing__(self, key):
        value = self[key] = self.make(key)
        return value
