"""read_idx: MNIST's big-endian IDX files (images magic 2051, labels magic 2049), gzip or raw."""
import gzip
import os
import struct
import zlib

import numpy as np

from singa.errors import DataError

__all__ = ["read_idx", "IMAGES_MAGIC", "LABELS_MAGIC"]

IMAGES_MAGIC = 2051
LABELS_MAGIC = 2049

_NDIM = {IMAGES_MAGIC: 3, LABELS_MAGIC: 1}
_CHUNK = 1 << 24


def read_idx(path):
    """uint8 array (N, rows, cols) for an images file, (N,) for a labels file.

    Gzip is recognised by its magic bytes 1f 8b, not by the file name.
    """
    path = os.fspath(path)
    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            f = gzip.GzipFile(fileobj=raw) if gzipped else raw
            try:
                return _read(f, path, None if gzipped else os.fstat(raw.fileno()).st_size)
            except (OSError, EOFError, zlib.error) as e:
                # A corrupt or truncated gzip stream.
                raise DataError(f"{path}: not a readable gzip IDX file ({e})") from None
    except FileNotFoundError:
        raise DataError(f"{path}: no such IDX file") from None
    except IsADirectoryError:
        raise DataError(f"{path}: is a directory, not an IDX file") from None
    except PermissionError:
        raise DataError(f"{path}: permission denied") from None


def _read(f, path, file_size):
    head = f.read(4)
    if len(head) < 4:
        raise DataError(f"{path}: truncated IDX header ({len(head)} bytes)")
    (magic,) = struct.unpack(">i", head)
    if magic not in _NDIM:
        raise DataError(f"{path}: bad IDX magic {magic} (expected {IMAGES_MAGIC} for images "
                        f"or {LABELS_MAGIC} for labels)")
    ndim = _NDIM[magic]
    dims = f.read(4 * ndim)
    if len(dims) < 4 * ndim:
        raise DataError(f"{path}: truncated IDX header")
    shape = struct.unpack(f">{ndim}i", dims)
    if min(shape) < 0:
        raise DataError(f"{path}: negative dimension in IDX header {shape}")
    size = int(np.prod(shape, dtype=object))
    header = 4 + 4 * ndim
    if file_size is not None and file_size != header + size:
        raise DataError(f"{path}: {'truncated' if file_size < header + size else 'size mismatch'}"
                        f": header says {shape} = {size} bytes of data, file has "
                        f"{file_size - header}")
    # Read in chunks so a hostile header cannot make us allocate more than the data holds.
    data = bytearray()
    while len(data) <= size:
        chunk = f.read(min(_CHUNK, size + 1 - len(data)))
        if not chunk:
            break
        data += chunk
    if len(data) != size:
        raise DataError(f"{path}: {'truncated' if len(data) < size else 'size mismatch'}: header "
                        f"says {shape} = {size} bytes of data, file has "
                        f"{len(data)}{'' if len(data) < size else ' or more'}")
    return np.frombuffer(data, dtype=np.uint8).reshape(shape)
