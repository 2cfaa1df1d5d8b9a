"""Caffe's binary files read in place: a `.caffemodel` (NetParameter), a `.solverstate`
(SolverState) and a mean `.binaryproto` (BlobProto), walked through mmap.

A VGG-16 `.caffemodel` is 553 MB of packed floats in the `blobs` of a few layers. Parsing it
with protobuf would hold the file, the parsed message and Python's copies at once; instead
we walk the wire format by hand: each layer's blobs become float32 arrays that are views of the
mapped file (no copy; `double_data` is converted), and the layer's other fields (a few hundred
bytes) are parsed with `caffe_pb2` once its blobs are cut out. Every length is checked against
the message that holds it before anything is read (`singa.io.protowire`).
"""
import math
import mmap
import os
from dataclasses import dataclass

import numpy as np
from google.protobuf.message import DecodeError

from singa.errors import DataError
from singa.io import protowire
from singa.io.protowire import FIXED32, FIXED64, LEN, VARINT, WireError
from singa.proto import caffe_pb2

__all__ = ["Blob", "CaffeFile", "read_blob_file"]

# field numbers of caffe.proto holding blobs
_NET_LAYER, _NET_LAYERS = 100, 2           # NetParameter.layer (V2), .layers (V1)
_V2_BLOBS, _V1_BLOBS, _V1_V0, _V0_BLOBS = 7, 6, 1, 50
_STATE_HISTORY = 3                         # SolverState.history


@dataclass
class Blob:
    """One BlobProto: `values` (float32, flat), `shape` (from `shape`, else the legacy
    num/channels/height/width, or (count,) when it has neither) and whether the shape is the
    legacy 4-D one (old files pad an InnerProduct weight (N, K) to 1x1xNxK)."""
    values: np.ndarray
    shape: tuple
    legacy: bool


