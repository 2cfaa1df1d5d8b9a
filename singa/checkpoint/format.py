"""One snapshot file: SINGA's `BlobProtos`, our checksum, crash-safe writes, checked reads
(the hand-framed values: `wire`; the `.meta` text: `meta`).

A snapshot of step N is one file per group-0 worker W,
`<workspace>/checkpoint/step<N>-worker<W>.bin` (SINGA 0.3 writes the same name without `.bin`).
Each file is one `BlobProtos`: SINGA's fields (entry i of `version`, `name`, `blob` belong
together, as Worker::Checkpoint writes them), then our additions (fields 300-308: step,
updater, RNG and reader state, LR index, worker count, test metrics, whether the step's
evaluation ran, see `state`; 309: which entries are pieces of a model-partitioned param) and
last a CRC-32 trailer (field 310): `payload + b"\\xb5\\x13" + crc32(payload)` as
little-endian uint32, payload = all bytes before it. Beside it `step<N>-worker<W>.meta` (the
`.bin` suffix replaced; `<path>.meta` for SINGA's suffix-less files) lists, as text, the
file's size and CRC, the step, one line per param
`param<TAB>name<TAB>shape<TAB>dtype<TAB>version` (shape as `64,784`) and one per piece
`piece<TAB>name<TAB>axis<TAB>k<TAB>parts`.

A file is read only after its size is checked (at most 2 GiB): `wire` locates the values
(packed floats of blobs and updater buffers) and views them in place, every length checked
against the file, and protobuf parses the rest; a file not framed as we write it goes to
protobuf whole. Every array size is checked against its shape before anything is allocated.
"""
import dataclasses
import errno
import math
import os
import re
import struct
import threading
import zlib

import numpy as np
from google.protobuf.message import DecodeError

from singa.checkpoint import state as _state
from singa.checkpoint import wire
from singa.checkpoint.meta import META_SUFFIX, SUFFIX, meta_path, meta_text, read_meta
from singa.errors import CheckpointError
from singa.files import fsync_dir, replaceable
from singa.io.protowire import FIXED32, floats, key
from singa.job.workspace import CHECKPOINT
from singa.proto import common_pb2

#: Larger files are refused before reading (SINGA itself cannot read more than 512 MiB).
MAX_FILE_BYTES = 2 << 30
_CRC_TAG = key(310, FIXED32)  # BlobProtos.crc32
_NAME_RE = re.compile(r"step(\d+)-worker(\d+)(\.bin)?")
#: Steps are int32 in JobProto and BlobProtos: a file name with a larger step is no snapshot.
MAX_STEP = 2**31 - 1


def folder(workspace):
    """`<workspace>/checkpoint`, where a job's snapshots are (the caller resolves a relative
    workspace: the conf's against the SINGA home, the Python API's and a command's argument
    against the current directory)."""
    return os.path.join(workspace, CHECKPOINT)


def snapshot_file(folder, step, worker):
    """Path of worker `worker`'s file of step `step` in `folder` (ours, with `.bin`)."""
    return os.path.join(folder, f"step{step}-worker{worker}{SUFFIX}")


def parse_step_worker(filename):
    """(step, worker) of a file name `step<N>-worker<W>` or `step<N>-worker<W>.bin`, else None.

    The whole base name must match. SINGA's rule (any name containing "step") would also pick
    `.meta` files, temporary files of an interrupted write (`.step5-worker0.bin.tmp-123`) and
    editor backups (`step5-worker0~`, `step5-worker0.bin.swp`); we ignore all of those.
    """
    m = _NAME_RE.fullmatch(os.path.basename(filename))
    return (int(m.group(1)), int(m.group(2))) if m else None


def existing_file(path):
    """`path` if it is a file, else `path.bin` (SINGA confs name our files without suffix)."""
    if os.path.isfile(path):
        return path
    if os.path.isfile(path + SUFFIX):
        return path + SUFFIX
    raise CheckpointError(f"checkpoint file not found: {path} (nor {path}{SUFFIX})")


# ---------------------------------------------------------------------------------------------
# Writing

