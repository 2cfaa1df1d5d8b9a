"""open_store: SINGA's CreateStore(backend) + Open(path, mode) (src/io/store.cc)."""
from itertools import islice

from singa.errors import DataError
from singa.io.images import image_record
from singa.io.imagelist import ImageListStore
from singa.io.kvfile import KVFile
from singa.io.lmdbstore import LMDBStore
from singa.io.memory import MemoryStore
from singa.io.records import Samples
from singa.io.textfile import TextFileStore

__all__ = ["open_store", "read_cyclic", "read_batch", "read_columns", "count_records",
           "KVFileStore", "TextFileStore", "BACKENDS", "CAFFE_BACKENDS"]


class KVFileStore(KVFile):
    """The "kvfile" backend: a KVFile whose write(key, value) is insert."""

    def write(self, key, value):
        return self.insert(key, value)


BACKENDS = {"kvfile": KVFileStore, "textfile": TextFileStore, "memory": MemoryStore,
            "lmdb": LMDBStore, "imagelist": ImageListStore}

#: backends reading Caffe's data as it is, as RecordProtos that carry their shape; they take
#: the layer's store_conf (imagelist: root_folder, new_height, ...)
CAFFE_BACKENDS = ("lmdb", "imagelist")


def open_store(backend, path, mode="read", conf=None):
    """A store of `backend` (see BACKENDS) opened on `path` in mode read/create/append; `conf`:
    the layer's StoreProto, for the backends that read more of it (CAFFE_BACKENDS; "memory":
    its target_dim).

    Every store has read() -> (key, value) | None, seek_to_first(), tell(), seek(offset),
    write(key, value), flush() and close(), and is a context manager. A store whose order is
    drawn (a shuffled imagelist) also has start(rng), called before its first read.
    """
    if backend not in BACKENDS:
        raise DataError(f"{path}: store backend {backend!r} not recognized "
                        f"(known: {', '.join(sorted(BACKENDS))})")
    if backend in CAFFE_BACKENDS or backend == "memory":
        return BACKENDS[backend](path, mode, conf)
    return BACKENDS[backend](path, mode)


def read_cyclic(store, path, backend):
    """The next (key, value) of `store`: `read_batch` of one."""
    return read_batch(store, 1, path, backend)[0]


def read_batch(store, n, path, backend):
    """The next `n` (key, value) pairs of `store`, starting again at its first tuple after its
    last (SINGA's input layers wrap around); DataError naming `path` when the store is empty."""
    got = _read_many(store, n)
    while len(got) < n:
        store.seek_to_first()
        more = _read_many(store, n - len(got))
        if not more:
            raise DataError(f"{path}: the {backend} store is empty")
        got += more
    return got


def read_columns(store, n, path, backend):
    """`read_batch` as (keys, values): the values as one `records.Samples` where the store
    gives them so (`read_samples`: the memory store's, an LMDB's images), else a list."""
    if not hasattr(store, "read_samples"):
        return tuple(zip(*read_batch(store, n, path, backend)))
    keys, values = store.read_samples(n)
    parts = [values]
    while len(keys) < n:
        store.seek_to_first()
        more, values = store.read_samples(n - len(keys))
        if not more:
            raise DataError(f"{path}: the {backend} store is empty")
        keys += more
        parts.append(values)
    if all(isinstance(part, Samples) for part in parts):
        return keys, Samples.join(parts)
    return keys, [v if isinstance(part, list) else image_record(v.x, v.label)
                  for part in parts for v in part]


def count_records(backend, path):
    """The number of tuples in the store of `backend` at `path` (read through once; numpy
    data, LMDBs and image lists: their length)."""
    with open_store(backend, path, "read") as store:
        if isinstance(store, MemoryStore):
            return len(store.x)
        if backend in CAFFE_BACKENDS:
            return store.count()
        return sum(1 for _ in iter(store.read, None))


def _read_many(store, n):
    """The next `n` pairs of `store`, fewer only at its end (a kvfile cuts them from one block)."""
    return store.read_many(n) if hasattr(store, "read_many") else list(islice(store, n))
