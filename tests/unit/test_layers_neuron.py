"""InnerProduct, activations, Dropout and Softmax: values against numpy, gradients by gradcheck."""
import types

import numpy as np
import pytest

from gradcheck import BACKWARD, FORWARD, Source, check_gradients, make_layer
from singa.device import threads
from singa.errors import ConfigError
from singa.layers.neuron import STANH_A, STANH_B
from singa.proto import job_pb2

IP = """name: "ip" type: kInnerProduct innerproduct_conf {{ num_output: 4 {extra} }}
        param {{ name: "w" }} param {{ name: "b" }}"""


def inputs(shape, seed=1, away_from_zero=0.0):
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    x[np.abs(x) < away_from_zero] += 2 * away_from_zero
    return x


@pytest.mark.parametrize("transpose", [False, True])
def test_innerproduct_forward_is_x_times_w_transposed_plus_b(transpose):
    src = Source(inputs((3, 2, 5)))
    layer = make_layer(IP.format(extra="transpose: true" if transpose else ""), [src])
    w, b = layer.params
    assert w.shape == ((10, 4) if transpose else (4, 10)) and b.shape == (4,)
    layer.compute_feature(FORWARD, [src])
    x = src.data.reshape(3, 10)
    want = x @ (w.data if transpose else w.data.T) + b.data
    np.testing.assert_allclose(layer.data, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("transpose", [False, True])
def test_innerproduct_gradients(transpose):
    src = Source(inputs((3, 2, 5)))
    layer = make_layer(IP.format(extra="transpose: true" if transpose else ""), [src])
    assert check_gradients(layer, [src]) == 30 + 40 + 4


def test_innerproduct_aggregates_param_grads_with_kagggrad():
    src = Source(inputs((3, 5)))
    layer = make_layer(IP.format(extra=""), [src])
    layer.compute_feature(FORWARD, [src])
    layer.grad[...] = inputs((3, 4), seed=2)
    layer.compute_gradient(BACKWARD, [src])
    once = [p.grad.copy() for p in layer.params]
    layer.compute_gradient(BACKWARD | job_pb2.kAggGrad, [src])
    for p, g in zip(layer.params, once):
        np.testing.assert_allclose(p.grad, 2 * g, rtol=1e-6)


def test_innerproduct_splits_outputs_over_partitions_on_dim_1():
    src = Source(inputs((2, 6)))
    layer = make_layer(IP.format(extra="") + " partition_dim: 1 num_partitions: 2", [src])
    assert layer.data.shape == (2, 2) and layer.params[0].shape == (2, 6)


@pytest.mark.parametrize("transpose", [False, True])
def test_innerproduct_without_bias_term_has_w_alone(transpose):
    src = Source(inputs((3, 2, 5)))
    conf = ('name: "ip" type: kInnerProduct innerproduct_conf { num_output: 4 bias_term: false '
            f'{"transpose: true" if transpose else ""} }} param {{ name: "w" }}')
    layer = make_layer(conf, [src])
    (w,) = layer.params
    layer.compute_feature(FORWARD, [src])
    x = src.data.reshape(3, 10)
    np.testing.assert_allclose(layer.data, x @ (w.data if transpose else w.data.T),
                               rtol=1e-5, atol=1e-6)
    assert check_gradients(layer, [src]) == 30 + 40
    layer.compute_gradient(BACKWARD | job_pb2.kAggGrad, [src])


def test_innerproduct_without_bias_term_refuses_a_bias_param():
    with pytest.raises(ConfigError, match="layer 'ip' .* has 1 param, but its conf lists 2"):
        make_layer(IP.format(extra="bias_term: false"), [Source(inputs((2, 3)))])


def test_innerproduct_without_params_names_the_layer():
    with pytest.raises(ConfigError, match="layer 'ip' needs 2 param entries"):
        make_layer('name: "ip" type: kInnerProduct innerproduct_conf { num_output: 4 }',
                   [Source(inputs((2, 3)))])


FUNCTIONS = {
    "kReLU": lambda x: np.maximum(x, 0),
    "kSigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "kSTanh": lambda x: STANH_A * np.tanh(STANH_B * x),
}
ACTIVATIONS = {"RELU": FUNCTIONS["kReLU"], "SIGMOID": FUNCTIONS["kSigmoid"], "TANH": np.tanh,
               "STANH": FUNCTIONS["kSTanh"]}


@pytest.mark.parametrize("kind", sorted(FUNCTIONS))
def test_elementwise_layer_values_and_gradients(kind):
    src = Source(inputs((3, 4), away_from_zero=0.05))
    layer = make_layer(f'name: "f" type: {kind}', [src])
    layer.compute_feature(FORWARD, [src])
    np.testing.assert_allclose(layer.data, FUNCTIONS[kind](src.data), rtol=1e-5, atol=1e-6)
    check_gradients(layer, [src])


@pytest.mark.parametrize("kind", sorted(ACTIVATIONS))
@pytest.mark.parametrize("layer_type", ["kActivation", "kCudnnActivation"])
def test_activation_layer_values_and_gradients(kind, layer_type):
    src = Source(inputs((3, 4), away_from_zero=0.05))
    layer = make_layer(f'name: "a" type: {layer_type} activation_conf {{ type: {kind} }}', [src])
    layer.compute_feature(FORWARD, [src])
    np.testing.assert_allclose(layer.data, ACTIVATIONS[kind](src.data), rtol=1e-5, atol=1e-6)
    check_gradients(layer, [src])


@pytest.mark.parametrize("conf", ['name: "f" type: kReLU',
                                  'name: "a" type: kActivation activation_conf { type: TANH } '
                                  'share_src_blobs: true'])
def test_elementwise_forward_by_chunks_of_samples_on_two_threads(monkeypatch, conf):
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)
    x = inputs((9, 2, 3))
    src = Source(x.copy())     # in place with share_src_blobs
    layer = make_layer(conf, [src])
    with threads.limit(2):
        layer.compute_feature(job_pb2.kTest, [src])
    want = np.tanh(x) if "TANH" in conf else np.maximum(x, 0)
    np.testing.assert_allclose(layer.data, want, rtol=1e-6, atol=1e-7)


