"""BPTTWorker on an unrolled char-rnn net: gradients of the shared params are those of the summed
loss of every unrolled step, only copy 0 is updated, display averages the copies, and a
sampling test net feeds each step the previous sample and GRU state."""
import logging

import numpy as np
import pytest
from google.protobuf import text_format

from gradcheck import numeric_gradient
from singa.errors import ConfigError
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2
from singa.train.worker import BPTTWorker, Worker

kTrain, kTest, kForward = job_pb2.kTrain, job_pb2.kTest, job_pb2.kForward
UNIFORM = "init { type: kUniform low: -0.5 high: 0.5 }"
GRU_PARAMS = " ".join(f'param {{ name: "{n}" {UNIFORM} }}'
                      for n in ("z_hx", "r_hx", "c_hx", "z_hh", "r_hh", "c_hh", "z_b", "r_b", "c_b"))

TRAIN = """
unroll_len: 3
layer {{ name: "data" type: kCharRNN unroll_len: 1
  char_rnn_conf {{ path: "{d}/input.txt" vocab_path: "{d}/vocab.txt" batchsize: 2 unroll_len: 3 }} }}
layer {{ name: "onehot" type: kOneHot srclayers: "data" unroll_conn_type: kUnrollOneToAll
  onehot_conf {{ vocab_size: 5 }} }}
layer {{ name: "label" type: kRNNLabel srclayers: "data" unroll_conn_type: kUnrollOneToAll }}
layer {{ name: "gru" type: kGRU srclayers: "onehot" gru_conf {{ dim_hidden: 3 }} {gru} }}
layer {{ name: "ip" type: kInnerProduct srclayers: "gru" innerproduct_conf {{ num_output: 5 }}
  param {{ name: "w" {init} }} param {{ name: "b" {init} }} }}
layer {{ name: "loss" type: kSoftmaxLoss srclayers: "ip" srclayers: "label" }}
"""

SAMPLE = """
layer {{ name: "data" type: kRNNDummy
  rnn_dummy_conf {{ shape: 1 integer: true low: 0 high: 5 dynamic_srclayer: "argsort" }} }}
layer {{ name: "onehot" type: kOneHot srclayers: "data" onehot_conf {{ vocab_size: 5 }} }}
layer {{ name: "gru" type: kGRU srclayers: "onehot" gru_conf {{ dim_hidden: 3 }} {gru} }}
layer {{ name: "ip" type: kInnerProduct srclayers: "gru" innerproduct_conf {{ num_output: 5 }}
  param {{ name: "w" {init} }} param {{ name: "b" {init} }} }}
layer {{ name: "softmax" type: kSoftmax srclayers: "ip" }}
layer {{ name: "argsort" type: kArgSort srclayers: "softmax" }}
"""


class LocalBPTTWorker(BPTTWorker):
    """The BPTT algorithm without servers: params are always fresh, updates are recorded."""

    def __init__(self, net):
        self.train_net = net
        self.updated = []
        self.params = self              # its ParamClient: records the updates
        self.channel, self.grp = None, 0     # alone in group 0

    def collect(self, p):
        pass

    def update(self, step, p):
        self.updated.append(p.name)


def make_net(text, phase, tmp_path):
    (tmp_path / "vocab.txt").write_bytes(b"abc \n")
    (tmp_path / "input.txt").write_bytes(b"abc cab\nbca acb\nab ba ca \n")
    conf = text_format.Parse(text.format(d=tmp_path, gru=GRU_PARAMS, init=UNIFORM),
                             job_pb2.NetProto())
    net = NeuralNet(conf, phase, np.random.default_rng(0))
    for p in net.owner_params:
        p.init_values(np.random.default_rng(p.id))
    return net


def summed_loss(net):
    """Σ over the unrolled loss layers of mean_n −log p[label_n], recomputed from their outputs."""
    net.by_name["0#data"].seek(0, True)
    net.forward(kTrain | kForward)
    total = 0.0
    for t in range(3):
        p = net.by_name[f"{t}#loss"].data.astype(np.float64)
        labels = net.by_name[f"{t}#label"].aux_data
        total += -np.log(p[np.arange(len(labels)), labels]).mean()
    return total


def test_bptt_gradients_are_those_of_the_loss_summed_over_unrolled_steps(tmp_path):
    net = make_net(TRAIN, kTrain, tmp_path)
    assert [layer.name for layer in net.layers if "gru" in layer.name] == [
        "0#gru", "split(0#gru)", "1#gru", "split(1#gru)", "2#gru"]
    worker = LocalBPTTWorker(net)
    for _ in range(2):   # the second batch must not add to the first one's gradients
        net.by_name["0#data"].seek(0, True)
        worker.train_one_batch(0)
    assert worker.updated == 2 * [p.name for p in net.owner_params]
    assert all(p.name.startswith("0#") for p in net.owner_params) and len(net.owner_params) == 11
    for p in net.owner_params:
        numeric = numeric_gradient(lambda: summed_loss(net), p.data, 1e-2)
        np.testing.assert_allclose(p.grad, numeric, rtol=1e-2, atol=1e-3, err_msg=p.name)


