"""Record decoding: RecordProto data/pixel, 0.1 Record wrapper, SINGA's shards, count checks;
regression targets in the records we write."""
import os
import numpy as np
import pytest

from singa.errors import ConfigError, DataError
from singa.io.kvfile import KVFile
from singa.io.records import (Sample, decode_batch, encode_record, holds_targets,
                              parse_record, record_values, targets_of, uniform_pixels,
                              write_records)
from singa.proto import common_pb2

FIXTURES = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "fixtures", "singa-0.3"))


def _rec(**kw):
    return common_pb2.RecordProto(**kw).SerializeToString()


def test_singa_record_input_layer_records():
    # The three records of SINGA's test_record_input_layer.cc.
    values = [_rec(data=[3.2, 1, 14.1], label=12), _rec(data=[0.2, 0, 1.1], label=2),
              _rec(data=[2.2, 1, 4.1], label=1)]
    x, labels = decode_batch(values, 3)
    np.testing.assert_array_equal(
        x, np.array([[3.2, 1, 14.1], [0.2, 0, 1.1], [2.2, 1, 4.1]], np.float32))
    assert x.dtype == np.float32 and labels.tolist() == [12, 2, 1]


def test_pixels_are_unsigned_bytes_and_fill_preallocated_out():
    out = np.full((2, 4), -1, np.float32)
    labels = np.zeros(2, np.int32)
    x, lab = decode_batch([_rec(pixel=bytes([0, 128, 255, 7]), label=3),
                           _rec(pixel=bytes([1, 2, 3, 4]))], 4, out=out, labels_out=labels)
    assert x is out and lab is labels
    assert out.tolist() == [[0, 128, 255, 7], [1, 2, 3, 4]] and labels.tolist() == [3, 0]


def test_record_values_reshapes_and_reads_v01_wrapper():
    inner = common_pb2.RecordProto(shape=[2, 2], label=5, pixel=bytes([9, 8, 7, 6]))
    wrapped = common_pb2.Record(type=0, image=inner).SerializeToString()
    x, label = record_values(wrapped, (1, 2, 2))
    assert x.shape == (1, 2, 2) and label == 5 and x.ravel().tolist() == [9, 8, 7, 6]


def test_count_mismatch_names_count_shape_and_key():
    msg = r"'00000007' has 3 values, expected 784 \(shape \[1, 28, 28\]\)"
    with pytest.raises(DataError, match=msg):
        record_values(_rec(data=[1, 2, 3]), (1, 28, 28), key=b"00000007")


def test_garbage_value_names_key():
    with pytest.raises(DataError, match="record 'k9' is not a RecordProto"):
        decode_batch([b"\xff\xff\xff"], 3, [b"k9"])


def test_decodes_singa_fashion_mnist_shard():
    with KVFile(f"{FIXTURES}/train-1000.bin") as f:
        keys, values = zip(*f)
    x, labels = decode_batch(list(values), 784, keys)
    assert x.shape == (1000, 784) and x.dtype == np.float32
    assert 0 <= x.min() and x.max() == 255 and x.mean() > 10
    assert set(labels.tolist()) == set(range(10))
    shape = common_pb2.RecordProto.FromString(values[0]).shape
    assert list(shape) == [28, 28]


def _mixed_batch():
    """Pixel, float and 0.1-wrapped records of 4 values each, with their keys."""
    wrapped = common_pb2.Record(type=0, image=common_pb2.RecordProto(
        label=7, pixel=bytes([4, 3, 2, 1]))).SerializeToString()
    values = [_rec(pixel=bytes([0, 128, 255, 7]), label=3), _rec(data=[0.5, -1, 2, 1e9], label=1),
              wrapped, _rec(pixel=bytes([9, 9, 9, 9]), data=[1, 2, 3, 4], label=-2)]
    return [b"k%d" % i for i in range(len(values))], values


#: what each record of _mixed_batch decodes to: its float data, else its pixel bytes
MIXED_X = [[0, 128, 255, 7], [0.5, -1, 2, 1e9], [4, 3, 2, 1], [1, 2, 3, 4]]
MIXED_LABELS = [3, 1, 7, -2]


