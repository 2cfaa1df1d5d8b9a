"""Caffe's Scale, Eltwise, Flatten and Crop: values against float64 references, gradients by
gradcheck, one-line errors for bad confs, and partition_dim 1 refused."""
import numpy as np
import pytest
from google.protobuf import text_format

from gradcheck import BACKWARD, FORWARD, Source, check_gradients, make_layer
from singa.device import threads
from singa.errors import ConfigError
from singa.net import partition
from singa.proto import job_pb2


def inputs(shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


SCALE = 'name: "scale" type: kScale param { name: "g" } param { name: "b" } scale_conf { %s }'


@pytest.mark.parametrize("conf, view", [
    ("", (1, 3, 1, 1)), ("bias_term: true", (1, 3, 1, 1)),
    ("axis: 1 num_axes: 2 bias_term: true", (1, 3, 4, 1)), ("axis: -2", (1, 1, 4, 1)),
    ("num_axes: -1", (1, 3, 4, 2)), ("axis: 0 num_axes: 0 bias_term: true", (1, 1, 1, 1))])
def test_scale_multiplies_along_its_axes_and_adds_the_bias(conf, view):
    src = Source(inputs((2, 3, 4, 2)))
    text = SCALE % conf
    layer = make_layer(text if "bias_term" in conf else text.replace(' param { name: "b" }', ""),
                       [src])
    assert len(layer.params) == (2 if "bias_term" in conf else 1)
    assert layer.params[0].size == np.prod(view)
    layer.compute_feature(FORWARD, [src])
    want = src.data.astype(np.float64) * layer.params[0].data.reshape(view)
    if len(layer.params) == 2:
        want += layer.params[1].data.reshape(view)
    np.testing.assert_allclose(layer.data, want, rtol=1e-6, atol=1e-7)
    assert check_gradients(layer, [src]) == src.data.size + sum(p.size for p in layer.params)


def test_scale_without_bias_term_refuses_a_bias_param_it_would_not_use():
    with pytest.raises(ConfigError, match=r"^layer 'scale' \(kScale\) has 1 param, but its conf "
                                          r"lists 2: 'b' would be unused$"):
        make_layer(SCALE % "", [Source(inputs((2, 3, 4, 2)))])


@pytest.mark.parametrize("conf, view", [("bias_term: true", (1, 3, 1, 1)),
                                        ("axis: 0 num_axes: 2 bias_term: true", (6, 3, 1, 1))])
def test_scale_by_chunks_of_samples_on_two_threads(monkeypatch, conf, view):
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)
    src = Source(inputs((6, 3, 4, 2)))
    layer = make_layer(SCALE % conf, [src])
    with threads.limit(2):
        layer.compute_feature(job_pb2.kTest, [src])
    want = src.data.astype(np.float64) * layer.params[0].data.reshape(view) + \
        layer.params[1].data.reshape(view)
    np.testing.assert_allclose(layer.data, want, rtol=1e-6, atol=1e-7)


def test_scale_on_a_two_dimensional_source():
    src = Source(inputs((3, 5)))
    layer = make_layer(SCALE % "bias_term: true", [src])
    assert layer.params[0].shape == (5,)
    check_gradients(layer, [src])


@pytest.mark.parametrize("conf, error", [
    ("axis: 4", r"scale_conf.axis 4 is out of range for a source of 4 axes"),
    ("axis: 2 num_axes: 3", r"scale_conf.num_axes 3 from axis 2 does not fit a source of "
                            r"shape \(2, 3, 4, 2\)")])
def test_scale_refuses_axes_outside_the_source(conf, error):
    with pytest.raises(ConfigError, match=f"layer 'scale': {error}"):
        make_layer(SCALE % conf, [Source(inputs((2, 3, 4, 2)))])


ELTWISE = 'name: "sum" type: kEltwise eltwise_conf { %s }'


def eltwise_sources(n, shape=(2, 3, 2, 2)):
    return [Source(inputs(shape, seed=i), name=f"x{i}") for i in range(n)]


@pytest.mark.parametrize("conf, reference", [
    ("", lambda xs: sum(xs)),
    ("operation: SUM coeff: 1 coeff: -0.5 coeff: 2", lambda xs: xs[0] - 0.5 * xs[1] + 2 * xs[2]),
    ("operation: PROD", lambda xs: xs[0] * xs[1] * xs[2]),
    ("operation: MAX", lambda xs: np.maximum(np.maximum(xs[0], xs[1]), xs[2]))])
def test_eltwise_values_and_gradients(conf, reference):
    srcs = eltwise_sources(3)
    layer = make_layer(ELTWISE % conf, srcs)
    layer.compute_feature(FORWARD, srcs)
    np.testing.assert_allclose(layer.data, reference([s.data.astype(np.float64) for s in srcs]),
                               rtol=1e-6)
    assert check_gradients(layer, srcs) == 3 * srcs[0].data.size


