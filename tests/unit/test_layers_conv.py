"""Convolution and pooling: values against direct loops, Caffe's pooling rules, gradients;
each on numba's compiled copies and on numpy's.

SINGA's own cnn checkpoint is run through these layers in test_layers_loss.py."""
import numpy as np
import pytest
from google.protobuf import text_format

from gradcheck import BACKWARD, FORWARD, Source, check_gradients, make_layer
from singa.device import threads
from singa.errors import ConfigError
from singa.layers import conv
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2


@pytest.fixture(autouse=True, params=["onednn", "numba", "numpy"])
def kernels(request, monkeypatch):
    """Every test on oneDNN and on both of convolution's copies (singa.layers.kernels)."""
    if request.param == "numba":
        pytest.importorskip("numba")
    if request.param == "onednn":
        onednn = pytest.importorskip("singa.layers.kernels.onednn")
        try:
            onednn.library()
        except OSError as e:
            pytest.skip(str(e))
    monkeypatch.setenv("SINGA_KERNELS", request.param)
    return request.param


def im2col_path(kernels):
    """A test of the im2col path's own choices (its chunks, col2im, the transposed
    convolution, pointwise, direct loops): oneDNN's convolution has none
    (tests/unit/test_onednn.py has its own)."""
    if kernels == "onednn":
        pytest.skip("the im2col path's own choices")


def conv_conf(layer_type="kCConvolution", num_filters=3, **kw):
    fields = " ".join(f"{k}: {v}" for k, v in kw.items())
    return (f'name: "conv" type: {layer_type} convolution_conf {{ num_filters: {num_filters} '
            f'{fields} }} '
            'param { name: "w" } param { name: "b" }')


def direct_conv(x, w, b, kh, kw, ph, pw, sh, sw):
    """Convolution by loops over output positions (the definition)."""
    n, c, h, wd = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh, ow = (h + 2 * ph - kh) // sh + 1, (wd + 2 * pw - kw) // sw + 1
    wk = w.reshape(-1, c, kh, kw)
    y = np.empty((n, wk.shape[0], oh, ow))
    for i in range(oh):
        for j in range(ow):
            patch = xp[:, :, i * sh:i * sh + kh, j * sw:j * sw + kw]
            y[:, :, i, j] = np.tensordot(patch, wk, axes=([1, 2, 3], [1, 2, 3])) + b
    return y


@pytest.mark.parametrize("layer_type", ["kConvolution", "kCConvolution", "kCudnnConv"])
@pytest.mark.parametrize("window", [dict(kernel=3), dict(kernel=3, pad=1, stride=2),
                                    dict(kernel_x=3, kernel_y=2, pad_x=1, stride_y=2)])
def test_convolution_matches_direct_loops(layer_type, window):
    src = Source(np.random.default_rng(0).standard_normal((2, 2, 7, 6)))
    layer = make_layer(conv_conf(layer_type, **window), [src])
    layer.compute_feature(FORWARD, [src])
    kh = window.get("kernel", window.get("kernel_y", 3))
    kw = window.get("kernel", window.get("kernel_x", 3))
    ph = window.get("pad", window.get("pad_y", 0))
    pw = window.get("pad", window.get("pad_x", 0))
    sh = window.get("stride", window.get("stride_y", 1))
    sw = window.get("stride", window.get("stride_x", 1))
    w, b = layer.params
    assert w.shape == (3, 2 * kh * kw)
    want = direct_conv(src.data, w.data, b.data, kh, kw, ph, pw, sh, sw)
    assert layer.data.shape == want.shape
    np.testing.assert_allclose(layer.data, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("window", [dict(kernel=3), dict(kernel=3, pad=1),
                                    dict(kernel_x=3, kernel_y=2, pad_x=1),
                                    dict(kernel=3, pad=1, stride=2)])
def test_convolution_gradients(window):
    # more filters than channels: col2im, in long runs for stride 1 (no transposed convolution)
    src = Source(np.random.default_rng(0).standard_normal((2, 2, 5, 5)))
    layer = make_layer(conv_conf(num_filters=6, **window), [src])
    assert not layer.transposed
    check_gradients(layer, [src])


@pytest.mark.parametrize("window", [dict(kernel=3, pad=1), dict(kernel=3),
                                    dict(kernel_x=3, kernel_y=2, pad_x=2, pad_y=1)])
def test_convolution_gradients_through_the_transposed_convolution(kernels, window):
    im2col_path(kernels)
    src = Source(np.random.default_rng(0).standard_normal((2, 4, 5, 6)))
    layer = make_layer(conv_conf(num_filters=2, **window), [src])
    assert layer.transposed
    check_gradients(layer, [src])


@pytest.mark.parametrize("window", [dict(kernel=3, pad=1), dict(kernel=3, pad=1, stride=2)])
@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_convolution_in_chunks_of_samples_matches_direct_loops(kernels, monkeypatch, window, keep,
                                                               nthreads):
    im2col_path(kernels)
    # Two samples per chunk for a batch of 5: the last chunk is partial. The chunks' cols are
    # kept for the backward pass or made again; the chunks run on one thread or two.
    monkeypatch.setattr(threads, "CHUNK_BYTES", 2 * 2 * 9 * 5 * 5 * 4 if "stride" not in window
                        else 2 * 2 * 9 * 3 * 3 * 4)
    monkeypatch.setattr(threads, "MIN_CHUNKS", 2)
    if not keep:
        monkeypatch.setattr(conv, "KEEP_COL_BYTES", 0)
        monkeypatch.setattr(conv, "KEEP_COMPILED_COL_BYTES", 0)
    src = Source(np.random.default_rng(0).standard_normal((5, 2, 5, 5)))
    layer = make_layer(conv_conf(**window), [src])
    assert [r.stop - r.start for r in layer.chunks] == [2, 2, 1]
    with threads.limit(nthreads):
        layer.compute_feature(FORWARD, [src])
        w, b = layer.params
        s = window.get("stride", 1)
        want = direct_conv(src.data, w.data, b.data, 3, 3, 1, 1, s, s)
        np.testing.assert_allclose(layer.data, want, rtol=1e-4, atol=1e-5)
        check_gradients(layer, [src])


def test_a_pointwise_convolution_multiplies_each_sample_without_col(kernels):
    im2col_path(kernels)
    src = Source(np.random.default_rng(0).standard_normal((3, 2, 28, 29)))
    layer = make_layer(conv_conf(num_filters=4, kernel=1), [src])
    assert layer.pointwise and layer._cols is None
    layer.compute_feature(FORWARD, [src])
    w, b = layer.params
    want = direct_conv(src.data, w.data, b.data, 1, 1, 0, 0, 1, 1)
    np.testing.assert_allclose(layer.data, want, rtol=1e-5, atol=1e-5)
    check_gradients(layer, [src])


def test_no_convolution_keeps_its_chunks_weight_gradients():
    """The chunks' weight gradients (chunks × W's size) of a backward pass on the host are in
    the calling thread's workspace, which every convolution's backward pass uses in turn: no
    layer keeps them (ResNet-50's layers kept 2.5 times its weights), forward or backward."""
    src = Source(np.random.default_rng(0).standard_normal((4, 2, 5, 5)))
    layer = make_layer(conv_conf(kernel=3, pad=1), [src])
    layer.compute_feature(job_pb2.kTest, [src])
    assert layer._gws is None
    check_gradients(layer, [src])
    assert layer._gws is None
    space = threads._local.spaces["conv gW"]
    assert space.size >= len(layer.chunks) * layer.weight.data.size


@pytest.mark.parametrize("channels, conf, direct", [
    (3, dict(num_filters=4, kernel=3, pad=1), False),               # im2col + GEMM, 7 chunks
    (6, dict(num_filters=6, group=6, kernel=3, pad=1), True)])      # depthwise: direct loops
def test_convolution_results_do_not_depend_on_the_thread_count(kernels, monkeypatch, channels, conf,
                                                                direct):
    im2col_path(kernels)
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)      # chunks this small, to have 7
    src = Source(np.random.default_rng(0).standard_normal((20, channels, 8, 8)))
    results = []
    for nthreads in (1, 2, 3):
        layer = make_layer(conv_conf(**conf), [src])
        assert layer.direct == direct and len(layer.chunks) == 7
        w = layer.params[0].data
        w[...] = np.random.default_rng(1).standard_normal(w.shape)
        layer.grad[...] = np.random.default_rng(2).standard_normal(layer.grad.shape)
        with threads.limit(nthreads):
            layer.compute_feature(FORWARD, [src])
            layer.compute_gradient(BACKWARD, [src])
        results.append([layer.data.copy(), layer.params[0].grad.copy(), src.grad.copy()])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("channels, filters, window, path", [
    (2, 6, dict(kernel=3, pad=1), "col2im"),
    (4, 2, dict(kernel=3, pad=1), "transposed"),
    (2, 4, dict(kernel=1), "pointwise"),
    (4, 4, dict(kernel=3, pad=1, group=4), "direct")])
