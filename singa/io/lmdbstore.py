"""The "lmdb" store backend: Caffe's LMDB of `Datum`s (convert_imageset's output) read as it is,
each Datum given as the RecordProto SINGA's LMDBDataLayer makes of it (ConvertCaffeDatumToRecord,
src/neuralnet/input_layer/lmdb_data.cc): shape (channels, height, width), label, `pixel` bytes
or float `data`; an encoded (JPEG, PNG) Datum is decoded as Caffe does (OpenCV's BGR order),
a batch's side by side."""
import os
import threading

from google.protobuf.message import DecodeError

from singa.errors import DataError
from singa.io.base import ReadOnly
from singa.io.images import batch_values, decode_image, decode_many, image_record
from singa.proto import caffe_pb2, common_pb2

__all__ = ["LMDBStore", "datum_record"]

# LMDB allows one environment per database and process: the stores of one database (workers,
# partitions, test nets) share it, each with its own read transaction and cursor
_ENVS = {}          # real path -> [Environment, stores open on it]
_ENVS_LOCK = threading.Lock()


class LMDBStore(ReadOnly):
    """A Caffe LMDB opened for reading (a folder holding data.mdb, or the file itself).

    read() gives (key, RecordProto bytes) in key order, as Caffe's cursor walks it; positions
    (`tell`/`seek`) are record indices. Opened without LMDB's lock file, so a read-only
    folder reads too (nobody may write the database meanwhile).
    """

    backend = "lmdb"

    _env = None

    def __init__(self, path, mode="read", conf=None):
        self.path = os.fspath(path)
        if mode != "read":
            raise DataError(f"{self.path}: the lmdb store is read-only (write Caffe's LMDBs with "
                            f"its convert_imageset)")
        lmdb = _lmdb()
        if not os.path.exists(self.path):
            raise DataError(f"{self.path}: no such LMDB")
        self._real = os.path.realpath(self.path)
        _check_length(self.path)
        try:
            with _ENVS_LOCK:
                held = _ENVS.get(self._real)
                if held is None:
                    held = _ENVS[self._real] = [lmdb.open(
                        self.path, readonly=True, lock=False, readahead=False,
                        subdir=os.path.isdir(self.path)), 0]
                held[1] += 1
                self._env = held[0]
            self._txn = self._env.begin()
            self._cursor = self._txn.cursor()
            self._valid = self._cursor.first()
        except lmdb.Error as e:
            self.close()
            raise DataError(f"{self.path}: not a readable LMDB ({_why(e)})") from None
        self._lmdb = lmdb
        self._pos = 0

    def read(self):
        """Next (key, RecordProto bytes), or None after the last record."""
        got = self.read_many(1)
        return got[0] if got else None

    def read_many(self, n):
        """The next `n` (key, RecordProto bytes), fewer at the end: the encoded Datums among
        them decoded side by side (`images.decode_many`)."""
        keys, records = self._read(n)
        return list(zip(keys, _recorded(records)))

    def read_samples(self, n):
        """(keys, values) of the next `n` records, fewer at the end: where all are encoded
        Datums, `images.batch_values`'s (one array where they have one shape), else
        `read_many`'s RecordProto bytes."""
        keys, records = self._read(n)
        if records and all(isinstance(r, tuple) for r in records):
            return keys, batch_values([r[:2] for r in records], [r[2] for r in records])
        return keys, _recorded(records)

    def _read(self, n):
        """(keys, `_datum` of each) of the next `n` records, fewer at the end."""
        items = []
        try:
            while len(items) < n and self._valid:
                items.append(self._cursor.item())
                self._valid = self._cursor.next()
                self._pos += 1
        except self._lmdb.Error as e:
            raise DataError(f"{self.path}: record {self._pos} cannot be read: {_why(e)}") from None
        return [key for key, _ in items], [_datum(value, key, self.path) for key, value in items]

    def seek_to_first(self):
        self.seek(0)

    def tell(self):
        """The index of the next record."""
        return self._pos

    def seek(self, offset):
        """Continue reading at record `offset` (a value of `tell`)."""
        if offset < 0 or offset > self.count():
            raise DataError(f"{self.path}: position {offset} is beyond its {self.count()} records")
        try:
            if offset < self._pos or not self._valid:
                self._valid, self._pos = self._cursor.first(), 0
            while self._pos < offset:
                self._valid = self._cursor.next()
                self._pos += 1
        except self._lmdb.Error as e:
            raise DataError(f"{self.path}: cannot walk to record {offset}: {_why(e)}") from None

    def count(self):
        """The number of records."""
        return self._env.stat()["entries"]

    def close(self):
        if self._env is None:
            return
        if getattr(self, "_txn", None) is not None:
            self._txn.abort()
            self._txn = None
        with _ENVS_LOCK:
            held = _ENVS[self._real]
            held[1] -= 1
            if held[1] == 0:
                del _ENVS[self._real]
                self._env.close()
        self._env = None


