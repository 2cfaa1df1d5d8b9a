"""Every layer kind of SINGA's examples on GPU 0 against the CPU: one forward and backward
pass of small nets with the same params, inputs and random draws; each blob, each gradient
and each param gradient within `BOUND` of its largest value on the CPU. The bounds are float32
rounding: cuBLAS and CuPy's reductions sum in another order than numpy (about 1e-6 of a
blob's scale after a few layers); exp, log, tanh and pow are CUDA's own (a few ulp)."""
import zlib

import numpy as np
import pytest
from google.protobuf import text_format

from singa import device
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2

TRAIN, BACK = job_pb2.kTrain | job_pb2.kForward, job_pb2.kTrain | job_pb2.kBackward


def dummy(name, *shape, src=None):
    conf = f'layer {{ name: "{name}" type: kDummy dummy_conf {{ input: true '
    return conf + " ".join(f"shape: {s}" for s in shape) + " } }\n"


def param(name, init="kGaussian std: 0.3"):
    return f'param {{ name: "{name}" init {{ type: {init} }} }}'


def loss(src, n, kind="kSoftmaxLoss softmaxloss_conf { topk: 2 }"):
    """A loss of `src` with the labels of a batch of `n` (layer y)."""
    return (dummy("y", n, 1) + f'layer {{ name: "loss" type: {kind.split()[0]} srclayers: "{src}" '
            f'srclayers: "y" {" ".join(kind.split()[1:])} }}\n')

