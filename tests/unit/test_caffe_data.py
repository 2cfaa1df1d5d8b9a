"""Caffe's Data (backend LMDB) and ImageData layers imported by `singa-import caffe` read the
data as it is, with transform_param, and give what Caffe's own layers gave for it
(tests/fixtures/caffe/data: made and run by real Caffe)."""
import os

import numpy as np
import pytest

from singa import HOME
from singa.interop.caffe.importer import import_caffe
from singa.job import config
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2

pytest.importorskip("lmdb")
pytest.importorskip("PIL")

DATA = os.path.join(HOME, "tests", "fixtures", "caffe", "data")


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    out = tmp_path_factory.mktemp("import")
    lines = []
    conf = import_caffe(os.path.join(DATA, "data.prototxt"), str(out), print=lines.append)
    return config.load_job(conf), lines


def test_data_layers_read_caffes_files_as_they_are(imported):
    job, lines = imported
    stores = {layer.name: layer.store_conf for layer in job.neuralnet.layer
              if layer.type == job_pb2.kRecordInput}
    assert stores["raw"].backend == "lmdb" and stores["raw"].path == f"{DATA}/raw_lmdb"
    assert list(stores["raw"].shape) == [3, 7, 9]          # the first Datum's
    lst = stores["list_resized"]
    assert (lst.backend, lst.path, lst.root_folder, lst.new_height, lst.new_width) == (
        "imagelist", f"{DATA}/list.txt", f"{DATA}/images", 5, 12)
    assert list(lst.shape) == [3, 5, 12]
    assert any(f"reads the lmdb {DATA}/encoded_lmdb as it is" in line for line in lines)


@pytest.mark.parametrize("name", ["raw", "encoded", "list", "list_resized",
                                  "raw_tf", "encoded_tf", "list_tf"])
def test_test_net_gives_caffes_blobs(imported, name):
    """The TEST net: (x − mean_value) then the centre crop, times scale 0.017, as Caffe's
    DataTransformer; equal to the bit, JPEG decoding and the resize included."""
    job, _ = imported
    net = NeuralNet(job.neuralnet, job_pb2.kTest, np.random.default_rng(0))
    net.forward(job_pb2.kTest)
    layer = net.by_name.get(f"0#{name}_transform") or net.by_name[f"0#{name}"]
    want = np.load(os.path.join(DATA, "caffe_out", f"{name}.npy"))
    assert layer.data.shape == want.shape
    np.testing.assert_array_equal(layer.data, want)
    labels = net.by_name[f"0#{name}"].aux_data
    np.testing.assert_array_equal(labels, np.load(os.path.join(DATA, "caffe_out",
                                                               f"{name}_label.npy")))
