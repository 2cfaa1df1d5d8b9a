"""singa.io.protowire against protobuf itself: varints and keys are the bytes protobuf writes, the
walk finds the fields protobuf parses (as unknown fields of an empty message, which keeps each
one's number, wire type and value), and damaged or truncated bytes raise WireError at once,
never another error, a read past the end or an allocation of what a length claims."""
import re
import tracemalloc

import numpy as np
import pytest
from google.protobuf import empty_pb2, unknown_fields, wrappers_pb2
from google.protobuf.internal import api_implementation
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st

from singa.io import protowire
from singa.io.protowire import (FIXED32, FIXED64, LEN, VARINT, WireError, fields, floats, int64,
                             key, prefix, read_key, read_varint, varint)
from singa.proto import caffe_pb2, common_pb2

U64 = st.integers(0, 2**64 - 1)
I64 = st.integers(-2**63, 2**63 - 1)
FLOAT32 = st.floats(width=32, allow_nan=False)


def protobuf_fields(data):
    """[(number, wire type, value or payload bytes)] of `data` as protobuf parses it."""
    msg = empty_pb2.Empty.FromString(data)
    return [(f.field_number, f.wire_type, f.data) for f in unknown_fields.UnknownFieldSet(msg)]


def walked(data):
    """protobuf_fields, by protowire.fields."""
    return [(n, w, bytes(data[s:e]) if w == LEN else v) for n, w, _, s, e, v in fields(data)]


# --- varints and keys ------------------------------------------------------------------------
@pytest.mark.parametrize("n, message", [
    (0, lambda value: caffe_pb2.BlobProto(num=value)),      # proto3 (the wrappers) omits a 0
    (1, wrappers_pb2.UInt64Value),
    (127, wrappers_pb2.UInt64Value), (128, wrappers_pb2.UInt64Value),
    (300, wrappers_pb2.UInt64Value), (2**32 - 1, wrappers_pb2.UInt32Value),
    (2**63 - 1, wrappers_pb2.Int64Value), (2**64 - 1, wrappers_pb2.UInt64Value),
    (-1, wrappers_pb2.Int32Value), (-2**31, wrappers_pb2.Int32Value),
    (-1, wrappers_pb2.Int64Value), (-2**63, wrappers_pb2.Int64Value),
])
def test_varint_of_edge_values_is_what_protobuf_writes_and_reads_back(n, message):
    data = message(value=n).SerializeToString()
    assert data == b"\x08" + varint(n)
    if n < 0:
        assert len(varint(n)) == 10         # a negative int32 too: sign-extended to 64 bits
    value, end = read_varint(data, 1)
    assert end == len(data) and value == n % 2**64 and int64(value) == (n if n < 2**63 else
                                                                        n - 2**64)


@given(st.one_of(U64, I64))
def test_varint_round_trips_as_protobuf_writes_it(n):
    message = wrappers_pb2.Int64Value if n < 0 else wrappers_pb2.UInt64Value
    assert b"\x08" + varint(n) == (message(value=n).SerializeToString() or b"\x08\x00")
    assert read_varint(varint(n)) == (n % 2**64, len(varint(n)))


@pytest.mark.parametrize("n", [-2**63 - 1, 2**64])
def test_varint_refuses_what_is_no_int64_or_uint64(n):
    with pytest.raises(ValueError):
        varint(n)


@given(st.integers(1, protowire.MAX_FIELD), st.sampled_from([VARINT, FIXED64, LEN, FIXED32]))
def test_keys_are_what_protobuf_reads(number, wire_type):
    body = {VARINT: b"\x05", FIXED64: bytes(8), LEN: b"\x01x", FIXED32: bytes(4)}[wire_type]
    data = key(number, wire_type) + body
    assert [f[:2] for f in protobuf_fields(data)] == [(number, wire_type)]
    assert read_key(data) == (number, wire_type, len(key(number, wire_type)))


def test_known_keys_and_prefixes():
    assert key(5, LEN) == b"\x2a" and key(310, FIXED32) == b"\xb5\x13"
    assert prefix(100, 300) == b"\xa2\x06\xac\x02"          # NetParameter.layer of 300 bytes
    for number, wire_type in [(0, VARINT), (2**29, VARINT), (1, 6)]:
        with pytest.raises(ValueError):
            key(number, wire_type)