def test_a_convolution_with_one_param_has_no_bias(kernels, channels, filters, window, path):
    im2col_path(kernels)
    side = 28 if path == "pointwise" else 5
    src = Source(np.random.default_rng(0).standard_normal((2, channels, side, side)))
    conf = conv_conf(num_filters=filters, **window).replace(' param { name: "b" }', '')
    layer = make_layer(conf, [src])
    assert len(layer.params) == 1 and layer.bias is None
    assert {"col2im": not (layer.transposed or layer.pointwise or layer.direct),
            "transposed": layer.transposed, "pointwise": layer.pointwise,
            "direct": layer.direct}[path]
    layer.compute_feature(FORWARD, [src])
    if "group" not in window:
        k, p = window["kernel"], window.get("pad", 0)
        want = direct_conv(src.data, layer.params[0].data, 0, k, k, p, p, 1, 1)
        np.testing.assert_allclose(layer.data, want, rtol=1e-4, atol=1e-4)
    check_gradients(layer, [src])


def test_convolution_treats_a_3d_input_as_one_channel():
    src = Source(np.random.default_rng(0).standard_normal((2, 5, 5)))
    layer = make_layer(conv_conf(kernel=3), [src])
    assert layer.data.shape == (2, 3, 3, 3) and layer.params[0].shape == (3, 9)
    check_gradients(layer, [src])


def test_convolution_rejects_a_kernel_larger_than_the_input():
    with pytest.raises(ConfigError, match="layer 'conv': kernel 5, pad 0, stride 1"):
        make_layer(conv_conf(kernel=5), [Source(np.zeros((1, 1, 4, 4)))])


def pool_conf(layer_type="kCPooling", pool="MAX", **kw):
    fields = " ".join(f"{k}: {v}" for k, v in kw.items())
    return f'name: "pool" type: {layer_type} pooling_conf {{ pool: {pool} {fields} }}'


def distinct(shape, seed=0):
    """Values at least 0.1 apart, so a small perturbation never changes which one is the max."""
    v = np.random.default_rng(seed).permutation(int(np.prod(shape))) * 0.1
    return v.reshape(shape).astype(np.float32)


def test_max_pooling_values_and_output_size_use_floor():
    x = distinct((1, 1, 5, 5))
    src = Source(x)
    layer = make_layer(pool_conf(kernel=2, stride=2), [src])
    layer.compute_feature(FORWARD, [src])
    want = x[:, :, :4, :4].reshape(1, 1, 2, 2, 2, 2).max(axis=(3, 5))
    np.testing.assert_array_equal(layer.data, want)


def test_max_pooling_routes_the_gradient_to_the_first_maximum_like_caffe():
    src = Source(np.ones((1, 1, 2, 2)))
    layer = make_layer(pool_conf(kernel=2, stride=2), [src])
    layer.compute_feature(FORWARD, [src])
    layer.grad[...] = 5
    layer.compute_gradient(BACKWARD, [src])
    np.testing.assert_array_equal(src.grad[0, 0], [[5, 0], [0, 0]])


def test_max_pooling_ignores_padding_even_for_negative_inputs():
    src = Source(-1 - distinct((1, 1, 3, 3)))
    layer = make_layer(pool_conf(kernel=2, stride=2, pad=1), [src])
    layer.compute_feature(FORWARD, [src])
    x = src.data[0, 0]
    want = [[x[0, 0], x[0, 1:3].max()], [x[1:3, 0].max(), x[1:3, 1:3].max()]]
    np.testing.assert_array_equal(layer.data[0, 0], want)


