"""SINGA's kvfile: a plain concatenation of (8-byte LE key_len, key, 8-byte LE val_len, value).

No header, magic or checksum (src/io/kvfile.cc), so shards written here load in SINGA 0.3 and back.
"""
import os
import struct

from singa.errors import DataError
from singa.io.base import Store

__all__ = ["KVFile", "CAPACITY", "pack"]

#: SINGA's default write-buffer capacity in bytes.
CAPACITY = 10485760
#: bytes a reader reads at once (more when one tuple is longer)
CHUNK = 1 << 18

_LEN = struct.Struct("<Q")


class KVFile(Store):
    """A kvfile opened in mode "read", "create" or "append".

    Read and append open `path`, or `path/shard.dat` when `path` is a 0.1 shard folder;
    create writes exactly `path`. Append continues after the last complete tuple and cuts
    off a torn tail; it remembers the existing keys and rejects duplicates, like SINGA.
    """

    def __init__(self, path, mode="read", capacity=CAPACITY):
        if mode not in ("read", "create", "append"):
            raise ValueError(f"KVFile mode must be read, create or append, not {mode!r}")
        self.path = os.fspath(path)
        self.mode = mode
        self.capacity = capacity
        self._keys = set()
        self._buf = bytearray()
        if mode == "create":
            self._file = _open(self.path, "wb")
            return
        if os.path.isdir(self.path):
            self.path = os.path.join(self.path, "shard.dat")
        if mode == "read":
            if not os.path.exists(self.path):
                raise DataError(f"{self.path}: no such kvfile")
            self._file = _open(self.path, "rb")
            self._size = os.fstat(self._file.fileno()).st_size
            self.seek(0)
            return
        if not os.path.exists(self.path):
            self._file = _open(self.path, "wb")
            return
        end = 0
        with _open(self.path, "rb") as f:
            for key, end in _walk(f):
                self._keys.add(key)
        self._file = _open(self.path, "r+b")
        self._file.truncate(end)
        self._file.seek(end)

    def read(self):
        """Next (key, value) as bytes, or None at the end of the file (see `read_many`)."""
        got = self.read_many(1)
        return got[0] if got else None

    def read_many(self, n):
        """The next `n` (key, value) pairs as bytes, fewer only at the end of the file.

        Tuples are cut from chunks of CHUNK bytes read at once; `tell` still gives the offset
        of the next tuple not returned. A tuple cut short (a truncated file, or a length prefix
        pointing past the end) is a DataError naming the file, the tuple's byte offset and the
        tuples before it, and reading stays there; SINGA stops there without a word, so a job
        trained on the first few tuples of a shard.
        """
        got, unpack = [], _LEN.unpack_from
        chunk, pos, size = self._chunk, self._pos, len(self._chunk)
        while len(got) < n:
            if pos + 8 <= size:
                key = pos + 8 + unpack(chunk, pos)[0]
                if key + 8 <= size:
                    end = key + 8 + unpack(chunk, key)[0]
                    if end <= size:
                        got.append((chunk[pos + 8:key], chunk[key + 8:end]))
                        pos = end
                        continue
            more = self._fill(self._at + pos)
            chunk, pos, size = self._chunk, 0, len(self._chunk)
            if not more:
                break
        self._pos = pos
        return got

    def seek_to_first(self):
        self.seek(0)

    def tell(self):
        """Byte offset of the next tuple to read (or of the end, when writing)."""
        if self.mode == "read":
            return self._at + self._pos
        return self._file.tell() + len(self._buf)

    def seek(self, offset):
        """Continue reading at byte `offset`, a value returned by `tell`."""
        if self.mode != "read":
            raise ValueError("KVFile.seek needs read mode")
        if offset < 0:
            raise DataError(f"{self.path}: negative offset {offset}")
        self._chunk, self._at, self._pos = b"", offset, 0

    def insert(self, key, value):
        """Buffer one tuple; False (nothing written) for an empty value or a key seen in append."""
        key, value = _bytes(key), _bytes(value)
        if not value or key in self._keys:
            return False
        tuple_ = pack(key, value)
        if len(self._buf) + len(tuple_) > self.capacity:
            self._write_buffer()
        if len(tuple_) > self.capacity:
            # SINGA aborts here; writing it unbuffered is just as correct.
            self._file.write(tuple_)
        else:
            self._buf += tuple_
        if self.mode == "append":
            self._keys.add(key)
        return True

    def flush(self):
        """Write buffered tuples to the file and flush it to the OS."""
        if self.mode != "read":
            self._write_buffer()
            self._file.flush()

    def close(self):
        if self._file.closed:
            return
        try:
            self.flush()
        finally:
            self._file.close()

    def count(self):
        """Number of complete tuples in the file (buffered tuples are flushed first)."""
        self.flush()
        with _open(self.path, "rb") as f:
            return sum(1 for _ in _walk(f))

    def _fill(self, start):
        """Read the chunk from byte `start`, long enough for its first tuple; False at the end."""
        self._chunk, self._at, self._pos = b"", start, 0
        self._file.seek(start)
        chunk = self._file.read(CHUNK)
        if not chunk:
            return False
        chunk = self._extend(chunk, start, 8, f"{len(chunk)} bytes, less than a key length")
        (klen,) = _LEN.unpack_from(chunk)
        chunk = self._extend(chunk, start, 16 + klen, f"its key length {klen} points past the end")
        (vlen,) = _LEN.unpack_from(chunk, 8 + klen)
        self._chunk = self._extend(chunk, start, 16 + klen + vlen,
                                   f"its value length {vlen} points past the end")
        return True

    def _extend(self, chunk, start, need, why):
        """`chunk`, the file's bytes from `start`, read on to `need` bytes; cut short (`why`)
        if the file is shorter."""
        if start + need > self._size:
            self._size = os.fstat(self._file.fileno()).st_size
        # A length prefix beyond the end of the file is a torn tail or garbage: never allocate it.
        if start + need > self._size:
            raise self._cut_short(start, why)
        chunk += self._file.read(max(0, need - len(chunk)))
        if len(chunk) < need:           # the file shrank under us
            raise self._cut_short(start, why)
        return chunk

    def _cut_short(self, start, why):
        """The DataError for the incomplete tuple at byte `start`."""
        whole = sum(1 for _, end in _walk(self._file) if end <= start)
        return DataError(f"{self.path}: the tuple at byte {start} is cut short ({why} of the "
                         f"{self._size}-byte file); {whole} whole tuple{'s' * (whole != 1)} "
                         f"before it: truncated or corrupt")

    def _write_buffer(self):
        if self._buf:
            self._file.write(self._buf)
            self._buf.clear()


def pack(key, value):
    """The bytes of one tuple (`key`, `value`: bytes)."""
    return b"".join((_LEN.pack(len(key)), key, _LEN.pack(len(value)), value))


def _walk(f):
    """Yield (key, end offset) of each complete tuple of open file `f`, skipping the values."""
    size = os.fstat(f.fileno()).st_size
    pos = 0
    while pos + 8 <= size:
        f.seek(pos)
        (klen,) = _LEN.unpack(f.read(8))
        if pos + 16 + klen > size:
            return
        key = f.read(klen)
        (vlen,) = _LEN.unpack(f.read(8))
        end = pos + 16 + klen + vlen
        if end > size:
            return
        yield key, end
        pos = end


def _bytes(s):
    return s.encode() if isinstance(s, str) else bytes(s)


def _open(path, mode):
    try:
        return open(path, mode)
    except OSError as e:
        raise DataError(f"{path}: cannot open kvfile: {e.strerror}") from None
