"""ONNX export: onnx.checker passes and onnxruntime computes what our layers compute, net by
net (LeNet, the cifar10 net, the MNIST MLP) and layer by layer (Caffe's rules: group
convolution, ceil pooling, padded AVG divisors, LRN, transposed InnerProduct; Caffe's kinds:
BatchNorm, Scale, Eltwise, Deconvolution, Crop, global pooling, Flatten, softmax over an
axis, LRN within channels); refusals."""
import numpy as np
import pytest

from export_helpers import fresh_snapshot, write_conf
from singa.checkpoint.format import CheckpointReader, write_file
from singa.interop import deploy, exporter as cli
from singa.interop import onnx as export_onnx

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


TOLERANCE = 1e-5

# The Caffe fixture's convnet (tests/fixtures/caffe README): stride-2 padded conv, MAX ceil
# pooling, LRN, group convolution, padded AVG ceil pooling, transposed InnerProduct, Dropout.
CONVNET = """
name: "convnet20"
train_steps: 1
train_one_batch { alg: kBP }
updater { type: kSGD learning_rate { type: kFixed base_lr: 0.01 } }
cluster { workspace: "WORKSPACE" }
neuralnet {
  layer { name: "data" type: kRecordInput
    store_conf { backend: "kvfile" path: "nowhere.bin" batchsize: 8 shape: 3 shape: 20 shape: 20 } }
  layer { name: "conv1" type: kCConvolution srclayers: "data"
    convolution_conf { num_filters: 12 kernel: 7 pad: 1 stride: 2 }
    param { name: "conv1_w" init { type: kGaussian std: 0.05 } }
    param { name: "conv1_b" init { type: kConstant value: 0.1 } } }
  layer { name: "relu1" type: kReLU srclayers: "conv1" }
  layer { name: "pool1" type: kCPooling srclayers: "relu1"
    pooling_conf { pool: MAX kernel: 3 stride: 2 ceil_mode: true } }
  layer { name: "norm1" type: kLRN srclayers: "pool1"
    lrn_conf { local_size: 5 alpha: 0.5 beta: 0.75 knorm: 1.5 } }
  layer { name: "conv2" type: kCConvolution srclayers: "norm1"
    convolution_conf { num_filters: 16 kernel: 3 pad: 1 group: 2 }
    param { name: "conv2_w" init { type: kGaussian std: 0.05 } }
    param { name: "conv2_b" init { type: kConstant value: 0.1 } } }
  layer { name: "relu2" type: kReLU srclayers: "conv2" }
  layer { name: "pool2" type: POOLTYPE srclayers: "relu2"
    pooling_conf { pool: AVG kernel: 3 stride: 2 pad: 1 CEIL } }
  layer { name: "ip1" type: kInnerProduct srclayers: "pool2"
    innerproduct_conf { num_output: 32 transpose: true }
    param { name: "ip1_w" init { type: kGaussian std: 0.05 } }
    param { name: "ip1_b" init { type: kConstant value: 0.1 } } }
  layer { name: "relu3" type: kReLU srclayers: "ip1" }
  layer { name: "drop1" type: kDropout srclayers: "relu3" dropout_conf { dropout_ratio: 0.3 } }
  layer { name: "ip2" type: kInnerProduct srclayers: "drop1" innerproduct_conf { num_output: 8 }
    param { name: "ip2_w" init { type: kGaussian std: 0.1 } }
    param { name: "ip2_b" init { type: kConstant value: 0 } } }
  layer { name: "loss" type: kSoftmaxLoss srclayers: "ip2" srclayers: "data" }
}
"""

# Activations, Concat, a 3-D input into a convolution, Softmax of a 4-D blob, and an output
# layer that is left out.
BRANCHES = """
name: "branches"
train_steps: 1
train_one_batch { alg: kBP }
updater { type: kSGD learning_rate { type: kFixed base_lr: 0.01 } }
cluster { workspace: "WORKSPACE" }
neuralnet {
  layer { name: "data" type: kCSVInput
    store_conf { path: "nowhere.csv" batchsize: 4 shape: 9 shape: 9 } }
  layer { name: "conv" type: kConvolution srclayers: "data"
    convolution_conf { num_filters: 4 kernel: 3 }
    param { name: "cw" init { type: kGaussian std: 0.3 } }
    param { name: "cb" init { type: kConstant value: 0.1 } } }
  layer { name: "a_stanh" type: kSTanh srclayers: "conv" }
  layer { name: "a_sigmoid" type: kActivation srclayers: "conv" activation_conf { type: SIGMOID } }
  layer { name: "a_tanh" type: kActivation srclayers: "conv" activation_conf { type: TANH } }
  layer { name: "a_stanh2" type: kActivation srclayers: "conv" activation_conf { type: STANH } }
  layer { name: "cat" type: kConcate srclayers: "a_stanh" srclayers: "a_sigmoid"
    srclayers: "a_tanh" srclayers: "a_stanh2" concate_conf { concate_dim: 1 num_concates: 4 } }
  layer { name: "pool" type: kCudnnPool srclayers: "cat"
    pooling_conf { pool: AVG kernel: 3 stride: 2 pad: 1 ceil_mode: true } }
  layer { name: "sm" type: kSoftmax srclayers: "pool" }
  layer { name: "ip" type: kInnerProduct srclayers: "sm" innerproduct_conf { num_output: 5 }
    param { name: "w" init { type: kGaussian std: 0.3 } }
    param { name: "b" init { type: kConstant value: 0.1 } } }
  layer { name: "loss" type: kSoftmaxLoss srclayers: "ip" srclayers: "data" }
  layer { name: "acc" type: kAccuracy srclayers: "ip" srclayers: "data" }
}
"""

