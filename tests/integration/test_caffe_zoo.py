"""The Caffe model zoo after 2014, as small nets written after each family's own prototxt
(tests/fixtures/caffe/zoo, README there): each imports and runs forward to its output shape;
CIFAR-10 full trains; ONNX of each computes our outputs (onnxruntime) and its Caffe export
imports back to the same ops, params and outputs, bit for bit; -fold-bn against the
unfolded ResNet."""
import os
import shutil

import lmdb
import numpy as np
import pytest

import singa
from singa.api import session
from singa.checkpoint.format import write_file
from singa.interop import deploy, exporter
from singa.interop.caffe import write as caffe_write
from singa.interop.caffe.importer import import_caffe
from singa.job import config
from singa.net.neuralnet import NeuralNet
from singa.proto import caffe_pb2, job_pb2

ZOO = os.path.join(singa.HOME, "tests", "fixtures", "caffe", "zoo")


def zoo_import(name, out, weights=None, **kw):
    """`singa-import.sh caffe ZOO/name [weights] -o out`: the job.conf."""
    return import_caffe(os.path.join(ZOO, name), str(out), weights=weights,
                        print=lambda *a: None, **kw)


def seeded_snapshot(conf, folder):
    """A snapshot of seeded values for the test net of `conf`: BatchNorm sums of a factor
    0.999·k (variances positive), Scale's γ near 1; returns the snapshot file."""
    job = config.load_job(conf, check_paths=False)
    net = NeuralNet(deploy.deploy_net(job.neuralnet, conf), job_pb2.kTest,
                    np.random.default_rng(0))
    rng = np.random.default_rng(29)
    for p in net.owner_params:
        v = rng.normal(0, 0.3, p.data.shape)
        if p.name.endswith("_factor"):
            v = np.full(p.data.shape, 0.999 * 3)
        elif p.name.endswith("_variance"):
            v = np.abs(v) * 3 + 0.1
        elif p.name.endswith("_scale"):
            v += 1
        p.data[...] = v
    os.makedirs(folder, exist_ok=True)
    return write_file(os.path.join(folder, "step0-worker0"),
                      [(p.name, p.data, 0) for p in net.owner_params])


def batch(model, seed=1):
    x = model.inputs[0]
    return {x.name: np.random.default_rng(seed).normal(0, 1, x.shape).astype(np.float32)}


NETS = [("resnet50_deploy.prototxt", "prob", (2, 10)),
        ("mobilenet_deploy.prototxt", "fc7", (2, 10, 1, 1)),
        ("squeezenet_v1.1_deploy.prototxt", "prob", (2, 10, 1, 1)),
        ("fcn32s_deploy.prototxt", "score", (1, 5, 8, 8)),
        ("cifar10_full_solver.prototxt", "loss", (20, 10))]


@pytest.mark.parametrize("name, output, shape", NETS)
def test_zoo_nets_import_run_and_export(name, output, shape, tmp_path):
    """Import (in-place BatchNorm/Scale/ReLU, depthwise group convolution, global pooling,
    Concat, Deconvolution and Crop, LRN WITHIN_CHANNEL), a forward pass to the output's
    shape; ONNX within 1e-5 of ours (relative to the output's size); the Caffe export
    imported back: the same ops, every param and output bit for bit."""
    conf = zoo_import(name, tmp_path / "job")
    snapshot = seeded_snapshot(conf, tmp_path / "job" / "checkpoint")
    model = deploy.read(conf, snapshot)
    assert model.outputs == [output]
    feeds = batch(model)
    ours = model.forward(feeds)
    assert ours[output].shape == shape and np.isfinite(ours[output]).all()

    onnx_path = tmp_path / "m.onnx"
    assert exporter.main(["onnx", conf, snapshot, "-o", str(onnx_path)]) == 0
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)[0]
    diff = np.abs(got - ours[output]).max()
    print(name, "max |onnxruntime − ours|", diff)
    assert diff <= 1e-5 * max(1, np.abs(ours[output]).max())

    assert exporter.main(["caffe", conf, snapshot, "-o", str(tmp_path / "caffe")]) == 0
    back = import_caffe(str(tmp_path / "caffe" / caffe_write.DEPLOY), str(tmp_path / "back"),
                        str(tmp_path / "caffe" / caffe_write.WEIGHTS), print=lambda *a: None)
    theirs = deploy.read(back, str(tmp_path / "back"))
    assert [(op.name, op.type) for op in model.ops] == [(op.name, op.type) for op in theirs.ops]
    for a, b in zip(model.ops, theirs.ops):
        assert len(a.params) == len(b.params), a.name
        for u, v in zip(a.params, b.params):
            assert np.array_equal(u, v), a.name
    again = theirs.forward(feeds)
    assert all(np.array_equal(again[op.name], ours[op.name]) for op in model.ops)


