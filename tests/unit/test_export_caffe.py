"""Caffe export: deploy.prototxt + model.caffemodel that real Caffe ran to our outputs (its
recorded blobs, tests/fixtures/caffe/exported), that the Caffe importer reads back to the
same values (import ∘ export is the identity, bit for bit), and an imported Caffe model
exported again gives back Caffe's own weights; ONNX of an imported Caffe model reproduces
Caffe's outputs. Real Caffe is never needed."""
import hashlib
import importlib.util
import os

import numpy as np
import pytest
from google.protobuf import text_format

from export_helpers import fresh_snapshot, write_conf
from singa.errors import ConfigError
from singa.interop import deploy as deploy_view, exporter as cli
from singa.interop.caffe import write as caffe
from singa.proto import caffe_pb2
from test_export_onnx import BRANCHES, CAFFE_KINDS, CONVNET

caffe_cli = pytest.importorskip("singa.interop.caffe.importer")
FIXTURES = "tests/fixtures/caffe"
EXPORTED = os.path.join(FIXTURES, "exported")


def import_caffe(deploy, weights, out):
    """`singa-import.sh caffe deploy weights -o out`; the imported job.conf."""
    assert caffe_cli.main(["caffe", str(deploy), str(weights), "-o", str(out)]) == 0
    return os.path.join(out, "job.conf")


def export_caffe(conf, snapshot, out):
    assert cli.main(["caffe", str(conf), str(snapshot), "-o", str(out)]) == 0
    return os.path.join(out, caffe.DEPLOY), os.path.join(out, caffe.WEIGHTS)


def caffemodel_blobs(path):
    """{layer name: [array of its blob's shape]} of a V2 .caffemodel."""
    net = caffe_pb2.NetParameter()
    with open(path, "rb") as f:
        net.ParseFromString(f.read())
    return {layer.name: [np.array(b.data, np.float32).reshape(tuple(b.shape.dim))
                         for b in layer.blobs] for layer in net.layer if layer.blobs}


def exported_nets():
    """tests/fixtures/caffe/exported/make/nets.py: the nets whose exports real Caffe ran."""
    spec = importlib.util.spec_from_file_location(
        "exported_nets", os.path.join(EXPORTED, "make", "nets.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("name", ["mlp", "lenet", "cifar10", "convnet", "rules",
                                  "preprocess"])
def test_real_caffe_ran_our_export_to_our_outputs(name, tmp_path):
    """Each net of the fixtures (the MNIST MLP, LeNet, the cifar10 net, the Caffe convnet
    imported, a net of Caffe's rules, one with kImagePreprocess), exported again: the same
    deploy.prototxt and model.caffemodel bytes real Caffe 1.0 (pycaffe, CPU) ran, whose
    recorded blobs are our forward's within 1e-5 (outputs; other blobs 1e-5 relative to their
    size), from the job conf and from the export imported back (STanh, written as Power, TanH,
    Power, comes back as kSTanh; kImagePreprocess, written as Power, as kImagePreprocess)."""
    folder = os.path.join(EXPORTED, name)
    conf, snapshot, x = exported_nets().make(name, tmp_path / "src")
    if name != "convnet":
        assert np.array_equal(x, np.load(os.path.join(folder, "input.npy")))
    deploy, weights = export_caffe(conf, snapshot, tmp_path / "caffe")
    remake = "the export changed: remake the fixtures (tests/fixtures/caffe/exported/README.md)"
    with open(deploy) as f, open(os.path.join(folder, caffe.DEPLOY)) as g:
        assert f.read() == g.read(), remake
    with open(weights, "rb") as f, open(os.path.join(folder, "model.sha256")) as g:
        assert hashlib.sha256(f.read()).hexdigest() == g.read().split()[0], remake
    caffes = np.load(os.path.join(folder, "caffe_blobs.npz"))
    model = deploy_view.read(conf, str(snapshot), "Caffe")
    runs = [model]
    if name != "mlp":       # the MLP's round trip: test_import_of_an_export_with_power_layers
        back = import_caffe(deploy, weights, tmp_path / "back")
        runs.append(deploy_view.read(back, str(tmp_path / "back")))
    assert set(model.outputs) <= set(caffes.files)
    for ours in runs:
        got = ours.forward({ours.inputs[0].name: x.reshape(ours.inputs[0].shape)})
        for blob in caffes.files:
            want = caffes[blob].astype(np.float64)
            have = got[blob].reshape(want.shape)
            bound = 1e-5 if blob in model.outputs else 1e-5 * max(1, np.abs(want).max())
            diff = np.abs(have - want).max()
            assert diff < bound, (blob, diff)
        print(name, "max |Caffe − ours| of", model.outputs,
              max(np.abs(got[o].reshape(caffes[o].shape) - caffes[o]).max()
                  for o in model.outputs))


