"""A snapshot file's BlobProtos on the wire, by hand where the values are: protobuf encodes
packed floats one by one and parses them into Python lists, so blobs (field 5) and updater
buffers (field 301) are framed and located here (with `singa.io.protowire`), as views of the
arrays and of the file's bytes; every other field goes through protobuf.

Contract (tests/unit/test_checkpoint_wire.py): `payload` gives the bytes of
`SerializeToString()` of the whole message, and `split` the message `ParseFromString()` gives;
bytes encoded otherwise than protobuf and SINGA write them raise `Unusual` (the caller then
leaves them to protobuf).
"""
from singa.io.protowire import LEN, VARINT, WireError, fields, key, varint
from singa.proto import common_pb2

BLOB, BUFFER, PARAM_STATE = 5, 2, 301   # BlobProtos.blob, ParamState.buffer, .param_state
SHAPE, DATA = 1, 2                      # BlobProto.shape (varints), .data (packed floats)
# the keys once: each param's blob is framed with them
_BLOB_KEY, _BUFFER_KEY, _STATE_KEY = key(BLOB, LEN), key(BUFFER, LEN), key(PARAM_STATE, LEN)
_SHAPE_KEY, _DATA_KEY = key(SHAPE, VARINT), key(DATA, LEN)


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
        yield from blob_pieces(_BLOB_KEY, a)
    if m.HasField("step"):
        yield common_pb2.BlobProtos(step=m.step).SerializeToString()
    for name, buffers in param_state:
        head = common_pb2.ParamState(name=name).SerializeToString()
        blobs = [list(blob_pieces(_BUFFER_KEY, b)) for b in buffers]
        size = len(head) + sum(len(p) if isinstance(p, bytes) else p.nbytes
                               for pieces in blobs for p in pieces)
        yield _STATE_KEY + varint(size) + head
        for pieces in blobs:
            yield from pieces
    rest = common_pb2.BlobProtos()
    rest.CopyFrom(m)
    for field in ("version", "name", "step"):
        rest.ClearField(field)
    yield rest.SerializeToString()


def blob_pieces(field_key, a):
    """A BlobProto as the field of `field_key`: key, length, shape varints (field 1), then the
    values packed (field 2: key, byte count, float32 LE) as a view of `a`, omitted when
    empty."""
    head = b"".join(_SHAPE_KEY + varint(d) for d in a.shape)
    if a.size:
        head += _DATA_KEY + varint(a.nbytes)
    yield field_key + varint(len(head) + a.nbytes) + head
    if a.size:
        yield memoryview(a.reshape(-1)).cast("B")


class Unusual(Exception):
    """Bytes that `split` leaves to protobuf: malformed, or encoded otherwise than SINGA and
    we write (groups, unpacked or split values, unknown blob fields)."""


def split(data):
    """Parse `data` without copying values: blobs (field 5) and ParamStates (field 301) by
    hand, every other field by protobuf. Raises Unusual or DecodeError."""
    mv = memoryview(data)
    rest, blobs, param_state = [], [], []
    try:
        for number, wire, tag, start, end, _ in fields(data):
            if number == BLOB and wire == LEN:
                blobs.append(_blob(data, mv, start, end))
            elif number == PARAM_STATE and wire == LEN:
                param_state.append(_param_state(data, mv, start, end))
            else:
                rest.append(mv[tag:end])
    except WireError:
        raise Unusual() from None
    return common_pb2.BlobProtos.FromString(b"".join(rest)), blobs, param_state


def _blob(data, mv, start, end):
    """(shape, raw values) of the BlobProto in data[start:end]."""
    shape, raw = [], mv[start:start]
    for number, wire, _, s, e, value in fields(data, start, end):
        if number == SHAPE and wire == VARINT and value < 1 << 31:
            shape.append(value)
        elif number == DATA and wire == LEN and not raw and (e - s) % 4 == 0:
            raw = mv[s:e]
        else:
            raise Unusual()
    return tuple(shape), raw


def _param_state(data, mv, start, end):
    """(name, [(shape, raw)]) of the ParamState in data[start:end]."""
    name, buffers = None, []
    for number, wire, tag, s, e, _ in fields(data, start, end):
        if number == 1 and wire == LEN and name is None:
            name = common_pb2.ParamState.FromString(bytes(mv[tag:e])).name
        elif number == BUFFER and wire == LEN:
            buffers.append(_blob(data, mv, s, e))
        else:
            raise Unusual()
    return name or "", buffers
