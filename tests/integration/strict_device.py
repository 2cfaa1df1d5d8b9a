"""A stand-in for CuPy that runs on the CPU and is stricter than CuPy about what a GPU cannot
do, so that the CPU tests find the code that would break on a GPU: an operation mixing a host
array (numpy's) with a device array, a host array as an index or as an assigned value, a
device array handed to the buffer protocol (`bytes`, ZeroMQ), atomic adds (`ufunc.at`),
float64 creeping into device arrays. Device arrays are `DevArray`s; host <-> device only
through `asarray`, `DevArray.get` and `DevArray.set`, as with CuPy. It counts the bytes that
cross (`moved`) and the host's waits for the GPU (`waits`): a device value read on the host
(`get`, `float`, `int`, `bool`, `item`) and a copy to the device from pageable memory; a copy
from pinned memory (`cuda.alloc_pinned_memory`) on a stream does not wait.

`installed(monkeypatch)` makes `singa.device` use this module as cupy, with one visible GPU.
It checks the discipline only: numbers are numpy's, so a GPU's own rounding is tests/gpu's.
"""
import collections
import operator
import sys
import types

import numpy as np

float32, float64, int32, int64, intp, uint8 = (np.float32, np.float64, np.int32, np.int64,
                                               np.intp, np.uint8)


class StrictError(TypeError):
    """What CuPy would refuse (or a GPU would compute in a varying order)."""


def _check(values, what):
    for v in values:
        if isinstance(v, (list, tuple)):
            _check(v, what)
        elif type(v) is np.ndarray:
            raise StrictError(f"{what}: a host array of shape {v.shape} mixed with device arrays")


def _plain(v):
    if isinstance(v, DevArray):
        return v.view(np.ndarray)
    if isinstance(v, (list, tuple)):
        return type(v)(_plain(x) for x in v)
    return v


def _dev(v):
    """Results on the device: arrays, and scalars as 0-d arrays (CuPy's reductions)."""
    if type(v) is np.ndarray:
        return v.view(DevArray)
    if isinstance(v, np.generic):
        return np.asarray(v).view(DevArray)
    if isinstance(v, tuple):
        return tuple(_dev(x) for x in v)
    if isinstance(v, list):
        return [_dev(x) for x in v]
    return v


#: bytes copied between host and device, each way
moved = collections.Counter()
#: the host's waits for the GPU, by kind: "read" (a device value on the host), "pageable copy"
waits = collections.Counter()


class DevArray(np.ndarray):
    """An array 'on the GPU'."""

    @property
    def __cuda_array_interface__(self):
        """What marks a device array (singa.device.is_host); its pointer is a host one here."""
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3, "strides": None,
                "data": (self.data.ptr, False)}

    @property
    def data(self):
        """CuPy's MemoryPointer, of which `ptr` is the address of the first element (the host
        buffer the numpy attribute gives stays out of reach)."""
        return types.SimpleNamespace(ptr=self.view(np.ndarray).__array_interface__["data"][0])

    @property
    def device(self):
        return _Device(0)

    def __array_ufunc__(self, ufunc, method, *inputs, out=None, **kwargs):
        if method == "at":
            raise StrictError(f"{ufunc.__name__}.at on a device array: atomic adds, whose order "
                              f"varies")
        _check(inputs + (out or ()), f"{ufunc.__name__}.{method}")
        if out is not None:
            kwargs["out"] = tuple(_plain(o) for o in out)
        result = getattr(ufunc, method)(*_plain(inputs), **kwargs)
        if out is not None:
            return out[0] if len(out) == 1 else out
        return _dev(result)

    def __array_function__(self, func, types_, args, kwargs):
        _check(list(args) + list(kwargs.values()), func.__name__)
        result = func(*_plain(args), **{k: _plain(v) for k, v in kwargs.items()})
        if "out" in kwargs and kwargs["out"] is not None:
            return kwargs["out"]
        if func is np.count_nonzero and isinstance(result, int):
            result = np.intp(result)
        return _dev(result)

    def __getitem__(self, index):
        _check(index if isinstance(index, tuple) else (index,), "indexing")
        return _dev(np.ndarray.__getitem__(self.view(np.ndarray), _plain(index)))

    def __setitem__(self, index, value):
        _check(index if isinstance(index, tuple) else (index,), "indexing")
        _check((value,), "assignment")
        np.ndarray.__setitem__(self.view(np.ndarray), _plain(index), _plain(value))

    def __buffer__(self, flags):
        raise StrictError("a device array has no host buffer (bytes, ZeroMQ frames)")

    def tobytes(self, order="C"):
        raise StrictError("tobytes of a device array: copy it to the host first")

    def get(self):
        """A host copy (cupy.ndarray.get)."""
        moved["to host"] += self.nbytes
        waits["read"] += 1
        return np.array(self.view(np.ndarray))

    def _read(self, convert):
        waits["read"] += 1
        return convert(self.view(np.ndarray))

    def __float__(self):
        return self._read(float)

    def __int__(self):
        return self._read(int)

    def __index__(self):
        return self._read(operator.index)

    def __bool__(self):
        return self._read(bool)

    def item(self, *args):
        return self._read(lambda a: a.item(*args))

    def set(self, values, stream=None):
        """Copy host `values` of the same shape and dtype in (cupy.ndarray.set): asynchronous
        from pinned memory on a `stream`, else the host waits."""
        if type(values) is not np.ndarray or values.shape != self.shape or \
                values.dtype != self.dtype:
            raise StrictError(f"set: needs a host array of shape {self.shape} and dtype "
                              f"{self.dtype}, got {type(values).__name__}")
        moved["to device"] += values.nbytes
        if stream is None or not _pinned(values):
            waits["pageable copy"] += 1
        np.copyto(self.view(np.ndarray), values)