@pytest.mark.parametrize("conf_text", [
    CONVNET.replace("POOLTYPE", "kCPooling").replace("CEIL", "ceil_mode: true"),
    CONVNET.replace("POOLTYPE", "kPooling").replace("CEIL", ""),
    None])                                          # LeNet
def test_import_of_an_export_is_the_identity(conf_text, tmp_path):
    conf = write_conf(tmp_path, conf_text) if conf_text else "examples/mnist/conv.conf"
    fresh_snapshot(conf, tmp_path / "checkpoint")
    deploy, weights = export_caffe(conf, tmp_path / "checkpoint", tmp_path / "caffe")
    back = import_caffe(deploy, weights, tmp_path / "back")
    ours = deploy_view.read(conf, str(tmp_path / "checkpoint"))
    theirs = deploy_view.read(back, str(tmp_path / "back"))
    assert [(op.name, op.type) for op in ours.ops] == [(op.name, op.type) for op in theirs.ops]
    for a, b in zip(ours.ops, theirs.ops):
        assert len(a.params) == len(b.params)
        for x, y in zip(a.params, b.params):
            assert x.shape == y.shape and np.array_equal(x, y), a.name
        if a.type == "Pooling":
            assert a.conf.pooling_conf.ceil_mode == b.conf.pooling_conf.ceil_mode
        if a.type == "Convolution":
            assert a.conf.convolution_conf.group == b.conf.convolution_conf.group
    x = np.random.default_rng(0).random(ours.inputs[0].shape, dtype=np.float32)
    want, got = ours.forward({"data": x}), theirs.forward({"data": x})
    assert ours.outputs == theirs.outputs == ["loss"]
    assert np.array_equal(want["loss"], got["loss"])


def test_import_of_an_export_of_caffes_kinds_is_the_identity(tmp_path):
    """BatchNorm, Scale (γ of one number: Caffe's shape ()), Eltwise, LRN WITHIN_CHANNEL,
    Deconvolution, Crop, global pooling, softmax over axis 1, Flatten: written as Caffe's
    layers and read back to the same ops and confs, params and outputs bit for bit."""
    conf = write_conf(tmp_path, CAFFE_KINDS)
    fresh_snapshot(conf, tmp_path / "checkpoint")
    deploy, weights = export_caffe(conf, tmp_path / "checkpoint", tmp_path / "caffe")
    layers = {l.name: l for l in text_format.Parse(open(deploy).read(),
                                                   caffe_pb2.NetParameter()).layer}
    assert [layers[n].type for n in ("bn", "scale", "sum", "up", "crop", "rows")] == [
        "BatchNorm", "Scale", "Eltwise", "Deconvolution", "Crop", "Flatten"]
    assert layers["gmax"].pooling_param.global_pooling
    assert layers["norm"].lrn_param.norm_region == caffe_pb2.LRNParameter.WITHIN_CHANNEL
    assert layers["crop"].bottom == ["up", "data"] and layers["sm"].bottom == ["cat"]
    assert [b.shape for b in caffemodel_blobs(weights)["gain"]] == [()]
    back = import_caffe(deploy, weights, tmp_path / "back")
    ours = deploy_view.read(conf, str(tmp_path / "checkpoint"))
    theirs = deploy_view.read(back, str(tmp_path / "back"))
    assert [(op.name, op.type) for op in ours.ops] == [(op.name, op.type) for op in theirs.ops]
    for a, b in zip(ours.ops, theirs.ops):
        for field in ("batch_norm_conf", "scale_conf", "eltwise_conf", "flatten_conf",
                      "crop_conf", "pooling_conf", "lrn_conf", "softmax_conf"):
            assert getattr(a.conf, field) == getattr(b.conf, field), (a.name, field)
        assert len(a.params) == len(b.params), a.name
        for u, v in zip(a.params, b.params):
            assert u.shape == v.shape and np.array_equal(u, v), a.name
    x = np.random.default_rng(0).random(ours.inputs[0].shape, dtype=np.float32)
    want, got = ours.forward({"data": x}), theirs.forward({"data": x})
    assert all(np.array_equal(want[op.name], got[op.name]) for op in ours.ops)


