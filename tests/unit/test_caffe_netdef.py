"""singa.interop.caffe.netdef: NetParameter from text or binary, V1/V0 layers and the deprecated input
header upgraded to V2 layers, Caffe's phase rules."""
import os
import subprocess
import sys

import pytest
from google.protobuf import text_format

import singa
from singa.interop.caffe.netdef import TEST, TRAIN, in_net_state, read_net
from singa.errors import ConfigError
from singa.proto import caffe_pb2

FX = os.path.join(singa.HOME, "tests", "fixtures", "caffe")


def summary(net):
    return [(layer.name, layer.type, list(layer.bottom), list(layer.top)) for layer in net.layer]


def test_v1_deploy_upgrades_like_caffes_upgrade_tool():
    ours = read_net(os.path.join(FX, "legacy", "mlp_v1_deploy.prototxt"))
    caffes = read_net(os.path.join(FX, "legacy", "mlp_v1_deploy_upgraded.prototxt"))
    assert summary(ours) == summary(caffes) == [
        ("input", "Input", [], ["data"]), ("ip1", "InnerProduct", ["data"], ["ip1"]),
        ("relu1", "ReLU", ["ip1"], ["ip1"]), ("ip2", "InnerProduct", ["ip1"], ["ip2"]),
        ("prob", "Softmax", ["ip2"], ["prob"])]
    assert list(ours.layer[0].input_param.shape[0].dim) == [16, 1, 8, 8]
    assert ours.layer[1].inner_product_param.num_output == 64


def test_binary_net_and_blobs_lr_become_param_specs():
    net = read_net(os.path.join(FX, "legacy", "mlp_v1.caffemodel"))
    ip1 = net.layer[1]
    assert (ip1.name, ip1.type) == ("ip1", "InnerProduct")
    assert [(p.lr_mult, p.decay_mult) for p in ip1.param] == [(1, 1), (2, 0)]
    assert net.layer[0].type == "HDF5Data" and net.layer[-1].type == "SoftmaxWithLoss"


def test_v0_layers_upgrade(tmp_path):
    net = caffe_pb2.NetParameter(input=["data"], input_dim=[2, 3, 8, 8])
    v1 = net.layers.add(bottom=["data"], top=["conv"])
    v0 = v1.layer
    v0.name, v0.type, v0.num_output, v0.kernelsize, v0.pad, v0.stride, v0.group = \
        "conv", "conv", 4, 3, 1, 2, 1
    v0.blobs_lr.extend([1, 2])
    v1 = net.layers.add(bottom=["conv"], top=["pool"])
    v1.layer.name, v1.layer.type, v1.layer.kernelsize, v1.layer.stride = "pool", "pool", 3, 2
    path = tmp_path / "v0.prototxt"
    path.write_text(text_format.MessageToString(net))
    up = read_net(str(path))
    assert summary(up) == [("input", "Input", [], ["data"]),
                           ("conv", "Convolution", ["data"], ["conv"]),
                           ("pool", "Pooling", ["conv"], ["pool"])]
    c = up.layer[1].convolution_param
    assert (c.num_output, list(c.kernel_size), list(c.pad), list(c.stride)) == (4, [3], [1], [2])
    assert [p.lr_mult for p in up.layer[1].param] == [1, 2]
    assert (up.layer[2].pooling_param.kernel_size, up.layer[2].pooling_param.stride) == (3, 2)


def test_input_shape_header(tmp_path):
    path = tmp_path / "n.prototxt"
    path.write_text('input: "x" input_shape { dim: 4 dim: 10 }\n'
                    'layer { name: "ip" type: "InnerProduct" bottom: "x" top: "ip" }\n')
    net = read_net(str(path))
    assert list(net.layer[0].input_param.shape[0].dim) == [4, 10]


def test_phase_rules_are_caffes():
    layer = caffe_pb2.LayerParameter(include=[caffe_pb2.NetStateRule(phase=TEST)])
    assert in_net_state(layer, TEST) and not in_net_state(layer, TRAIN)
    layer = caffe_pb2.LayerParameter(exclude=[caffe_pb2.NetStateRule(phase=TEST)])
    assert in_net_state(layer, TRAIN) and not in_net_state(layer, TEST)
    staged = caffe_pb2.LayerParameter(include=[caffe_pb2.NetStateRule(stage=["deploy"])])
    assert not in_net_state(staged, TEST)
    assert in_net_state(caffe_pb2.LayerParameter(), TRAIN)


def test_text_mistakes_are_one_line_with_file_and_line(tmp_path):
    path = tmp_path / "bad.prototxt"
    path.write_text('name: "x"\nlayer {\n  name: "a"\n  typo: 3\n}\n')
    with pytest.raises(ConfigError) as e:
        read_net(str(path))
    assert str(e.value).startswith(f"{path}:4:") and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="No such file"):
        read_net(str(tmp_path / "missing.prototxt"))


def test_caffe_pb2_is_generated_from_proto_caffe_proto(tmp_path):
    subprocess.run(["sh", os.path.join(singa.HOME, "proto", "generate.sh"), str(tmp_path),
                    sys.executable], check=True, capture_output=True)
    with open(tmp_path / "caffe_pb2.py") as fresh, \
            open(os.path.join(singa.HOME, "singa", "proto", "caffe_pb2.py")) as ours:
        assert fresh.read() == ours.read(), "singa/proto/caffe_pb2.py is stale: run proto/generate.sh"