def test_activation_sharing_source_blobs_works_in_place():
    x = inputs((3, 4))
    plain_src, shared_src = Source(x), Source(x.copy())
    conf = 'name: "a" type: kActivation activation_conf { type: SIGMOID }'
    plain = make_layer(conf, [plain_src])
    shared = make_layer(conf + " share_src_blobs: true", [shared_src])
    assert shared.data is shared_src.data and shared.grad is shared_src.grad
    g = inputs((3, 4), seed=3)
    for layer, src in ((plain, plain_src), (shared, shared_src)):
        layer.compute_feature(FORWARD, [src])
        layer.grad[...] = g
        layer.compute_gradient(BACKWARD, [src])
    np.testing.assert_array_equal(shared_src.data, plain.data)
    np.testing.assert_array_equal(shared_src.grad, plain_src.grad)


def test_dropout_scales_kept_units_and_drops_the_rest_in_training():
    src = Source(np.ones((200, 50), np.float32))
    layer = make_layer('name: "d" type: kDropout dropout_conf { dropout_ratio: 0.3 }', [src])
    layer.compute_feature(FORWARD, [src])
    kept = layer.data != 0
    np.testing.assert_allclose(layer.data[kept], 1 / 0.7, rtol=1e-6)
    assert abs(kept.mean() - 0.7) < 0.02


def test_dropout_is_identity_outside_training():
    src = Source(inputs((4, 5)))
    layer = make_layer('name: "d" type: kDropout', [src])
    layer.compute_feature(job_pb2.kTest | job_pb2.kForward, [src])
    np.testing.assert_array_equal(layer.data, src.data)


def test_dropout_gradients_with_a_fixed_mask():
    src = Source(inputs((4, 5)))
    layer = make_layer('name: "d" type: kDropout', [src])

    def same_mask():
        layer.rng = np.random.default_rng(7)
    check_gradients(layer, [src], before_forward=same_mask)
    assert 0 < np.count_nonzero(layer.mask) < layer.mask.size