# Caffe's kinds: BatchNorm (global statistics, a factor of 2) and Scale with a bias, a Scale
# of one number, Eltwise SUM with coeffs, PROD of three, MAX, LRN within channels, a group
# Deconvolution, Crop to the input at two offsets, global MAX and AVG pooling, softmax over
# the channels, Flatten from axis 2 (3-D) and from axis 1 into an InnerProduct.
CAFFE_KINDS = """
name: "caffe_kinds"
train_steps: 1
train_one_batch { alg: kBP }
updater { type: kSGD learning_rate { type: kFixed base_lr: 0.01 } }
cluster { workspace: "WORKSPACE" }
neuralnet {
  layer { name: "data" type: kRecordInput
    store_conf { backend: "kvfile" path: "nowhere.bin" batchsize: 2 shape: 4 shape: 6 shape: 6 } }
  layer { name: "conv" type: kCConvolution srclayers: "data"
    convolution_conf { num_filters: 4 kernel: 3 pad: 1 }
    param { name: "cw" init { type: kGaussian std: 0.3 } }
    param { name: "cb" init { type: kConstant value: 0.1 } } }
  layer { name: "bn" type: kCaffeBatchNorm srclayers: "conv" batch_norm_conf { eps: 0.001 }
    param { name: "mean" init { type: kGaussian std: 0.5 } }
    param { name: "var" init { type: kUniform low: 1 high: 3 } }
    param { name: "factor" init { type: kConstant value: 2 } } }
  layer { name: "scale" type: kScale srclayers: "bn" scale_conf { bias_term: true }
    param { name: "gamma" init { type: kUniform low: 0.5 high: 1.5 } }
    param { name: "beta" init { type: kGaussian std: 0.3 } } }
  layer { name: "gain" type: kScale srclayers: "data" scale_conf { num_axes: 0 }
    param { name: "g" init { type: kConstant value: 0.5 } } }
  layer { name: "sum" type: kEltwise srclayers: "scale" srclayers: "gain"
    eltwise_conf { coeff: 1 coeff: -0.5 } }
  layer { name: "prod" type: kEltwise srclayers: "sum" srclayers: "scale" srclayers: "data"
    eltwise_conf { operation: PROD } }
  layer { name: "max" type: kEltwise srclayers: "prod" srclayers: "sum"
    eltwise_conf { operation: MAX } }
  layer { name: "norm" type: kLRN srclayers: "max"
    lrn_conf { local_size: 3 alpha: 0.5 beta: 0.75 norm_region: WITHIN_CHANNEL } }
  layer { name: "up" type: kDeconvolution srclayers: "norm"
    convolution_conf { num_filters: 6 kernel: 4 stride: 2 pad: 1 group: 2 }
    param { name: "uw" init { type: kGaussian std: 0.3 } }
    param { name: "ub" init { type: kConstant value: 0.1 } } }
  layer { name: "crop" type: kCrop srclayers: "up" srclayers: "data"
    crop_conf { offset: 3 offset: 2 } }
  layer { name: "gmax" type: kPooling srclayers: "crop"
    pooling_conf { pool: MAX global_pooling: true } }
  layer { name: "gavg" type: kPooling srclayers: "crop"
    pooling_conf { pool: AVG global_pooling: true } }
  layer { name: "cat" type: kConcate srclayers: "gmax" srclayers: "gavg"
    concate_conf { concate_dim: 1 num_concates: 2 } }
  layer { name: "sm" type: kSoftmax srclayers: "cat" softmax_conf { axis: 1 } }
  layer { name: "rows" type: kFlatten srclayers: "crop" flatten_conf { axis: 2 } }
  layer { name: "flat" type: kFlatten srclayers: "sm" }
  layer { name: "ip" type: kInnerProduct srclayers: "flat" innerproduct_conf { num_output: 3 }
    param { name: "w" init { type: kGaussian std: 0.3 } }
    param { name: "b" init { type: kConstant value: 0.1 } } }
}
"""


