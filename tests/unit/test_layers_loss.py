"""SoftmaxLoss, EuclideanLoss and MSELoss: metrics, gradients; SINGA's own checkpoints
(MLP and cnn fixtures) reproduce the test lines SINGA logged."""
import os

import numpy as np
import pytest

from gradcheck import FORWARD, Source, check_gradients, make_layer
from singa.errors import ConfigError, DataError
from singa.proto import common_pb2, job_pb2

FIXTURES = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "fixtures", "singa-0.3"))


def softmax_loss(scores, labels, conf="", layer_type="kSoftmaxLoss"):
    srcs = [Source(scores), Source(np.zeros((len(labels), 1)), labels=labels, grad=False)]
    layer = make_layer(f'name: "loss" type: {layer_type} {conf}', srcs)
    return layer, srcs


def test_softmax_loss_metrics_are_averaged_then_reset():
    scores = np.log(np.array([[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]], np.float32))
    layer, srcs = softmax_loss(scores, [0, 1])
    layer.compute_feature(FORWARD, srcs)
    np.testing.assert_allclose(layer.data, np.exp(scores), rtol=1e-6)
    want_loss = -(np.log(0.7) + np.log(0.3)) / 2
    assert layer.metrics(FORWARD) == pytest.approx({"Loss": want_loss, "accuracy": 0.5})
    assert layer.metrics(FORWARD) == {}


def test_softmax_loss_averages_over_calls_and_applies_scale():
    scores = np.array([[2.0, 0.0], [0.0, 2.0]], np.float32)
    layer, srcs = softmax_loss(scores, [0, 0], "softmaxloss_conf { scale: 2 }")
    for labels in ([0, 0], [0, 1]):
        srcs[1].aux_data[...] = labels
        layer.compute_feature(FORWARD, srcs)
    assert layer.metrics(FORWARD)["accuracy"] == pytest.approx(2 * (0.5 + 1.0) / 2)


def test_softmax_loss_topk_ties_rank_the_higher_index_first_like_singa():
    scores = np.zeros((1, 4), np.float32)
    hits = []
    for label in range(4):
        layer, srcs = softmax_loss(scores, [label], "softmaxloss_conf { topk: 2 }")
        layer.compute_feature(FORWARD, srcs)
        hits.append(layer.metrics(FORWARD)["accuracy"])
    assert hits == [0, 0, 1, 1]


def test_softmax_loss_is_stable_for_huge_scores_and_clips_log_at_flt_min():
    layer, srcs = softmax_loss(np.array([[1e4, -1e4]], np.float32), [1])
    layer.compute_feature(FORWARD, srcs)
    assert layer.metrics(FORWARD)["Loss"] == pytest.approx(-np.log(np.finfo(np.float32).tiny))


def test_softmax_loss_gradient_is_p_minus_onehot_times_scale_over_n():
    scores = np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32)
    labels = [4, 0, 2]
    layer, srcs = softmax_loss(scores, labels, "softmaxloss_conf { scale: 0.5 }")

    def loss():
        return layer.metrics(FORWARD)["Loss"]
    check_gradients(layer, srcs, objective=loss)
    p = layer.data.copy()
    p[range(3), labels] -= 1
    np.testing.assert_allclose(srcs[0].grad, p * 0.5 / 3, rtol=1e-6)


def test_softmax_loss_rejects_a_label_outside_the_classes():
    layer, srcs = softmax_loss(np.zeros((2, 3), np.float32), [0, 3])
    with pytest.raises(DataError, match="label 3 from source 'src' is outside \\[0, 3\\)"):
        layer.compute_feature(FORWARD, srcs)


def test_softmax_loss_refuses_a_source_of_regression_targets():
    srcs = [Source(np.zeros((2, 3))), Source(np.zeros((2, 1)), labels=[0, 1], grad=False)]
    srcs[1].targets = np.zeros((2, 1), np.float32)
    with pytest.raises(ConfigError, match="source 'src' gives regression targets"):
        make_layer('name: "loss" type: kSoftmaxLoss', srcs)

def test_cudnn_softmax_loss_shows_only_the_loss_and_ignores_scale():
    scores = np.log(np.array([[0.5, 0.5]], np.float32))
    layer, srcs = softmax_loss(scores, [0], "softmaxloss_conf { scale: 3 }", "kCudnnSoftmaxLoss")
    layer.compute_feature(FORWARD, srcs)
    assert layer.metrics(FORWARD) == pytest.approx({"Loss": np.log(2)})


def euclidean(r, t):
    srcs = [Source(r, name="r"), Source(t, grad=False, name="t")]
    return make_layer('name: "loss" type: kEuclideanLoss', srcs), srcs


def test_euclidean_loss_is_squared_error_over_batch_without_half():
    layer, srcs = euclidean(np.array([[1.0, 2.0], [0.0, 0.0]]), np.array([[0.0, 0.0], [3.0, 0.0]]))
    layer.compute_feature(FORWARD, srcs)
    layer.compute_feature(FORWARD, srcs)
    assert layer.metrics(FORWARD) == pytest.approx({"Loss": (1 + 4 + 9) / 2})


def test_euclidean_loss_gradient_is_that_of_half_the_loss():
    rng = np.random.default_rng(0)
    layer, srcs = euclidean(rng.standard_normal((3, 4)), rng.standard_normal((3, 4)))

    def half_loss():
        return layer.metrics(FORWARD)["Loss"] / 2
    assert check_gradients(layer, srcs, objective=half_loss) == 12
    np.testing.assert_allclose(srcs[0].grad, (srcs[0].data - srcs[1].data) / 3, rtol=1e-6)