@pytest.mark.parametrize("layer_type, divisors", [
    # Caffe clips the window to the padded image; with floor output sizes no window passes it.
    ("kCPooling", [[9, 9], [9, 9]]),
    # mshadow divides by k*k.
    ("kPooling", [[9, 9], [9, 9]]),
    # cuDNN excludes the padding.
    ("kCudnnPool", [[4, 4], [4, 4]]),
])
def test_avg_pooling_divisors(layer_type, divisors):
    src = Source(np.ones((1, 1, 3, 3)))
    layer = make_layer(pool_conf(layer_type, "AVG", kernel=3, stride=2, pad=1), [src])
    layer.compute_feature(FORWARD, [src])
    counts = np.array([[4, 4], [4, 4]])
    np.testing.assert_allclose(layer.data[0, 0], counts / np.array(divisors), rtol=1e-6)


@pytest.mark.parametrize("layer_type", ["kCPooling", "kPooling", "kCudnnPool"])
@pytest.mark.parametrize("pool", ["MAX", "AVG"])
@pytest.mark.parametrize("window", [dict(kernel=2, stride=2), dict(kernel=3, stride=2, pad=1),
                                    dict(kernel_x=2, kernel_y=3, stride_x=1, stride_y=2)])
def test_pooling_gradients(layer_type, pool, window):
    src = Source(distinct((2, 2, 5, 5)))
    layer = make_layer(pool_conf(layer_type, pool, **window), [src])
    check_gradients(layer, [src])


def direct_pool(x, reduce, kh, kw, sh, sw):
    """Pooling by loops over output positions, no padding."""
    oh, ow = (x.shape[2] - kh) // sh + 1, (x.shape[3] - kw) // sw + 1
    return np.array([[[[reduce(x[n, c, i * sh:i * sh + kh, j * sw:j * sw + kw])
                        for j in range(ow)] for i in range(oh)]
                      for c in range(x.shape[1])] for n in range(x.shape[0])])


@pytest.mark.parametrize("pool, reduce", [("MAX", np.max), ("AVG", np.mean)])
@pytest.mark.parametrize("window", [dict(kernel=3, stride=2),
                                    dict(kernel_x=2, kernel_y=3, stride_x=1, stride_y=2)])
@pytest.mark.parametrize("flag", [FORWARD, job_pb2.kTest])
def test_pooling_matches_direct_loops(pool, reduce, window, flag):
    x = distinct((2, 3, 7, 6))
    src = Source(x)
    layer = make_layer(pool_conf("kCPooling", pool, **window), [src])
    layer.compute_feature(flag, [src])
    kh = window.get("kernel", window.get("kernel_y"))
    kw = window.get("kernel", window.get("kernel_x"))
    sh = window.get("stride", window.get("stride_y"))
    sw = window.get("stride", window.get("stride_x"))
    np.testing.assert_allclose(layer.data, direct_pool(x, reduce, kh, kw, sh, sw), rtol=1e-6)


def test_max_pooling_breaks_ties_in_row_major_order_like_caffe():
    # The maximum 1 is at (0, 1) and (1, 0): Caffe's scan reaches (0, 1) first.
    src = Source(np.array([[[[0, 1], [1, 0]]]]))
    layer = make_layer(pool_conf(kernel=2, stride=2), [src])
    layer.compute_feature(FORWARD, [src])
    layer.grad[...] = 5
    layer.compute_gradient(BACKWARD, [src])
    np.testing.assert_array_equal(src.grad[0, 0], [[0, 5], [0, 0]])


def test_max_pooling_adds_the_gradients_of_windows_sharing_their_maximum():
    # Windows of 3 at stride 2 share column 2, where the maximum of both is.
    x = np.zeros((1, 1, 3, 5), np.float32)
    x[0, 0, 1, 2] = 1
    src = Source(x)
    layer = make_layer(pool_conf(kernel=3, stride=2), [src])
    layer.compute_feature(FORWARD, [src])
    layer.grad[...] = [[[[2, 3]]]]
    layer.compute_gradient(BACKWARD, [src])
    want = np.zeros((3, 5))
    want[1, 2] = 5
    np.testing.assert_array_equal(src.grad[0, 0], want)


@pytest.mark.parametrize("pool, reduce", [("MAX", np.max), ("AVG", np.mean)])
def test_pooling_on_two_threads_matches_one(monkeypatch, pool, reduce):
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)
    src = Source(np.random.default_rng(0).standard_normal((20, 3, 9, 9)))
    results = []
    for nthreads in (1, 2):
        layer = make_layer(pool_conf(pool=pool, kernel=3, stride=2), [src])
        assert len(layer.chunks) > 2
        layer.grad[...] = np.random.default_rng(2).standard_normal(layer.grad.shape)
        with threads.limit(nthreads):
            layer.compute_feature(FORWARD, [src])
            layer.compute_gradient(BACKWARD, [src])
        results.append([layer.data.copy(), src.grad.copy()])
    want = direct_pool(src.data, reduce, 3, 3, 2, 2)
    np.testing.assert_allclose(results[0][0], want, rtol=1e-5, atol=1e-6)
    for a, b in zip(*results):
        assert np.array_equal(a, b)


# ---- group convolution (ours: Caffe's `group`) ----

def direct_group_conv(x, w, b, group, kh, kw, ph, pw, sh, sw):
    """Group convolution in float64: filter block i on channel block i, by direct loops."""
    x, w, b = (np.asarray(a, np.float64) for a in (x, w, b))
    cg, fg = x.shape[1] // group, w.shape[0] // group
    return np.concatenate([direct_conv(x[:, i * cg:(i + 1) * cg], w[i * fg:(i + 1) * fg],
                                       b[i * fg:(i + 1) * fg], kh, kw, ph, pw, sh, sw)
                           for i in range(group)], axis=1)


@pytest.mark.parametrize("layer_type", ["kConvolution", "kCConvolution", "kCudnnConv"])
@pytest.mark.parametrize("group, window", [(2, dict(kernel=3, pad=1)),
                                           (2, dict(kernel=3, pad=1, stride=2)),
                                           (3, dict(kernel_x=3, kernel_y=2, pad_x=1, stride_y=2))])
