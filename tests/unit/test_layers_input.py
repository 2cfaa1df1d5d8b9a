"""RecordInput and CSVInput: batches, wrap-around, labels, normalisation, batch rules, random
skip, resumable read position, and clear errors for bad data."""
import os

import numpy as np
import pytest

from gradcheck import make_layer
import singa
from singa.errors import ConfigError, DataError
from singa.io.kvfile import KVFile
from singa.proto import common_pb2, job_pb2

TRAIN = job_pb2.kTrain | job_pb2.kForward


def write_records(path, xs, labels, as_floats=False):
    with KVFile(path, "create") as f:
        for i, (x, label) in enumerate(zip(xs, labels)):
            rec = common_pb2.RecordProto(shape=[len(x)], label=int(label))
            if as_floats:
                rec.data.extend(x)
            else:
                rec.pixel = bytes(bytearray(int(v) for v in x))
            f.insert(b"%08d" % i, rec.SerializeToString())
    return str(path)


def record_input(path, store="", extra="", layer_type="kRecordInput", seed=0):
    conf = (f'name: "data" type: {layer_type} {extra} store_conf {{ path: "{path}" {store} }}')
    return make_layer(conf, [], seed=seed)


@pytest.fixture
def shard(tmp_path):
    xs = np.arange(7 * 4).reshape(7, 4)
    return write_records(tmp_path / "shard.bin", xs, np.arange(7) % 3), xs


def test_record_input_reads_batches_in_order_and_wraps_around(shard):
    path, xs = shard
    layer = record_input(path, 'backend: "kvfile" batchsize: 3 shape: 2 shape: 2')
    assert layer.one_to_many and layer.data.shape == (3, 2, 2) and layer.aux_data.dtype == np.int32
    seen = []
    for _ in range(3):
        layer.compute_feature(TRAIN, [])
        seen.append((layer.data.reshape(3, 4).copy(), layer.aux_data.copy()))
    order = [0, 1, 2, 3, 4, 5, 6, 0, 1]
    np.testing.assert_array_equal(np.concatenate([s[0] for s in seen]), xs[order])
    np.testing.assert_array_equal(np.concatenate([s[1] for s in seen]), np.array(order) % 3)


def test_record_input_normalises_with_mean_and_std_values(shard):
    path, xs = shard
    layer = record_input(path, 'backend: "kvfile" batchsize: 2 shape: 4 mean_value: 3 std_value: 2')
    layer.compute_feature(TRAIN, [])
    np.testing.assert_array_equal(layer.data, (xs[:2] - np.float32(3)) / np.float32(2))


def test_record_input_normalises_with_mean_and_std_files(tmp_path, shard):
    path, xs = shard
    mean = write_records(tmp_path / "mean.bin", [[1.5, 2, 3, 4]], [0], as_floats=True)
    std = write_records(tmp_path / "std.bin", [[2, 4, 8, 0.5], [9, 9, 9, 9]], [0, 0],
                        as_floats=True)
    layer = record_input(path, f'backend: "kvfile" batchsize: 2 shape: 4 mean_file: "{mean}" '
                               f'std_file: "{std}"')
    layer.compute_feature(TRAIN, [])
    want = (xs[:2] - np.float32([1.5, 2, 3, 4])) / np.float32([2, 4, 8, 0.5])
    np.testing.assert_allclose(layer.data, want, rtol=1e-6)


def test_record_input_refuses_a_std_of_zero_it_would_divide_by(tmp_path, shard):
    path, _ = shard
    with pytest.raises(ConfigError, match=r"^layer 'data': store_conf.std_value must not be 0"):
        record_input(path, 'backend: "kvfile" batchsize: 2 shape: 4 std_value: 0')
    std = write_records(tmp_path / "std.bin", [[2, 4, 0, 0.5]], [0], as_floats=True)
    with pytest.raises(DataError, match=rf"^{std}: the std file holds 0 at index 2"):
        record_input(path, f'backend: "kvfile" batchsize: 2 shape: 4 std_file: "{std}"')


def test_record_input_resolves_relative_paths_against_the_singa_home(shard):
    path, xs = shard
    rel = os.path.relpath(path, singa.HOME)
    layer = record_input(rel, 'backend: "kvfile" batchsize: 1 shape: 4')
    layer.compute_feature(TRAIN, [])
    np.testing.assert_array_equal(layer.data[0], xs[0])


