"""Decode store values (RecordProto of 0.2/0.3, 0.1 Record{image}) into float32 (src/io/)."""
import numpy as np
from google.protobuf.message import DecodeError

from singa.errors import DataError
from singa.proto import common_pb2

__all__ = ["record_values", "decode_batch", "parse_record"]


def record_values(value, shape, key=b""):
    """(x float32 of `shape`, label) from one store value.

    x = data if the record has floats, else its pixel bytes as uint8; the element count must
    equal prod(shape).
    """
    shape = tuple(shape)
    x = np.empty(shape, np.float32)
    labels = np.empty(1, np.int32)
    decode_batch([value], x.size, [key], out=x.reshape(1, -1), labels_out=labels, shape=shape)
    return x, int(labels[0])


def decode_batch(values, dim, keys=None, out=None, labels_out=None, shape=None):
    """(x float32 (N, dim), labels int32 (N,)) from N store values.

    `out` / `labels_out` are filled in place when given (the input layer's preallocated blobs).
    `keys` and `shape` only make error messages precise.
    """
    n = len(values)
    x = np.empty((n, dim), np.float32) if out is None else out
    labels = np.empty(n, np.int32) if labels_out is None else labels_out
    rec = common_pb2.RecordProto()
    for i, value in enumerate(values):
        parse_record(value, _key(keys, i), rec)
        count = len(rec.data) if rec.data else len(rec.pixel)
        if count != dim:
            want = f"{dim} (shape {list(shape)})" if shape else f"{dim}"
            raise DataError(f"record {_key(keys, i)!r} has {count} values, expected {want}")
        if rec.data:
            x[i] = rec.data
        else:
            x[i] = np.frombuffer(rec.pixel, np.uint8)
        labels[i] = rec.label
    return x, labels


def parse_record(value, key="", rec=None):
    """The RecordProto of a store value: a 0.2/0.3 RecordProto or a 0.1 Record{image}; fills
    and returns `rec` when given (reused by batch readers)."""
    rec = common_pb2.RecordProto() if rec is None else rec
    try:
        rec.ParseFromString(value)
        if not rec.pixel and not rec.data:
            # A 0.1 shard wraps the record: Record{type, image = SingleLabelImageRecord}.
            wrapper = common_pb2.Record.FromString(value)
            if wrapper.HasField("image"):
                rec.CopyFrom(wrapper.image)
    except DecodeError:
        raise DataError(f"record {key!r} is not a RecordProto ({len(value)} bytes)") from None
    return rec


def _key(keys, i):
    key = keys[i] if keys is not None else b""
    return key.decode(errors="backslashreplace") if isinstance(key, bytes) else str(key)