def test_group_convolution_matches_direct_loops_per_block(layer_type, group, window):
    src = Source(np.random.default_rng(0).standard_normal((2, 6, 7, 6)))
    layer = make_layer(conv_conf(layer_type, num_filters=6, group=group, **window), [src])
    layer.compute_feature(FORWARD, [src])
    kh = window.get("kernel", window.get("kernel_y", 3))
    kw = window.get("kernel", window.get("kernel_x", 3))
    w, b = layer.params
    assert w.shape == (6, 6 // group * kh * kw)     # Caffe's (F, C/group, kh, kw) row-major
    want = direct_group_conv(src.data, w.data, b.data, group, kh, kw,
                             window.get("pad", window.get("pad_y", 0)),
                             window.get("pad", window.get("pad_x", 0)),
                             window.get("stride", window.get("stride_y", 1)),
                             window.get("stride", window.get("stride_x", 1)))
    np.testing.assert_allclose(layer.data, want, rtol=1e-5, atol=1e-5)


def test_group_convolution_equals_a_block_diagonal_weight():
    src = Source(np.random.default_rng(0).standard_normal((2, 4, 5, 5)))
    grouped = make_layer(conv_conf(num_filters=4, group=2, kernel=3, pad=1), [src])
    whole = make_layer(conv_conf(num_filters=4, kernel=3, pad=1), [src])
    w = grouped.params[0].data.reshape(2, 2, 2 * 9)
    whole.params[0].data[...] = 0
    for i in range(2):
        whole.params[0].data[2 * i:2 * i + 2, 18 * i:18 * i + 18] = w[i]
    whole.params[1].data[...] = grouped.params[1].data
    for layer in (grouped, whole):
        layer.compute_feature(FORWARD, [src])
    np.testing.assert_allclose(grouped.data, whole.data, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("num_filters, window", [
    (12, dict(kernel=3)), (12, dict(kernel=3, pad=1)), (12, dict(kernel=3, pad=1, stride=2)),
    (12, dict(kernel_x=3, kernel_y=2, pad_x=1)),
    (2, dict(kernel=3, pad=1)), (2, dict(kernel_x=3, kernel_y=2, pad_x=2, pad_y=1))])
def test_group_convolution_gradients(kernels, monkeypatch, num_filters, window):
    im2col_path(kernels)
    # 12 filters on 4 channels: col2im (long runs at stride 1); 2 filters: transposed convolution
    # (not the direct loops, which 2 filters of 2 channels per group would choose)
    monkeypatch.setattr(conv, "DIRECT_GROUP", 0)
    src = Source(np.random.default_rng(0).standard_normal((2, 4, 5, 6)))
    layer = make_layer(conv_conf(num_filters=num_filters, group=2, **window), [src])
    assert layer.transposed == (num_filters == 2)
    check_gradients(layer, [src])


@pytest.mark.parametrize("window", [dict(kernel=3, pad=1), dict(kernel=3, pad=1, stride=2)])
@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("nthreads", [1, 2, 3])
def test_group_convolution_in_chunks_of_samples(monkeypatch, window, keep, nthreads):
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)
    monkeypatch.setattr(threads, "MIN_CHUNKS", 3)
    if not keep:
        monkeypatch.setattr(conv, "KEEP_COL_BYTES", 0)
        monkeypatch.setattr(conv, "KEEP_COMPILED_COL_BYTES", 0)
    src = Source(np.random.default_rng(0).standard_normal((5, 4, 5, 5)))
    layer = make_layer(conv_conf(num_filters=4, group=2, **window), [src])
    assert len(layer.chunks) >= 3
    with threads.limit(nthreads):
        layer.compute_feature(FORWARD, [src])
        w, b = layer.params
        s = window.get("stride", 1)
        want = direct_group_conv(src.data, w.data, b.data, 2, 3, 3, 1, 1, s, s)
        np.testing.assert_allclose(layer.data, want, rtol=1e-5, atol=1e-5)
        check_gradients(layer, [src])


@pytest.mark.parametrize("num_filters", [4, 14])    # transposed convolution, col2im
def test_group_convolution_results_do_not_depend_on_the_thread_count(kernels, monkeypatch,
                                                                     num_filters):
    im2col_path(kernels)
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)
    src = Source(np.random.default_rng(0).standard_normal((20, 6, 8, 8)))
    results = []
    for nthreads in (1, 2, 3):
        layer = make_layer(conv_conf(num_filters=num_filters, group=2, kernel=3, pad=1), [src])
        assert len(layer.chunks) == 7 and layer.transposed == (num_filters == 4)
        layer.params[0].data[...] = np.random.default_rng(1).standard_normal((num_filters, 27))
        layer.grad[...] = np.random.default_rng(2).standard_normal(layer.grad.shape)
        with threads.limit(nthreads):
            layer.compute_feature(FORWARD, [src])
            layer.compute_gradient(BACKWARD, [src])
        results.append([layer.data.copy(), layer.params[0].grad.copy(), src.grad.copy()])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert np.array_equal(a, b)


# ---- depthwise and other small groups: direct loops over the kernel taps ----

DIRECT_CASES = [  # (channels, num_filters, group, window)
    (6, 6, 6, dict(kernel=3, pad=1)),                           # depthwise, 3 × 3 in one pass
    (6, 6, 6, dict(kernel=3, pad=1, stride=2)),                 # strided: phase planes
    (6, 12, 6, dict(kernel=3, stride_x=2)),                     # 2 filters per channel
    (8, 8, 4, dict(kernel_x=3, kernel_y=2, pad_x=2, stride_y=2)),   # 2 channels per group
    (4, 4, 4, dict(kernel=5, pad=2, stride=3)),                 # any kernel, tap by tap
]


@pytest.mark.parametrize("channels, num_filters, group, window", DIRECT_CASES)
def test_small_groups_run_direct_loops_that_match_the_definition(kernels, channels, num_filters,
                                                                group, window):
    im2col_path(kernels)
    src = Source(np.random.default_rng(0).standard_normal((3, channels, 7, 8)))
    layer = make_layer(conv_conf(num_filters=num_filters, group=group, **window), [src])
    assert layer.direct and layer._cols is None
    layer.compute_feature(FORWARD, [src])
    w, b = layer.params

    def get(name, axis, default):
        return window.get(name, window.get(f"{name}_{axis}", default))
    want = direct_group_conv(src.data, w.data, b.data, group, get("kernel", "y", 3),
                             get("kernel", "x", 3), get("pad", "y", 0), get("pad", "x", 0),
                             get("stride", "y", 1), get("stride", "x", 1))
    np.testing.assert_allclose(layer.data, want, rtol=1e-5, atol=1e-5)
    check_gradients(layer, [src])