@pytest.mark.parametrize("extra, sizes, want", [
    ("partition_dim: 0 num_partitions: 2", "batchsize: 8", 4),
    ("partition_dim: 0 num_partitions: 2 partition_id: 1", "batchsize: 8 batchsize: 5", 5),
    ("partition_dim: 1 num_partitions: 2", "batchsize: 8 batchsize: 5", 8),
])
def test_record_input_batch_size_rule(shard, extra, sizes, want):
    layer = record_input(shard[0], f'backend: "kvfile" {sizes} shape: 4', extra)
    assert layer.data.shape == (want, 4)


@pytest.mark.parametrize("k", [0, 1])
def test_record_input_partitions_on_dim_0_keep_their_rows_of_each_whole_batch(shard, k):
    path, xs = shard
    layer = record_input(path, 'backend: "kvfile" batchsize: 4 shape: 4',
                         f"partition_dim: 0 num_partitions: 2 partition_id: {k}")
    rows = []
    for _ in range(2):
        layer.compute_feature(TRAIN, [])
        rows += layer.aux_data.tolist()
    whole = [0, 1, 2, 3, 4, 5, 6, 0]        # the two batches of 4 one worker reads
    assert rows == [i % 3 for i in whole[2 * k:2 * k + 2] + whole[4 + 2 * k:6 + 2 * k]]


def test_record_input_random_skip_draws_from_the_layer_rng(shard):
    path, xs = shard
    skip = np.random.default_rng(5).integers(0, 4)
    assert skip > 0
    layer = record_input(path, 'backend: "kvfile" batchsize: 1 shape: 4 random_skip: 3', seed=5)
    layer.compute_feature(TRAIN, [])
    np.testing.assert_array_equal(layer.data[0], xs[skip])


def test_record_input_resumes_at_its_position_without_skipping_again(shard):
    path, _ = shard
    store = 'backend: "kvfile" batchsize: 3 shape: 4 random_skip: 6'
    first = record_input(path, store, seed=1)
    assert first.position() == (0, False)
    for _ in range(2):
        first.compute_feature(TRAIN, [])
    offset, skipped = first.position()
    assert skipped and offset > 0
    first.compute_feature(TRAIN, [])
    resumed = record_input(path, store, seed=2)
    resumed.seek(offset, skipped)
    resumed.compute_feature(TRAIN, [])
    np.testing.assert_array_equal(resumed.data, first.data)
    np.testing.assert_array_equal(resumed.aux_data, first.aux_data)


@pytest.mark.parametrize("extra, want", [("", [3, 6, 2]),
                                         ("partition_dim: 0 num_partitions: 3 partition_id: 1", [3, 6, 2])])
def test_record_input_position_is_the_tuple_after_its_batch(shard, extra, want):
    path, _ = shard
    tuple_bytes = os.path.getsize(path) // 7
    layer = record_input(path, 'backend: "kvfile" batchsize: 3 shape: 4', extra)
    offsets = []
    for _ in range(3):
        layer.compute_feature(TRAIN, [])
        offsets.append(layer.position()[0])
    assert offsets == [i * tuple_bytes for i in want]


def test_record_input_rejects_records_of_the_wrong_size(shard):
    layer = record_input(shard[0], 'backend: "kvfile" batchsize: 1 shape: 5')
    with pytest.raises(DataError, match="has 4 values, expected 5"):
        layer.compute_feature(TRAIN, [])


def test_record_input_rejects_an_empty_store(tmp_path):
    path = write_records(tmp_path / "empty.bin", [], [])
    layer = record_input(path, 'backend: "kvfile" batchsize: 1 shape: 1')
    with pytest.raises(DataError, match="empty.bin: the kvfile store is empty"):
        layer.compute_feature(TRAIN, [])


@pytest.mark.parametrize("store, message", [
    ("batchsize: 1 shape: 4", "store_conf.backend is not set"),
    ('backend: "kvfile" shape: 4', "store_conf.batchsize is not set"),
    ('backend: "kvfile" batchsize: 1', "store_conf.shape must list positive sizes"),
])
def test_record_input_names_a_missing_store_field(shard, store, message):
    with pytest.raises(ConfigError, match=f"layer 'data': {message}"):
        record_input(shard[0], store)


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines))
    return str(path)


def csv_input(path, store="", seed=0):
    return record_input(path, store, layer_type="kCSVInput", seed=seed)