# --- the walk against protobuf ---------------------------------------------------------------
@st.composite
def blob_protos(draw):
    """A BlobProtos with names, versions (negative ones too), blobs of packed floats, a step
    and a fixed32 (crc32): the fields of a snapshot file."""
    names = draw(st.lists(st.text(max_size=5), max_size=4))
    msg = common_pb2.BlobProtos(name=names)
    for _ in names:
        msg.version.append(draw(st.integers(-2**31, 2**31 - 1)))
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        msg.blob.add(shape=shape, data=draw(st.lists(FLOAT32, min_size=int(np.prod(shape)),
                                                     max_size=int(np.prod(shape)))))
    if draw(st.booleans()):
        msg.step = draw(st.integers(0, 2**31 - 1))
        msg.crc32 = draw(st.integers(0, 2**32 - 1))
    return msg


def caffe_net():
    """A NetParameter with V2 layers holding blobs of `shape` (packed int64 dims) and packed
    float and double values, and a V1 layer with legacy dims."""
    net = caffe_pb2.NetParameter(name="net")
    ip = net.layer.add(name="ip", type="InnerProduct", bottom=["data"], top=["ip"])
    ip.blobs.add(shape=caffe_pb2.BlobShape(dim=[3, 4]), data=np.arange(12) / 7)
    ip.blobs.add(shape=caffe_pb2.BlobShape(dim=[3]), double_data=[0.5, -1, 1e300])
    ip.param.add(lr_mult=2)
    v1 = net.layers.add(name="old")
    v1.blobs.add(num=-1, channels=1, height=2, width=1, data=[1.5, -2.5])
    return net


@settings(max_examples=200, deadline=None)
@given(blob_protos())
def test_walk_finds_the_fields_protobuf_parses_with_their_values(msg):
    data = msg.SerializeToString()
    assert walked(data) == protobuf_fields(data)
    names, versions, blobs = [], [], []
    for number, wire_type, _, s, e, value in fields(data):
        if number == 3:
            versions.append(int64(value))
        elif number == 4:
            names.append(data[s:e].decode())
        elif number == 5:
            shape, values = [], np.zeros(0, np.float32)
            for n, w, _, bs, be, v in fields(data, s, e):
                if n == 1:
                    shape.append(v)
                else:
                    assert (n, w) == (2, LEN)
                    values = floats(data, bs, be)
                    assert np.shares_memory(values, np.frombuffer(data, np.uint8))   # no copy
            blobs.append((shape, values.tobytes()))
        elif number == 310:
            assert (wire_type, value) == (FIXED32, msg.crc32)
    assert names == list(msg.name) and versions == list(msg.version)
    assert blobs == [(list(b.shape), np.float32(b.data).tobytes()) for b in msg.blob]


def payloads(data, number, span=None):
    """[(start, end)] of the length-delimited fields `number` of the message data[span]."""
    return [(s, e) for n, w, _, s, e, _ in fields(data, *(span or ())) if (n, w) == (number, LEN)]


def test_walk_of_a_caffe_net_reads_what_protobuf_parses():
    net = caffe_net()
    data = net.SerializeToString()
    assert walked(data) == protobuf_fields(data)
    layer, = payloads(data, 100)
    name, = payloads(data, 1, layer)
    assert data[slice(*name)] == b"ip"
    found = []
    for blob in payloads(data, 7, layer):
        shape_msg, = payloads(data, 7, blob)
        (start, end), = payloads(data, 1, shape_msg)        # BlobShape.dim, packed varints
        shape, pos = [], start
        while pos < end:
            d, pos = read_varint(data, pos, end)
            shape.append(d)
        single, double = payloads(data, 5, blob), payloads(data, 8, blob)
        values = floats(data, *single[0]) if single else floats(data, *double[0], dtype="<f8")
        found.append((shape, values.tolist()))
    assert found == [(list(b.shape.dim), list(b.data or b.double_data))
                     for b in net.layer[0].blobs]
    v1, = payloads(data, 2)
    blob, = payloads(data, 6, v1)
    legacy = {n: int64(v) for n, w, _, _, _, v in fields(data, *blob) if w == VARINT}
    assert legacy == {1: -1, 2: 1, 3: 2, 4: 1}


# --- damaged and truncated bytes -------------------------------------------------------------
class Guarded:
    """Bytes that fail a test when read at or past `end` (a walk of data[:end] that reads on
    would find valid bytes there)."""

    def __init__(self, data, end):
        self.data, self.end = data, end

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        last = i.stop - 1 if isinstance(i, slice) else i
        assert last < self.end, f"read byte {last} of a walk that ends at {self.end}"
        return self.data[i]