@pytest.mark.parametrize("name", ["mlp", "rules", "preprocess"])
def test_import_of_an_export_with_power_layers_is_the_identity(name, tmp_path):
    """The nets whose Caffe export has Power layers (the MNIST MLP's STanh, the rules net's
    STanh, kImagePreprocess's scale), with the fixtures' seeded values: imported back, the same
    ops (STanh as kSTanh, the Power of kImagePreprocess as kImagePreprocess), every param bit
    for bit and every op's output within 1e-6 of ours."""
    conf, snapshot, x = exported_nets().make(name, tmp_path / "src")
    deploy, weights = export_caffe(conf, snapshot, tmp_path / "caffe")
    back = import_caffe(deploy, weights, tmp_path / "back")
    ours = deploy_view.read(conf, str(snapshot), "Caffe")
    theirs = deploy_view.read(back, str(tmp_path / "back"))
    assert [(op.name, op.type) for op in ours.ops] == [(op.name, op.type) for op in theirs.ops]
    assert ours.outputs == theirs.outputs
    for a, b in zip(ours.ops, theirs.ops):
        assert len(a.params) == len(b.params), a.name
        for u, v in zip(a.params, b.params):
            assert u.shape == v.shape and np.array_equal(u, v), a.name
        if a.type == "Preprocess":
            assert b.conf.rgbimage_conf.scale == a.conf.rgbimage_conf.scale
    want = ours.forward({ours.inputs[0].name: x.reshape(ours.inputs[0].shape)})
    got = theirs.forward({theirs.inputs[0].name: x.reshape(theirs.inputs[0].shape)})
    diff = max(np.abs(got[op.name] - want[op.name].reshape(got[op.name].shape)).max()
               for op in ours.ops)
    print(name, "max |imported − ours| over the ops", diff)
    assert diff <= 1e-6


@pytest.mark.parametrize("net, deploy, weights", [
    ("convnet", "convnet_deploy.prototxt", "convnet_iter_60.caffemodel"),
    ("mlp", "mlp_deploy.prototxt", "mlp_iter_40.caffemodel")])
def test_export_of_an_imported_caffe_model_gives_back_caffes_weights(net, deploy, weights,
                                                                     tmp_path):
    folder = os.path.join(FIXTURES, net)
    back = import_caffe(os.path.join(folder, deploy), os.path.join(folder, weights),
                        tmp_path / "imported")
    new_deploy, new_weights = export_caffe(back, tmp_path / "imported", tmp_path / "caffe")
    want, got = caffemodel_blobs(os.path.join(folder, weights)), caffemodel_blobs(new_weights)
    assert sorted(want) == sorted(got)
    for name in want:
        for a, b in zip(want[name], got[name]):
            assert a.shape == b.shape and np.array_equal(a, b), name
    # the deploy net is Caffe's, in-place ReLU/Dropout written as their own tops
    ours = text_format.Parse(open(new_deploy).read(), caffe_pb2.NetParameter())
    theirs = text_format.Parse(open(os.path.join(folder, deploy)).read(),
                               caffe_pb2.NetParameter())
    assert [(l.name, l.type) for l in ours.layer] == [(l.name, l.type) for l in theirs.layer]
    for a, b in zip(ours.layer, theirs.layer):
        if a.type == "Pooling":
            assert a.pooling_param.pool == b.pooling_param.pool
            assert a.pooling_param.round_mode == caffe_pb2.PoolingParameter.CEIL
        if a.type == "Convolution":
            assert a.convolution_param.group == b.convolution_param.group
        if a.type == "LRN":
            assert (a.lrn_param.local_size, a.lrn_param.alpha, a.lrn_param.k) == \
                (b.lrn_param.local_size, b.lrn_param.alpha, b.lrn_param.k)