NETS = {
    "innerproduct, relu, softmax loss": (
        dummy("x", 8, 20)
        + f'layer {{ name: "h" type: kInnerProduct srclayers: "x" {param("w1")} {param("b1")} '
          'innerproduct_conf { num_output: 16 } }\n'
        + 'layer { name: "r" type: kReLU srclayers: "h" }\n'
        + f'layer {{ name: "o" type: kInnerProduct srclayers: "r" {param("w2")} {param("b2")} '
          'innerproduct_conf { num_output: 10 transpose: true } }\n'
        + loss("o", 8), (8, 20), 1e-5),
    "convolution, pooling, LRN": (
        dummy("x", 4, 4, 12, 12)
        + f'layer {{ name: "c1" type: kConvolution srclayers: "x" {param("w1")} {param("b1")} '
          'convolution_conf { num_filters: 6 kernel: 3 pad: 1 } }\n'
        + 'layer { name: "p1" type: kPooling srclayers: "c1" '
          'pooling_conf { pool: MAX kernel: 3 stride: 2 } }\n'
        + f'layer {{ name: "c2" type: kCConvolution srclayers: "p1" {param("w2")} {param("b2")} '
          'convolution_conf { num_filters: 4 kernel: 3 stride: 2 pad: 1 group: 2 } }\n'
        + 'layer { name: "n" type: kLRN srclayers: "c2" lrn_conf { local_size: 3 alpha: 0.5 '
          'beta: 0.75 } }\n'
        + 'layer { name: "p2" type: kCudnnPool srclayers: "n" '
          'pooling_conf { pool: AVG kernel: 2 stride: 1 pad: 1 } }\n'
        + 'layer { name: "p3" type: kPooling srclayers: "p2" '
          'pooling_conf { pool: AVG kernel: 2 stride: 2 ceil_mode: true } }\n'
        + f'layer {{ name: "o" type: kInnerProduct srclayers: "p3" {param("w3")} {param("b3")} '
          'innerproduct_conf { num_output: 10 } }\n'
        + loss("o", 4), (4, 4, 12, 12), 2e-5),
    "activations, dropout, euclidean loss": (
        dummy("x", 6, 30) + dummy("t", 6, 5)
        + 'layer { name: "s" type: kSigmoid srclayers: "x" }\n'
        + 'layer { name: "st" type: kSTanh srclayers: "s" }\n'
        + 'layer { name: "a" type: kActivation srclayers: "st" activation_conf { type: TANH } }\n'
        + 'layer { name: "d" type: kDropout srclayers: "a" dropout_conf { dropout_ratio: 0.3 } }\n'
        + f'layer {{ name: "o" type: kInnerProduct srclayers: "d" {param("w")} {param("b")} '
          'innerproduct_conf { num_output: 5 } }\n'
        + 'layer { name: "loss" type: kEuclideanLoss srclayers: "o" srclayers: "t" }\n',
        (6, 30), 1e-5),
    "batch normalisation (kCudnnBM), cuDNN softmax loss": (
        dummy("x", 4, 3, 5, 5)
        + 'layer { name: "bm" type: kCudnnBM srclayers: "x" '
        + " ".join(param(f"k{i}", "kConstant value: %g" % v)
                   for i, v in ((1, 1.5), (2, 0.2), (3, 0), (4, 0))) + " }\n"
        + 'layer { name: "r" type: kCudnnActivation srclayers: "bm" '
          'activation_conf { type: RELU } }\n'
        + f'layer {{ name: "o" type: kInnerProduct srclayers: "r" {param("w")} {param("b")} '
          'innerproduct_conf { num_output: 10 } }\n'
        + loss("o", 4, "kCudnnSoftmaxLoss"), (4, 3, 5, 5), 2e-5),
    "slice, split, concate": (
        dummy("x", 6, 8)
        + 'layer { name: "sl" type: kSlice srclayers: "x" slice_conf { slice_dim: 1 '
          'num_slices: 2 } }\n'
        + f'layer {{ name: "a" type: kInnerProduct srclayers: "sl" {param("wa")} {param("ba")} '
          'innerproduct_conf { num_output: 3 } }\n'
        + f'layer {{ name: "b" type: kInnerProduct srclayers: "sl" {param("wb")} {param("bb")} '
          'innerproduct_conf { num_output: 4 } }\n'
        + 'layer { name: "cat" type: kConcate srclayers: "a" srclayers: "b" '
          'concate_conf { concate_dim: 1 } }\n'
        + 'layer { name: "sp" type: kSplit srclayers: "cat" split_conf { num_splits: 2 } }\n'
        + f'layer {{ name: "o1" type: kInnerProduct srclayers: "sp" {param("w1")} {param("b1")} '
          'innerproduct_conf { num_output: 10 } }\n'
        + 'layer { name: "o2" type: kSigmoid srclayers: "sp" }\n'
        + 'layer { name: "t" type: kDummy srclayers: "o2" dummy_conf { output: true } }\n'
        + loss("o1", 6), (6, 8), 1e-5),
    "embedding, GRU": (
        dummy("x", 8, 1)
        + 'layer { name: "e" type: kEmbedding srclayers: "x" ' + param("emb")
        + ' embedding_conf { vocab_size: 10 feature_dim: 6 } }\n'
        + 'layer { name: "g" type: kGRU srclayers: "e" '
        + " ".join(param(n) for n in ("zx", "rx", "cx", "zh", "rh", "ch", "bz", "br", "bc"))
        + ' gru_conf { dim_hidden: 7 } }\n'
        + f'layer {{ name: "o" type: kInnerProduct srclayers: "g" {param("w")} {param("b")} '
          'innerproduct_conf { num_output: 10 } }\n'
        + loss("o", 8), (8, 1), 1e-5),
}


def run(conf, place, x, labels):
    """One forward and backward pass of `conf` on `place`: the net."""
    net = NeuralNet(conf, job_pb2.kTrain, np.random.default_rng(0), device=place)
    for p in net.params:
        p.init_values(np.random.default_rng(zlib.crc32(p.name.encode())))
    for layer in net.layers:
        if layer.conf.type == job_pb2.kDummy and layer.conf.dummy_conf.input:
            if layer.name.endswith("#x"):
                layer.feed(x)
            elif layer.name.endswith("#y"):
                layer.feed(aux_data=labels)
            else:
                layer.feed(np.random.default_rng(9).random(layer.data.shape, np.float32))
    with place.selected():
        net.forward(TRAIN)
        for layer in reversed(net.layers):
            layer.compute_gradient(BACK, net.srclayers[layer.name])
    return net


def blobs(net):
    """{name: host copy} of every layer's data and grad and every param's gradient."""
    out = {}
    for layer in net.layers:
        for what in ("data", "grad"):
            a = getattr(layer, what, None)
            if hasattr(a, "shape"):
                out[f"{layer.name}.{what}"] = device.host(a).copy()
        for p in layer.params:
            out[f"{p.name}.grad"] = device.host(p.grad).copy()
    return out


