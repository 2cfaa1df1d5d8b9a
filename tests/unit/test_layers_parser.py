"""SINGA 0.1's ShardData and parser layers (Mnist, Label, RGBImage) on shards written here."""
import numpy as np
import pytest

from gradcheck import make_layer
from singa.errors import ConfigError, DataError
from singa.io.kvfile import KVFile
from singa.proto import caffe_pb2, common_pb2, job_pb2

TRAIN = job_pb2.kTrain | job_pb2.kForward


def write_shard(folder, images, labels, wrap=True):
    """A 0.1 shard folder (folder/shard.dat) of Record{image} values (RecordProto if not wrap)."""
    folder.mkdir()
    with KVFile(str(folder / "shard.dat"), "create") as f:
        for i, (x, label) in enumerate(zip(images, labels)):
            image = common_pb2.RecordProto(shape=x.shape, label=int(label), pixel=x.tobytes())
            value = common_pb2.Record(image=image) if wrap else image
            f.insert(b"%05d" % i, value.SerializeToString())
    return str(folder)


def pixels(n, shape, seed=0):
    return np.random.default_rng(seed).integers(0, 256, (n,) + shape).astype(np.uint8)


def shard_data(path, batch=2, extra=""):
    return make_layer(f'name: "data" type: kShardData sharddata_conf {{ path: "{path}" '
                      f'batchsize: {batch} }} {extra}', [])


@pytest.mark.parametrize("wrap", [True, False])
def test_shard_data_reads_records_of_a_shard_folder_and_wraps_around(tmp_path, wrap):
    x = pixels(3, (2, 2))
    data = shard_data(write_shard(tmp_path / "shard", x, [5, 6, 7], wrap))
    data.compute_feature(TRAIN, [])
    assert data.data.shape == (2, 2, 2)
    np.testing.assert_array_equal(data.data, x[:2])
    data.compute_feature(TRAIN, [])
    np.testing.assert_array_equal(data.data, x[[2, 0]])
    assert list(data.aux_data) == [7, 5]


def test_shard_data_splits_the_batch_over_partitions(tmp_path):
    path = write_shard(tmp_path / "shard", pixels(4, (2, 2)), range(4))
    data = shard_data(path, batch=4, extra="num_partitions: 2 partition_dim: 0")
    assert data.data.shape == (2, 2, 2)


def test_shard_data_position_is_saved_and_restored(tmp_path):
    path = write_shard(tmp_path / "shard", pixels(5, (2, 2)), range(5))
    a, b = shard_data(path), shard_data(path)
    a.compute_feature(TRAIN, [])
    b.seek(*a.position())
    a.compute_feature(TRAIN, [])
    b.compute_feature(TRAIN, [])
    assert list(b.aux_data) == list(a.aux_data) == [2, 3]


def test_shard_data_names_an_empty_shard(tmp_path):
    (tmp_path / "shard").mkdir()
    (tmp_path / "shard" / "shard.dat").write_bytes(b"")
    with pytest.raises(DataError, match=f"{tmp_path}/shard/shard.dat: the kvfile store is empty"):
        shard_data(tmp_path / "shard")


def parser(kind, data, conf=""):
    layer = make_layer(f'name: "p" type: {kind} srclayers: "data" {conf}', [data])
    layer.compute_feature(TRAIN, [data])
    return layer


def test_mnist_parser_normalises_pixels(tmp_path):
    x = pixels(2, (3, 3))
    data = shard_data(write_shard(tmp_path / "shard", x, [1, 2]))
    data.compute_feature(TRAIN, [])
    layer = parser("kMnist", data, "mnist_conf { norm_a: 127.5 norm_b: 1 }")
    assert layer.data.shape == (2, 1, 3, 3)
    for i in range(2):
        for r in range(3):
            for c in range(3):
                assert layer.data[i, 0, r, c] == pytest.approx(x[i, r, c] / 127.5 - 1, abs=1e-6)


