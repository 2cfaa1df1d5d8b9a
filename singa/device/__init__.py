"""Where a net computes: the CPU (numpy) or a CUDA GPU (CuPy, the `gpu` extra).

Layers, params and updaters allocate with their device's `xp` (numpy or cupy) and otherwise
call numpy's functions, which numpy hands on to CuPy for CuPy arrays (NEP 13 and 18): one code
path serves both devices. Values cross between the host and a GPU only here: `host(a)` (device
to host; `Readback` without waiting: a step's loss) and `assign(dst, src)` / `Device.put` /
`Uploader` (host to device, the last without waiting for the GPU: a step's batch and random
draws); inside a process executors hand GPU arrays to each other as they are
(`singa.comm.socket`), and `assign` / `like` copy them across where the receiver's lie on
another GPU (a partition's bridge blob, a param's values and gradients). Nothing imports CuPy
until a job names a GPU.
"""
import contextlib
import importlib
import importlib.util
import os
import sys

import numpy as np

from singa.errors import ConfigError

__all__ = ["CPU", "Device", "Readback", "Uploader", "address", "assign", "check",
           "compute_capability", "cupy", "host", "host_copy", "is_host", "like", "module",
           "of_process", "of_workers", "on", "same_place"]

#: CuPy's switch to a default stream per thread (see `check`)
PER_THREAD_STREAM = "CUPY_CUDA_PER_THREAD_DEFAULT_STREAM"

INSTALL = "pip install 'singa[gpu]' (CuPy for CUDA 12; 'singa[gpu-cuda13]' for CUDA 13)"


class Device:
    """The CPU (`gpu` None) or CUDA device `gpu`; `xp` is numpy or cupy."""

    def __init__(self, gpu=None):
        self.gpu = gpu
        self.xp = np if gpu is None else cupy()

    def __str__(self):
        return "CPU" if self.gpu is None else f"GPU {self.gpu}"

    def __repr__(self):
        return f"Device({self.gpu})"

    def use(self):
        """Make this the calling thread's current CUDA device (CuPy's is per thread): a
        worker's thread, for its whole life."""
        if self.gpu is not None:
            self.xp.cuda.Device(self.gpu).use()

    @contextlib.contextmanager
    def selected(self):
        """Within the block the calling thread allocates on this device (then on the one it
        had before): a net built in one thread and run in another."""
        if self.gpu is None:
            yield
            return
        with self.xp.cuda.Device(self.gpu):
            yield

    def put(self, a):
        """`a` (an array of the host or of this device) as an array of this device."""
        return a if self.gpu is None else self.xp.asarray(a)


CPU = Device()


def is_host(a):
    """True for an array in host memory: numpy's, not one with CUDA's array interface."""
    return type(a) is np.ndarray or \
        isinstance(a, np.ndarray) and not hasattr(a, "__cuda_array_interface__")


def module(a):
    """The array module of `a`: numpy, or that of a device array (cupy)."""
    return np if is_host(a) else sys.modules[type(a).__module__.partition(".")[0]]


def host(a):
    """`a` as a numpy array: `a` itself, or a device-to-host copy of a CuPy array."""
    return a if is_host(a) else a.get()


def host_copy(a):
    """A copy of `a`'s values in host memory (of a host or a device array)."""
    return a.copy() if is_host(a) else a.get()


def like(ref, a):
    """`a` where `ref` is (the host or ref's device): `a` itself if it is there, else a copy."""
    if is_host(ref):
        return host(a)
    if is_host(a):
        with on(ref):
            return module(ref).asarray(a)
    if a.device.id != ref.device.id:
        with on(ref):
            out = module(ref).empty(a.shape, a.dtype)
        _across(out, a)
        return out
    return a


def same_place(a, b):
    """True when arrays `a` and `b` are both of the host or both of one GPU."""
    return is_host(a) == is_host(b) and (is_host(a) or a.device.id == b.device.id)


