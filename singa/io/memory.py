"""The "memory" store backend: numpy arrays handed to the Python API, read like a kvfile.

`register(x, y)` keeps N samples `x` (any shape (N, ...); uint8 become RecordProto `pixel`
bytes, other dtypes float `data`) and N integer labels `y` (None: label 0) under a path
`memory://<n>`; `open_store("memory", path)` reads them as (key, RecordProto bytes) tuples in
order, so the input layers batch, skip and preprocess them exactly as a kvfile of the same
records. Positions (`tell`/`seek`) are record indices. Arrays live in this process only: a
job of several processes reads numpy data from a kvfile (`records.write_records`).
"""
import itertools
import threading

import numpy as np

from singa.errors import ConfigError, DataError
from singa.io.base import ReadOnly
from singa.io.records import class_indices, encode_record

PREFIX = "memory://"
_ARRAYS = {}        # path -> (x, y)
_LOCK = threading.Lock()
_NUMBERS = itertools.count()


def register(x, y=None):
    """Keep `x` (and labels `y`) for the memory store; returns their store path."""
    x = np.asarray(x)
    if x.ndim < 1 or len(x) == 0:
        raise ConfigError(f"numpy data: x must hold at least one sample, got shape {x.shape}")
    if not (x.dtype == np.uint8 or np.issubdtype(x.dtype, np.number)):
        raise ConfigError(f"numpy data: x must be numbers, got dtype {x.dtype}")
    if y is not None:
        y = class_indices(y, len(x))
    with _LOCK:
        path = f"{PREFIX}{next(_NUMBERS)}"
        _ARRAYS[path] = (x, y)
    return path


def release(path):
    """Forget the arrays of `path` (a store opened on them keeps reading them)."""
    with _LOCK:
        _ARRAYS.pop(path, None)


def arrays(path):
    """(x, y) registered under `path`; DataError if none are."""
    with _LOCK:
        found = _ARRAYS.get(path)
    if found is None:
        raise DataError(f"{path}: no numpy data registered under this path in this process "
                        f"(numpy data lives in the process that gave it)")
    return found


class MemoryStore(ReadOnly):
    """A read-only store over registered arrays (see `singa.io.store.open_store`)."""

    backend = "memory"

    def __init__(self, path, mode="read"):
        if mode != "read":
            raise DataError(f"{path}: the memory store is read-only")
        self.path = path
        self.x, self.y = arrays(path)
        self.pos = 0

    def read(self):
        if self.pos >= len(self.x):
            return None
        i = self.pos
        self.pos += 1
        return f"{i:05d}".encode(), encode_record(self.x[i], 0 if self.y is None else self.y[i])

    def seek_to_first(self):
        self.pos = 0

    def tell(self):
        return self.pos

    def seek(self, offset):
        if not 0 <= offset <= len(self.x):
            raise DataError(f"{self.path}: position {offset} is beyond its {len(self.x)} records")
        self.pos = offset

