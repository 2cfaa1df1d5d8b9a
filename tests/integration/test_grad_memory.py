"""A kBP step's gradient blobs share memory by when they are live (singa/net/grad_memory.py):
the same bytes trained as with every blob apart, in a fraction of the memory."""
import numpy as np
import pytest

import strict_device
from conftest import FIXTURES
from example_models import BRANCHED_JOB, RESIDUAL_JOB, fitted, small_job
from singa.device import CPU, Device, is_host
from singa.job import config
from singa.layers.base import Layer, register
from singa.net import grad_memory
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2
from singa.train.worker import Worker

#: in-place activations (share_src_blobs, as SINGA's cudnn_bm.conf), a Slice and a Concate,
#: Eltwise's PROD and MAX, Dropout, LRN, max and average pooling, and an autoencoder's
#: EuclideanLoss beside a SoftmaxLoss
MIXED_JOB = small_job("mixed", """  layer { name: "conv" type: kConvolution srclayers: "data"
    convolution_conf { num_filters: 6 kernel: 5 stride: 2 }
    param { name: "w0" init { type: kGaussian std: 0.1 } }
    param { name: "b0" init { type: kConstant value: 0 } } }
  layer { name: "bm" type: kCudnnBM srclayers: "conv"
    param { name: "s" init { type: kConstant value: 1 } }
    param { name: "t" init { type: kConstant value: 0 } }
    param { name: "m" init { type: kConstant value: 0 } }
    param { name: "v" init { type: kConstant value: 0 } } }
  layer { name: "relu" type: kCudnnActivation activation_conf { type: RELU }
    share_src_blobs: true srclayers: "bm" }
  layer { name: "norm" type: kLRN srclayers: "relu"
    lrn_conf { local_size: 3 alpha: 0.0001 beta: 0.75 } }
  layer { name: "slice" type: kSlice srclayers: "norm"
    slice_conf { slice_dim: 1 num_slices: 3 } }
  layer { name: "p1" type: kPooling srclayers: "slice"
    pooling_conf { pool: MAX kernel: 3 stride: 2 } }
  layer { name: "p2" type: kPooling srclayers: "slice"
    pooling_conf { pool: AVG kernel: 3 stride: 2 } }
  layer { name: "p3" type: kPooling srclayers: "slice"
    pooling_conf { pool: MAX kernel: 3 stride: 2 } }
  layer { name: "prod" type: kEltwise srclayers: "p1" srclayers: "p2"
    eltwise_conf { operation: PROD } }
  layer { name: "max" type: kEltwise srclayers: "p2" srclayers: "p3"
    eltwise_conf { operation: MAX } }
  layer { name: "join" type: kConcate srclayers: "prod" srclayers: "max"
    concate_conf { concate_dim: 1 } }
  layer { name: "drop" type: kDropout srclayers: "join" dropout_conf { dropout_ratio: 0.3 } }
  layer { name: "ip" type: kInnerProduct srclayers: "drop" innerproduct_conf { num_output: 10 }
    param { name: "w1" init { type: kGaussian std: 0.05 } }
    param { name: "b1" init { type: kConstant value: 0 } } }
  layer { name: "tanh" type: kSTanh srclayers: "ip" }
  layer { name: "loss" type: kSoftmaxLoss srclayers: "tanh" srclayers: "data" }
  layer { name: "decode" type: kInnerProduct srclayers: "tanh" innerproduct_conf { num_output: 784 }
    param { name: "w2" init { type: kGaussian std: 0.05 } }
    param { name: "b2" init { type: kConstant value: 0 } } }
  layer { name: "out" type: kSigmoid srclayers: "decode" }
  layer { name: "rebuilt" type: kEuclideanLoss srclayers: "out" srclayers: "data" }""")


def job_text(job, tmp_path):
    return job.replace("DATA", f"{FIXTURES}/train-1000.bin").replace("WS", str(tmp_path))


def trained(tmp_path, job, shared, monkeypatch, device=None):
    """(history, final params) of `job` fitted 8 steps, its gradient blobs `shared` or apart."""
    monkeypatch.setattr(Worker, "shares_grad_memory", shared)
    return fitted(tmp_path, f"shared-{shared}", job, device=device)


@pytest.mark.parametrize("job", [RESIDUAL_JOB, BRANCHED_JOB, MIXED_JOB],
                         ids=["residual", "branched", "mixed"])
def test_shared_gradient_memory_trains_to_the_bytes_of_blobs_apart(tmp_path, monkeypatch, job):
    """Every blob's gradient written whole before it is read, and not overwritten before its
    layer's backward pass reads it: the same losses and params, bit for bit, as with each
    blob's gradient in memory of its own."""
    shared = trained(tmp_path, job, True, monkeypatch)
    apart = trained(tmp_path, job, False, monkeypatch)
    assert shared[0] == apart[0]
    assert shared[1].keys() == apart[1].keys()
    for name, values in apart[1].items():
        assert np.array_equal(shared[1][name], values), name


def test_shared_gradient_memory_on_the_gpu_path(tmp_path, monkeypatch):
    """On the CuPy stand-in (device memory, CUDA graphs), the residual block as apart."""
    strict_device.installed(monkeypatch)
    shared = trained(tmp_path, RESIDUAL_JOB, True, monkeypatch, device=[0])
    apart = trained(tmp_path, RESIDUAL_JOB, False, monkeypatch, device=[0])
    assert shared[0] == apart[0]
    for name, values in apart[1].items():
        assert np.array_equal(shared[1][name], values), name