def on(a):
    """A context in which the calling thread computes on `a`'s device (none for a host array):
    threads other than the worker's (stub, servers) work on its arrays."""
    return _NOWHERE if is_host(a) else a.device


_NOWHERE = contextlib.nullcontext()     # reusable, reentrant


def address(a):
    """Where `a`'s values start: a host pointer, or a device pointer (CUDA's addresses are
    unique across the devices of a process; CuPy's `data.ptr`, which builds no dict)."""
    return a.__array_interface__["data"][0] if is_host(a) else a.data.ptr


def assign(dst, src):
    """dst[...] = src, where `src` is in host memory or on a device (dst's or another)."""
    if is_host(dst):
        np.copyto(dst, host(src), casting="unsafe")
    elif is_host(src) and dst.flags.c_contiguous:
        dst.set(np.ascontiguousarray(src.reshape(dst.shape), dst.dtype))
    elif not is_host(src) and src.device.id != dst.device.id:
        _across(dst, src)
    else:
        dst[...] = module(dst).asarray(src)


def _across(dst, src):
    """dst[...] = src (as many values, dst's dtype) from another GPU, without the host
    waiting: a copy between the devices (peer to peer where they allow it) on dst's current
    stream, after what src's device has queued so far (the values' making) and before what it
    queues next (which may overwrite them)."""
    if src.size != dst.size:
        raise ValueError(f"cannot copy {src.size} values into {dst.size}")
    cuda = module(dst).cuda
    with on(src):
        if src.dtype != dst.dtype or not src.flags.c_contiguous:
            src = module(src).ascontiguousarray(src, dst.dtype)
        made = cuda.Event(disable_timing=True)
        made.record()
    with on(dst):
        stream = cuda.get_current_stream()
        stream.wait_event(made)
        out = dst if dst.flags.c_contiguous else module(dst).empty(dst.shape, dst.dtype)
        out.data.copy_from_device_async(src.data, src.nbytes, stream)
        if out is not dst:
            dst[...] = out
        copied = cuda.Event(disable_timing=True)
        copied.record(stream)
    with on(src):
        cuda.get_current_stream().wait_event(copied)


class Uploader:
    """Copies host values into device arrays without the host waiting for the GPU: each
    destination gets a pinned buffer of its own, refilled once its previous copy has finished,
    from which an asynchronous copy runs on the current stream (a copy from pageable memory
    would first wait for everything queued before it). For destinations that live as long as
    the uploader (a layer's blobs); a host destination is simply assigned."""

    def __init__(self):
        self._staged = {}

    def __call__(self, dst, src):
        """dst[...] = src (host values of dst's size)."""
        if is_host(dst):
            np.copyto(dst, np.reshape(src, dst.shape), casting="unsafe")
            return
        xp = module(dst)
        staged = self._staged.get(id(dst))
        if staged is None:
            with on(dst):
                pinned = np.ndarray(dst.shape, dst.dtype,
                                    buffer=xp.cuda.alloc_pinned_memory(dst.nbytes))
                staged = self._staged[id(dst)] = (dst, pinned, xp.cuda.Event(disable_timing=True))
        _, pinned, copied = staged
        copied.synchronize()
        np.copyto(pinned, np.reshape(src, dst.shape), casting="unsafe")
        with on(dst):
            dst.set(pinned, stream=xp.cuda.get_current_stream())
            copied.record()