@pytest.mark.parametrize("conf", ["", "operation: SUM coeff: -1 coeff: 1 coeff: 0.5"])
def test_eltwise_sum_by_chunks_of_samples_on_two_threads_gives_one_threads_bits(monkeypatch,
                                                                                conf):
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)
    srcs = eltwise_sources(3, (5, 3, 2, 2))
    outs = []
    for n in (1, 2):
        layer = make_layer(ELTWISE % conf, srcs)
        with threads.limit(n):
            layer.compute_feature(job_pb2.kTest, srcs)
        outs.append(layer.data.tobytes())
    assert outs[0] == outs[1]
    np.testing.assert_allclose(layer.data, sum(s.data.astype(np.float64) * c for s, c in zip(
        srcs, [-1, 1, 0.5] if conf else [1, 1, 1])), rtol=1e-6)


def test_eltwise_max_routes_ties_as_caffes_loop():
    """Caffe's first comparison is x0 > x1: a tie of the first two goes to x1; a later source
    takes the maximum only when strictly greater."""
    a, b, c = (Source(np.array(v, np.float32), name=n) for v, n in
               (([[1, 2, 5, 0]], "a"), ([[1, 3, 5, 0]], "b"), ([[1, 3, 4, 0]], "c")))
    layer = make_layer(ELTWISE % "operation: MAX", [a, b, c])
    layer.compute_feature(FORWARD, [a, b, c])
    layer.grad[...] = [[1, 2, 3, 4]]
    layer.compute_gradient(BACKWARD, [a, b, c])
    np.testing.assert_array_equal(layer.data, [[1, 3, 5, 0]])
    np.testing.assert_array_equal(a.grad, [[0, 0, 0, 0]])
    np.testing.assert_array_equal(b.grad, [[1, 2, 3, 4]])
    np.testing.assert_array_equal(c.grad, [[0, 0, 0, 0]])


@pytest.mark.parametrize("conf, srcs, error", [
    ("", [(2, 3)], r"\(kEltwise\) needs 2 or more srclayers, got 1"),
    ("", [(2, 3), (2, 4)], r"source 'x1' has shape \(2, 4\), 'x0' \(2, 3\); Eltwise needs one "
                           r"shape"),
    ("coeff: 1", [(2, 3), (2, 3)], r"eltwise_conf.coeff needs operation SUM and one value per "
                                   r"source \(2\), got 1"),
    ("operation: PROD coeff: 1 coeff: 2", [(2, 3), (2, 3)], r"eltwise_conf.coeff needs")])
def test_eltwise_refuses_bad_confs_in_one_line(conf, srcs, error):
    sources = [Source(inputs(s), name=f"x{i}") for i, s in enumerate(srcs)]
    with pytest.raises(ConfigError, match=f"layer 'sum':? {error}"):
        make_layer(ELTWISE % conf, sources)


FLATTEN = 'name: "flat" type: kFlatten flatten_conf { %s }'


@pytest.mark.parametrize("conf, shape", [("", (2, 24)), ("axis: 2", (2, 3, 8)),
                                         ("axis: 1 end_axis: 2", (2, 12, 2)),
                                         ("axis: -3 end_axis: -2", (2, 12, 2)),
                                         ("axis: 0", (48,))])
def test_flatten_merges_axis_to_end_axis(conf, shape):
    src = Source(inputs((2, 3, 4, 2)))
    layer = make_layer(FLATTEN % conf, [src])
    layer.compute_feature(FORWARD, [src])
    np.testing.assert_array_equal(layer.data, src.data.reshape(shape))
    assert check_gradients(layer, [src]) == src.data.size


def test_flatten_refuses_an_end_before_its_axis():
    with pytest.raises(ConfigError, match=r"layer 'flat': flatten_conf.end_axis 1 comes before "
                                          r"axis 2 in a source of shape \(2, 3, 4\)"):
        make_layer(FLATTEN % "axis: 2 end_axis: 1", [Source(inputs((2, 3, 4)))])


CROP = 'name: "crop" type: kCrop crop_conf { %s }'


@pytest.mark.parametrize("conf, window", [
    ("", (slice(None), slice(None), slice(0, 3), slice(0, 2))),
    ("offset: 1", (slice(None), slice(None), slice(1, 4), slice(1, 3))),
    ("offset: 2 offset: 3", (slice(None), slice(None), slice(2, 5), slice(3, 5))),
    ("axis: 1 offset: 1 offset: 0 offset: 2", (slice(None), slice(1, 3), slice(0, 3),
                                                slice(2, 4)))])
