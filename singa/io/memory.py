"""The "memory" store backend: numpy arrays handed to the Python API, read like a kvfile.

`register(x, y)` keeps N samples `x` (any shape (N, ...); uint8 become RecordProto `pixel`
bytes, other dtypes float `data`) and what they are compared with, `y` (None: label 0), under
a path `memory://<n>`; `open_store("memory", path, conf=store_conf)` reads them as (key,
`records.Sample`) tuples in order (or a batch of them as arrays, `read_samples`), which
`records.decode_batch` takes for the RecordProto bytes of a kvfile of the same records (the
same bits, without encoding them), so the input layers batch, skip and preprocess them
exactly as that kvfile. The layer's store_conf says
what `y` is: with target_dim k, regression targets (k floats per sample, the records'
`target`); without, class labels (`records.class_indices`: indices or one-hot rows). `y` is kept as given, so a model
may read the same y either way (Keras' mean squared error takes integer y as targets).
Positions (`tell`/`seek`) are record indices. Arrays live in this process only: a job of
several processes reads numpy data from a kvfile (`records.write_records`).
"""
import itertools
import threading

import numpy as np

from singa.errors import ConfigError, DataError
from singa.io.base import ReadOnly
from singa.io.records import Samples, class_indices, holds_targets, targets_of

PREFIX = "memory://"
_ARRAYS = {}        # path -> (x, y)
_LOCK = threading.Lock()
_NUMBERS = itertools.count()


def register(x, y=None):
    """Keep `x` (and `y`: class labels, or regression targets (`records.holds_targets`), each
    checked as such) for the memory store; returns their store path."""
    x = np.asarray(x)
    if x.ndim < 1 or len(x) == 0:
        raise ConfigError(f"numpy data: x must hold at least one sample, got shape {x.shape}")
    if not (x.dtype == np.uint8 or np.issubdtype(x.dtype, np.number)):
        raise ConfigError(f"numpy data: x must be numbers, got dtype {x.dtype}")
    if y is not None:
        y = np.asarray(y)
        (targets_of if holds_targets(y) else class_indices)(y, len(x))
    with _LOCK:
        path = f"{PREFIX}{next(_NUMBERS)}"
        _ARRAYS[path] = (x, y)
    return path


def release(path):
    """Forget the arrays of `path` (a store opened on them keeps reading them)."""
    with _LOCK:
        _ARRAYS.pop(path, None)


def arrays(path):
    """(x, y) registered under `path`, y as given (or None); DataError if none are."""
    with _LOCK:
        found = _ARRAYS.get(path)
    if found is None:
        raise DataError(f"{path}: no numpy data registered under this path in this process "
                        f"(numpy data lives in the process that gave it)")
    return found


class MemoryStore(ReadOnly):
    """A read-only store over registered arrays (see `singa.io.store.open_store`); `conf`,
    the reading layer's StoreProto, says whether y are targets (its target_dim)."""

    backend = "memory"

    def __init__(self, path, mode="read", conf=None):
        if mode != "read":
            raise DataError(f"{path}: the memory store is read-only")
        self.path = path
        self.x, self.y = arrays(path)
        self.target_dim = conf.target_dim if conf is not None else 0
        self._rows = None       # per sample: its label, or its targets; made at the first read
        self.pos = 0

    def read(self):
        got = self.read_many(1)
        return got[0] if got else None

    def read_many(self, n):
        """The next `n` (key, Sample) pairs, fewer at the end (`read`'s, in one call)."""
        keys, samples = self.read_samples(n)
        return [(key, samples[i]) for i, key in enumerate(keys)]

    def read_samples(self, n):
        """(keys, `Samples`) of the next `n` records, fewer at the end: `read_many`'s values
        as one batch of arrays (views of the registered ones)."""
        if self._rows is None:
            self._rows = self._compared()
        start, stop = self.pos, min(self.pos + n, len(self.x))
        self.pos = stop
        keys = [b"%05d" % i for i in range(start, stop)]
        if self.target_dim:
            return keys, Samples(self.x[start:stop], targets=self._rows[start:stop])
        return keys, Samples(self.x[start:stop], self._rows[start:stop])

    def _compared(self):
        """What the samples are compared with: (N, target_dim) targets (0 without y), or (N,)
        class labels (0 without y)."""
        n, k = len(self.x), self.target_dim
        if not k:
            return np.zeros(n, np.int64) if self.y is None else class_indices(self.y, n)
        if self.y is None:
            return np.zeros((n, k), np.float32)
        t = targets_of(self.y, n)
        if t.shape[1] != k:
            raise DataError(f"{self.path}: y holds {t.shape[1]} targets per sample, the input "
                            f"layer reads {k} (store_conf.target_dim)")
        return t

    def seek_to_first(self):
        self.pos = 0

    def tell(self):
        return self.pos

    def seek(self, offset):
        if not 0 <= offset <= len(self.x):
            raise DataError(f"{self.path}: position {offset} is beyond its {len(self.x)} records")
        self.pos = offset