def compare(conf, snapshot, tmp_path, inputs=None, snapshot_needed=True):
    """Export through the CLI, check the model, run it in onnxruntime with every op as an
    output, and return {op name: max |ours − onnxruntime|} (asserting shapes agree)."""
    if not snapshot_needed:         # a net without params: an empty snapshot file
        write_file(str(tmp_path / "step1-worker0"), [])
    out = tmp_path / "model.onnx"
    assert cli.main(["onnx", str(conf), str(snapshot), "-o", str(out)]) == 0
    onnx.checker.check_model(onnx.load(out), full_check=True)
    model = deploy.read(str(conf), str(snapshot))
    proto = export_onnx.to_onnx(model, extra_outputs=[op.name for op in model.ops
                                                      if op.type != "Input"])
    rng = np.random.default_rng(7)
    feeds = inputs or {op.name: rng.random(op.shape, dtype=np.float32) for op in model.inputs}
    ours = model.forward(feeds)
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)
    diffs = {}
    for meta, value in zip(sess.get_outputs(), got):
        assert value.shape == ours[meta.name].shape, meta.name
        diffs[meta.name] = float(np.abs(value.astype(np.float64) - ours[meta.name]).max())
    return model, diffs


@pytest.mark.parametrize("conf", ["examples/mnist/conv.conf", "examples/cifar10/job.conf",
                                  "examples/mnist/job.conf"])
def test_example_nets_run_in_onnxruntime_as_in_singa(conf, tmp_path):
    snapshot = fresh_snapshot(conf, tmp_path / "checkpoint")
    model, diffs = compare(conf, tmp_path / "checkpoint", tmp_path)
    print(conf, "max |diff| of the outputs", {k: diffs[k] for k in model.outputs},
          "of any layer", max(diffs.values()))
    assert model.outputs == ["loss"]
    assert max(diffs.values()) < TOLERANCE, diffs
    assert snapshot.endswith(".bin")


@pytest.mark.parametrize("pool_type, ceil", [("kCPooling", "ceil_mode: true"),
                                             ("kPooling", "ceil_mode: true"),
                                             ("kCudnnPool", "ceil_mode: true"),
                                             ("kCPooling", ""), ("kCudnnPool", "")])
def test_caffes_rules_carry_over_layer_by_layer(pool_type, ceil, tmp_path):
    conf = write_conf(tmp_path, CONVNET.replace("POOLTYPE", pool_type).replace("CEIL", ceil))
    fresh_snapshot(conf, tmp_path / "checkpoint")
    model, diffs = compare(conf, tmp_path / "checkpoint", tmp_path)
    shapes = {op.name: op.shape for op in model.ops}
    assert shapes["pool1"] == (8, 12, 4, 4)
    assert shapes["pool2"] == ((8, 16, 3, 3) if ceil else (8, 16, 2, 2))
    assert onnx.load(tmp_path / "model.onnx").opset_import[0].version == 17
    assert max(diffs.values()) < TOLERANCE, diffs


def test_activations_concat_and_softmax_of_a_4d_blob(tmp_path):
    conf = write_conf(tmp_path, BRANCHES)
    fresh_snapshot(conf, tmp_path / "checkpoint")
    model, diffs = compare(conf, tmp_path / "checkpoint", tmp_path)
    assert [op.type for op in model.ops if op.name.startswith("a_")] == \
        ["STanh", "Sigmoid", "Tanh", "STanh"]
    assert model.outputs == ["loss"]            # kAccuracy left out
    assert max(diffs.values()) < TOLERANCE, diffs


def test_caffes_kinds_run_in_onnxruntime_as_in_singa(tmp_path):
    conf = write_conf(tmp_path, CAFFE_KINDS)
    fresh_snapshot(conf, tmp_path / "checkpoint")
    model, diffs = compare(conf, tmp_path / "checkpoint", tmp_path)
    print("Caffe's kinds: max |diff| per op", diffs)
    assert sorted(model.outputs) == ["ip", "rows"]
    proto = onnx.load(tmp_path / "model.onnx")
    assert proto.opset_import[0].version == 17
    kinds = {n.op_type for n in proto.graph.node}
    assert {"BatchNormalization", "Sum", "Max", "ConvTranspose", "Slice", "GlobalMaxPool",
            "GlobalAveragePool", "Flatten", "Reshape", "Pow"} <= kinds
    assert max(diffs.values()) < TOLERANCE, diffs


def test_batch_statistics_at_test_are_refused_in_one_line(tmp_path, capsys):
    conf = write_conf(tmp_path, CAFFE_KINDS.replace("eps: 0.001", "use_global_stats: false"))
    fresh_snapshot(conf, tmp_path / "checkpoint")
    assert cli.main(["onnx", conf, str(tmp_path), "-o", str(tmp_path / "x.onnx")]) == 2
    assert capsys.readouterr().err == (
        f"singa-export: {conf}: layer 'bn' (kCaffeBatchNorm): normalises by batch statistics "
        f"at test (use_global_stats: false); ONNX's BatchNormalization takes given statistics\n")