def test_csv_input_reads_label_and_values_with_textfile_default(tmp_path):
    path = write_lines(tmp_path / "a.csv", ["1,0.5,2", "0,-1,3e1", "2,4,5"])
    layer = csv_input(path, "batchsize: 2 shape: 2")
    layer.compute_feature(TRAIN, [])
    np.testing.assert_array_equal(layer.data, [[0.5, 2], [-1, 30]])
    np.testing.assert_array_equal(layer.aux_data, [1, 0])
    layer.compute_feature(TRAIN, [])
    np.testing.assert_array_equal(layer.data, [[4, 5], [0.5, 2]])
    np.testing.assert_array_equal(layer.aux_data, [2, 1])


def test_csv_input_without_labels_and_with_a_separator(tmp_path):
    path = write_lines(tmp_path / "a.csv", ["1;2;3"])
    layer = csv_input(path, 'batchsize: 1 shape: 3 has_label: false separator: ";"')
    layer.compute_feature(TRAIN, [])
    np.testing.assert_array_equal(layer.data, [[1, 2, 3]])
    deploy = csv_input(write_lines(tmp_path / "b.csv", ["4,5"]), "batchsize: 1 shape: 2")
    deploy.compute_feature(job_pb2.kDeploy, [])
    np.testing.assert_array_equal(deploy.data, [[4, 5]])


def test_csv_input_normalises_with_a_textfile_mean(tmp_path):
    path = write_lines(tmp_path / "a.csv", ["0,3,5"])
    mean = write_lines(tmp_path / "mean.csv", ["1,2", "7,7"])
    layer = csv_input(path, f'batchsize: 1 shape: 2 mean_file: "{mean}"')
    layer.compute_feature(TRAIN, [])
    np.testing.assert_array_equal(layer.data, [[2, 3]])


@pytest.mark.parametrize("lines, message", [
    (["0,1,2", "1,2"], "line 1 has 2 values, expected 3"),
    (["0,1,2,3"], "line 0 has 4 values, expected 3"),
    (["0,1,x"], "could not convert string to float"),
])
def test_csv_input_names_the_bad_line(tmp_path, lines, message):
    layer = csv_input(write_lines(tmp_path / "a.csv", lines), f"batchsize: {len(lines)} shape: 2")
    with pytest.raises(DataError, match=message):
        layer.compute_feature(TRAIN, [])


def image_preprocess(x, conf, seed=0):
    from gradcheck import Source
    src = Source(x, grad=False, name="data")
    return make_layer(f'name: "image" type: kImagePreprocess rgbimage_conf {{ {conf} }}', [src],
                      seed=seed), src


def images(n, c=3, size=6):
    return np.random.default_rng(3).integers(0, 256, (n, c, size, size)).astype(np.float32)


def test_image_preprocess_crops_the_top_left_corner_and_scales_outside_training():
    x = images(4)
    layer, src = image_preprocess(x, "cropsize: 4 mirror: true scale: 0.5")
    layer.compute_feature(job_pb2.kTest, [src])
    assert layer.data.shape == (4, 3, 4, 4)
    for i in range(4):
        for c in range(3):
            for r in range(4):
                assert list(layer.data[i, c, r]) == [v / 2 for v in x[i, c, r, :4]]


def test_image_preprocess_center_crop_takes_caffes_test_crop_of_non_square_images():
    x = np.random.default_rng(3).integers(0, 256, (2, 3, 7, 10)).astype(np.float32)
    layer, src = image_preprocess(x, "cropsize: 4 center_crop: true scale: 0.5")
    layer.compute_feature(job_pb2.kTest, [src])
    np.testing.assert_array_equal(layer.data, x[:, :, 1:5, 3:7] * np.float32(0.5))
    layer.compute_feature(TRAIN, [src])         # training crops at random within the image
    for i in range(2):
        offsets = {(h, w) for h in range(4) for w in range(7)
                   if np.array_equal(x[i, :, h:h + 4, w:w + 4] * np.float32(0.5), layer.data[i])}
        assert len(offsets) == 1


def placements(image, out):
    """(h, w, mirrored) of every place where `out` is a crop of `image`, found by trying all."""
    s = out.shape[-1]
    found = []
    for h in range(image.shape[1] - s + 1):
        for w in range(image.shape[2] - s + 1):
            window = image[:, h:h + s, w:w + s]
            found += [(h, w, m) for m, v in ((False, window), (True, window[:, :, ::-1]))
                      if np.array_equal(v, out)]
    return found