def asarray(a, dtype=None):
    """A device array of `a` (copied from the host; a device array itself)."""
    if isinstance(a, DevArray) and (dtype is None or a.dtype == dtype):
        return a
    a = np.array(_plain(a), dtype=dtype)
    moved["to device"] += a.nbytes
    waits["pageable copy"] += 1
    return a.view(DevArray)


def _made(name):
    make = getattr(np, name)

    def f(*args, **kwargs):
        return make(*args, **kwargs).view(DevArray)
    f.__name__ = name
    return f


zeros, empty, ones, full, arange = (_made(n) for n in ("zeros", "empty", "ones", "full", "arange"))


def zeros_like(a, *args, **kwargs):
    return np.zeros_like(_plain(a), *args, **kwargs).view(DevArray)


def empty_like(a, *args, **kwargs):
    return np.empty_like(_plain(a), *args, **kwargs).view(DevArray)


class _Device:
    current = None

    def __init__(self, i):
        self.id = i

    def use(self):
        _Device.current = self.id

    def __enter__(self):
        self.outer, _Device.current = _Device.current, self.id

    def __exit__(self, *exc):
        _Device.current = self.outer


class _Pinned(bytearray):
    """Page-locked host memory (cupy.cuda.alloc_pinned_memory)."""


def _pinned(a):
    """True when host array `a` lies in pinned memory."""
    while isinstance(a, np.ndarray):
        a = a.base
    return isinstance(a.obj if isinstance(a, memoryview) else a, _Pinned)


class _Event:
    """cupy.cuda.Event: every launch here has finished when it returns."""

    def __init__(self, block=False, disable_timing=False, interprocess=False):
        self.recorded = False

    def record(self, stream=None):
        self.recorded = True

    def synchronize(self):
        pass


_stream = types.SimpleNamespace(ptr=0, synchronize=lambda: None)

cuda = types.SimpleNamespace(Device=_Device, Event=_Event,
                             alloc_pinned_memory=_Pinned,
                             get_current_stream=lambda: _stream,
                             runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))


def installed(monkeypatch):
    """Make singa.device take this module for cupy (GPU 0 visible)."""
    from singa import device
    module = sys.modules[__name__]
    monkeypatch.setattr(device, "cupy", lambda: module)
    monkeypatch.setitem(sys.modules, __name__.partition(".")[0], module)
    return module


# ---- CUDA kernels (singa.layers.cuda): run on the CPU through tests/cuda_shim.py ----

import cuda_shim   # noqa: E402  (kept apart from the rest of the stand-in)


def ascontiguousarray(a, dtype=None):
    """A C-contiguous device array of `a` (`a`'s memory where it is one)."""
    return np.ascontiguousarray(_plain(a), dtype).view(DevArray)


class RawKernel(cuda_shim.RawKernel):
    """cupy.RawKernel: `code`'s kernel `name`, built by the C++ compiler (cuda_shim) at its
    first launch; its grid runs serially, on device arrays only. Skips the test where no
    compiler is found."""

    def __call__(self, grid, block, args, shared_mem=0):
        _check(args, f"kernel {self.name}")
        if cuda_shim.compiler() is None:
            import pytest
            pytest.skip("no C++ compiler to run the CUDA kernels on the CPU")
        try:
            super().__call__(grid, block, _plain(tuple(args)), shared_mem)
        except TypeError as e:
            raise StrictError(str(e)) from None
