"""open_store: SINGA's CreateStore(backend) + Open(path, mode) (src/io/store.cc)."""
from singa.errors import DataError
from singa.io.kvfile import KVFile
from singa.io.memory import MemoryStore
from singa.io.textfile import TextFileStore

__all__ = ["open_store", "read_cyclic", "count_records", "KVFileStore", "TextFileStore", "BACKENDS"]


class KVFileStore(KVFile):
    """The "kvfile" backend: a KVFile whose write(key, value) is insert."""

    def write(self, key, value):
        return self.insert(key, value)


BACKENDS = {"kvfile": KVFileStore, "textfile": TextFileStore, "memory": MemoryStore}


def open_store(backend, path, mode="read"):
    """A store of `backend` ("kvfile" | "textfile" | "memory") opened on `path` in mode read/create/append.

    Every store has read() -> (key, value) | None, seek_to_first(), tell(), seek(offset),
    write(key, value), flush() and close(), and is a context manager.
    """
    if backend not in BACKENDS:
        raise DataError(f"{path}: store backend {backend!r} not recognized "
                        f"(known: {', '.join(sorted(BACKENDS))})")
    return BACKENDS[backend](path, mode)


def read_cyclic(store, path, backend):
    """The next (key, value) of `store`, starting again at its first tuple after its last (SINGA's
    input layers wrap around); DataError naming `path` when the store is empty."""
    kv = store.read()
    if kv is None:
        store.seek_to_first()
        kv = store.read()
        if kv is None:
            raise DataError(f"{path}: the {backend} store is empty")
    return kv


def count_records(backend, path):
    """The number of tuples in the store of `backend` at `path` (read through once; numpy
    data: their length)."""
    with open_store(backend, path, "read") as store:
        if isinstance(store, MemoryStore):
            return len(store.x)
        return sum(1 for _ in iter(store.read, None))