@pytest.mark.parametrize("net, deploy, weights", [
    ("convnet", "convnet_deploy.prototxt", "convnet_iter_60.caffemodel"),
    ("mlp", "mlp_deploy.prototxt", "mlp_iter_40.caffemodel")])
def test_onnx_of_an_imported_caffe_model_gives_caffes_outputs(net, deploy, weights, tmp_path):
    ort = pytest.importorskip("onnxruntime")
    folder = os.path.join(FIXTURES, net)
    back = import_caffe(os.path.join(folder, deploy), os.path.join(folder, weights),
                        tmp_path / "imported")
    out = tmp_path / "model.onnx"
    assert cli.main(["onnx", back, str(tmp_path / "imported"), "-o", str(out)]) == 0
    x = np.load(os.path.join(folder, "input.npy"))
    prob = np.load(os.path.join(folder, "prob.npy"))
    sess = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    got = sess.run(None, {sess.get_inputs()[0].name: x})[0]
    print(net, "max |onnxruntime − Caffe| of prob", np.abs(got - prob).max())
    assert got.shape == prob.shape
    assert np.abs(got - prob).max() < 1e-5


def test_stanh_becomes_power_tanh_power(tmp_path):
    conf = write_conf(tmp_path, BRANCHES.replace(
        'layer { name: "pool" type: kCudnnPool', 'layer { name: "pool" type: kCPooling'))
    fresh_snapshot(conf, tmp_path / "checkpoint")
    deploy, _ = caffe.to_caffe(deploy_view.read(conf, str(tmp_path / "checkpoint"), "Caffe"))
    layers = {l.name: l for l in deploy.layer}
    assert [layers[n].type for n in ("a_stanh_Bx", "a_stanh_tanh", "a_stanh")] == \
        ["Power", "TanH", "Power"]
    assert layers["a_stanh"].bottom == ["a_stanh_tanh"]
    assert np.float32(layers["a_stanh"].power_param.scale) == np.float32(1.7159047)
    # the 3-D input read by a convolution is declared with its one channel
    assert list(layers["data"].input_param.shape[0].dim) == [4, 1, 9, 9]
    assert layers["sm"].bottom == ["sm_flat"] and layers["sm_flat"].type == "Flatten"


def test_a_padded_cudnn_avg_pooling_is_refused_in_one_line(tmp_path, capsys):
    conf = write_conf(tmp_path, BRANCHES)
    fresh_snapshot(conf, tmp_path / "checkpoint")
    assert cli.main(["caffe", conf, str(tmp_path), "-o", str(tmp_path / "caffe")]) == 2
    assert capsys.readouterr().err == (
        f"singa-export: {conf}: layer 'pool' (kCudnnPool) divides by the real pixels of a "
        f"padded window (cuDNN); Caffe's AVE counts the padding\n")
    assert not os.path.exists(tmp_path / "caffe")
    with pytest.raises(ConfigError):
        caffe.to_caffe(deploy_view.read(conf, str(tmp_path / "checkpoint"), "Caffe"))


def test_the_streamed_caffemodel_is_the_message_protobuf_would_write(tmp_path):
    conf = write_conf(tmp_path, CONVNET.replace("POOLTYPE", "kCPooling")
                      .replace("CEIL", "ceil_mode: true"))
    fresh_snapshot(conf, tmp_path / "checkpoint")
    deploy, blobs = caffe.to_caffe(deploy_view.read(conf, str(tmp_path / "checkpoint"), "Caffe"))
    want = caffe_pb2.NetParameter()
    want.CopyFrom(deploy)
    for layer in want.layer:
        for values in blobs.get(layer.name, ()):
            b = layer.blobs.add()
            b.shape.dim.extend(values.shape)
            b.data.extend(values.ravel())
    path = tmp_path / "m.caffemodel"
    with open(path, "wb") as f:
        caffe.write_caffemodel(f, deploy, blobs)
    got = caffe_pb2.NetParameter.FromString(path.read_bytes())
    assert got == want
    assert [len(layer.blobs) for layer in got.layer if layer.blobs] == [2, 2, 2, 2]
