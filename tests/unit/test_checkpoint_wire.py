"""checkpoint.wire's contract on random messages: `payload` is the bytes protobuf's
SerializeToString gives, and `split` reads what ParseFromString reads; what it does not frame
itself it leaves to protobuf (Unusual)."""
import numpy as np
import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from singa.checkpoint import wire
from singa.io.protowire import varint
from singa.proto import common_pb2

FLOATS = hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4),
                    elements=st.floats(width=32, allow_nan=False))
NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)
BYTES16 = st.binary(min_size=16, max_size=16)


@st.composite
def messages(draw):
    """(the whole BlobProtos, it without the values, the param arrays, the updater buffers)."""
    names = draw(st.lists(NAMES, max_size=4, unique=True))
    arrays = [draw(FLOATS) for _ in names]
    owners = draw(st.lists(st.sampled_from(names), unique=True)) if names else []
    buffers = [(name, draw(st.lists(FLOATS, max_size=2))) for name in owners]
    bare = common_pb2.BlobProtos(name=names, version=[draw(st.integers(0, 2**31 - 1))
                                                      for _ in names])
    if draw(st.booleans()):
        bare.step = draw(st.integers(0, 2**31 - 1))
        bare.lr_index = draw(st.integers(-1, 5))
        bare.nworkers = draw(st.integers(1, 8))
        bare.evaluated = draw(st.booleans())
        for key in draw(st.lists(NAMES, max_size=3)):
            bare.metric_name.append(key)
            bare.metric_value.append(draw(st.floats(width=32, allow_nan=False)))
        for key in draw(st.lists(NAMES, max_size=2)):
            bare.rng.add(name=key, bit_generator="PCG64", state=draw(BYTES16),
                         inc=draw(BYTES16), has_uint32=draw(st.integers(0, 1)),
                         uinteger=draw(st.integers(0, 2**32 - 1)))
        for key in draw(st.lists(NAMES, max_size=2)):
            bare.reader.add(name=key, offset=draw(st.integers(0, 2**63 - 1)),
                            skipped=draw(st.booleans()))
        for name in draw(st.lists(st.sampled_from(names), unique=True)) if names else []:
            bare.piece.add(name=name, axis=draw(st.integers(0, 2)), k=draw(st.integers(0, 3)),
                           parts=draw(st.integers(1, 4)))
    whole = common_pb2.BlobProtos()
    whole.CopyFrom(bare)
    for a in arrays:
        whole.blob.add(shape=a.shape, data=a.ravel().tolist())
    for name, bufs in buffers:
        ps = whole.param_state.add(name=name)
        for b in bufs:
            ps.buffer.add(shape=b.shape, data=b.ravel().tolist())
    return whole, bare, arrays, buffers


@settings(max_examples=200, deadline=None)
@given(messages())
def test_payload_is_serialize_to_string_and_split_reads_what_parse_reads(message):
    whole, bare, arrays, buffers = message
    data = b"".join(bytes(piece) for piece in wire.payload(bare, arrays, buffers))
    assert data == whole.SerializeToString()
    msg, blobs, param_state = wire.split(data)
    assert msg == bare
    assert [(shape, bytes(raw)) for shape, raw in blobs] == \
        [(a.shape, a.astype("<f4").tobytes()) for a in arrays]
    assert [(name, [(shape, bytes(raw)) for shape, raw in bufs]) for name, bufs in param_state] \
        == [(name, [(b.shape, b.astype("<f4").tobytes()) for b in bufs]) for name, bufs in buffers]
    parsed = common_pb2.BlobProtos.FromString(data)
    assert parsed == whole


@settings(max_examples=300, deadline=None)
@given(messages(), st.data())
def test_split_of_damaged_bytes_reads_what_parse_reads_or_leaves_them_to_protobuf(message, data):
    whole = message[0].SerializeToString()
    if not whole:
        return
    damaged = bytearray(whole)
    for i in data.draw(st.lists(st.integers(0, len(whole) - 1), min_size=1, max_size=3)):
        damaged[i] = data.draw(st.integers(0, 255))
    damaged = bytes(damaged[:data.draw(st.integers(0, len(damaged)))])
    try:
        msg, blobs, param_state = wire.split(damaged)
    except (wire.Unusual, DecodeError):
        return
    parsed = common_pb2.BlobProtos.FromString(damaged)
    # as bytes: damage can make a NaN, which equals nothing, not even itself
    assert [(tuple(b.shape), np.asarray(b.data, "<f4").tobytes()) for b in parsed.blob] == \
        [(shape, bytes(raw)) for shape, raw in blobs]
    parsed.ClearField("blob")
    parsed.ClearField("param_state")
    assert msg == parsed


def blob(body):
    """Field 5 (a BlobProto) holding the bytes `body`."""
    return b"\x2a" + varint(len(body)) + body


F = b"\x00\x00\x80\x3f"        # 1.0f


@pytest.mark.parametrize("data", [
    blob(b"\x15" + F),                                  # a value unpacked (fixed32)
    blob(b"\x12\x04" + F + b"\x12\x04" + F),            # the values in two packed runs
    blob(b"\x12\x03" + F[:3]),                          # packed bytes not whole floats
    blob(b"\x08\x80\x80\x80\x80\x08"),                  # a dimension of 2**31
    blob(b"\x18\x01"),                                  # a field BlobProto does not have
    blob(b"\x08" + b"\x80" * 10 + b"\x01"),              # a varint longer than 64 bits
    b"\x2a\x05\x08\x02",                                # a length past the end
    b"\x0b\x0c",                                        # a group (wire types 3 and 4)
    b"\x00\x00",                                        # field number 0
    b"\xea\x12\x02\x18\x01",                            # a ParamState field it lacks
    b"\xea\x12\x06\x0a\x01a\x0a\x01b",                  # a ParamState named twice
], ids=["unpacked", "two-runs", "partial-float", "big-dim", "unknown-field", "long-varint",
        "past-end", "group", "field-0", "param-state-field", "param-state-names"])
def test_split_leaves_encodings_we_do_not_write_to_protobuf(data):
    with pytest.raises(wire.Unusual):
        wire.split(data)