class CheckpointWriter:
    """One snapshot file's params and state; `close()` writes `<prefix>.bin` and `<prefix>.meta`.

    Crash-safe: both files go to temporary names, are flushed and fsynced, renamed, then the
    directory is fsynced. Leaving a `with` block by an exception writes nothing. Float32
    arrays are not copied by `write`/`set_snapshot_state`: their values are read by `close()`.
    """

    def __init__(self, prefix):
        self.prefix = prefix[:-len(SUFFIX)] if prefix.endswith(SUFFIX) else prefix
        self.path = self.prefix + SUFFIX
        self._msg = common_pb2.BlobProtos()     # every field but the values (blob, param_state)
        self._arrays = []                       # entry i of blob
        self._param_state = []                  # [(name, [arrays])], field 301
        self._names = set()
        self._closed = False

    def write(self, name, array, version, piece=None):
        """Append param `name` (values as float32, row-major) with its `version`; `piece` =
        (axis, k, parts) when it is piece k of a model-partitioned param (SINGA's layout: the
        pieces share the name across the worker files; we record which piece in field 309)."""
        if name in self._names:
            raise ValueError(f"param {name} written twice to {self.path}")
        a = _float32(array)
        if piece is not None:
            axis, k, parts = piece
            if not (0 <= axis < a.ndim and 0 <= k < parts):
                raise ValueError(f"param {name} of shape {a.shape}: no piece {k} of {parts} "
                                 f"along axis {axis}")
            self._msg.piece.add(name=name, axis=axis, k=k, parts=parts)
        self._names.add(name)
        self._msg.version.append(version)
        self._msg.name.append(name)
        self._arrays.append(a)

    def set_snapshot_state(self, snap):
        """Store a `SnapshotState` in our fields (SINGA ignores them)."""
        self._param_state = [(name, [_float32(b) for b in buffers])
                             for name, buffers in _state.encode(snap, self._msg)]

    def close(self):
        """Write the binary file, then its `.meta`; returns the binary file's path."""
        if self._closed:
            return self.path
        self._closed = True
        meta = self.prefix + META_SUFFIX
        for target in (self.path, meta):
            try:
                replaceable(target)
            except OSError as e:
                raise CheckpointError(f"cannot write checkpoint {target}: {e.strerror}") from None
        tmps = [tmp_name(self.path), tmp_name(meta)]
        try:
            with open(tmps[0], "w+b") as f:
                crc, size = _write_checksummed(
                    f, wire.payload(self._msg, self._arrays, self._param_state))
                f.write(_CRC_TAG + struct.pack("<I", crc))
                f.flush()
                os.fsync(f.fileno())
            with open(tmps[1], "wb") as f:
                f.write(meta_text(self.path, self._msg, self._arrays, size + 6, crc))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmps[0], self.path)
            os.replace(tmps[1], meta)
            fsync_dir(os.path.dirname(self.path) or ".")
        except OSError as e:
            raise CheckpointError(f"cannot write checkpoint {self.path}: {e.strerror}") from None
        finally:
            for tmp in tmps:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return self.path

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        if exc_type is None:
            self.close()


def write_file(path, params, snapshot_state=None):
    """Write a snapshot file: `params` = iterable of (name, ndarray, version) or (name,
    ndarray, version, piece) with piece as in `CheckpointWriter.write`; `snapshot_state` (a
    SnapshotState) optional."""
    with CheckpointWriter(path) as w:
        for name, array, version, *piece in params:
            w.write(name, array, version, *piece)
        if snapshot_state is not None:
            w.set_snapshot_state(snapshot_state)
    return w.path


_CHUNK = 1 << 20


def _float32(array):
    return np.ascontiguousarray(array, dtype="<f4")


def _write_checksummed(f, pieces):
    """Write `pieces` to file `f` (opened for reading too), fsync it, and return (CRC-32, byte
    count) of the file's bytes.

    The CRC is computed over the bytes read back from the file (the page cache) while a helper
    thread runs the fsync (which waits on the disk, without the GIL): it matches the file even
    if another thread updated a param while it was written (servers update params in place).
    """
    for piece in pieces:
        f.write(piece)
    f.flush()
    size, fd, errors = f.tell(), f.fileno(), []

    def sync():
        try:
            os.fsync(fd)
        except OSError as e:
            errors.append(e)     # raised again by the caller's thread

    thread = threading.Thread(target=sync, name="checkpoint-fsync", daemon=True)
    thread.start()
    crc, pos, buf = 0, 0, bytearray(min(size, _CHUNK))
    try:
        while pos < size:
            n = os.preadv(fd, [buf], pos)
            if n == 0:
                raise OSError(errno.EIO, "file shorter than written")
            crc = zlib.crc32(memoryview(buf)[:n], crc)
            pos += n
    finally:
        thread.join()
    if errors:
        raise errors[0]
    return crc, size


def tmp_name(path):
    """The temporary name `path` is written under: `.<base>.tmp-<pid>` in its folder."""
    folder, base = os.path.split(path)
    return os.path.join(folder, f".{base}.tmp-{os.getpid()}")


_TMP_RE = re.compile(r"\.step\d+-worker\d+(\.bin|\.meta)?(\.meta)?\.tmp-(\d+)")