@pytest.mark.parametrize("name", NETS)
def test_each_layer_on_the_gpu_agrees_with_the_cpu(name):
    text, shape, bound = NETS[name]
    conf = text_format.Parse(text, job_pb2.NetProto())
    rng = np.random.default_rng(3)
    x = rng.standard_normal(shape).astype(np.float32)
    if name.startswith("embedding"):
        x = rng.integers(0, 10, shape).astype(np.float32)
    labels = rng.integers(0, 10 if "euclidean" not in name else 1, shape[0])
    cpu = blobs(run(conf, device.CPU, x, labels))
    gpu_net = run(conf, device.Device(0), x, labels)
    assert all(not device.is_host(p.data) for p in gpu_net.params)
    gpu = blobs(gpu_net)
    assert gpu.keys() == cpu.keys()
    for key, ours in cpu.items():
        scale = np.abs(ours).max()
        assert np.abs(gpu[key] - ours).max() <= bound * scale + 1e-7, (key, scale)
    assert any(np.abs(v).max() > 0 for k, v in gpu.items() if k.endswith(".grad"))


#: convolutions for cuDNN: (C, H, W, conv_conf, bias)
CONVS = {
    "pad 1": (3, 11, 11, "num_filters: 5 kernel: 3 pad: 1", True),
    "stride 2, rectangular": (4, 12, 9, "num_filters: 6 kernel_y: 3 kernel_x: 5 stride: 2 "
                              "pad_x: 2", True),
    "4 groups": (8, 9, 9, "num_filters: 8 kernel: 3 pad: 1 group: 4", True),
    "depthwise, no bias": (6, 10, 10, "num_filters: 6 kernel: 3 stride: 2 pad: 1 group: 6",
                           False),
    "1 x 1": (16, 7, 7, "num_filters: 12 kernel: 1", True),
    "ResNet-50's conv1": (3, 32, 32, "num_filters: 8 kernel: 7 stride: 2 pad: 3", True),
}


@pytest.fixture
def engines(monkeypatch):
    """Run `conv_net` with SINGA_GPU_KERNELS=choice; on the stand-in (SINGA_GPU_STANDIN) a
    fake libcudnn (tests/integration/fake_cudnn.py)."""
    from singa.layers import kernels
    import conftest
    if conftest.STANDIN:
        import fake_cudnn
        fake_cudnn.installed(monkeypatch)

    def on(choice):
        monkeypatch.setenv("SINGA_GPU_KERNELS", choice)
        monkeypatch.setattr(kernels, "gpu_engine", kernels.functools.cache(
            kernels.gpu_engine.__wrapped__))
    return on


@pytest.mark.parametrize("name", CONVS)
def test_cudnns_convolution_agrees_with_the_im2col_path_and_the_cpu(name, engines):
    """Forward, data and filter gradients of a convolution on cuDNN (deterministic algorithms,
    float32) against our im2col path on the same GPU and against the CPU: within float32
    rounding of each blob's largest value."""
    from singa.layers.kernels import cudnn
    c, h, w, fields, bias = CONVS[name]
    params = param("w") + (param("b") if bias else "")
    text = (dummy("x", 4, c, h, w)
            + f'layer {{ name: "c" type: kCudnnConv srclayers: "x" {params} '
              f'convolution_conf {{ {fields} }} }}\n' + loss("c", 4))
    conf = text_format.Parse(text, job_pb2.NetProto())
    x = np.random.default_rng(3).standard_normal((4, c, h, w)).astype(np.float32)
    labels = np.random.default_rng(4).integers(0, 10, 4)
    cpu = blobs(run(conf, device.CPU, x, labels))
    out = {}
    for choice in ("cuda", "cudnn"):
        engines(choice)
        net = run(conf, device.Device(0), x, labels)
        conv = net.by_name["0#c"]
        assert isinstance(conv.engine, cudnn.Conv) == (choice == "cudnn"), choice
        out[choice] = blobs(net)
    for key, ours in cpu.items():
        scale = np.abs(ours).max()
        for choice in out:
            assert np.abs(out[choice][key] - ours).max() <= 1e-5 * scale + 1e-7, (key, choice)
        assert np.abs(out["cudnn"][key] - out["cuda"][key]).max() <= 1e-5 * scale + 1e-7, key