def test_crop_cuts_source_1_to_the_shape_of_source_2(conf, window):
    x, ref = Source(inputs((2, 4, 5, 6)), name="x"), Source(inputs((1, 2, 3, 2)), name="ref")
    layer = make_layer(CROP % conf, [x, ref])
    layer.compute_feature(FORWARD, [x, ref])
    np.testing.assert_array_equal(layer.data, x.data[window])
    ref.grad[...] = np.nan
    assert check_gradients(layer, [x, ref]) == x.data.size + ref.data.size
    assert not ref.grad.any()


@pytest.mark.parametrize("conf, error", [
    ("offset: 1 offset: 2 offset: 3", r"crop_conf.offset needs 0, 1 or 2 values \(one per "
                                      r"axis from 2\), got 3"),
    ("offset: 3", r"offset 3 and size 3 on axis 2 pass the end of a source of shape "
                  r"\(2, 4, 5, 6\)"),
    ("axis: -5", r"crop_conf.axis -5 is out of range for a source of 4 axes")])
def test_crop_refuses_windows_past_the_source(conf, error):
    x, ref = Source(inputs((2, 4, 5, 6)), name="x"), Source(inputs((1, 2, 3, 2)), name="ref")
    with pytest.raises(ConfigError, match=f"layer 'crop': {error}"):
        make_layer(CROP % conf, [x, ref])


@pytest.mark.parametrize("kind", ["kCaffeBatchNorm", "kScale", "kEltwise", "kFlatten", "kCrop",
                                  "kDeconvolution"])
def test_caffe_layer_kinds_are_refused_on_partition_dim_1(kind):
    net = text_format.Parse(f"""
        layer {{ name: "in" type: kDummy partition_dim: 0 }}
        layer {{ name: "0#c" type: {kind} srclayers: "in" partition_dim: 1 }}""",
                            job_pb2.NetProto())
    with pytest.raises(ConfigError, match=rf"layer 'c' \({kind}\) cannot compute on a part of "
                                          rf"its features \(partition_dim 1 over 2 workers\); "
                                          rf"give it partition_dim: 0"):
        partition.add_connection_layers(list(net.layer), 2)


def test_a_net_of_caffes_kinds_builds_and_runs_forward_and_back():
    """A residual block (BatchNorm, Scale, Eltwise over a split source) and an FCN-style head
    (Deconvolution, Crop to the input, global pooling, Flatten, softmax over axis 1)."""
    from singa.net.neuralnet import NeuralNet

    def p(name):
        return f'param {{ name: "{name}" init {{ type: kGaussian std: 0.3 }} }}'
    conf = text_format.Parse(f"""
        layer {{ name: "x" type: kDummy dummy_conf {{ input: true shape: 4 shape: 3 shape: 6
                                                         shape: 6 }} }}
        layer {{ name: "conv" type: kCConvolution srclayers: "x" {p("w")} {p("b")}
                 convolution_conf {{ num_filters: 3 kernel: 3 pad: 1 }} }}
        layer {{ name: "bn" type: kCaffeBatchNorm srclayers: "conv" {p("m")} {p("v")} {p("f")} }}
        layer {{ name: "scale" type: kScale srclayers: "bn" scale_conf {{ bias_term: true }}
                 {p("g")} {p("be")} }}
        layer {{ name: "sum" type: kEltwise srclayers: "scale" srclayers: "x" }}
        layer {{ name: "up" type: kDeconvolution srclayers: "sum" {p("wd")} {p("bd")}
                 convolution_conf {{ num_filters: 3 kernel: 4 stride: 2 pad: 1 }} }}
        layer {{ name: "crop" type: kCrop srclayers: "up" srclayers: "x"
                 crop_conf {{ offset: 3 }} }}
        layer {{ name: "pool" type: kPooling srclayers: "crop"
                 pooling_conf {{ pool: AVG global_pooling: true }} }}
        layer {{ name: "flat" type: kFlatten srclayers: "pool" }}
        layer {{ name: "sm" type: kSoftmax srclayers: "flat" softmax_conf {{ axis: 1 }} }}
        layer {{ name: "y" type: kDummy srclayers: "sm" dummy_conf {{ output: true }} }}
        """, job_pb2.NetProto())
    net = NeuralNet(conf, job_pb2.kTrain, np.random.default_rng(0))
    assert "split(0#x)" in net.by_name
    rng = np.random.default_rng(1)
    for q in net.params:
        q.data[...] = rng.normal(0, 0.3, q.shape)
    net.forward(FORWARD)
    for layer in reversed(net.layers):
        layer.compute_gradient(BACKWARD, net.srclayers[layer.name])
    assert net.by_name["0#flat"].data.shape == (4, 3)
    np.testing.assert_allclose(net.by_name["0#sm"].data.sum(axis=1), 1, rtol=1e-6)
    assert all(np.isfinite(q.grad).all() for q in net.params)
    assert net.by_name["0#conv"].params[0].grad.any()
