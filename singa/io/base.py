"""What every store backend is (`singa.io.store.open_store` says its methods): a context
manager that closes it, iterable from its position to its end; `ReadOnly`, the backends that
only read (numpy data, Caffe's LMDBs and image lists)."""
from singa.errors import DataError

__all__ = ["ReadOnly", "Store"]


class Store:
    """A store: `with store:` closes it; iterating gives (key, value) from its position."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __iter__(self):
        return iter(self.read, None)


class ReadOnly(Store):
    """A store that only reads: write is a DataError naming `path` and the `backend`."""

    backend = None

    def write(self, key, value):
        raise DataError(f"{self.path}: the {self.backend} store is read-only")

    def flush(self):
        pass

    def close(self):
        pass