def test_zoo_in_place_layers_read_the_last_writer(tmp_path):
    """ResNet's in-place BatchNorm, Scale and ReLU on one blob, MobileNet's depthwise
    convolutions (group = channels)."""
    net = config.load_job(zoo_import("resnet50_deploy.prototxt", tmp_path / "r"),
                          check_paths=False).neuralnet
    src = {layer.name: list(layer.srclayers) for layer in net.layer}
    assert src["bn_conv1"] == ["conv1"] and src["scale_conv1"] == ["bn_conv1"]
    assert src["pool1"] == ["conv1_relu"]
    assert src["res2a"] == ["scale2a_branch1", "scale2a_branch2c"]
    assert src["res2b"] == ["res2a_relu", "scale2b_branch2c"]
    net = config.load_job(zoo_import("mobilenet_deploy.prototxt", tmp_path / "m"),
                          check_paths=False).neuralnet
    by = {layer.name: layer for layer in net.layer}
    assert [by[n].convolution_conf.group for n in ("conv2_1/dw", "conv2_2/dw")] == [8, 16]
    assert list(by["conv2_1/sep"].srclayers) == ["relu2_1/dw"]


def test_cifar10_full_trains(tmp_path):
    """The solver and its train_test net (LMDB Data layers with a mean file, LRN
    WITHIN_CHANNEL), its LMDBs of raw Datums beside the prototxt as Caffe's examples lay them
    out: 12 SGD steps on two classes, the loss falls."""
    src = tmp_path / "src"
    (src / "examples" / "cifar10").mkdir(parents=True)
    for name in ("cifar10_full_solver.prototxt", "cifar10_full_train_test.prototxt",
                 "mean.binaryproto"):
        shutil.copy(os.path.join(ZOO, name), src / name)
    rng = np.random.default_rng(0)
    for phase in ("train", "test"):
        path = src / "examples" / "cifar10" / f"cifar10_{phase}_lmdb"
        with lmdb.open(str(path), map_size=1 << 24) as env, env.begin(write=True) as txn:
            for i in range(40):
                x = rng.integers(0, 128, (3, 16, 16), dtype=np.uint8) + np.uint8(100 * (i % 2))
                d = caffe_pb2.Datum(channels=3, height=16, width=16, label=i % 2,
                                    data=x.tobytes())
                txn.put(b"%08d" % i, d.SerializeToString())
    conf = import_caffe(str(src / "cifar10_full_solver.prototxt"), str(tmp_path / "out"),
                        print=lambda *a: None)
    history = session.train(config.load_job(conf), progress=False)
    losses = [m["loss"] for _, m in history["train"]]
    print("cifar10_full losses", [round(v, 4) for v in losses])
    assert len(losses) == 12 and losses[-1] < losses[0] - 0.02


