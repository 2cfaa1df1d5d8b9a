"""RBMVis / RBMHid against a float64 numpy CD reference; the kCD worker step; sort and display."""
from types import SimpleNamespace

import numpy as np
import pytest
from google.protobuf import text_format

from singa.errors import ConfigError
from singa.layers.base import create_layer
from singa.layers.rbm import RBMHidLayer, RBMVisLayer
from singa.net.graph import sort
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2
from singa.train.worker import CDWorker, Worker, worker_class
from gradcheck import Source

kPositive, kNegative, kTest, kTrain = (job_pb2.kPositive, job_pb2.kNegative, job_pb2.kTest,
                                       job_pb2.kTrain)
N, VDIM, HDIM, SEED = 5, 7, 4, 3


def rbm_pair(gaussian=False):
    """A set-up tiny RBM on random data in [0, 1): (data source, vis, hid); rng seeded SEED."""
    data = Source(np.random.default_rng(0).random((N, VDIM)), name="data")
    vis = create_layer(text_format.Parse(
        f'name: "vis" type: kRBMVis srclayers: "data" srclayers: "hid" rbm_conf {{ hdim: {HDIM} }}'
        ' param { name: "w" } param { name: "bv" }', job_pb2.LayerProto()))
    hid = create_layer(text_format.Parse(
        f'name: "hid" type: kRBMHid srclayers: "vis" rbm_conf {{ hdim: {HDIM} gaussian: '
        f'{str(gaussian).lower()} }} param {{ name: "w_" share_from: "w" }} param {{ name: "bh" }}',
        job_pb2.LayerProto()))
    rng = np.random.default_rng(SEED)
    vis.rng = hid.rng = rng
    vis.setup([data, hid])
    hid.setup([vis])
    hid.weight.share_data_from(vis.weight)
    init = np.random.default_rng(1)
    for p in (vis.weight, vis.bias, hid.bias):
        p.data[...] = init.normal(0, 0.5, p.shape)
    return data, vis, hid


def sigmoid(x):
    return 1 / (1 + np.exp(-x))


def reference_cd(v0, w, bv, bh, cd_k=1, gaussian=False):
    """Float64 CD-k as SINGA's CDWorker runs it, drawing samples like RBMHid from rng SEED:
    (v−, h+, h−, gW, gb_vis, gb_hid, squared error of the first reconstruction)."""
    rng = np.random.default_rng(SEED)
    v0, w, bv, bh = (np.asarray(a, np.float64) for a in (v0, w, bv, bh))
    act = (lambda x: x) if gaussian else sigmoid

    def sample(h):
        if gaussian:
            return rng.standard_normal(h.shape, dtype=np.float32) + h
        return (rng.random(h.shape, dtype=np.float32) < h.astype(np.float32)).astype(np.float64)

    hp = act(v0 @ w.T + bh)
    h = hp
    for k in range(cd_k):
        vn = sigmoid(sample(h) @ w + bv)
        if k == 0:
            err = ((v0 - vn) ** 2).sum() / len(v0)
        h = act(vn @ w.T + bh)
    n = len(v0)
    return vn, hp, h, (h.T @ vn - hp.T @ v0) / n, (vn.sum(0) - v0.sum(0)) / n, \
        (h.sum(0) - hp.sum(0)) / n, err


def cd_step(data, vis, hid, cd_k=1):
    """CDWorker's phases on the pair: positive, negative|test, cd_k-1 negatives, gradients."""
    vis.compute_feature(kPositive, [data, hid])
    hid.compute_feature(kPositive, [vis])
    vis.compute_feature(kNegative | kTest, [data, hid])
    hid.compute_feature(kNegative | kTest, [vis])
    for _ in range(cd_k - 1):
        vis.compute_feature(kNegative, [data, hid])
        hid.compute_feature(kNegative, [vis])
    for p in vis.params + hid.params:
        p.grad[...] = np.nan
    vis.compute_gradient(kTrain, [data, hid])
    hid.compute_gradient(kTrain, [vis])


