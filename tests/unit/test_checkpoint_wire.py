"""checkpoint.wire's contract on random messages: `payload` is the bytes protobuf's
SerializeToString gives, and `split` reads what ParseFromString reads."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from singa.checkpoint import wire
from singa.proto import common_pb2

FLOATS = hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=4),
                    elements=st.floats(width=32, allow_nan=False))
NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=6)


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