def test_fold_bn_folds_batchnorm_and_scale_into_the_convolution(tmp_path):
    """ResNet's BatchNorm (use_global_stats, factor 2.997) and Scale folded into each
    Convolution: no kCaffeBatchNorm/kScale layer is left, the params are the folded float32
    values, and the outputs differ from the unfolded net's by float32 rounding only."""
    conf = zoo_import("resnet50_deploy.prototxt", tmp_path / "src")
    snapshot = seeded_snapshot(conf, tmp_path / "src" / "checkpoint")
    net, blobs = caffe_write.to_caffe(deploy.read(conf, snapshot))
    for layer in net.layer:     # the prototxt's convolutions without a bias term
        if layer.type == "Convolution" and layer.name != "conv1":
            del blobs[layer.name][1:]
    weights = str(tmp_path / "w.caffemodel")
    with open(weights, "wb") as f:
        caffe_write.write_caffemodel(f, net, blobs)
    plain = deploy.read(zoo_import("resnet50_deploy.prototxt", tmp_path / "plain", weights),
                        str(tmp_path / "plain"))
    notes = []
    folded_conf = import_caffe(os.path.join(ZOO, "resnet50_deploy.prototxt"),
                               str(tmp_path / "fold"), weights, fold_bn=True, print=notes.append)
    assert "-fold-bn: 8 BatchNorm layers folded into the Convolution before them (8 with " \
           "their Scale); the job computes inference statistics only" in notes
    folded = deploy.read(folded_conf, str(tmp_path / "fold"))
    assert not {"BatchNorm", "Scale"} & {op.type for op in folded.ops}
    feeds = batch(plain)
    want, got = plain.forward(feeds), folded.forward(feeds)
    # every convolution's output before the fold is the scale layer's after it
    pairs = [("fc1000", "fc1000"), ("res2b_relu", "res2b_relu"),
             ("scale2a_branch2c", "res2a_branch2c")]
    for a, b in pairs:
        scale = np.abs(want[a]).max()
        diff = np.abs(got[b] - want[a]).max()
        print(f"-fold-bn: max |folded − unfolded| of {a}: {diff:.3g} (values up to {scale:.3g})")
        assert diff <= 2e-6 * scale
    assert np.abs(got["prob"] - want["prob"]).max() < 1e-6


def test_fold_bn_keeps_what_it_cannot_fold_and_says_why(tmp_path):
    """MobileNet's BatchNorm sets no use_global_stats: global in a net without a loss, so it
    folds; a BatchNorm after a ReLU stays, with a note."""
    prototxt = tmp_path / "n.prototxt"
    prototxt.write_text(
        'input: "data" input_dim: 1 input_dim: 2 input_dim: 3 input_dim: 3\n'
        'layer { name: "c" type: "Convolution" bottom: "data" top: "c" '
        'convolution_param { num_output: 2 kernel_size: 1 } }\n'
        'layer { name: "bn" type: "BatchNorm" bottom: "c" top: "bn" }\n'
        'layer { name: "r" type: "ReLU" bottom: "bn" top: "bn" }\n'
        'layer { name: "bn2" type: "BatchNorm" bottom: "bn" top: "bn" }\n')
    one = [np.ones(2, np.float32), np.ones(2, np.float32), np.ones(1, np.float32)]
    blobs = {"c": [np.ones((2, 2, 1, 1), np.float32), np.zeros(2, np.float32)],
             "bn": one, "bn2": one}
    net = caffe_write.C.NetParameter()
    for name, kind in (("c", "Convolution"), ("bn", "BatchNorm"), ("bn2", "BatchNorm")):
        net.layer.add(name=name, type=kind)
    with open(tmp_path / "w.caffemodel", "wb") as f:
        caffe_write.write_caffemodel(f, net, blobs)
    notes = []
    conf = import_caffe(str(prototxt), str(tmp_path / "out"), str(tmp_path / "w.caffemodel"),
                        fold_bn=True, print=notes.append)
    layers = config.load_job(conf, check_paths=False).neuralnet.layer
    assert [layer.name for layer in layers] == ["input", "c", "r", "bn2"]
    assert "-fold-bn: BatchNorm 'bn2' is kept: it does not read a Convolution's top" in notes