class Readback:
    """Device arrays copied to host memory without the host waiting for the GPU: `start`
    queues the copies into pinned buffers of its own on the current stream, `values` waits
    for them (for the GPU to reach them, not for what was queued after) and gives the host
    arrays, valid until the next `start`."""

    def __init__(self):
        self._pinned = {}       # (position, shape, dtype) -> pinned host array
        self._out = []
        self._copied = None

    def start(self, arrays):
        """Queue copies of `arrays`, device arrays of one GPU."""
        self._out = []
        if not arrays:
            return
        cuda = module(arrays[0]).cuda
        with on(arrays[0]):
            for i, a in enumerate(arrays):
                out = self._pinned.get((i, a.shape, a.dtype))
                if out is None:
                    out = self._pinned[i, a.shape, a.dtype] = np.ndarray(
                        a.shape, a.dtype, buffer=cuda.alloc_pinned_memory(max(a.nbytes, 1)))
                a.get(out=out, blocking=False)
                self._out.append(out)
            if self._copied is None:
                self._copied = cuda.Event(disable_timing=True)
            self._copied.record()

    def values(self):
        if self._copied is not None:
            self._copied.synchronize()
        return self._out


def cupy():
    """The cupy module; ConfigError naming the extra to install where it is missing."""
    if importlib.util.find_spec("cupy") is None:
        raise ConfigError(f"training on a GPU needs CuPy, which is not installed: {INSTALL}")
    try:
        return importlib.import_module("cupy")
    except Exception as e:   # e.g. a CuPy built for another CUDA than the driver's
        raise ConfigError(f"CuPy does not load ({type(e).__name__}: {e}): {INSTALL}") from None


def compute_capability(gpu):
    """(major, minor) of CUDA device `gpu`'s compute capability: (9, 0) for an H100."""
    cc = cupy().cuda.Device(gpu).compute_capability      # CuPy's "90", "120"
    return int(cc[:-1]), int(cc[-1])


def of_workers(ids, workers, make=True):
    """{worker: its Device} of a process's `workers` (in creation order): the i-th takes GPU
    ids[i], those beyond the ids the CPU (SINGA's rule); with make=False, {worker: id or None}
    (no CuPy needed)."""
    ids = list(ids)
    gpus = {w: ids[i] if i < len(ids) else None for i, w in enumerate(workers)}
    if not make:
        return gpus
    made = {gpu: CPU if gpu is None else Device(gpu) for gpu in set(gpus.values())}
    return {w: made[gpu] for w, gpu in gpus.items()}


def of_process(ids, host_rank):
    """The GPU ids that the process of `host_rank` on its host (0 for a job's first process
    there, 1 for its second, ...) takes of the conf's `ids`: each shifted by host_rank ×
    (max(ids) + 1), so that the processes of one host take GPUs of their own (`gpu: 0`: GPU
    host_rank; `gpu: 0  gpu: 1`: GPUs 2·host_rank and 2·host_rank + 1)."""
    ids = list(ids)
    return [i + host_rank * (max(ids) + 1) for i in ids] if ids else ids


def check(ids, what="gpu"):
    """ConfigError unless every id of `ids` names a visible CUDA device (ids none: nothing
    to check, and CuPy is not imported), and CuPy's threads share CUDA's legacy default
    stream: a worker's kernels and its servers' updates, queued by different threads, run in
    the order of their messages only on that one stream."""
    if not ids:
        return
    if os.environ.get(PER_THREAD_STREAM, "0") not in ("", "0"):
        raise ConfigError(f"{what}: {list(ids)} with {PER_THREAD_STREAM} set: a job's worker "
                          f"and server threads order their work on a GPU by CUDA's one legacy "
                          f"default stream, which that setting replaces by a stream per "
                          f"thread; unset it")
    xp = cupy()
    try:
        count = xp.cuda.runtime.getDeviceCount()
    except Exception as e:    # no driver, or none that suits this CUDA
        raise ConfigError(f"{what}: {list(ids)} names a GPU, but CUDA sees none here "
                          f"({type(e).__name__}: {e})") from None
    if count == 0:
        raise ConfigError(f"{what}: {list(ids)} names a GPU, but CUDA sees none here")
    bad = [i for i in ids if not 0 <= i < count]
    if bad:
        raise ConfigError(f"{what}: {bad[0]} is not a GPU of this machine: it has {count} "
                          f"(ids 0 to {count - 1})")
