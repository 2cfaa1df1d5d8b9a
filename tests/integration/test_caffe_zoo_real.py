"""Against real Caffe 1.0 (tests/fixtures/caffe/zoo/caffe, README there): the small zoo nets
(tests/fixtures/caffe/zoo), each imported with the caffemodel Caffe wrote from seeded values,
match every blob Caffe kept; a BatchNorm net trains as Caffe's SGD solver trained it; the
zoo's own deploy prototxts import to Caffe's output shapes."""
import os

import numpy as np
import pytest
from google.protobuf import text_format

import singa
from singa.api import session
from singa.checkpoint.format import CheckpointReader
from singa.interop import deploy
from singa.interop.caffe.importer import import_caffe
from singa.job import config
from singa.net.neuralnet import NeuralNet
from singa.proto import caffe_pb2, job_pb2

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


def test_batchnorm_net_trains_as_caffes_solver(tmp_path):
    """conv → BatchNorm (training: batch statistics, moving_average_fraction 0.95, sums of a
    factor 2.997 to start) → Scale → ReLU, in place, → InnerProduct → SoftmaxWithLoss over
    an LMDB (a TRAIN-only Data layer: the solver has no test_iter, so no TEST net), 20 SGD
    steps from Caffe's initial params: each loss within 1e-5 of Caffe's, every final param
    (BatchNorm's three sums too) within 1e-5 of its largest value."""
    folder = os.path.join(REAL, "bn_train")
    solver = os.path.join(folder, "bn_solver.prototxt")
    conf = import_caffe(solver, str(tmp_path / "ours"), os.path.join(folder, "init.caffemodel"),
                        print=lambda *a: None)
    history = session.train(config.load_job(conf), progress=False)
    losses = np.array([m["loss"] for _, m in history["train"]])
    want = np.loadtxt(os.path.join(folder, "losses.txt"))
    rel = np.abs(losses - want) / want
    print(f"BatchNorm training: 20 losses {want[0]:.4f} → {want[-1]:.4f}, "
          f"max relative difference {rel.max():.3g}")
    assert len(losses) == 20 and rel.max() <= 1e-5
    # Caffe's final params as the importer reads them: the same names as ours
    import_caffe(solver, str(tmp_path / "caffe"), os.path.join(folder, "final.caffemodel"),
                 print=lambda *a: None)
    ours = CheckpointReader(str(tmp_path / "ours" / "checkpoint" / "step20-worker0.bin"))
    theirs = CheckpointReader(str(tmp_path / "caffe" / "checkpoint" / "step0-worker0.bin"))
    assert sorted(ours.names) == sorted(theirs.names)
    # Caffe's factor after 20 steps of f ← 0.95·f + 1, from 2.997
    assert np.isclose(theirs.param("0#bn_factor")[0], 2.997 * 0.95**20 + (1 - 0.95**20) / 0.05)
    for name in theirs.names:
        ref = theirs.param(name)
        diff = np.abs(ours.param(name) - ref).max() / np.abs(ref).max()
        print(f"  {name}: max |ours − Caffe| / max |Caffe| {diff:.3g}")
        assert diff <= 1e-5, name


@pytest.mark.parametrize("name, output, shape", [
    ("ResNet-50-deploy", "prob", (1, 1000)),
    ("ResNet-101-deploy", "prob", (1, 1000)),
    ("ResNet-152-deploy", "prob", (1, 1000)),
    ("mobilenet_deploy", "prob", (1, 1000, 1, 1)),
    ("mobilenet_v2_deploy", "prob", (1, 1000, 1, 1)),
    ("SqueezeNet_v1.0_deploy", "prob", (10, 1000, 1, 1)),
    ("SqueezeNet_v1.1_deploy", "prob", (10, 1000, 1, 1)),
    ("voc-fcn8s_deploy", "score", (1, 21, 500, 500)),
    ("cifar10_full", "prob", (1, 10))])
def test_the_zoos_own_deploy_prototxts_import(name, output, shape, tmp_path):
    """The zoo's prototxts as published (tests/fixtures/caffe/zoo/real), no weights: the job
    conf builds the net, its output of Caffe's shape."""
    conf = import_caffe(os.path.join(ZOO, "real", name + ".prototxt"), str(tmp_path),
                        print=lambda *a: None)
    job = config.load_job(conf, check_paths=False)
    net = NeuralNet(deploy.deploy_net(job.neuralnet, conf), job_pb2.kTest,
                    np.random.default_rng(0))
    assert job.neuralnet.layer[-1].name == output
    assert net.layers[-1].data.shape == shape