class CaffeFile:
    """A Caffe binary file mapped read-only; its arrays are views of the mapping, valid until
    `close()` (use it as a context manager).

    `net()`: the NetParameter of a `.caffemodel` without blobs, and {layer name: [Blob]}
    (a later layer of the same name wins, as in Caffe's CopyTrainedLayersFrom).
    `solver_state()`: the SolverState without history, and the history as [Blob].
    """

    def __init__(self, path):
        self.path = path
        try:
            with open(path, "rb") as f:
                size = os.fstat(f.fileno()).st_size
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        except OSError as e:
            raise DataError(f"cannot read {path}: {e.strerror}") from None
        except ValueError:      # a NUL byte in the name
            raise DataError(f"cannot read {path!r}: not a file name") from None
        self._views = []
        if self._mm[:4] == b"\x89HDF":
            self.close()
            raise DataError(f"{path}: an HDF5 snapshot (snapshot_format: HDF5); import the "
                            f"BINARYPROTO format (Caffe's default)")

    def close(self):
        if isinstance(self._mm, mmap.mmap):
            del self._views[:]
            try:
                self._mm.close()
            except BufferError:     # an array still refers to it: the mapping goes with it
                pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def net(self):
        """(NetParameter without blobs, {layer name: [Blob]}) of a `.caffemodel`."""
        header, blobs = bytearray(), {}
        for field, wt, tag, start, end, _ in self._fields(0, len(self._mm), "NetParameter"):
            if wt == LEN and field in (_NET_LAYER, _NET_LAYERS):
                v1 = field == _NET_LAYERS
                rest, found = self._layer(start, end, v1)
                msg = self._parse(caffe_pb2.V1LayerParameter if v1 else caffe_pb2.LayerParameter,
                                  rest, "a layer")
                name = msg.layer.name if v1 and msg.HasField("layer") and not msg.name \
                    else msg.name
                if found:
                    blobs[name] = found
                header += protowire.prefix(field, len(rest)) + rest
            else:
                header += self._mm[tag:end]
        return self._parse(caffe_pb2.NetParameter, header, "a NetParameter"), blobs

    def solver_state(self):
        """(SolverState without history, [Blob] of the history) of a `.solverstate`."""
        rest, history = bytearray(), []
        for field, wt, tag, start, end, _ in self._fields(0, len(self._mm), "SolverState"):
            if field == _STATE_HISTORY and wt == LEN:
                history.append(self._blob(start, end))
            else:
                rest += self._mm[tag:end]
        return self._parse(caffe_pb2.SolverState, rest, "a SolverState"), history

    # --- the walk ---------------------------------------------------------------------------
    def _layer(self, start, end, v1):
        """(the layer's bytes without blobs, [Blob]); a V1 layer's nested V0 layer too."""
        rest, found = bytearray(), []
        blobs_field = _V1_BLOBS if v1 else _V2_BLOBS
        for field, wt, tag, s, e, _ in self._fields(start, end, "a layer"):
            if wt == LEN and field == blobs_field:
                found.append(self._blob(s, e))
            elif v1 and wt == LEN and field == _V1_V0:
                inner = bytearray()
                for f0, wt0, tag0, s0, e0, _ in self._fields(s, e, "a V0 layer"):
                    if wt0 == LEN and f0 == _V0_BLOBS:
                        found.append(self._blob(s0, e0))
                    else:
                        inner += self._mm[tag0:e0]
                rest += protowire.prefix(_V1_V0, len(inner)) + inner
            else:
                rest += self._mm[tag:e]
        return bytes(rest), found

    def _blob(self, start, end):
        """A BlobProto at [start, end): values viewed in place where packed float32; values
        that are not finite, or not as many as the shape holds, are a DataError."""
        shape, legacy, parts, doubles = None, [0, 0, 0, 0], [], []
        for field, wt, _, s, e, value in self._fields(start, end, "a blob"):
            if field == 7 and wt == LEN:
                shape = tuple(self._parse(caffe_pb2.BlobShape, self._mm[s:e], "a blob shape").dim)
            elif field in (1, 2, 3, 4) and wt == VARINT:
                legacy[field - 1] = protowire.int64(value)
            elif field == 5 and wt == LEN:
                parts.append(self._floats(s, e, "<f4"))
            elif field == 5 and wt == FIXED32:      # one value unpacked: copied, not viewed
                parts.append(protowire.floats(self._mm[s:e]))
            elif field == 8 and wt == LEN:
                doubles.append(self._floats(s, e, "<f8"))
            elif field == 8 and wt == FIXED64:
                doubles.append(protowire.floats(self._mm[s:e], dtype="<f8"))
        if parts and doubles:
            raise DataError(f"{self.path}: a blob holds both data and double_data")
        if doubles:
            with np.errstate(over="ignore"):    # beyond float32: inf, refused below
                values = np.concatenate(doubles).astype(np.float32)
        elif len(parts) == 1:
            values = parts[0]
        else:
            values = np.concatenate(parts).astype(np.float32) if parts else \
                np.zeros(0, np.float32)
        is_legacy = shape is None and any(legacy)
        if shape is None:
            shape = tuple(legacy) if is_legacy else (values.size,)
        what = f"{self.path}: a blob of shape {'x'.join(map(str, shape)) or '()'}"
        if any(d < 0 for d in shape) or math.prod(shape) != values.size:
            raise DataError(f"{what} holds {values.size} values")
        if values.size and not (np.isfinite(values.min()) and np.isfinite(values.max())):
            raise DataError(f"{what} holds nan or inf values")
        return Blob(values, shape, is_legacy)

    def _floats(self, start, end, dtype):
        try:
            a = protowire.floats(self._mm, start, end, dtype)
        except WireError as e:
            raise DataError(f"{self.path}: {e} (truncated or corrupt)") from None
        self._views.append(a)
        return a

    def _fields(self, start, end, what):
        """protowire.fields of `what` in [start, end), malformed bytes a DataError."""
        try:
            yield from protowire.fields(self._mm, start, end)
        except WireError as e:
            raise DataError(f"{self.path}: not a Caffe binary file ({what}: {e}; truncated or "
                            f"corrupt)") from None

    def _parse(self, cls, data, what):
        try:
            return cls.FromString(bytes(data))
        except DecodeError:
            raise DataError(f"{self.path}: {what} does not parse (truncated or corrupt)") from None


def read_blob_file(path):
    """The Blob of a `.binaryproto` file (a mean image), its values copied."""
    with CaffeFile(path) as f:
        blob = f._blob(0, len(f._mm))
        return Blob(np.array(blob.values, np.float32), blob.shape, blob.legacy)