def test_bptt_display_averages_each_metric_over_the_unrolled_copies(tmp_path, caplog):
    net = make_net(TRAIN, kTrain, tmp_path)
    net.forward(kTrain | kForward)
    losses = [net.by_name[f"{t}#loss"].metric_sums["Loss"] for t in range(3)]
    with caplog.at_level(logging.INFO, logger="singa"):
        metrics = LocalBPTTWorker(net).display(kTrain, "Train @ step 0", net)
    assert metrics["loss"] == pytest.approx(np.mean(losses), rel=1e-12)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [f"Train @ step 0  Loss = {metrics['loss']:f}, "
                     f"accuracy = {metrics['accuracy']:f}"]


MLP = """
layer { name: "data" type: kRecordInput store_conf { backend: "kvfile" batchsize: 10
  path: "tests/fixtures/singa-0.3/test-500.bin" shape: 784 std_value: 255 } }
layer { name: "ip" type: kInnerProduct srclayers: "data" innerproduct_conf { num_output: 10 }
  param { name: "w" init { type: kGaussian std: 0.05 } }
  param { name: "b" init { type: kConstant value: 0 } } }
layer { name: "loss" type: kSoftmaxLoss srclayers: "ip" srclayers: "data" }
"""


def test_test_metrics_for_the_snapshot_are_the_unrounded_numbers(caplog):
    """checkpoint_keep_best ranks snapshots by the metrics of their step's test: the numbers
    themselves, not the 6 decimals of the log line."""
    net = NeuralNet(text_format.Parse(MLP, job_pb2.NetProto()), kTest, np.random.default_rng(0))
    for p in net.owner_params:
        p.init_values(np.random.default_rng(p.id))
    worker = Worker.__new__(Worker)
    worker.channel, worker.grp = None, 0    # a worker alone in group 0
    with caplog.at_level(logging.INFO, logger="singa"):
        metrics = worker.test(1, kTest, net)
    p, labels = net.by_name["0#loss"].data.astype(np.float64), net.by_name["0#data"].aux_data
    loss = -np.log(p[np.arange(10), labels]).mean()
    accuracy = np.mean(p.argmax(axis=1) == labels)
    assert metrics == {"loss": pytest.approx(loss, rel=1e-12), "accuracy": accuracy}
    assert [r.getMessage() for r in caplog.records] == [
        f"   Loss = {loss:f}, accuracy = {accuracy:f}"]


def test_sampling_feeds_each_step_the_previous_sample_and_gru_state(tmp_path):
    net = make_net(SAMPLE, kTest, tmp_path)
    gru, argsort = net.by_name["0#gru"], net.by_name["0#argsort"]
    BPTTWorker.test_one_batch(kTest, net, 0)
    first_sample, first_state = argsort.data.copy(), gru.data.copy()
    BPTTWorker.test_one_batch(kTest, net, 1)
    assert net.by_name["0#data"].data is argsort.data
    # the GRU of step 1 read the one-hot of step 0's sample and step 0's state
    x = np.eye(5, dtype=np.float32)[first_sample[:, 0].astype(int)]
    w = [p.data.astype(np.float64) for p in gru.params]
    sig = lambda v: 1 / (1 + np.exp(-v))   # noqa: E731
    z = sig(x @ w[0].T + first_state @ w[3].T + w[6])
    r = sig(x @ w[1].T + first_state @ w[4].T + w[7])
    c = np.tanh(x @ w[2].T + r * (first_state @ w[5].T) + w[8])
    np.testing.assert_allclose(gru.data, z * first_state + (1 - z) * c, rtol=1e-5, atol=1e-6)


def test_a_dynamic_srclayer_naming_no_layer_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="layer '0#data': rnn_dummy_conf.dynamic_srclayer "
                                          "'argsort' names no layer of the net"):
        make_net(SAMPLE.replace('srclayers: "softmax"', 'srclayers: "softmax" include: kTrain'),
                 kTest, tmp_path)


def test_display_metrics_cross_between_workers_as_numbers_and_bad_frames_are_refused():
    from singa.comm.msg import frame_metrics, metric_frames
    from singa.errors import ClusterError
    rows = [{"Loss": 2.1574078273526225, "accuracy": 0.25}, {}, {"Squared Error": 1e-300}]
    assert frame_metrics(metric_frames(rows)) == rows
    frames = metric_frames(rows)
    for bad in (frames[:-1], [b"Loss\taccuracy", b"\0" * 12]):
        with pytest.raises(ClusterError, match="display metrics"):
            frame_metrics(bad)