@pytest.mark.parametrize("mirror", [False, True])
def test_image_preprocess_crops_at_random_offsets_and_mirrors_half_in_training(mirror):
    x = images(64)
    layer, src = image_preprocess(x, f"cropsize: 4 mirror: {str(mirror).lower()}")
    layer.compute_feature(TRAIN, [src])
    found = [placements(x[i], layer.data[i]) for i in range(64)]
    assert all(len(f) == 1 for f in found)
    offsets = {f[0][:2] for f in found}
    assert offsets == {(h, w) for h in range(3) for w in range(3)}
    mirrored = sum(f[0][2] for f in found)
    assert (16 < mirrored < 48) if mirror else mirrored == 0


def test_image_preprocess_without_crop_scales_the_whole_image():
    x = images(2)
    layer, src = image_preprocess(x, "scale: 2")
    layer.compute_feature(TRAIN, [src])
    np.testing.assert_array_equal(layer.data, 2 * x)
    assert layer.grad is None


@pytest.mark.parametrize("shape, conf, message", [
    ((2, 12), "", r"needs images \(N, C, H, W\) from 'data', got shape \(2, 12\)"),
    ((2, 3, 4, 4), "cropsize: 5", r"rgbimage_conf.cropsize 5 must be in \[0, 4\]"),
    ((2, 3, 4, 6), "cropsize: 5", r"rgbimage_conf.cropsize 5 must be in \[0, 4\]"),
    ((2, 3, 4, 4), "scale: 0", "rgbimage_conf.scale must not be 0"),
])
def test_image_preprocess_conf_mistakes_name_the_layer(shape, conf, message):
    with pytest.raises(ConfigError, match=f"layer 'image'.*{message}"):
        image_preprocess(np.zeros(shape, np.float32), conf)


@pytest.mark.parametrize("label", ["nan", "inf", "1e10"])
def test_csv_label_that_is_not_an_int_is_a_data_error(tmp_path, label):
    path = tmp_path / "data.csv"
    path.write_text(f"1,0,0\n{label},1,2\n")
    layer = make_layer(f'name: "data" type: kCSVInput store_conf {{ path: "{path}" batchsize: 2 '
                       f'shape: 2 }}', [])
    with pytest.raises(DataError, match=rf"^{path}: label [^ ]+ in the batch from line 0 is not an int$"):
        layer.compute_feature(TRAIN, [])


def test_record_input_gives_the_records_targets_with_target_dim(tmp_path):
    from singa.io.records import write_records as write_numpy
    x = np.arange(8, dtype=np.float32).reshape(4, 2)
    y = np.arange(12, dtype=np.float64).reshape(4, 3) / 4
    path = str(tmp_path / "t.bin")
    write_numpy(path, x, y)
    layer = record_input(path, 'backend: "kvfile" batchsize: 3 shape: 2 target_dim: 3')
    assert layer.targets.shape == (3, 3)
    layer.compute_feature(TRAIN, [])
    layer.compute_feature(TRAIN, [])
    np.testing.assert_array_equal(layer.targets, y[[3, 0, 1]].astype(np.float32))
    np.testing.assert_array_equal(layer.data, x[[3, 0, 1]])
    assert record_input(path, 'backend: "kvfile" batchsize: 3 shape: 2').targets is None
    with pytest.raises(DataError, match="has 3 targets, expected 2"):
        record_input(path, 'backend: "kvfile" batchsize: 3 shape: 2 target_dim: 2'
                     ).compute_feature(TRAIN, [])


def test_memory_store_gives_y_as_targets_or_labels_as_the_layer_reads_them():
    from singa.io import memory
    path = memory.register(np.zeros((3, 2), np.float32), np.array([0, 2, 1]))
    as_targets = record_input(path, 'backend: "memory" batchsize: 3 shape: 2 target_dim: 1')
    as_labels = record_input(path, 'backend: "memory" batchsize: 3 shape: 2')
    for layer in (as_targets, as_labels):
        layer.compute_feature(TRAIN, [])
    assert as_targets.targets.tolist() == [[0.0], [2.0], [1.0]]
    assert as_labels.aux_data.tolist() == [0, 2, 1] and as_labels.targets is None
    memory.release(path)


def test_csv_input_reads_no_targets(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("1,2,3\n")
    with pytest.raises(ConfigError, match="store_conf.target_dim 1: kCSVInput reads no targets"):
        record_input(str(path), 'batchsize: 1 shape: 2 target_dim: 1', layer_type="kCSVInput")
