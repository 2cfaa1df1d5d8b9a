"""A snapshot file's BlobProtos on the wire, by hand where the values are: protobuf encodes
packed floats one by one and parses them into Python lists, so blobs (field 5) and updater
buffers (field 301) are framed and located here, as views of the arrays and of the file's
bytes; every other field goes through protobuf.

Contract (tests/unit/test_checkpoint_wire.py): `payload` gives the bytes of
`SerializeToString()` of the whole message, and `split` the message `ParseFromString()` gives;
bytes encoded otherwise than protobuf and SINGA write them raise `Unusual` (the caller then
leaves them to protobuf).
"""
from singa.proto import common_pb2

BLOB_TAG = b"\x2a"                 # BlobProtos.blob, field 5, length-delimited
BUFFER_TAG = b"\x12"               # ParamState.buffer, field 2, length-delimited
PARAM_STATE_TAG = b"\xea\x12"      # BlobProtos.param_state, field 301, length-delimited


def payload(msg, arrays, param_state):
    """The BlobProtos `msg` (every field but the values) with the param values `arrays` (entry
    i of blob) and the updater buffers `param_state` ([(name, [arrays])], field 301), as
    bytes-like pieces, the values as views of the arrays.

    The same bytes as `SerializeToString` of the whole message, which orders fields by
    number: 3 and 4 (versions, names), 5 (blobs), 300, 301 (updater state), 302-309. The
    parts without values are serialized by protobuf; blobs and ParamStates are framed by
    hand (field tag, length varint) because protobuf encodes packed floats one by one.
    """
    m = msg
    yield common_pb2.BlobProtos(version=m.version, name=m.name).SerializeToString()
    for a in arrays:
        yield from blob_pieces(BLOB_TAG, a)
    if m.HasField("step"):
        yield common_pb2.BlobProtos(step=m.step).SerializeToString()
    for name, buffers in param_state:
        head = common_pb2.ParamState(name=name).SerializeToString()
        blobs = [list(blob_pieces(BUFFER_TAG, b)) for b in buffers]
        size = len(head) + sum(len(p) if isinstance(p, bytes) else p.nbytes
                               for pieces in blobs for p in pieces)
        yield PARAM_STATE_TAG + varint(size) + head
        for pieces in blobs:
            yield from pieces
    rest = common_pb2.BlobProtos()
    rest.CopyFrom(m)
    for field in ("version", "name", "step"):
        rest.ClearField(field)
    yield rest.SerializeToString()


def blob_pieces(tag, a):
    """A BlobProto as a field `tag`: tag, length, shape varints (field 1), then the values
    packed (field 2: 0x12, byte count, float32 LE) as a view of `a`, omitted when empty."""
    head = b"".join(b"\x08" + varint(d) for d in a.shape)
    if a.size:
        head += b"\x12" + varint(a.nbytes)
    yield tag + varint(len(head) + a.nbytes) + head
    if a.size:
        yield memoryview(a.reshape(-1)).cast("B")


def varint(n):
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


class Unusual(Exception):
    """Bytes that `split` leaves to protobuf: malformed, or encoded otherwise than SINGA and
    we write (groups, unpacked or split values, unknown blob fields)."""


def split(data):
    """Parse `data` without copying values: blobs (field 5) and ParamStates (field 301) by
    hand, every other field by protobuf. Raises Unusual or DecodeError."""
    mv = memoryview(data)
    rest, blobs, param_state = [], [], []
    for field, wire, start, value, end in _fields(data, 0, len(data)):
        if field == 5 and wire == 2:
            blobs.append(_blob(data, mv, value, end))
        elif field == 301 and wire == 2:
            param_state.append(_param_state(data, mv, value, end))
        else:
            rest.append(mv[start:end])
    return common_pb2.BlobProtos.FromString(b"".join(rest)), blobs, param_state


def _blob(data, mv, start, end):
    """(shape, raw values) of the BlobProto in data[start:end]."""
    shape, raw = [], mv[start:start]
    for field, wire, _, value, stop in _fields(data, start, end):
        if field == 1 and wire == 0:
            d = _varint_at(data, value, stop)[0]
            if d >= 1 << 31:
                raise Unusual()
            shape.append(d)
        elif field == 2 and wire == 2 and not raw and (stop - value) % 4 == 0:
            raw = mv[value:stop]
        else:
            raise Unusual()
    return tuple(shape), raw


def _param_state(data, mv, start, end):
    """(name, [(shape, raw)]) of the ParamState in data[start:end]."""
    name, buffers = None, []
    for field, wire, first, value, stop in _fields(data, start, end):
        if field == 1 and wire == 2 and name is None:
            name = common_pb2.ParamState.FromString(bytes(mv[first:stop])).name
        elif field == 2 and wire == 2:
            buffers.append(_blob(data, mv, value, stop))
        else:
            raise Unusual()
    return name or "", buffers


def _fields(data, pos, end):
    """Yield (field, wire type, field start, value start, value end) of data[pos:end]."""
    while pos < end:
        key, value = _varint_at(data, pos, end)
        wire = key & 7
        if wire == 0:
            stop = _varint_at(data, value, end)[1]
        elif wire == 2:
            n, value = _varint_at(data, value, end)
            stop = value + n
        elif wire in (1, 5):
            stop = value + (8 if wire == 1 else 4)
        else:
            raise Unusual()
        if stop > end or key >> 3 == 0:
            raise Unusual()
        yield key >> 3, wire, pos, value, stop
        pos = stop


def _varint_at(data, pos, end):
    """(value, position after it) of the varint at data[pos]."""
    value = shift = 0
    while pos < end and shift < 64:
        b = data[pos]
        value |= (b & 0x7F) << shift
        pos += 1
        if b < 0x80:
            return value, pos
        shift += 7
    raise Unusual()