def test_label_parser_gives_labels_as_data_and_aux_data(tmp_path):
    data = shard_data(write_shard(tmp_path / "shard", pixels(2, (2, 2)), [4, 9]))
    data.compute_feature(TRAIN, [])
    layer = parser("kLabel", data)
    assert layer.data.dtype == np.float32 and list(layer.data) == [4.0, 9.0]
    assert list(layer.aux_data) == [4, 9]


def mean_image(path, shape, kind):
    mean = np.arange(np.prod(shape), dtype=np.float32).reshape(shape) / 7
    if kind == "record":      # SINGA 0.1's create_shard: a serialized record
        path.write_bytes(common_pb2.RecordProto(shape=shape, data=mean.ravel()).SerializeToString())
    elif kind == "kvfile":    # SINGA 0.3's create_data: a kvfile with one tuple
        with KVFile(str(path), "create") as f:
            f.insert(b"mean", common_pb2.RecordProto(shape=shape, data=mean.ravel()).SerializeToString())
    elif kind == "caffe":     # a Caffe mean (compute_image_mean)
        path.write_bytes(common_pb2.CaffeBlob(data=mean.ravel()).SerializeToString())
    else:                     # a Caffe mean of doubles, with its shape
        path.write_bytes(caffe_pb2.BlobProto(double_data=mean.ravel(), shape=caffe_pb2.BlobShape(
            dim=(1,) + shape)).SerializeToString())
    return mean


@pytest.mark.parametrize("kind, name", [("record", "image_mean.bin"), ("kvfile", "image_mean.bin"),
                                        ("caffe", "mean.binaryproto"),
                                        ("caffe double", "mean.binaryproto")])
def test_rgb_image_parser_subtracts_the_mean_file_and_scales(tmp_path, kind, name):
    x = pixels(2, (3, 4, 4))
    data = shard_data(write_shard(tmp_path / "shard", x, [0, 1]))
    data.compute_feature(TRAIN, [])
    mean = mean_image(tmp_path / name, (3, 4, 4), kind)
    layer = parser("kRGBImage", data, f'rgbimage_conf {{ meanfile: "{tmp_path / name}" scale: 0.5 }}')
    assert layer.data.shape == (2, 3, 4, 4)
    np.testing.assert_allclose(layer.data, (x - mean[None]) * 0.5, rtol=1e-6, atol=1e-5)


def test_rgb_image_parser_crops_in_training_and_takes_the_corner_otherwise(tmp_path):
    x = pixels(8, (3, 4, 4))
    data = shard_data(write_shard(tmp_path / "shard", x, range(8)), batch=8)
    data.compute_feature(TRAIN, [])
    conf = 'rgbimage_conf { cropsize: 2 mirror: true }'
    train = parser("kRGBImage", data, conf)
    test = make_layer(f'name: "p" type: kRGBImage srclayers: "data" {conf}', [data])
    test.compute_feature(job_pb2.kTest, [data])
    np.testing.assert_array_equal(test.data, x[:, :, :2, :2])
    crops = [{(h, w, m) for h in range(3) for w in range(3) for m in (0, 1)
              if np.array_equal(x[i, :, h:h + 2, w:w + 2][..., ::-1 if m else 1], train.data[i])}
             for i in range(8)]
    assert all(crops)
    assert len({next(iter(c)) for c in crops}) > 1


def test_rgb_image_parser_names_a_mean_file_of_the_wrong_size(tmp_path):
    data = shard_data(write_shard(tmp_path / "shard", pixels(2, (3, 4, 4)), [0, 1]))
    mean_image(tmp_path / "m.bin", (3, 2, 2), "record")
    with pytest.raises(DataError, match=r"m.bin: the mean file holds 12 values, the images 48 "
                                        r"\(shape \[3, 4, 4\]\)"):
        make_layer(f'name: "p" type: kRGBImage srclayers: "data" rgbimage_conf {{ meanfile: '
                   f'"{tmp_path / "m.bin"}" }}', [data])


def test_parser_needs_a_shard_data_source():
    from gradcheck import Source
    with pytest.raises(ConfigError, match="layer 'p' parses records: its one srclayer must be a "
                                          "kShardData or kLMDBData layer"):
        make_layer('name: "p" type: kLabel', [Source(np.zeros((2, 3)))])
