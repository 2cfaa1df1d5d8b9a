"""The small zoo nets (tests/fixtures/caffe/zoo) against real Caffe 1.0
(tests/fixtures/caffe/zoo/caffe, README there): each imported with the caffemodel Caffe wrote
from seeded values, our forward of Caffe's input matches every blob Caffe kept."""
import os

import numpy as np
import pytest
from google.protobuf import text_format

import singa
from singa.interop import deploy
from singa.interop.caffe.importer import import_caffe
from singa.proto import caffe_pb2

ZOO = os.path.join(singa.HOME, "tests", "fixtures", "caffe", "zoo")
REAL = os.path.join(ZOO, "caffe")


def last_writers(prototxt):
    """Caffe's blob name -> the layer that writes it last (in-place layers share a blob)."""
    net = caffe_pb2.NetParameter()
    with open(prototxt) as f:
        text_format.Merge(f.read(), net)
    return {top: layer.name for layer in net.layer for top in layer.top}


@pytest.mark.parametrize("name", ["resnet50_deploy", "mobilenet_deploy",
                                  "squeezenet_v1.1_deploy", "fcn32s_deploy"])
def test_zoo_net_matches_caffe(name, tmp_path):
    """BatchNorm (factor 2.997, use_global_stats true and unset), Scale, Eltwise, depthwise
    convolution, global pooling, Concat, Softmax, Deconvolution and Crop: each blob within
    1e-5 of its largest value."""
    prototxt = os.path.join(ZOO, name + ".prototxt")
    conf = import_caffe(prototxt, str(tmp_path), os.path.join(REAL, name, "model.caffemodel"),
                        print=lambda *a: None)
    model = deploy.read(conf, str(tmp_path))
    x = np.load(os.path.join(REAL, name, "input.npy"))
    ours = model.forward({model.inputs[0].name: x})
    want = np.load(os.path.join(REAL, name, "caffe_blobs.npz"))
    writer = last_writers(prototxt)
    worst = 0.0
    for blob in want.files:
        got, ref = ours[writer[blob]], want[blob]
        assert got.shape == ref.shape, blob
        rel = np.abs(got - ref).max() / np.abs(ref).max()
        worst = max(worst, rel)
        assert rel <= 1e-5, (blob, rel)
    print(f"{name}: {len(want.files)} blobs, max |ours − Caffe| / max |Caffe| {worst:.3g}")
