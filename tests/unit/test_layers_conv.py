"""Convolution and pooling: values against direct loops, Caffe's pooling rules, gradients.

SINGA's own cnn checkpoint is run through these layers in test_layers_loss.py."""
import numpy as np
import pytest

from gradcheck import BACKWARD, FORWARD, Source, check_gradients, make_layer
from singa import threads
from singa.errors import ConfigError
from singa.layers import conv
from singa.proto import job_pb2


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
def test_convolution_gradients_through_the_transposed_convolution(window):
    src = Source(np.random.default_rng(0).standard_normal((2, 4, 5, 6)))
    layer = make_layer(conv_conf(num_filters=2, **window), [src])
    assert layer.transposed
    check_gradients(layer, [src])


@pytest.mark.parametrize("window", [dict(kernel=3, pad=1), dict(kernel=3, pad=1, stride=2)])
@pytest.mark.parametrize("keep", [True, False])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_convolution_in_chunks_of_samples_matches_direct_loops(monkeypatch, window, keep,
                                                               nthreads):
    # Two samples per chunk for a batch of 5: the last chunk is partial. The chunks' cols are
    # kept for the backward pass or made again; the chunks run on one thread or two.
    monkeypatch.setattr(threads, "CHUNK_BYTES", 2 * 2 * 9 * 5 * 5 * 4 if "stride" not in window
                        else 2 * 2 * 9 * 3 * 3 * 4)
    monkeypatch.setattr(threads, "MIN_CHUNKS", 2)
    if not keep:
        monkeypatch.setattr(conv, "KEEP_COL_BYTES", 0)
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


def test_convolution_results_do_not_depend_on_the_thread_count(monkeypatch):
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)      # chunks this small, to have 7
    src = Source(np.random.default_rng(0).standard_normal((20, 3, 8, 8)))
    results = []
    for nthreads in (1, 2, 3):
        layer = make_layer(conv_conf(num_filters=4, kernel=3, pad=1), [src])
        assert len(layer.chunks) == 7
        layer.params[0].data[...] = np.random.default_rng(1).standard_normal((4, 27))
        layer.grad[...] = np.random.default_rng(2).standard_normal(layer.grad.shape)
        with threads.limit(nthreads):
            layer.compute_feature(FORWARD, [src])
            layer.compute_gradient(BACKWARD, [src])
        results.append([layer.data.copy(), layer.params[0].grad.copy(), src.grad.copy()])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert np.array_equal(a, b)


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