def tmp_writer(name):
    """The pid of the process writing temporary file `name` (see `tmp_name`), else None."""
    m = _TMP_RE.fullmatch(name)
    return int(m.group(3)) if m else None


# ---------------------------------------------------------------------------------------------
# Reading

class CheckpointReader:
    """One snapshot file (`path`, or `path.bin` for a prefix), parsed and verified at open;
    values become arrays on request.

    `verified` is True for our files (checksum matched) and False for SINGA's (no checksum;
    accepted when they parse and are consistent). Anything else is a CheckpointError.
    The file is read once; values are read-only views of its bytes until requested, so pass
    the reader along rather than opening the file again.
    """

    def __init__(self, path):
        self.path = existing_file(path)
        c = _load(self.path)
        self._contents = c
        self.size, self.verified = c.size, c.verified
        msg = c.msg
        sw = parse_step_worker(self.path)
        if msg.HasField("step"):
            self.step = msg.step
        else:
            self.step = sw[0] if sw else None
        self.nworkers = msg.nworkers if msg.HasField("nworkers") else None
        self.metrics = dict(zip(msg.metric_name, msg.metric_value))

    def snapshot_state(self, buffers=True):
        """The file's SnapshotState (None for SINGA's files); without its updater buffers
        (`param_state` empty) unless `buffers`."""
        c = self._contents
        if not c.msg.HasField("step"):
            return None
        return _state.decode(c.msg, {name: [_array(*b, copy=True) for b in bufs]
                                     for name, bufs in c.param_state} if buffers else {})

    def buffers(self, name):
        """Views of the updater buffers stored for param `name` ([] when none)."""
        return [_array(*b, copy=False) for n, bufs in self._contents.param_state if n == name
                for b in bufs]

    @property
    def names(self):
        return list(self._contents.msg.name)

    def meta(self):
        """[(name, shape, dtype, version)] without converting any values."""
        c = self._contents
        return [(n, shape, "float32", v)
                for n, v, (shape, _) in zip(c.msg.name, c.msg.version, c.blobs)]

    def shape(self, name):
        return self._contents.blobs[self._i(name)][0]

    def version(self, name):
        return self._contents.msg.version[self._i(name)]

    def param(self, name):
        """Values of param `name` as a new float32 array of its stored shape."""
        return _array(*self._contents.blobs[self._i(name)], copy=True)

    def view(self, name):
        """The values of param `name` without a copy (read-only for our files)."""
        return _array(*self._contents.blobs[self._i(name)], copy=False)

    def piece(self, name):
        """(axis, k, parts) when param `name` is piece k of a model-partitioned param the file
        records as such, else None (the whole param, or SINGA's files, which record nothing)."""
        return self._contents.pieces.get(name)

    def _i(self, name):
        try:
            return self._contents.index[name]
        except KeyError:
            raise CheckpointError(f"checkpoint {self.path}: no param named {name}") from None


@dataclasses.dataclass
class _Contents:
    """A parsed, checked file: `msg` has every field but the values, which are (shape, raw)
    pairs, raw = bytes of packed float32 LE or protobuf's repeated float."""
    size: int
    verified: bool
    msg: object
    blobs: list                 # entry i of msg.name
    param_state: list           # [(name, [(shape, raw)])], field 301
    index: dict                 # name -> i
    pieces: dict                # name -> (axis, k, parts), field 309


def _load(path):
    try:
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_size > MAX_FILE_BYTES:
                raise CheckpointError(f"checkpoint {path}: {st.st_size} bytes, more than the "
                                      f"{MAX_FILE_BYTES >> 30} GiB a checkpoint file may have")
            data = f.read(st.st_size)
    except OSError as e:
        raise CheckpointError(f"cannot read checkpoint {path}: {e.strerror}") from None
    if len(data) != st.st_size:
        raise CheckpointError(f"checkpoint {path}: changed while being read")
    verified, msg, blobs, param_state = _parse(path, data)
    _check_text(path, msg)
    index = _check_entries(path, msg, blobs)
    for name, buffers in param_state:
        for i, blob in enumerate(buffers):
            _check_blob(path, f"updater state {i} of {name}", *blob)
    _state.check(path, msg, {name: blobs[i][0] for name, i in index.items()},
                 [(name, [shape for shape, _ in buffers]) for name, buffers in param_state])
    return _Contents(len(data), verified, msg, blobs, param_state, index,
                     _check_pieces(path, msg, blobs, index))