def datum_record(value, key, path):
    """The RecordProto bytes of the serialized Caffe Datum `value` (record `key` of `path`)."""
    record = _datum(value, key, path)
    if isinstance(record, tuple):
        return image_record(decode_image(*record[:2]), record[2])
    return record


def _recorded(records):
    """`_datum`'s values as RecordProto bytes: the encoded images decoded side by side."""
    records = list(records)
    encoded = [i for i, r in enumerate(records) if isinstance(r, tuple)]
    for i, pixels in zip(encoded, decode_many([records[i][:2] for i in encoded])):
        records[i] = image_record(pixels, records[i][2])
    return records


def _datum(value, key, path):
    """`datum_record`'s bytes, or for an encoded Datum (its image, where it is, its label) to
    decode."""
    name = key.decode(errors="backslashreplace") if isinstance(key, bytes) else str(key)
    d = caffe_pb2.Datum()
    try:
        d.ParseFromString(value)
    except DecodeError:
        raise DataError(f"{path}: record '{name}' is not a Caffe Datum "
                        f"({len(value)} bytes)") from None
    if d.encoded:
        return d.data, f"{path}: record '{name}'", d.label
    shape = (d.channels, d.height, d.width)
    rec = common_pb2.RecordProto(shape=shape, label=d.label)
    # Caffe's DataTransformer takes the bytes when there are any, else float_data
    count = len(d.data) or len(d.float_data)
    if count != d.channels * d.height * d.width or count == 0 or min(shape) <= 0:
        raise DataError(f"{path}: record '{name}' is a Datum of shape {d.channels}x{d.height}x"
                        f"{d.width} holding {count} values")
    if d.data:
        rec.pixel = d.data
    else:
        rec.data.extend(d.float_data)
    return rec.SerializeToString()


def _check_length(path):
    """Refuse an LMDB file shorter than the pages its meta page counts (a copy or a
    convert_imageset that did not finish): LMDB reads those pages from the mapped file as
    memory, and one past its end stops the process (SIGBUS). The two meta pages are read as
    LMDB 0.9 lays them out on a 64-bit machine (magic at byte 16, page size at 40, last page
    at 136, transaction at 144); anything else is left to LMDB to refuse."""
    def number(meta, at, size=8):
        return int.from_bytes(meta[at:at + size], "little")
    file = os.path.join(path, "data.mdb") if os.path.isdir(path) else path
    try:
        with open(file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            metas = [f.read(152)]
            page = number(metas[0], 40, 4)
            f.seek(page)
            metas.append(f.read(152))
    except OSError:
        return
    if any(len(m) < 152 or number(m, 16, 4) != 0xBEEFC0DE for m in metas):
        return
    newer = metas[number(metas[0], 144) < number(metas[1], 144)]     # as LMDB picks it
    need = (number(newer, 136) + 1) * page
    if size < need:
        raise DataError(f"{path}: a truncated LMDB ({size} bytes; its pages need {need})")


def _lmdb():
    try:
        import lmdb
    except ImportError:
        raise DataError("the lmdb store backend needs the lmdb package: "
                        "pip install 'singa[lmdb]'") from None
    return lmdb


def _why(e):
    return str(e).splitlines()[0] if str(e) else type(e).__name__