@pytest.mark.parametrize("gaussian", [False, True])
@pytest.mark.parametrize("cd_k", [1, 3])
def test_cd_step_matches_float64_reference(cd_k, gaussian):
    data, vis, hid = rbm_pair(gaussian)
    vn, hp, hn, gw, gbv, gbh, err = reference_cd(data.data, vis.weight.data, vis.bias.data,
                                                 hid.bias.data, cd_k, gaussian)
    cd_step(data, vis, hid, cd_k)
    close = dict(rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(vis.pos_data, data.data)
    np.testing.assert_allclose(hid.pos_data, hp, **close)
    np.testing.assert_allclose(vis.neg_data, vn, **close)
    np.testing.assert_allclose(hid.neg_data, hn, **close)
    np.testing.assert_allclose(vis.weight.grad, gw, **close)
    np.testing.assert_allclose(vis.bias.grad, gbv, **close)
    np.testing.assert_allclose(hid.bias.grad, gbh, **close)
    # W's gradient belongs to the Vis layer; the Hid share of W contributes zero
    assert not hid.weight.grad.any()
    assert hid.weight.data is vis.weight.data
    # SINGA divides by every compute_feature call of the Vis layer (2 + cd_k - 1 here)
    assert vis.metrics(kTrain) == pytest.approx({"Squared Error": err / (cd_k + 1)}, rel=1e-5)


def test_binary_samples_are_zeros_and_ones_gaussian_are_not():
    _, vis, hid = rbm_pair()
    vis.compute_feature(kPositive, [vis.input, hid])
    hid.compute_feature(kPositive, [vis])
    s = hid.sample(kPositive)
    assert set(np.unique(s)) <= {0.0, 1.0} and s is hid.pos_sample
    _, vis, hid = rbm_pair(gaussian=True)
    vis.compute_feature(kPositive, [vis.input, hid])
    hid.compute_feature(kPositive, [vis])
    assert not set(np.unique(hid.sample(kPositive))) <= {0.0, 1.0}


def test_squared_error_display_resets_and_counts_every_call():
    data, vis, hid = rbm_pair()
    cd_step(data, vis, hid)
    assert vis.metrics(kTrain)["Squared Error"] > 0
    assert vis.metrics(kTrain) == {}
    vis.compute_feature(kPositive, [data, hid])
    vis.compute_feature(kPositive, [data, hid])
    assert (vis.metric_sums, vis.metric_count) == ({"Squared Error": 0.0}, 2)


def test_vis_needs_data_and_hid_sources():
    conf = text_format.Parse('name: "vis" type: kRBMVis rbm_conf { hdim: 2 } param { name: "w" }'
                             ' param { name: "b" }', job_pb2.LayerProto())
    with pytest.raises(ConfigError, match="kRBMVis needs two srclayers"):
        create_layer(conf).setup([Source(np.zeros((2, 3)))])
    hconf = text_format.Parse('name: "hid" type: kRBMHid rbm_conf { hdim: 2 }', job_pb2.LayerProto())
    with pytest.raises(ConfigError, match="kRBMHid needs one srclayer"):
        create_layer(hconf).setup([Source(np.zeros((2, 3)))])


FIXTURE = "tests/fixtures/singa-0.3/train-1000.bin"
RBM2 = f"""
layer {{ name: "data" type: kRecordInput
  store_conf {{ backend: "kvfile" path: "{FIXTURE}" batchsize: 10 shape: 784 std_value: 255 }} }}
layer {{ name: "Inner1" type: kInnerProduct srclayers: "data" innerproduct_conf {{ num_output: 8 }}
  param {{ name: "w1" init {{ type: kGaussian std: 0.1 }} }} param {{ name: "b12" init {{ type: kConstant value: 0 }} }} }}
layer {{ name: "Sigmoid1" type: kSigmoid srclayers: "Inner1" }}
layer {{ name: "RBMVis" type: kRBMVis srclayers: "Sigmoid1" srclayers: "RBMHid"
  rbm_conf {{ hdim: 5 }}
  param {{ name: "w2" init {{ type: kGaussian std: 0.1 }} }}
  param {{ name: "b21" init {{ type: kConstant value: 0 }} }} }}
layer {{ name: "RBMHid" type: kRBMHid srclayers: "RBMVis" rbm_conf {{ hdim: 5 }}
  param {{ name: "w2_" share_from: "w2" }}
  param {{ name: "b22" init {{ type: kConstant value: 0 }} }} }}
"""


def make(phase=kTrain, **kw):
    net = NeuralNet(text_format.Parse(RBM2, job_pb2.NetProto()), phase,
                    np.random.default_rng(0), **kw)
    for p in net.owner_params:
        p.init_values(np.random.default_rng(1))
    return net


def test_bidirectional_edge_sorts_vis_after_its_data_then_hid():
    net = make()
    assert [layer.name for layer in net.layers] == ["0#data", "0#Inner1", "0#Sigmoid1",
                                                    "0#RBMVis", "0#RBMHid"]
    vis, hid = net.layers[3:]
    assert vis.input is net.layers[2] and vis.hid is hid and hid.vis is vis
    assert [p.name for p in net.owner_params] == ["0#w1", "0#b12", "0#w2", "0#b21", "0#b22"]
    # SINGA's rule takes the first source; the sort does not depend on that order
    layers = list(text_format.Parse(RBM2.replace('srclayers: "Sigmoid1" srclayers: "RBMHid"',
                                                 'srclayers: "RBMHid" srclayers: "Sigmoid1"'),
                                    job_pb2.NetProto()).layer)
    assert [c.name for c in sort(layers)][-2:] == ["RBMVis", "RBMHid"]


class FakeJob:
    class train_one_batch:
        alg = job_pb2.kCD

        class cd_conf:
            cd_k = 1


def test_cd_worker_updates_only_rbm_params_and_tests_with_one_reconstruction():
    net = make()
    worker = CDWorker.__new__(CDWorker)   # the algorithm alone, without sockets
    worker.train_net, worker.job = net, FakeJob
    collected, updated = [], []
    worker.collect = collected.append
    worker.params = SimpleNamespace(update=lambda step, p: updated.append(p.name))
    worker.train_one_batch(0)
    assert [p.name for p in collected] == [p.name for p in net.params]
    assert updated == ["0#w2", "0#b21", "0#w2_", "0#b22"]
    vis = net.layers[3]
    assert vis.metric_count == 2 and vis.metric_sums["Squared Error"] > 0

    test = make(job_pb2.kTest, share_from=net, first_id=net.next_id)
    tvis, thid = test.layers[3:]
    # the test net's Hid uses the train net's W, not a stale copy of its own
    assert thid.weight.data is net.layers[3].weight.data is tvis.weight.data
    CDWorker.test_one_batch(kTest, test, 0)
    assert tvis.metric_count == 2 and tvis.metric_sums["Squared Error"] > 0
    assert worker_class(FakeJob) is CDWorker and Worker.test_one_batch is not CDWorker.test_one_batch