def _parse(path, data):
    """(verified, msg, blobs, param_state) of file bytes `data` (see _Contents); see the
    module docstring for the trailer."""
    trailer = len(data) >= 6 and data[-6:-4] == _CRC_TAG
    crc_ok = trailer and zlib.crc32(memoryview(data)[:-6]) == struct.unpack("<I", data[-4:])[0]
    if not crc_ok:
        _diagnose_by_meta(path, len(data))
    try:
        msg, blobs, param_state = wire.split(data)
    except (wire.Unusual, DecodeError):
        msg = common_pb2.BlobProtos()
        try:
            msg.ParseFromString(data)
        except DecodeError:
            why = "bad checksum" if trailer else "not a BlobProtos message"
            raise CheckpointError(f"checkpoint {path}: {why} (truncated or corrupt)") from None
        blobs = [(tuple(b.shape), b.data) for b in msg.blob]
        param_state = [(ps.name, [(tuple(b.shape), b.data) for b in ps.buffer])
                       for ps in msg.param_state]
    if crc_ok:
        return True, msg, blobs, param_state
    if data and not (blobs or param_state or msg.ListFields()):
        raise CheckpointError(f"checkpoint {path}: no field of a checkpoint in its {len(data)} "
                              f"bytes (a file of another kind?)")
    if msg.HasField("crc32"):
        raise CheckpointError(f"checkpoint {path}: bad checksum (corrupt)")
    if param_state or any(msg.HasField(f) if f in ("step", "lr_index", "nworkers", "evaluated")
                          else len(getattr(msg, f))
                          for f in _state.FIELDS + ("piece",) if f != "param_state"):
        raise CheckpointError(f"checkpoint {path}: checksum missing (truncated)")
    return False, msg, blobs, param_state


def _diagnose_by_meta(path, size):
    """A file without a valid checksum whose .meta says it had one was torn: say how."""
    mp = meta_path(path)
    if not os.path.isfile(mp):
        return
    meta = read_meta(mp)
    if meta.get("file") != os.path.basename(path):
        return  # the meta of `step<N>-worker<W>.bin` beside SINGA's `step<N>-worker<W>`
    if "bytes" in meta and meta["bytes"] != size:
        raise CheckpointError(f"checkpoint {path}: truncated or damaged: {size} bytes, "
                              f"{os.path.basename(mp)} records {meta['bytes']}")
    if "crc32" in meta:
        raise CheckpointError(f"checkpoint {path}: bad checksum (corrupt; "
                              f"{os.path.basename(mp)} records crc32 {meta['crc32']:08x})")


def _check_text(path, msg):
    """Every string field of `msg` (and of its messages) is UTF-8 text: protobuf hands
    invalid UTF-8 over as bytes."""
    for field, value in msg.ListFields():
        for v in value if field.is_repeated else [value]:
            if field.type == field.TYPE_MESSAGE:
                _check_text(path, v)
            elif field.type == field.TYPE_STRING and not isinstance(v, str):
                raise CheckpointError(f"checkpoint {path}: {field.name} {v!r} is not UTF-8 text")


def _check_entries(path, msg, blobs):
    n = len(msg.name)
    if len(msg.version) != n or len(blobs) != n:
        raise CheckpointError(f"checkpoint {path}: {len(msg.version)} versions, {n} names and "
                              f"{len(blobs)} blobs; entries must pair up (truncated or corrupt)")
    index = {}
    for i, (name, blob) in enumerate(zip(msg.name, blobs)):
        if name in index:
            raise CheckpointError(f"checkpoint {path}: param {name} appears twice")
        index[name] = i
        _check_blob(path, f"param {name}", *blob)
    return index


def _check_blob(path, what, shape, raw):
    count = len(raw) // 4 if isinstance(raw, memoryview) else len(raw)
    if any(d < 0 for d in shape) or math.prod(shape) != count:
        raise CheckpointError(f"checkpoint {path}: {what} has shape {shape} but {count} values")


def _array(shape, raw, copy):
    """The values as a float32 array of `shape`: a read-only view of the file's bytes unless
    `copy` (protobuf's repeated floats are always converted)."""
    if isinstance(raw, memoryview):
        a = floats(raw).reshape(shape)
        return a.astype(np.float32) if copy else a
    return np.array(raw, dtype=np.float32).reshape(shape)


def _check_pieces(path, msg, blobs, index):
    """{name: (axis, k, parts)} of field 309: each names a param of the file once, with an
    axis it has and 0 <= k < parts."""
    pieces = {}
    for p in msg.piece:
        shape = blobs[index[p.name]][0] if p.name in index else None
        if shape is None or p.name in pieces or not (0 <= p.axis < len(shape) and
                                                     0 <= p.k < p.parts):
            raise CheckpointError(f"checkpoint {path}: bad partition piece record of param "
                                  f"{p.name} (piece {p.k} of {p.parts} along axis {p.axis}"
                                  f"{'' if shape is None else f', shape {shape}'})")
        pieces[p.name] = (p.axis, p.k, p.parts)
    return pieces