def test_the_batch_is_symbolic_unless_given(tmp_path):
    conf = "examples/mnist/conv.conf"
    fresh_snapshot(conf, tmp_path / "checkpoint")
    model = deploy.read(conf, str(tmp_path / "checkpoint"))
    x = np.random.default_rng(0).random(model.inputs[0].shape, dtype=np.float32)
    ours = model.forward({"data": x})["loss"]
    proto = export_onnx.to_onnx(model)
    assert proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param == "N"
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    p = sess.run(None, {"data": x[:3]})[0]
    np.testing.assert_allclose(p, ours[:3], atol=TOLERANCE)
    fixed = export_onnx.to_onnx(model, batch=5)
    assert fixed.graph.input[0].type.tensor_type.shape.dim[0].dim_value == 5


def test_params_are_the_snapshots_values(tmp_path):
    conf = write_conf(tmp_path, CONVNET.replace("POOLTYPE", "kCPooling")
                      .replace("CEIL", "ceil_mode: true"))
    fresh_snapshot(conf, tmp_path / "checkpoint")
    model = deploy.read(conf, str(tmp_path / "checkpoint"))
    proto = export_onnx.to_onnx(model)
    init = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer}
    stored = CheckpointReader(str(tmp_path / "checkpoint" / "step5-worker0.bin"))
    assert init["conv2_w"].shape == (16, 6, 3, 3)
    np.testing.assert_array_equal(init["conv2_w"].reshape(16, -1), stored.param("0#conv2_w"))
    assert init["ip1_w"].shape == (144, 32)     # transposed: Gemm without transB
    np.testing.assert_array_equal(init["ip1_w"], stored.param("0#ip1_w"))


def test_unsupported_layer_is_one_line_naming_it(tmp_path, capsys):
    conf = write_conf(tmp_path, BRANCHES.replace('type: kSoftmax srclayers: "pool"',
                                                 'type: kBM srclayers: "pool" param { name: "s" } '
                                                 'param { name: "t" } param { name: "u" } '
                                                 'param { name: "v" }'))
    assert cli.main(["onnx", conf, str(tmp_path), "-o", str(tmp_path / "x.onnx")]) == 2
    err = capsys.readouterr().err
    assert err == f"singa-export: {conf}: layer 'sm' (kBM) has no ONNX equivalent\n"
    assert not (tmp_path / "x.onnx").exists()


POOLS = """
name: "pools"
train_steps: 1
train_one_batch { alg: kBP }
updater { type: kSGD learning_rate { type: kFixed base_lr: 0.01 } }
cluster { workspace: "WORKSPACE" }
neuralnet {
  layer { name: "data" type: kRecordInput
    store_conf { backend: "kvfile" path: "nowhere.bin" batchsize: 2 shape: 2 shape: 5 shape: 7 } }
  layer { name: "max" type: kCPooling srclayers: "data"
    pooling_conf { pool: MAX kernel: 2 stride: 2 pad: 1 ceil_mode: true } }
  layer { name: "avg" type: kCPooling srclayers: "data"
    pooling_conf { pool: AVG kernel: 2 stride: 2 pad: 1 ceil_mode: true } }
  layer { name: "rect" type: kPooling srclayers: "data"
    pooling_conf { pool: AVG kernel_y: 3 kernel_x: 2 stride_y: 2 stride_x: 3 pad_y: 1
                   ceil_mode: true } }
  layer { name: "cudnn" type: kCudnnPool srclayers: "data"
    pooling_conf { pool: AVG kernel: 3 stride: 2 pad: 1 ceil_mode: true } }
  layer { name: "cat" type: kConcate srclayers: "max" srclayers: "avg"
    concate_conf { concate_dim: 1 num_concates: 2 } }
}
"""


def test_ceil_pooling_drops_a_last_window_starting_in_the_padding_as_onnxruntime(tmp_path):
    # 5 rows, k 2, s 2, p 1: ceil gives 4 windows, the last would start at row 5 = H: 3
    conf = write_conf(tmp_path, POOLS)
    model, diffs = compare(conf, tmp_path, tmp_path, snapshot_needed=False)
    shapes = {op.name: op.shape for op in model.ops}
    assert shapes["max"] == (2, 2, 3, 4) and shapes["rect"] == (2, 2, 3, 3)
    # before opset 22, ONNX pooling keeps that window
    assert onnx.load(tmp_path / "model.onnx").opset_import[0].version == 22
    assert sorted(model.outputs) == ["cat", "cudnn", "rect"]
    assert max(diffs.values()) < TOLERANCE, diffs