def walk_all(data, start, end):
    """Walk data[start:end] and, as far as they walk, the messages inside its LEN fields."""
    for _, wire_type, _, s, e, _ in fields(data, start, end):
        if wire_type == LEN:
            try:
                walk_all(data, s, e)
            except WireError:
                pass        # a string or packed values, not a message


@pytest.mark.parametrize("message", [common_pb2.BlobProtos(
    name=["w", "b"], version=[3, -4], step=7, crc32=1,
    blob=[common_pb2.BlobProto(shape=[2, 3], data=range(6)), common_pb2.BlobProto(shape=[2])],
    param_state=[common_pb2.ParamState(name="w", buffer=[common_pb2.BlobProto(data=[1])])]),
    caffe_net()], ids=["BlobProtos", "NetParameter"])
def test_every_truncation_walks_or_raises_wire_error_without_reading_past_its_end(message):
    data = message.SerializeToString()
    for cut in range(len(data) + 1):
        try:
            walk_all(Guarded(data, cut), 0, cut)
        except WireError as e:
            assert 0 <= e.pos <= cut and "\n" not in str(e)
            with pytest.raises(DecodeError):
                type(message).FromString(data[:cut])


@pytest.mark.skipif(api_implementation.Type() != "upb", reason="the rules are upb's (the default)")
@settings(max_examples=500, deadline=None)
@given(st.one_of(st.binary(max_size=40), blob_protos().map(lambda m: m.SerializeToString())),
       st.data())
def test_damaged_bytes_walk_as_protobuf_parses_them_or_raise_wire_error(data, draw):
    damaged = bytearray(data)
    for i in draw.draw(st.lists(st.integers(0, len(data) - 1), max_size=3) if data else
                       st.just([])):
        damaged[i] = draw.draw(st.integers(0, 255))
    damaged = bytes(damaged)
    try:
        ours = walked(damaged)
    except WireError as e:
        try:
            protobuf_fields(damaged)
        except DecodeError:
            return
        if "field number 0" in str(e):
            # upb keeps field 0 among an empty message's unknown fields but refuses it in a
            # message that has fields, as we do
            with pytest.raises(DecodeError):
                wrappers_pb2.UInt64Value.FromString(damaged)
        else:
            assert "(a group)" in str(e)     # protobuf walks groups; no message of ours has one
        return
    assert ours == protobuf_fields(damaged)


@pytest.mark.parametrize("data, error", [
    (b"\x0a" + varint(2**60), "longer than 5 bytes"),          # a length of 2**60
    (b"\x0a" + varint(2**32 - 1) + b"xyz", "claims 4294967295 bytes, 3 remain"),
    (b"\x0a\x80\x80\x80\x80\x10", "2**32 or more"),          # a length of 2**32
    (b"\x08" + b"\xff" * 10 + b"\x01", "longer than 10 bytes"),
    (b"\x08\xff", "runs past the end"),
    (b"\x80", "runs past the end"),
    (b"\x00\x01", "field number 0"),
    (b"\x0d\x00\x00\x80", "needs 4 bytes, 3 remain"),
    (b"\x0b\x0c", "(a group)"),
    (b"\x0e", "wire type 6"),
])
def test_malformed_bytes_raise_wire_error_at_once(data, error):
    tracemalloc.start()
    try:
        with pytest.raises(WireError, match=re.escape(error)):
            list(fields(data))
        assert tracemalloc.get_traced_memory()[1] < 1 << 16     # nothing the length claims
    finally:
        tracemalloc.stop()


def test_floats_view_packed_values_in_place_and_refuse_partial_ones():
    data = bytearray(b"\x0a\x08" + np.float32([1.5, -2]).tobytes())
    a = floats(data, 2)
    assert a.dtype == np.dtype("<f4") and a.tolist() == [1.5, -2]
    data[2:6] = np.float32([4]).tobytes()
    assert a[0] == 4                                    # a view, not a copy
    assert floats(b"", 0).size == 0
    with pytest.raises(WireError, match="7 bytes at byte 2"):
        floats(data, 2, 9)


def test_walk_refuses_bounds_outside_the_bytes():
    with pytest.raises(ValueError):
        list(fields(b"\x08\x01", 0, 3))