@pytest.mark.parametrize("layer_type", ["kSoftmax", "kCudnnSoftmax"])
def test_softmax_rows_sum_to_one_and_backward_is_refused(layer_type):
    src = Source(inputs((3, 6)) * 50)
    layer = make_layer(f'name: "sm" type: {layer_type}', [src])
    layer.compute_feature(job_pb2.kTest, [src])
    e = np.exp(src.data - src.data.max(axis=1, keepdims=True))
    np.testing.assert_allclose(layer.data, e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    with pytest.raises(ConfigError, match="Softmax layer has no backward"):
        layer.compute_gradient(BACKWARD, [src])


@pytest.mark.parametrize("layer_type", ["kSoftmax", "kCudnnSoftmax"])
@pytest.mark.parametrize("shape, axis", [((2, 3, 4, 2), 1), ((2, 3, 4, 2), -1), ((3, 6), 1),
                                         ((2, 5), 0)])
def test_caffes_softmax_over_one_axis_at_each_position_and_its_gradient(layer_type, shape, axis):
    src = Source(inputs(shape) * 3)
    layer = make_layer(f'name: "sm" type: {layer_type} softmax_conf {{ axis: {axis} }}', [src])
    layer.compute_feature(FORWARD, [src])
    x = src.data.astype(np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    np.testing.assert_allclose(layer.data, e / e.sum(axis=axis, keepdims=True), rtol=1e-5,
                               atol=1e-7)
    assert check_gradients(layer, [src]) == src.data.size


def test_softmax_refuses_an_axis_out_of_range():
    with pytest.raises(ConfigError, match=r"layer 'sm': softmax_conf.axis 4 is out of range for "
                                          r"a source of shape \(2, 3, 4, 2\)"):
        make_layer('name: "sm" type: kSoftmax softmax_conf { axis: 4 }',
                   [Source(inputs((2, 3, 4, 2)))])


def test_gradcheck_catches_a_wrong_gradient():
    src = Source(inputs((3, 4), away_from_zero=0.05))
    layer = make_layer('name: "f" type: kSigmoid', [src])
    right = layer.kernels
    layer.kernels = types.SimpleNamespace(   # f' = 1.01·y, not (1 − y)·y
        activation=right.activation,
        activation_grad=lambda f, y, g, gx: np.multiply(g, y * np.float32(1.01), out=gx))
    with pytest.raises(AssertionError, match="gradient of source 'src'"):
        check_gradients(layer, [src])


def test_dummy_input_draws_uniform_data_of_its_shape_every_forward():
    layer = make_layer('name: "d" type: kDummy dummy_conf { input: true shape: 40 shape: 50 }', [])
    layer.compute_feature(FORWARD, [])
    first = layer.data.copy()
    assert first.shape == (40, 50) and 0 <= first.min() and first.max() < 1
    assert 0.45 < first.mean() < 0.55
    layer.compute_feature(FORWARD, [])
    assert not np.array_equal(first, layer.data)


def test_dummy_copies_its_source_and_passes_the_gradient_back():
    src = Source(inputs((3, 4)))
    layer = make_layer('name: "d" type: kDummy', [src])
    layer.compute_feature(FORWARD, [src])
    np.testing.assert_array_equal(layer.data, src.data)
    assert check_gradients(layer, [src]) == 12


def test_dummy_output_draws_its_gradient():
    src = Source(inputs((30, 40)))
    layer = make_layer('name: "d" type: kDummy dummy_conf { output: true }', [src])
    layer.compute_feature(FORWARD, [src])
    layer.compute_gradient(BACKWARD, [src])
    assert 0 <= layer.grad.min() and layer.grad.max() < 1 and 0.45 < layer.grad.mean() < 0.55
    np.testing.assert_array_equal(src.grad, layer.grad)


def test_dummy_input_keeps_the_batch_it_was_fed_with_its_labels():
    layer = make_layer('name: "d" type: kDummy dummy_conf { input: true shape: 2 shape: 3 }', [])
    layer.feed(np.arange(6, dtype=np.uint8), [[1], [0]])
    layer.compute_feature(FORWARD, [])
    np.testing.assert_array_equal(layer.data, np.arange(6, dtype=np.float32).reshape(2, 3))
    assert layer.aux_data.dtype == np.int32 and layer.aux_data.tolist() == [1, 0]
    with pytest.raises(ConfigError,
                       match=r"layer 'd': fed data of shape \(4,\), but it holds \(2, 3\)"):
        layer.feed(np.zeros(4))
    with pytest.raises(ConfigError, match="layer 'd': fed 3 labels for a batch of 2"):
        layer.feed(aux_data=[0, 1, 2])


@pytest.mark.parametrize("conf, srcs, message", [
    ("dummy_conf { input: true shape: 2 }", 1, "as input .* takes no srclayers, got 1"),
    ("dummy_conf { input: true }", 0, r"dummy_conf.shape must list positive sizes, got \[\]"),
    ("", 0, "needs 1 srclayer, got 0"),
])
def test_dummy_conf_mistakes_name_the_layer(conf, srcs, message):
    with pytest.raises(ConfigError, match=f"layer 'd'.*{message}"):
        make_layer(f'name: "d" type: kDummy {conf}', [Source(inputs((2, 2)))] * srcs)


def test_cut_covers_every_row_once_with_pieces_differing_by_at_most_one():
    from singa.layers.param import cut
    for n in range(1, 30):
        for parts in range(1, 7):
            pieces = [cut(n, parts, k) for k in range(parts)]
            assert pieces[0][0] == 0 and pieces[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(pieces, pieces[1:]))
            sizes = [stop - start for start, stop in pieces]
            assert max(sizes) - min(sizes) <= 1 and sorted(sizes, reverse=True) == sizes