def net_of(job, tmp_path, phase=job_pb2.kTrain, device=CPU, share_grads=False):
    """The NeuralNet of `job` for `phase` on `device`."""
    path = tmp_path / "net.conf"
    path.write_text(job_text(job, tmp_path))
    conf = config.load_job(str(path))
    return NeuralNet(conf.neuralnet, phase, np.random.default_rng(0), device=device,
                     share_grads=share_grads)


def root(a):
    while a.base is not None:
        a = a.base
    return a


def holders(net):
    """{layer name: its gradient blobs}."""
    return {layer.name: ([layer.grad] if layer.grad is not None else []) +
            list(getattr(layer, "grads", [])) for layer in net.layers}


def test_a_chain_of_blobs_needs_the_memory_of_its_two_largest_neighbours(tmp_path):
    """The residual block: its 20 gradient blobs (Splits' per destination) in three slots,
    but for the two blobs of its own Split layers that no destination writes (each of them
    read by an automatic Split), which keep their zeros."""
    net = net_of(RESIDUAL_JOB, tmp_path)
    apart, shared = grad_memory.share(net)
    assert shared < apart / 2, (apart, shared)
    memories = {id(root(g)) for gs in holders(net).values() for g in gs}
    assert len(memories) == 3 + 2, len(memories)


@register("test_grad_memory.Mirror")
class Mirror(Layer):
    """A layer of a user's: y = x, gx = g; whatever it does with gradients, its source's blob
    and its own stay apart."""

    sources = (1, 1)

    def setup(self, srclayers):
        self.data = np.zeros_like(srclayers[0].data_for(self))
        self.grad = np.zeros_like(self.data)

    def compute_feature(self, flag, srclayers):
        np.copyto(self.data, srclayers[0].data_for(self))

    def compute_gradient(self, flag, srclayers):
        gsrc = srclayers[0].grad_for(self)
        if gsrc is not None:
            np.copyto(gsrc, self.grad)


def test_blobs_a_users_layer_or_a_slice_touches_stay_apart(tmp_path):
    job = MIXED_JOB.replace('layer { name: "tanh" type: kSTanh srclayers: "ip" }',
                            'layer { name: "tanh0" type: kSTanh srclayers: "ip" }\n'
                            '  layer { name: "tanh" user_type: "test_grad_memory.Mirror" '
                            'srclayers: "tanh0" }')
    net = net_of(job, tmp_path)
    before = {name: [id(g) for g in gs] for name, gs in holders(net).items()}
    grad_memory.share(net)
    after = {name: [id(g) for g in gs] for name, gs in holders(net).items()}
    kept = {name for name in before if before[name] and before[name] == after[name]}
    # the user's layer and its source; the Slice's blobs per destination; the last layers'
    # (read by their own pass, written by none) and the losses' (no gradient blob)
    assert {"0#tanh", "0#tanh0", "0#slice"} <= kept, kept
    assert "0#conv" not in kept and "0#join" not in kept


def test_a_gpu_train_net_takes_device_memory_for_its_gradients_only_once_shared(
        tmp_path, monkeypatch):
    """On a GPU the layers' gradient blobs are host placeholders (numpy's zeros, no page
    written) until the net has set up every layer; then they are slots' views on the device,
    or zeros of their own there (a Slice's), and no device memory was taken for a blob's
    gradient apart."""
    strict_device.installed(monkeypatch)
    at_setup = {}
    share = grad_memory.share

    def seen(net):
        at_setup.update({name: [type(g) for g in gs] for name, gs in holders(net).items()})
        return share(net)
    monkeypatch.setattr(grad_memory, "share", seen)
    net = net_of(MIXED_JOB, tmp_path, device=Device(0), share_grads=True)
    assert at_setup["0#conv"] == [np.ndarray] and at_setup["0#slice"] == [np.ndarray] * 3
    assert all(t == np.ndarray for ts in at_setup.values() for t in ts), at_setup
    grads = holders(net)
    assert all(not is_host(g) for gs in grads.values() for g in gs), grads
    memories = {id(root(g)) for gs in grads.values() for g in gs}
    assert 1 < len(memories) < sum(map(len, grads.values())) / 2, len(memories)


def test_a_net_that_trains_nothing_takes_no_device_memory_for_gradients(tmp_path, monkeypatch):
    """A test net on a GPU computes no gradient: its blobs' gradients are host placeholders."""
    strict_device.installed(monkeypatch)
    net = net_of(MIXED_JOB, tmp_path, phase=job_pb2.kTest, device=Device(0))
    grads = [g for gs in holders(net).values() for g in gs]
    assert grads and all(type(g) is np.ndarray and not g.any() for g in grads)
    assert not is_host(net.by_name["0#conv"].data)


def test_a_blob_another_layer_keeps_a_view_of_stays_apart(tmp_path):
    """A view of a gradient blob kept by another layer (made at its setup): the blob keeps its
    memory, which the view reads, and the others share theirs."""
    net = net_of(RESIDUAL_JOB, tmp_path)
    viewed = net.by_name["0#scale"].grad
    net.by_name["0#ip"].kept = {"rows": [viewed[:2]]}
    grad_memory.share(net)
    assert net.by_name["0#scale"].grad is viewed
    assert net.by_name["0#bn"].grad.base is not None       # a slot's view
