"""LRN and BM: values against per-element loops in float64, gradients by gradcheck."""
import numpy as np
import pytest

from gradcheck import BACKWARD, FORWARD, Source, check_gradients, make_layer
from singa.device import threads
from singa.errors import ConfigError
from singa.proto import job_pb2

LRN = """name: "norm" type: {kind} lrn_conf {{ local_size: {n} alpha: {alpha} beta: {beta}
         knorm: {k} }}"""
BM = """name: "bm" type: {kind} param {{ name: "s" }} param {{ name: "b" }}
        param {{ name: "m" }} param {{ name: "v" }}"""


def inputs(shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def lrn_by_loops(x, n, alpha, beta, k):
    """y[:, c] = x[:, c]·(k + α/n·Σ_{|j−c| ≤ n//2} x[:, j]²)^{−β}, one channel at a time."""
    x = x.astype(np.float64)
    y = np.empty_like(x)
    channels = x.shape[1]
    for c in range(channels):
        lo, hi = max(0, c - n // 2), min(channels, c + n // 2 + 1)
        total = sum(x[:, j] ** 2 for j in range(lo, hi))
        y[:, c] = x[:, c] * (k + alpha / n * total) ** -beta
    return y


@pytest.mark.parametrize("kind", ["kLRN", "kCudnnLRN"])
@pytest.mark.parametrize("n, alpha, k", [(1, 0.5, 1), (3, 5e-05, 1), (5, 0.5, 2)])
@pytest.mark.parametrize("beta", [0.75, 0.6])
def test_lrn_normalises_across_a_window_of_channels(kind, n, alpha, k, beta):
    src = Source(3 * inputs((2, 7, 3, 4)))
    layer = make_layer(LRN.format(kind=kind, n=n, alpha=alpha, beta=beta, k=k), [src])
    layer.compute_feature(FORWARD, [src])
    np.testing.assert_allclose(layer.data, lrn_by_loops(src.data, n, alpha, beta, k),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("region", ["across", "within"])
def test_lrn_by_chunks_on_two_threads_matches_the_loops_and_one_thread(monkeypatch, region):
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)
    conf, shape, n, loops = {"across": (LRN, (20, 7, 3, 4), 5, lrn_by_loops),
                             "within": (WITHIN, (12, 3, 5, 4), 3, lrn_within_by_loops)}[region]
    src = Source(3 * inputs(shape))
    results = []
    for nthreads in (1, 2):
        layer = make_layer(conf.format(kind="kLRN", n=n, alpha=0.5, beta=0.75, k=1), [src])
        assert len(layer.chunks) > 2
        layer.grad[...] = inputs(layer.grad.shape, seed=2)
        with threads.limit(nthreads):
            layer.compute_feature(FORWARD, [src])
            layer.compute_gradient(BACKWARD, [src])
        results.append([layer.data.copy(), src.grad.copy()])
    np.testing.assert_allclose(results[0][0], loops(src.data, n, 0.5, 0.75, 1),
                               rtol=1e-5, atol=1e-6)
    for a, b in zip(*results):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("n", [1, 3, 5])
@pytest.mark.parametrize("beta", [0.75, 0.6])
def test_lrn_gradients(n, beta):
    src = Source(inputs((2, 6, 3, 3)))
    # a large alpha so that the normaliser's gradient term matters
    layer = make_layer(LRN.format(kind="kLRN", n=n, alpha=2.0, beta=beta, k=1), [src])
    assert check_gradients(layer, [src]) == src.data.size


@pytest.mark.parametrize("n", [0, 4])
def test_lrn_refuses_an_even_window(n):
    with pytest.raises(ConfigError, match="layer 'norm': lrn_conf.local_size must be odd"):
        make_layer(LRN.format(kind="kLRN", n=n, alpha=1, beta=0.75, k=1),
                   [Source(inputs((1, 4, 2, 2)))])


WITHIN = LRN.replace("knorm: {k}", "knorm: {k} norm_region: WITHIN_CHANNEL")


def lrn_within_by_loops(x, n, alpha, beta, k):
    """y = x·(k + α/n²·Σ_{n×n window} x²)^{−β}, pixel by pixel (Caffe's average of squares over
    a zero-padded window: the padding counts in n²)."""
    x = x.astype(np.float64)
    y = np.empty_like(x)
    h, w, r = x.shape[2], x.shape[3], n // 2
    for i in range(h):
        for j in range(w):
            win = x[:, :, max(0, i - r):i + r + 1, max(0, j - r):j + r + 1]
            y[:, :, i, j] = x[:, :, i, j] * (k + alpha / n ** 2 * (win ** 2).sum(axis=(2, 3))) \
                ** -beta
    return y


@pytest.mark.parametrize("n, alpha, k, beta", [(1, 0.5, 1, 0.75), (3, 5e-05, 1, 0.75),
                                               (5, 2.0, 2, 0.6)])
def test_lrn_within_channel_normalises_over_a_square_of_pixels(n, alpha, k, beta):
    src = Source(3 * inputs((2, 3, 6, 5)))
    layer = make_layer(WITHIN.format(kind="kLRN", n=n, alpha=alpha, beta=beta, k=k), [src])
    layer.compute_feature(FORWARD, [src])
    np.testing.assert_allclose(layer.data, lrn_within_by_loops(src.data, n, alpha, beta, k),
                               rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("n", [1, 3])
def test_lrn_within_channel_gradients(n):
    src = Source(inputs((2, 2, 4, 3)))
    layer = make_layer(WITHIN.format(kind="kLRN", n=n, alpha=4.0, beta=0.75, k=1), [src])
    assert check_gradients(layer, [src]) == src.data.size




def test_lrn_needs_four_dimensions():
    with pytest.raises(ConfigError, match=r"layer 'norm' needs a 4-D source .* \(2, 6\)"):
        make_layer(LRN.format(kind="kLRN", n=3, alpha=1, beta=0.75, k=1), [Source(inputs((2, 6)))])


def bm_by_loops(x, gamma, beta, eps=1e-5):
    """Each channel normalised by its own mean and (biased) variance, in float64."""
    x = x.astype(np.float64)
    y = np.empty_like(x)
    for c in range(x.shape[1]):
        v = x[:, c]
        mu = v.sum() / v.size
        var = ((v - mu) ** 2).sum() / v.size
        y[:, c] = gamma[c] * (v - mu) / np.sqrt(var + eps) + beta[c]
    return y


@pytest.mark.parametrize("kind", ["kBM", "kCudnnBM"])
@pytest.mark.parametrize("flag", [FORWARD, job_pb2.kTest])
def test_bm_normalises_each_channel_over_batch_and_space(kind, flag):
    src = Source(2 + 3 * inputs((4, 3, 2, 5)))
    layer = make_layer(BM.format(kind=kind), [src])
    assert [p.shape for p in layer.params] == [(1, 3, 1, 1)] * 4
    layer.compute_feature(flag, [src])
    gamma, beta = (p.data.ravel() for p in layer.params[:2])
    np.testing.assert_allclose(layer.data, bm_by_loops(src.data, gamma, beta),
                               rtol=1e-4, atol=1e-5)


def test_bm_gradients():
    src = Source(inputs((3, 2, 2, 3)))
    layer = make_layer(BM.format(kind="kCudnnBM"), [src])
    checked = check_gradients(layer, [src], eps=1e-3)
    assert checked == src.data.size + 4 * 2
    assert not layer.params[2].grad.any() and not layer.params[3].grad.any()


def test_bm_needs_its_four_params():
    with pytest.raises(ConfigError, match="layer 'bm' needs 4 param entries"):
        make_layer('name: "bm" type: kCudnnBM param { name: "s" }', [Source(inputs((1, 2, 2, 2)))])


def test_bm_backward_without_source_gradient_still_writes_param_gradients():
    src = Source(inputs((2, 2, 2, 2)), grad=False)
    layer = make_layer(BM.format(kind="kBM"), [src])
    layer.compute_feature(FORWARD, [src])
    layer.grad[...] = 1
    layer.compute_gradient(BACKWARD, [src])
    np.testing.assert_allclose(layer.params[1].grad.ravel(), [8, 8])


CAFFE_BN = """name: "bn" type: kCaffeBatchNorm param {{ name: "m" }} param {{ name: "v" }}
              param {{ name: "f" }} {conf}"""


def caffe_bn_train(x, sums, fraction=0.999, eps=1e-5):
    """Caffe's training pass in float64: (y, the updated (S_μ, S_σ², s))."""
    x = x.astype(np.float64)
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    mu, var = x.mean(axis=axes), x.var(axis=axes)
    m = x.size // x.shape[1]
    s_mu, s_var, s = sums
    sums = (fraction * s_mu + mu, fraction * s_var + m / (m - 1) * var, fraction * s + 1)
    return (x - mu.reshape(shape)) / np.sqrt(var.reshape(shape) + eps), sums


def test_caffe_batchnorm_trains_on_batch_statistics_and_keeps_caffes_moving_sums():
    """Three training steps against Caffe's batch_norm_layer.cpp formulas, then the test
    phase normalises by the sums divided by their factor."""
    layer = make_layer(CAFFE_BN.format(conf="batch_norm_conf { moving_average_fraction: 0.9 }"),
                       [Source(inputs((4, 3, 2, 2)))])
    mean, var, factor = layer.params
    assert [p.shape for p in layer.params] == [(3,), (3,), (1,)]
    assert all(p.lr_scale == p.wd_scale == 0 and p.updated_by_layer for p in layer.params)
    for p in layer.params:
        p.data[...] = 0
    sums = (np.zeros(3), np.zeros(3), 0.0)
    for step in range(3):
        src = Source(1 + (step + 1) * inputs((4, 3, 2, 2), seed=10 + step))
        layer.compute_feature(FORWARD, [src])
        want, sums = caffe_bn_train(src.data, sums, fraction=0.9)
        np.testing.assert_allclose(layer.data, want, rtol=1e-4, atol=1e-5)
        for p, s in zip(layer.params, sums):
            np.testing.assert_allclose(p.data, np.reshape(s, p.shape), rtol=1e-5)
    src = Source(inputs((4, 3, 2, 2), seed=20))
    layer.compute_feature(job_pb2.kTest, [src])
    mu, v = sums[0] / sums[2], sums[1] / sums[2]
    want = (src.data.astype(np.float64) - mu.reshape(1, 3, 1, 1)) / \
        np.sqrt(v.reshape(1, 3, 1, 1) + 1e-5)
    np.testing.assert_allclose(layer.data, want, rtol=1e-4, atol=1e-5)
    assert layer.params[2].data[0] == np.float32(sums[2])   # the test phase changes nothing


@pytest.mark.parametrize("shape", [(3, 2, 2, 3), (5, 4)])
def test_caffe_batchnorm_gradients_with_batch_statistics(shape):
    src = Source(inputs(shape))
    layer = make_layer(CAFFE_BN.format(conf=""), [src])
    layer.compute_feature(FORWARD, [src])
    np.testing.assert_allclose(layer.data, caffe_bn_train(src.data, (0, 0, 0))[0],
                               rtol=1e-4, atol=1e-5)
    checked = check_gradients(layer, [src], eps=1e-3)
    assert checked == src.data.size + 2 * shape[1] + 1
    assert not any(p.grad.any() for p in layer.params)


@pytest.mark.parametrize("conf, flag", [("batch_norm_conf { use_global_stats: true }", FORWARD),
                                        ("", job_pb2.kTest), ("", job_pb2.kVal)])
def test_caffe_batchnorm_global_statistics_scale_by_the_sums_factor(conf, flag):
    src = Source(inputs((2, 3, 2, 2)))
    layer = make_layer(CAFFE_BN.format(conf=conf), [src])
    mean, var, factor = layer.params
    mean.data[...], var.data[...], factor.data[...] = [1, -2, 4], [2, 4, 0.5], 2
    before = [p.data.copy() for p in layer.params]
    layer.compute_feature(flag, [src])
    want = (src.data.astype(np.float64) - np.reshape([0.5, -1, 2], (1, 3, 1, 1))) / \
        np.sqrt(np.reshape([1, 2, 0.25], (1, 3, 1, 1)) + 1e-5)
    np.testing.assert_allclose(layer.data, want, rtol=1e-5)
    assert layer.xhat is None       # y straight into data: no x̂ blob beside it
    assert all(np.array_equal(p.data, b) for p, b in zip(layer.params, before))
    factor.data[...] = 0        # Caffe's scale factor 0: μ = σ² = 0
    layer.compute_feature(flag, [src])
    np.testing.assert_allclose(layer.data, src.data / np.sqrt(1e-5), rtol=1e-5)
    factor.data[...] = 2
    params, layer.params = layer.params, []     # the sums are not learned: x's gradient only
    check_gradients(layer, [src], flag=flag, eps=1e-3)
    layer.params = params


def test_caffe_batchnorm_sums_are_kept_by_partition_0_only():
    src = Source(inputs((2, 3, 2, 2)))
    layer = make_layer(CAFFE_BN.format(conf="partition_id: 1 num_partitions: 2"), [src])
    before = [p.data.copy() for p in layer.params]
    layer.compute_feature(FORWARD, [src])
    assert all(np.array_equal(p.data, b) for p, b in zip(layer.params, before))


def test_caffe_batchnorm_refuses_a_one_dimensional_source_and_missing_params():
    with pytest.raises(ConfigError, match=r"layer 'bn' needs a source of shape \(N, C, ...\), "
                                          r"got \(4,\)"):
        make_layer(CAFFE_BN.format(conf=""), [Source(inputs((4,)))])
    with pytest.raises(ConfigError, match=r"layer 'bn' needs 3 param entries \(mean, variance, "
                                          r"factor\), got 1"):
        make_layer('name: "bn" type: kCaffeBatchNorm param { name: "m" }',
                   [Source(inputs((2, 3)))])


def test_caffe_batchnorm_global_statistics_by_chunks_of_samples_on_two_threads(monkeypatch):
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)
    src = Source(inputs((6, 3, 2, 2)))
    layer = make_layer(CAFFE_BN.format(conf=""), [src])
    mean, var, factor = layer.params
    mean.data[...], var.data[...], factor.data[...] = [1, -2, 4], [2, 4, 0.5], 2
    with threads.limit(2):
        layer.compute_feature(job_pb2.kTest, [src])
    want = (src.data.astype(np.float64) - np.reshape([0.5, -1, 2], (1, 3, 1, 1))) / \
        np.sqrt(np.reshape([1, 2, 0.25], (1, 3, 1, 1)) + 1e-5)
    np.testing.assert_allclose(layer.data, want, rtol=1e-5)