@pytest.mark.parametrize("pick", [[0], [0, 0, 0], [1, 3], [3, 3], [0, 1, 2, 3], [2, 0]])
def test_a_batch_decodes_as_its_records_one_by_one(pick):
    keys, values = _mixed_batch()
    x, labels = decode_batch([values[i] for i in pick], 4, [keys[i] for i in pick])
    np.testing.assert_array_equal(x, np.array([MIXED_X[i] for i in pick], np.float32))
    assert labels.tolist() == [MIXED_LABELS[i] for i in pick]


@pytest.mark.parametrize("bad, msg", [
    (_rec(pixel=bytes(5), label=1), r"^record 'k1' has 5 values, expected 4 \(shape \[2, 2\]\)$"),
    (b"\xff\xff\xff", r"^record 'k1' is not a RecordProto \(3 bytes\)$")])
def test_a_bad_record_mid_batch_names_its_key(bad, msg):
    keys, values = _mixed_batch()
    with pytest.raises(DataError, match=msg):
        decode_batch([values[0], bad, values[2]], 4, keys[:3], shape=(2, 2))


def test_a_batch_of_singas_pixel_records_decodes_as_each_record_says():
    with KVFile(f"{FIXTURES}/train-1000.bin") as f:
        keys, values = zip(*f.read_many(64))
    recs = [parse_record(value) for value in values]
    x, labels = decode_batch(values, 784, keys)
    np.testing.assert_array_equal(x, [np.frombuffer(rec.pixel, np.uint8) for rec in recs])
    assert labels.tolist() == [rec.label for rec in recs]


def test_a_batch_of_our_pixel_records_decodes_to_its_samples():
    x = np.random.default_rng(0).integers(0, 256, (3, 5), dtype=np.uint8)
    got, labels = decode_batch([encode_record(row, y) for row, y in zip(x, [0, 127, 5])], 5)
    np.testing.assert_array_equal(got, x)
    assert labels.tolist() == [0, 127, 5]


@pytest.mark.parametrize("values, want_x, want_labels", [
    # shape 300 and label 5 take 2 + 1 bytes, shape 2 and label 200 take 1 + 2: same lengths
    ([_rec(shape=[300], label=5, pixel=b"\1\2"), _rec(shape=[2], label=200, pixel=b"\3\4")],
     [[1, 2], [3, 4]], [5, 200]),
    # pixel before label (protobuf takes fields in any order)
    ([b"\x1a\x02\x01\x02\x10\x05", b"\x1a\x02\x01\x02\x10\x06"], [[1, 2], [1, 2]], [5, 6]),
    # pixels and floats: the floats win
    ([_rec(label=1, pixel=b"\1\2", data=[7, 8])] * 2, [[7, 8], [7, 8]], [1, 1])])
def test_records_of_one_length_laid_out_otherwise_decode_by_their_fields(values, want_x,
                                                                         want_labels):
    assert len(set(map(len, values))) == 1
    x, labels = decode_batch(values, 2)
    assert x.tolist() == want_x and labels.tolist() == want_labels


@pytest.mark.parametrize("bad, msg", [
    (_rec(shape=[300, 2], label=1, pixel=bytes(3)), "has 3 values, expected 4"),
    (_rec(shape=[2, 2], label=1, pixel=bytes(4)).replace(b"\x10\x01", b"\x10\x81"),
     r"is not a RecordProto \(12 bytes\)")])
def test_a_bad_record_of_the_batchs_byte_length_names_its_key(bad, msg):
    good = _rec(shape=[2, 2], label=1, pixel=bytes(4))
    assert len(good) == len(bad)
    with pytest.raises(DataError, match=rf"^record 'b' {msg}$"):
        decode_batch([good, bad], 4, [b"a", b"b"])


def test_float_targets_ride_in_the_target_field_singa_skips(tmp_path):
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    y = np.array([[0.5, -1.25], [2.0, 0.0], [1e-3, 7.0]])
    path = str(tmp_path / "t.bin")
    assert write_records(path, x, y) == 3
    with KVFile(path, "read") as f:
        pairs = list(iter(f.read, None))
    # SINGA's RecordProto (fields 1-4) reads the sample and label 0; field 300 is unknown to it
    singa = common_pb2.RecordProto.FromString(pairs[0][1])
    assert list(singa.data) == [0, 1] and not singa.HasField("label")
    targets = np.full((3, 2), np.nan, np.float32)
    got, _ = decode_batch([v for _, v in pairs], 2, targets_out=targets)
    np.testing.assert_array_equal(got, x)
    np.testing.assert_array_equal(targets, y.astype(np.float32))