def mse(p, t):
    provider = Source(np.zeros((len(p), 1)), grad=False, name="data")
    provider.targets = None if t is None else np.asarray(t, np.float32)
    srcs = [Source(p, name="p"), provider]
    return make_layer('name: "loss" type: kMSELoss', srcs), srcs


def test_mse_loss_is_keras_mean_over_batch_and_outputs_with_mae():
    rng = np.random.default_rng(1)
    p, t = rng.standard_normal((5, 3)), rng.standard_normal((5, 3))
    layer, srcs = mse(p, t)
    layer.compute_feature(FORWARD, srcs)
    d = srcs[0].data.astype(np.float64) - srcs[1].targets
    assert layer.metrics(FORWARD) == pytest.approx({"Loss": np.mean(d ** 2),
                                                    "mae": np.mean(np.abs(d))}, rel=1e-6)
    assert layer.metrics(FORWARD) == {}


def test_mse_loss_gradient_is_two_differences_over_n_times_k():
    rng = np.random.default_rng(2)
    layer, srcs = mse(rng.standard_normal((4, 3)), rng.standard_normal((4, 3)))

    def loss():
        return layer.metrics(FORWARD)["Loss"]
    assert check_gradients(layer, srcs, objective=loss) == 12
    np.testing.assert_allclose(srcs[0].grad, 2 * (srcs[0].data - srcs[1].targets) / 12,
                               rtol=1e-6)


def test_mse_loss_of_one_output_takes_targets_of_shape_n_1():
    layer, srcs = mse(np.array([[1.0], [3.0]]), [[0.0], [1.0]])
    layer.compute_feature(FORWARD, srcs)
    assert layer.metrics(FORWARD) == pytest.approx({"Loss": (1 + 4) / 2, "mae": 1.5})


def test_mse_loss_refuses_a_source_without_targets_or_of_another_width():
    with pytest.raises(ConfigError, match="source 'data' gives no regression targets .*"
                                          "loss='reconstruction'"):
        mse(np.zeros((2, 1)), None)
    with pytest.raises(ConfigError, match=r"prediction 'p' has shape \(2, 3\) but source "
                                          r"'data' gives targets of shape \(2, 1\)"):
        mse(np.zeros((2, 3)), np.zeros((2, 1)))


def load_checkpoint(path):
    blobs = common_pb2.BlobProtos()
    with open(path, "rb") as f:
        blobs.ParseFromString(f.read())
    return {name: np.array(b.data, np.float32).reshape(b.shape)
            for name, b in zip(blobs.name, blobs.blob)}


def net_metrics(layer_confs, checkpoint, shape):
    """The metrics of SINGA's `Test @ step` line for a checkpoint: 5 batches of 100 of test-500.bin, x / 255."""
    data_conf = (f'name: "data" type: kRecordInput partition_dim: 0 store_conf {{ '
                 f'backend: "kvfile" path: "{FIXTURES}/test-500.bin" batchsize: 100 {shape} '
                 f'std_value: 255 }}')
    net = [make_layer(data_conf, [])]
    for conf in layer_confs:
        net.append(make_layer(conf, [net[-1]]))
    loss = make_layer('name: "loss" type: kSoftmaxLoss', [net[-1], net[0]])
    values = load_checkpoint(checkpoint)
    for layer in net:
        for p in layer.params:
            p.data[...] = values["0#" + p.name]
    for _ in range(5):
        for i, layer in enumerate(net):
            layer.compute_feature(job_pb2.kTest, net[i - 1:i])
        loss.compute_feature(job_pb2.kTest, [net[-1], net[0]])
    return loss.metrics(job_pb2.kTest)


MLP = ['name: "ip1" type: kInnerProduct innerproduct_conf { num_output: 64 }'
       ' param { name: "weight1" } param { name: "bias1" }',
       'name: "sig1" type: kSigmoid',
       'name: "ip2" type: kInnerProduct innerproduct_conf { num_output: 10 }'
       ' param { name: "weight2" } param { name: "bias2" }']
CNN = ['name: "conv1" type: kCConvolution convolution_conf { num_filters: 8 kernel: 5 stride: 1 }'
       ' param { name: "cw1" } param { name: "cb1" }',
       'name: "pool1" type: kCPooling pooling_conf { pool: MAX kernel: 2 stride: 2 }',
       'name: "relu1" type: kReLU',
       'name: "ip1" type: kInnerProduct innerproduct_conf { num_output: 10 }'
       ' param { name: "iw1" } param { name: "ib1" }']


@pytest.mark.parametrize("layers, checkpoint, shape, accuracy, loss", [
    (MLP, "run-1worker/step100-worker0", "shape: 784", 0.670, 0.914131),
    (MLP, "run-1worker/step200-worker0", "shape: 784", 0.748, 0.706795),
    (MLP, "run-2workers/step200-worker0", "shape: 784", 0.726, 0.759747),
    (CNN, "cnn/step100-worker0", "shape: 1 shape: 28 shape: 28", 0.734, 0.730350),
    (CNN, "cnn/step200-worker0", "shape: 1 shape: 28 shape: 28", 0.758, 0.703733),
])
def test_singa_checkpoints_reproduce_singas_test_line(layers, checkpoint, shape, accuracy, loss):
    got = net_metrics(layers, f"{FIXTURES}/{checkpoint}", shape)
    got_loss, got_accuracy = got["Loss"], got["accuracy"]
    assert got_accuracy == pytest.approx(accuracy, abs=1e-9)
    assert got_loss == pytest.approx(loss, abs=1e-4)
