"""singa.io.caffe_blobs: Caffe's binary files walked through mmap, values viewed in place."""
import mmap
import os
import warnings

import numpy as np
import pytest

import singa
from singa.errors import DataError
from singa.io.caffe_blobs import CaffeFile, read_blob_file
from singa.proto import caffe_pb2

FX = os.path.join(singa.HOME, "tests", "fixtures", "caffe")


def model(path, layers, v1=False):
    net = caffe_pb2.NetParameter(name="n")
    for name, blobs in layers:
        layer = net.layers.add(name=name) if v1 else net.layer.add(name=name, type="x")
        layer.blobs.extend(blobs)
    path.write_bytes(net.SerializeToString())
    return str(path)


def test_v1_legacy_blobs_hold_the_v2_values():
    with CaffeFile(os.path.join(FX, "mlp", "mlp_iter_40.caffemodel")) as v2, \
            CaffeFile(os.path.join(FX, "legacy", "mlp_v1.caffemodel")) as v1:
        net2, blobs2 = v2.net()
        net1, blobs1 = v1.net()
        assert [layer.name for layer in net2.layer] == ["data", "ip1", "relu1", "ip2", "loss"]
        assert [layer.name for layer in net1.layers] == ["data", "ip1", "relu1", "ip2", "loss"]
        assert not any(layer.blobs for layer in net2.layer)     # cut out, not parsed
        assert [(b.shape, b.legacy) for b in blobs1["ip1"]] == [((1, 1, 64, 64), True),
                                                                ((1, 1, 1, 64), True)]
        assert [(b.shape, b.legacy) for b in blobs2["ip1"]] == [((64, 64), False), ((64,), False)]
        for name in ("ip1", "ip2"):
            for a, b in zip(blobs1[name], blobs2[name]):
                assert np.array_equal(a.values, b.values)


def test_values_are_views_of_the_mapped_file(tmp_path):
    values = np.arange(1000, dtype=np.float32)
    path = model(tmp_path / "m.caffemodel",
                 [("a", [caffe_pb2.BlobProto(shape=caffe_pb2.BlobShape(dim=[10, 100]),
                                             data=values)])])
    with CaffeFile(path) as f:
        _, blobs = f.net()
        a = blobs["a"][0].values
        assert np.array_equal(a, values) and blobs["a"][0].shape == (10, 100)
        assert not a.flags.owndata and not a.flags.writeable
        base = a
        while isinstance(base, np.ndarray):
            base = base.base
        assert isinstance(base, memoryview) and isinstance(base.obj, mmap.mmap)  # no copy


def test_double_data_and_legacy_dims(tmp_path):
    blob = caffe_pb2.BlobProto(num=1, channels=1, height=2, width=3,
                               double_data=[0.5, 1, 2, 3, 4, 1e-3])
    path = model(tmp_path / "d.caffemodel", [("w", [blob])], v1=True)
    with CaffeFile(path) as f:
        _, blobs = f.net()
    b = blobs["w"][0]
    assert b.shape == (1, 1, 2, 3) and b.legacy and b.values.dtype == np.float32
    assert np.array_equal(b.values, np.float32([0.5, 1, 2, 3, 4, 1e-3]))


def test_nested_v0_layer_blobs(tmp_path):
    net = caffe_pb2.NetParameter()
    v1 = net.layers.add(bottom=["data"], top=["ip"])
    v1.layer.name, v1.layer.type, v1.layer.num_output = "ip", "innerproduct", 2
    v1.layer.blobs.add(num=1, channels=1, height=2, width=3, data=range(6))
    v1.layer.blobs.add(num=1, channels=1, height=1, width=2, data=[7, 8])
    path = tmp_path / "v0.caffemodel"
    path.write_bytes(net.SerializeToString())
    with CaffeFile(str(path)) as f:
        parsed, blobs = f.net()
    assert parsed.layers[0].layer.num_output == 2 and not parsed.layers[0].layer.blobs
    assert [b.values.tolist() for b in blobs["ip"]] == [[0, 1, 2, 3, 4, 5], [7, 8]]


def test_solverstate_history():
    with CaffeFile(os.path.join(FX, "mlp", "mlp_iter_20.solverstate")) as f:
        state, history = f.solver_state()
    assert (state.iter, state.current_step, state.learned_net) == (20, 0, "mlp_iter_20.caffemodel")
    assert [h.shape for h in history] == [(64, 64), (64,), (10, 64), (10,)]


def test_mean_binaryproto_with_legacy_dims():
    blob = read_blob_file(os.path.join(FX, "convnet", "data", "mean.binaryproto"))
    assert blob.shape == (1, 3, 20, 20) and blob.legacy
    mean = np.load(os.path.join(FX, "convnet", "data", "mean.npy"))
    assert np.array_equal(blob.values.reshape(3, 20, 20), mean)


@pytest.mark.parametrize("cut", [1, 100, 5000, 19000])
def test_truncated_file_is_one_line(tmp_path, cut):
    data = open(os.path.join(FX, "mlp", "mlp_iter_40.caffemodel"), "rb").read()
    path = tmp_path / "cut.caffemodel"
    path.write_bytes(data[:cut])
    with pytest.raises(DataError) as e, CaffeFile(str(path)) as f:
        f.net()
    assert str(path) in str(e.value) and "\n" not in str(e.value)


def test_blob_count_must_match_its_shape(tmp_path):
    blob = caffe_pb2.BlobProto(shape=caffe_pb2.BlobShape(dim=[3, 3]), data=[1, 2])
    path = model(tmp_path / "b.caffemodel", [("w", [blob])])
    with pytest.raises(DataError, match="shape 3x3 holds 2 values"), CaffeFile(path) as f:
        f.net()


def test_hdf5_snapshot_is_named(tmp_path):
    path = tmp_path / "m.caffemodel.h5"
    path.write_bytes(b"\x89HDF\r\n\x1a\n" + bytes(100))
    with pytest.raises(DataError, match="HDF5 snapshot"):
        CaffeFile(str(path))


@pytest.mark.parametrize("blob, message", [
    (caffe_pb2.BlobProto(shape=caffe_pb2.BlobShape(dim=[2]), data=[1, float("nan")]),
     "a blob of shape 2 holds nan or inf values"),
    (caffe_pb2.BlobProto(shape=caffe_pb2.BlobShape(dim=[1]), double_data=[1e300]),
     "a blob of shape 1 holds nan or inf values"),      # beyond float32
    (caffe_pb2.BlobProto(shape=caffe_pb2.BlobShape(), data=[1, 2]),
     r"a blob of shape \(\) holds 2 values"),
])
def test_values_not_finite_or_not_fitting_a_scalar_shape_are_one_line(tmp_path, blob, message):
    """Found by fuzzing: nan and inf (a double beyond float32 too, with a numpy warning) went
    into the imported snapshot; a scalar shape printed as nothing."""
    path = model(tmp_path / "n.caffemodel", [("w", [blob])])
    with warnings.catch_warnings(), pytest.raises(DataError, match=rf"^{path}: {message}$"), \
            CaffeFile(path) as f:
        warnings.simplefilter("error")
        f.net()


def test_a_file_name_with_a_nul_byte_is_one_line():
    """Found by fuzzing: a solver state's learned_net "a\\0b" was a ValueError from open."""
    with pytest.raises(DataError, match=r"^cannot read 'a\\x00b': not a file name$"):
        CaffeFile("a\0b")