@pytest.mark.parametrize("channels, num_filters, group, window", DIRECT_CASES[:4])
def test_direct_loops_agree_with_the_gemm_path(kernels, monkeypatch, channels, num_filters, group,
                                               window):
    im2col_path(kernels)
    src = Source(np.random.default_rng(0).standard_normal((4, channels, 9, 9)))
    results = []
    for direct in (True, False):
        monkeypatch.setattr(conv, "DIRECT_GROUP", 4 if direct else 0)
        layer = make_layer(conv_conf(num_filters=num_filters, group=group, **window), [src])
        assert layer.direct == direct
        layer.grad[...] = np.random.default_rng(1).standard_normal(layer.grad.shape)
        layer.compute_feature(FORWARD, [src])
        layer.compute_gradient(BACKWARD, [src])
        results.append([layer.data.copy(), src.grad.copy(), layer.weight.grad.copy(),
                        layer.bias.grad.copy()])
    for a, b in zip(*results):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("channels, num_filters, what", [(5, 4, r"input channels \(5\)"),
                                                         (4, 3, r"num_filters \(3\)")])
def test_group_convolution_refuses_blocks_that_do_not_divide(channels, num_filters, what):
    with pytest.raises(ConfigError, match=f"layer 'conv': convolution_conf.group 2 must divide "
                                          f"both .*{what}"):
        make_layer(conv_conf(num_filters=num_filters, group=2, kernel=3),
                   [Source(np.zeros((1, channels, 5, 5)))])


