"""This machine's memory and the one rule for it (`check_fits`), and SHAPES: a device whose
arrays hold no memory, on which a net is set up to check what it would allocate, before it does.

The rule is per array: a param's values and gradient together, or any one array a layer
allocates, may need at most MEMORY_BYTES (their sum over the net is not checked). A number a
conf merely claims (`num_output: 2000000000`, `batchsize: 100000` of 3x224x224 images) is
refused in one line without any work of its size.
"""
import math
import os

import numpy as np
from numpy.lib.stride_tricks import as_strided

from singa.device import Device
from singa.errors import ConfigError

__all__ = ["MEMORY_BYTES", "SHAPES", "BeyondMemory", "check_fits", "format_bytes"]

#: Physical memory of this machine: no array may need more.
MEMORY_BYTES = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def format_bytes(n):
    """`n` bytes in decimal units: 12.5 TB, 3.1 MB, 512 B."""
    for unit in ("B", "kB", "MB", "GB", "TB", "PB"):
        if n < 1000 or unit == "PB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{n} B"
        n /= 1000


class BeyondMemory(ConfigError):
    """A conf whose param or layer array would need more than this machine's memory."""


def check_fits(nbytes, what, error=BeyondMemory):
    """`error`("<what> <nbytes>, more than this machine's <MEMORY_BYTES> of memory") if
    `nbytes` > MEMORY_BYTES; `what` ends with its verb ("param 'w' ...: its values and
    gradient need")."""
    if nbytes > MEMORY_BYTES:
        raise error(f"{what} {format_bytes(nbytes)}, more than this machine's "
                    f"{format_bytes(MEMORY_BYTES)} of memory")


class _Shaped(np.ndarray):
    """An array of SHAPES: every element is one shared element (all strides 0), and numpy's
    `*_like` functions give arrays of SHAPES again, so a layer's `np.zeros_like(self.data)`
    allocates nothing either."""

    def __array_function__(self, func, types, args, kwargs):
        if func not in _LIKE:
            return super().__array_function__(func, types, args, kwargs)
        a, rest = args[0], list(args[1:])
        if func is np.full_like:
            rest = rest[1:]
            kwargs.pop("fill_value", None)
        dtype = rest[0] if rest else kwargs.get("dtype")
        shape = kwargs.get("shape")
        return _empty(a.shape if shape is None else shape, a.dtype if dtype is None else dtype)


_LIKE = (np.zeros_like, np.empty_like, np.ones_like, np.full_like)


def _empty(shape, dtype=float, *args, **kwargs):
    """An array of `shape` and `dtype` holding no memory; MemoryError (as numpy's own) if it
    would need more than MEMORY_BYTES."""
    shape = tuple(map(int, shape)) if np.iterable(shape) else (int(shape),)
    if min(shape, default=0) < 0:
        raise ValueError(f"negative dimensions are not allowed: {shape}")
    dtype = np.dtype(dtype)
    check_fits(math.prod(shape) * dtype.itemsize,
               f"an array of shape {shape} ({dtype}) needs", MemoryError)
    return as_strided(np.zeros(1, dtype), shape, (0,) * len(shape)).view(_Shaped)


class _Module:
    """SHAPES's array module: numpy, whose allocating functions allocate nothing."""
    zeros = empty = ones = staticmethod(_empty)

    @staticmethod
    def full(shape, fill_value, dtype=None, *args, **kwargs):
        return _empty(shape, np.asarray(fill_value).dtype if dtype is None else dtype)

    def __getattr__(self, name):
        return getattr(np, name)


#: The device a net is set up on to learn what it would allocate (`NeuralNet(...,
#: device=SHAPES)`): the host, with arrays that hold no memory.
SHAPES = Device()
SHAPES.xp = _Module()