def test_targets_of_n_become_one_per_record_and_integers_are_labels_unless_asked(tmp_path):
    x = np.zeros((2, 2), np.uint8)
    write_records(str(tmp_path / "a.bin"), x, np.array([1.5, 2.5]))
    write_records(str(tmp_path / "b.bin"), x, np.array([3.0, 4.0]))    # integral: labels
    write_records(str(tmp_path / "c.bin"), x, np.array([3, 4]), target_dim=1)
    recs = {}
    for name in "abc":
        with KVFile(str(tmp_path / f"{name}.bin"), "read") as f:
            recs[name] = [common_pb2.RecordProto.FromString(v) for _, v in iter(f.read, None)]
    assert [list(r.target) for r in recs["a"]] == [[1.5], [2.5]]
    assert [(r.label, list(r.target)) for r in recs["b"]] == [(3, []), (4, [])]
    assert [list(r.target) for r in recs["c"]] == [[3.0], [4.0]]


def test_a_record_without_the_targets_asked_for_names_its_key():
    with pytest.raises(DataError, match=r"^record 'k1' has 0 targets, expected 2 "
                                        r"\(store_conf.target_dim\)$"):
        decode_batch([_rec(data=[1.0], label=3)], 1, [b"k1"],
                     targets_out=np.zeros((1, 2), np.float32))


def test_bad_targets_are_one_line():
    with pytest.raises(ConfigError, match=r"3 targets for 2 samples"):
        targets_of(np.zeros(3), 2)
    with pytest.raises(ConfigError, match="target nan of sample 1 is no finite number"):
        targets_of(np.array([0.0, np.nan]), 2)
    assert targets_of(np.array([1, 2]), 2).tolist() == [[1.0], [2.0]]
    assert holds_targets(np.array([0.5, 1])) and not holds_targets(np.array([0.5, 1]) * 2)
    assert not holds_targets(np.eye(3)[[0, 2]]) and not holds_targets(np.zeros(2, int))


@pytest.mark.parametrize("dtype", [np.uint8, np.float32, np.float64, np.int64])
@pytest.mark.parametrize("targets", [False, True])
def test_samples_decode_to_the_bits_of_their_encoded_records(dtype, targets):
    """The memory store's unserialized `Sample`s: decode_batch (and, for uint8, the device
    path's uniform_pixels) gives what it gives of the RecordProto bytes encode_record makes of
    them, float for float."""
    rng = np.random.default_rng(3)
    x = (rng.random((5, 2, 3)) * 255).astype(dtype) if dtype != np.float64 else \
        rng.standard_normal((5, 2, 3)) * 1e3
    y = rng.standard_normal((5, 2)).astype(np.float32) if targets else np.arange(5) * 7
    samples = [Sample(x[i], target=y[i]) if targets else Sample(x[i], y[i]) for i in range(5)]
    records = [encode_record(x[i], 0, y[i]) if targets else encode_record(x[i], y[i])
               for i in range(5)]
    got = [np.full((5, 2), np.nan, np.float32) if targets else None]
    want = [np.full((5, 2), np.nan, np.float32) if targets else None]
    a = decode_batch(samples, 6, targets_out=got[0])
    b = decode_batch(records, 6, targets_out=want[0])
    for u, v in zip(a + tuple(got), b + tuple(want)):
        if u is not None:
            assert u.dtype == v.dtype and u.tobytes() == v.tobytes()
    if dtype == np.uint8 and not targets:
        labels, more = np.zeros(5, np.int32), np.zeros(5, np.int32)
        assert uniform_pixels(samples, 6, labels).tobytes() == \
            uniform_pixels(records, 6, more).tobytes() and (labels == more).all()


def test_a_sample_of_another_size_is_named_like_a_record():
    with pytest.raises(DataError, match=r"record '00001' has 4 values, expected 6"):
        decode_batch([Sample(np.zeros(6)), Sample(np.zeros(4))], 6, keys=[b"00000", b"00001"])