@pytest.mark.parametrize("window", [dict(kernel=3, pad=1), dict(kernel=3, pad=1, stride=2)])
@pytest.mark.parametrize("group, parts", [(2, 2), (4, 2), (4, 4)])
def test_group_convolution_cut_on_its_filters_computes_the_whole(window, group, parts):
    """Partition k of a model-partitioned grouped convolution holds whole groups: its filters
    and, of the source it reads whole, its groups' channel block."""
    x = np.random.default_rng(0).standard_normal((3, 8, 6, 6))
    conf = conv_conf(num_filters=8, group=group, **window)
    whole_src = Source(x)
    whole = make_layer(conf, [whole_src])
    whole.grad[...] = np.random.default_rng(1).standard_normal(whole.grad.shape)
    whole.compute_feature(FORWARD, [whole_src])
    whole.compute_gradient(BACKWARD, [whole_src])
    outs, gws, gxs = [], [], []
    for k in range(parts):
        src = Source(x)
        piece = make_layer(conf + f" partition_dim: 1 num_partitions: {parts} partition_id: {k}",
                           [src])
        rows = slice(8 // parts * k, 8 // parts * (k + 1))
        assert piece.weight.shape == (8 // parts, 8 // group * 9)
        assert piece.weight.partition == (0, k, parts)
        piece.weight.data[...] = whole.weight.data[rows]
        piece.bias.data[...] = whole.bias.data[rows]
        piece.grad[...] = whole.grad[:, rows]
        src.grad[...] = np.nan              # every channel written, the others' with 0
        piece.compute_feature(FORWARD, [src])
        piece.compute_gradient(BACKWARD, [src])
        outs.append(piece.data.copy())
        gws.append(piece.weight.grad.copy())
        gxs.append(src.grad.copy())
        check_gradients(piece, [src])
    np.testing.assert_allclose(np.concatenate(outs, axis=1), whole.data, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.concatenate(gws), whole.weight.grad, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(sum(gxs), whole_src.grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("group, parts", [(2, 4), (4, 3)])
def test_group_convolution_refuses_a_cut_through_a_group(group, parts):
    conf = conv_conf(num_filters=8, group=group, kernel=3) + \
        f" partition_dim: 1 num_partitions: {parts} partition_id: 1"
    with pytest.raises(ConfigError, match=fr"layer 'conv': num_filters 8 cut over {parts} "
                                          fr"workers \(partition_dim 1\) splits the blocks of "
                                          fr"group {group} \({8 // group} filters each\)"):
        make_layer(conf, [Source(np.zeros((1, 8, 5, 5)))])


# ---- ceil_mode pooling (ours: Caffe's output size and AVG divisor) ----

def caffe_pool(x, pool, kh, kw, ph, pw, sh, sw):
    """Caffe's pooling (round_mode CEIL) in float64 by loops over windows, from its definition:
    out = ceil((H + 2p − k)/s) + 1, less one if (out − 1)·s ≥ H + p when p > 0; window rows
    [o·s − p, min(o·s − p + k, H + p)); AVG sums the real pixels and divides by that window's
    area, MAX takes the largest real pixel."""
    def size(n, k, p, s):
        o = int(np.ceil((n + 2 * p - k) / s)) + 1
        return o - 1 if p > 0 and (o - 1) * s >= n + p else o
    n, c, h, w = x.shape
    oh, ow = size(h, kh, ph, sh), size(w, kw, pw, sw)
    y = np.empty((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            r0, c0 = i * sh - ph, j * sw - pw
            r1, c1 = min(r0 + kh, h + ph), min(c0 + kw, w + pw)
            real = x[:, :, max(r0, 0):min(r1, h), max(c0, 0):min(c1, w)].astype(np.float64)
            y[:, :, i, j] = real.max(axis=(2, 3)) if pool == "MAX" else \
                real.sum(axis=(2, 3)) / ((r1 - r0) * (c1 - c0))
    return y


def test_ceil_avg_pooling_reproduces_caffes_pool2_divisors():
    # the fixture README's pool2: 4x4, AVE k3 s2 p1 -> 3x3, windows [-1,2), [1,4), [3,5)
    src = Source(np.ones((1, 1, 4, 4)))
    layer = make_layer(pool_conf(pool="AVG", kernel=3, stride=2, pad=1, ceil_mode="true"), [src])
    layer.compute_feature(FORWARD, [src])
    real = np.array([2, 3, 1])
    divisors = np.array([[9, 9, 6], [9, 9, 6], [6, 6, 4]])
    np.testing.assert_allclose(layer.data[0, 0], np.outer(real, real) / divisors, rtol=1e-7)
    x = np.random.default_rng(0).standard_normal((2, 3, 4, 4)).astype(np.float32)
    src = Source(x)
    layer = make_layer(pool_conf(pool="AVG", kernel=3, stride=2, pad=1, ceil_mode="true"), [src])
    layer.compute_feature(FORWARD, [src])
    np.testing.assert_allclose(layer.data, caffe_pool(x, "AVG", 3, 3, 1, 1, 2, 2), rtol=1e-6)


@pytest.mark.parametrize("layer_type", ["kCPooling", "kPooling"])
@pytest.mark.parametrize("pool", ["MAX", "AVG"])
@pytest.mark.parametrize("shape, window, out", [
    ((8, 8), dict(kernel=3, stride=2), (4, 4)),             # pool1: ceil 4 vs floor 3
    ((4, 4), dict(kernel=3, stride=2, pad=1), (3, 3)),      # pool2: ceil 3 vs floor 2
    ((5, 5), dict(kernel=2, stride=2, pad=1), (3, 3)),      # ceil 4, last window at H + p: 3
    ((7, 6), dict(kernel_x=3, kernel_y=3, stride_x=2, stride_y=2, pad_y=1), (4, 3)),
    ((6, 6), dict(kernel=2, stride=2), (3, 3))])            # exact fit: ceil = floor
def test_ceil_pooling_matches_caffe(layer_type, pool, shape, window, out):
    x = distinct((2, 3) + shape) - 30           # negative values: padding must never win MAX
    src = Source(x)
    layer = make_layer(pool_conf(layer_type, pool, ceil_mode="true", **window), [src])
    layer.compute_feature(FORWARD, [src])
    kh = window.get("kernel", window.get("kernel_y"))
    kw = window.get("kernel", window.get("kernel_x"))
    ph = window.get("pad", window.get("pad_y", 0))
    pw = window.get("pad", window.get("pad_x", 0))
    sh = window.get("stride", window.get("stride_y"))
    sw = window.get("stride", window.get("stride_x"))
    assert layer.data.shape[2:] == out
    np.testing.assert_allclose(layer.data, caffe_pool(x, pool, kh, kw, ph, pw, sh, sw),
                               rtol=1e-6)


def test_ceil_pooling_refuses_a_last_window_past_the_input():
    # stride 3 > kernel 2 on 6: ceil(4/3) + 1 = 3 windows, the last at [6, 8): Caffe pools
    # nothing there (MAX -FLT_MAX, AVG 0/0)
    with pytest.raises(ConfigError, match=r"layer 'pool': with ceil_mode the last window "
                                          r"\(kernel 2, pad 0, stride 3\) starts past the input "
                                          r"of size 6"):
        make_layer(pool_conf(kernel=2, stride=3, ceil_mode="true"),
                   [Source(np.zeros((1, 1, 6, 6)))])


def test_ceil_mode_off_keeps_singas_floor_size():
    layer = make_layer(pool_conf(kernel=3, stride=2), [Source(np.zeros((1, 1, 8, 8)))])
    assert layer.data.shape == (1, 1, 3, 3)


@pytest.mark.parametrize("layer_type", ["kCPooling", "kCudnnPool"])
@pytest.mark.parametrize("pool", ["MAX", "AVG"])
@pytest.mark.parametrize("window", [dict(kernel=3, stride=2), dict(kernel=3, stride=2, pad=1),
                                    dict(kernel=2, stride=2, pad=1),
                                    dict(kernel_x=2, kernel_y=3, stride_x=2, stride_y=2, pad_y=1)])
def test_ceil_pooling_gradients(layer_type, pool, window):
    src = Source(distinct((2, 2, 6, 7)))
    layer = make_layer(pool_conf(layer_type, pool, ceil_mode="true", **window), [src])
    check_gradients(layer, [src])


def test_ceil_pooling_on_cudnn_divides_by_the_real_pixels():
    src = Source(np.ones((1, 1, 4, 4)))
    layer = make_layer(pool_conf("kCudnnPool", "AVG", kernel=3, stride=2, pad=1,
                                 ceil_mode="true"), [src])
    layer.compute_feature(FORWARD, [src])
    np.testing.assert_allclose(layer.data[0, 0], np.ones((3, 3)), rtol=1e-7)


@pytest.mark.parametrize("pool", ["MAX", "AVG"])
@pytest.mark.parametrize("window", [dict(kernel=3, stride=2), dict(kernel=3, stride=2, pad=1)])
def test_ceil_pooling_results_do_not_depend_on_the_thread_count(monkeypatch, pool, window):
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)
    src = Source(np.random.default_rng(0).standard_normal((20, 3, 8, 8)))
    results = []
    for nthreads in (1, 2, 3):
        layer = make_layer(pool_conf(pool=pool, ceil_mode="true", **window), [src])
        assert len(layer.chunks) > 2
        layer.grad[...] = np.random.default_rng(2).standard_normal(layer.grad.shape)
        with threads.limit(nthreads):
            layer.compute_feature(FORWARD, [src])
            layer.compute_gradient(BACKWARD, [src])
        results.append([layer.data.copy(), src.grad.copy()])
    want = caffe_pool(src.data, pool, 3, 3, window.get("pad", 0), window.get("pad", 0), 2, 2)
    np.testing.assert_allclose(results[0][0], want, rtol=1e-5, atol=1e-6)
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert np.array_equal(a, b)


def test_a_net_cut_on_a_grouped_convolutions_filters_computes_the_whole_net():
    from test_partition import run_all_partitions
    text = """
    layer { name: "data" type: kRecordInput partition_dim: 0
      store_conf { backend: "kvfile" path: "tests/fixtures/singa-0.3/train-1000.bin"
                   batchsize: 4 shape: 4 shape: 14 shape: 14 std_value: 255 } }
    layer { name: "conv" type: kCConvolution srclayers: "data" partition_dim: 1
      convolution_conf { num_filters: 4 kernel: 3 pad: 1 group: 2 }
      param { name: "w" init { type: kGaussian std: 0.3 } } param { name: "b" } }
    layer { name: "loss" type: kEuclideanLoss srclayers: "conv" srclayers: "data"
      partition_dim: 0 }
    """
    conf = text_format.Parse(text, job_pb2.NetProto())
    whole = NeuralNet(conf, job_pb2.kTrain, np.random.default_rng(0))
    cut = NeuralNet(conf, job_pb2.kTrain, np.random.default_rng(0), num_partitions=2)
    rng = np.random.default_rng(3)
    for p in whole.params:
        p.data[...] = rng.normal(0, 0.3, p.shape)
    for p in cut.params:
        axis, k, n = p.partition
        p.data[...] = np.array_split(next(q for q in whole.params if q.name == p.name).data,
                                     n, axis=axis)[k]
    whole.forward(FORWARD)
    run_all_partitions(cut)
    got = np.concatenate([cut.by_name[f"0#conv@{k}"].data for k in (0, 1)], axis=1)
    np.testing.assert_allclose(got, whole.by_name["0#conv"].data, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("layer_type", ["kCPooling", "kPooling", "kCudnnPool"])
@pytest.mark.parametrize("pool, reduce", [("MAX", np.max), ("AVG", np.mean)])
@pytest.mark.parametrize("shape", [(2, 2, 4, 3), (2, 3, 4)])
def test_global_pooling_reduces_each_whole_plane(layer_type, pool, reduce, shape):
    src = Source(distinct(shape))
    layer = make_layer(pool_conf(layer_type, pool, global_pooling="true"), [src])
    layer.compute_feature(FORWARD, [src])
    x = src.data.astype(np.float64).reshape(shape[0], -1, *shape[-2:])
    np.testing.assert_allclose(layer.data, reduce(x, axis=(2, 3), keepdims=True), rtol=1e-6)
    assert check_gradients(layer, [src]) == src.data.size


def test_global_max_pooling_routes_the_gradient_to_the_first_maximum():
    src = Source(np.array([[[[1, 4], [4, 0]], [[2, 2], [2, 2]]]], np.float32))
    layer = make_layer(pool_conf(pool="MAX", global_pooling="true"), [src])
    layer.compute_feature(FORWARD, [src])
    layer.grad[...] = [[[[3]], [[5]]]]
    layer.compute_gradient(BACKWARD, [src])
    np.testing.assert_array_equal(src.grad, [[[[0, 3], [0, 0]], [[5, 0], [0, 0]]]])


@pytest.mark.parametrize("window, given", [(dict(kernel=3), "kernel"),
                                           (dict(pad_x=1, stride=2), "pad_x, stride")])
def test_global_pooling_takes_no_window(window, given):
    with pytest.raises(ConfigError, match=rf"layer 'pool': global_pooling pools the whole H × W "
                                          rf"\(pad 0, stride 1\); it takes no {given}$"):
        make_layer(pool_conf(global_pooling="true", **window), [Source(distinct((1, 1, 3, 3)))])
    make_layer(pool_conf(global_pooling="true", pad=0, stride=1), [Source(distinct((1, 1, 3, 3)))])


def deconv_conf(num_filters=4, group=1, **kw):
    fields = " ".join(f"{k}: {v}" for k, v in kw.items())
    return (f'name: "deconv" type: kDeconvolution convolution_conf {{ num_filters: {num_filters} '
            f'group: {group} {fields} }} param {{ name: "w" }} param {{ name: "b" }}')


def direct_deconv(x, w, b, group, kh, kw, ph, pw, sh, sw):
    """Caffe's deconvolution by loops in float64: input pixel (i, j) of channel c adds
    x·W[c, f] to the kh × kw output window at (i·sh − ph, j·sw − pw) of each filter f of c's
    group."""
    n, c, h, wd = x.shape
    f = w.shape[1] * group
    oh, ow = sh * (h - 1) + kh - 2 * ph, sw * (wd - 1) + kw - 2 * pw
    y = np.zeros((n, f, oh + 2 * ph, ow + 2 * pw))
    cg, fg = c // group, f // group
    for ch in range(c):
        fs = slice(ch // cg * fg, (ch // cg + 1) * fg)
        for i in range(h):
            for j in range(wd):
                y[:, fs, i * sh:i * sh + kh, j * sw:j * sw + kw] += \
                    x[:, ch, i, j][:, None, None, None] * w[ch].astype(np.float64)
    return y[:, :, ph:ph + oh, pw:pw + ow] + b.reshape(1, -1, 1, 1)


DECONV_WINDOWS = [dict(kernel=2, stride=2), dict(kernel=4, stride=2, pad=1),
                  dict(kernel=3, stride=1, pad=1), dict(kernel_x=3, kernel_y=2, stride_x=2,
                                                        stride_y=1, pad_x=1)]


def deconv_window(window):
    def get(name, axis):
        return window.get(name, window.get(f"{name}_{axis}", {"kernel": 3, "pad": 0,
                                                               "stride": 1}[name]))
    return [get(k, a) for k in ("kernel", "pad", "stride") for a in ("y", "x")]


@pytest.mark.parametrize("window", DECONV_WINDOWS)
@pytest.mark.parametrize("group, channels, num_filters", [(1, 3, 4), (2, 4, 6)])
def test_deconvolution_matches_caffes_direct_loops(window, group, channels, num_filters):
    src = Source(np.random.default_rng(1).standard_normal((2, channels, 4, 3)))
    layer = make_layer(deconv_conf(num_filters, group, **window), [src])
    w, b = (p.data for p in layer.params)
    assert w.shape[:2] == (channels, num_filters // group)
    layer.compute_feature(FORWARD, [src])
    kh, kw, ph, pw, sh, sw = deconv_window(window)
    want = direct_deconv(src.data.astype(np.float64), w, b, group, kh, kw, ph, pw, sh, sw)
    np.testing.assert_allclose(layer.data, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("window", DECONV_WINDOWS[1:3])
@pytest.mark.parametrize("group", [1, 2])
def test_deconvolution_gradients(window, group):
    src = Source(np.random.default_rng(2).standard_normal((2, 2, 3, 3)))
    layer = make_layer(deconv_conf(2, group, **window), [src])
    assert check_gradients(layer, [src]) == src.data.size + sum(p.size for p in layer.params)


def test_deconvolution_in_chunks_on_two_threads_matches_one(monkeypatch):
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)
    src = Source(np.random.default_rng(3).standard_normal((10, 4, 5, 5)))
    results = []
    for nthreads in (1, 2):
        layer = make_layer(deconv_conf(6, 2, kernel=4, stride=2, pad=1), [src])
        assert len(layer.chunks) > 2
        layer.grad[...] = np.random.default_rng(4).standard_normal(layer.grad.shape)
        with threads.limit(nthreads):
            layer.compute_feature(FORWARD, [src])
            layer.compute_gradient(BACKWARD, [src])
        results.append([layer.data.copy(), src.grad.copy(), layer.params[0].grad.copy(),
                        layer.params[1].grad.copy()])
    w, b = (p.data for p in layer.params)
    want = direct_deconv(src.data.astype(np.float64), w, b, 2, 4, 4, 1, 1, 2, 2)
    np.testing.assert_allclose(results[0][0], want, rtol=1e-5, atol=1e-5)
    for a, b in zip(*results):
        assert np.array_equal(a, b)


def test_deconvolution_is_the_transposed_convolution():
    """⟨deconv(x), y⟩ = ⟨x, conv(y)⟩ with the same weights and no biases."""
    x = Source(np.random.default_rng(5).standard_normal((2, 3, 4, 4)))
    deconv = make_layer(deconv_conf(2, kernel=3, stride=2, pad=1), [x])
    deconv.params[1].data[...] = 0
    deconv.compute_feature(FORWARD, [x])
    y = Source(np.random.default_rng(6).standard_normal(deconv.data.shape))
    conv = make_layer(conv_conf(num_filters=3, kernel=3, stride=2, pad=1), [y])
    conv.params[0].data[...] = deconv.params[0].data.reshape(3, -1)
    conv.params[1].data[...] = 0
    conv.compute_feature(FORWARD, [y])
    assert conv.data.shape == x.data.shape
    np.testing.assert_allclose(np.vdot(deconv.data.astype(np.float64), y.data),
                               np.vdot(x.data.astype(np.float64), conv.data), rtol=1e-5)


@pytest.mark.parametrize("conf, error", [
    (deconv_conf(3, 2), r"convolution_conf.group 2 must divide both the input channels \(4\) "
                        r"and num_filters \(3\)"),
    (deconv_conf(2, kernel=1, pad=1), r"kernel \(1, 1\), pad \(1, 1\), stride \(1, 1\) leave "
                                      r"no output for an input of 1 × 3")])
def test_deconvolution_refuses_bad_confs_in_one_line(conf, error):
    with pytest.raises(ConfigError, match=f"layer 'deconv': {error}"):
        make_layer(conf, [Source(np.zeros((1, 4, 1, 3)))])


CHAIN = """
layer { name: "x" type: kDummy dummy_conf { input: true shape: 6 shape: 3 shape: 9 shape: 9 } }
layer { name: "conv" type: kCConvolution srclayers: "x"
        convolution_conf { num_filters: 4 kernel: 3 pad: 1 }
        param { name: "w" init { type: kGaussian std: 0.3 } }
        param { name: "b" init { type: kUniform low: -1 high: 1 } } }
layer { name: "bn" type: kCaffeBatchNorm srclayers: "conv"
        param { name: "mean" init { type: kGaussian std: 0.5 } }
        param { name: "var" init { type: kUniform low: 1 high: 3 } }
        param { name: "factor" init { type: kConstant value: 2 } } }
layer { name: "scale" type: kScale srclayers: "bn" scale_conf { bias_term: true }
        param { name: "g" init { type: kUniform low: 0.5 high: 1.5 } }
        param { name: "beta" init { type: kUniform low: -1 high: 1 } } }
layer { name: "relu" type: kReLU srclayers: "scale" }
layer { name: "pool" type: kCPooling srclayers: "relu"
        pooling_conf { pool: MAX kernel: 3 stride: 2 } }
layer { name: "norm" type: kLRN srclayers: "pool" lrn_conf { local_size: 3 } }
layer { name: "avg" type: kCPooling srclayers: "norm" pooling_conf { pool: AVG kernel: 4 } }
"""


@pytest.mark.parametrize("nthreads", [1, 2])
def test_a_convolutions_chunks_compute_the_per_sample_layers_after_it_to_their_own_bits(
        kernels, monkeypatch, nthreads):
    """conv -> BatchNorm (global statistics in a test pass) -> Scale -> ReLU -> MAX pooling ->
    LRN -> AVG pooling: the convolution's chunks compute the other layers' rows too (each
    then skips its own pass once), every blob to the bytes of each layer on its own; a
    training pass (BatchNorm on the batch's statistics) breaks the chain at BatchNorm."""
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)
    monkeypatch.setattr(threads, "CHUNK_BYTES", 3 * 4 * 81 * 4)    # several chunks
    net = NeuralNet(text_format.Parse(CHAIN, job_pb2.NetProto()), job_pb2.kTest,
                    np.random.default_rng(0))
    for p in net.params:
        p.init_values(np.random.default_rng(p.id))
    layers = {layer.name.partition("#")[2]: layer for layer in net.layers}     # 0#conv
    assert [f for f, _ in layers["conv"].then] == [layers[n] for n in (
        "bn", "scale", "relu", "pool", "norm", "avg")]
    assert len(layers["conv"].chunks) > 1
    runs, start = [], [p.data.copy() for p in net.params]
    for chained in (True, False):
        if not chained:
            then, layers["conv"].then = layers["conv"].then, []
        for p, values in zip(net.params, start):    # a training pass moves BatchNorm's sums
            p.data[...] = values
        with threads.limit(nthreads):
            for flag in (job_pb2.kTest, job_pb2.kTrain):
                layers["x"].feed(np.random.default_rng(flag).standard_normal((6, 3, 9, 9)))
                net.forward(flag | job_pb2.kForward)
                runs.append([layers[n].data.tobytes() for n in ("conv", "bn", "scale", "relu",
                                                                "pool", "norm", "avg")])
                assert not any(layer.ahead for layer in net.layers)
    assert runs[:2] == runs[2:]
    layers["conv"].then = then
    assert np.asarray(layers["relu"].data).min() == 0 < np.asarray(layers["relu"].data).max()
