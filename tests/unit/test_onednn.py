"""Convolution on oneDNN (singa.layers.kernels.onednn, the `onednn` extra): each pass against
the numpy im2col path within float32 rounding, results independent of the thread count,
and the engine's choice (SINGA_KERNELS, a library that is not there). The values against
the definition, gradients and groups: test_layers_conv.py, whose every test runs on oneDNN
too."""
import logging

import numpy as np
import pytest
from google.protobuf import text_format

from gradcheck import BACKWARD, FORWARD, Source, make_layer
from singa.device import CPU, threads
from singa.errors import ConfigError
from singa.layers import kernels
from singa.net.neuralnet import NeuralNet
from singa.proto import job_pb2

onednn = pytest.importorskip("singa.layers.kernels.onednn")


@pytest.fixture
def loaded():
    try:
        onednn.library()
    except OSError as e:
        pytest.skip(str(e))


def conv_conf(num_filters, **kw):
    fields = " ".join(f"{k}: {v}" for k, v in kw.items())
    return (f'name: "conv" type: kCConvolution convolution_conf {{ num_filters: {num_filters} '
            f'{fields} }} param {{ name: "w" }} param {{ name: "b" }}')


def passes(monkeypatch, choice, x, conf, nthreads=2):
    """(y, gW, gb, gx) of one forward and backward pass on SINGA_KERNELS=choice."""
    monkeypatch.setenv("SINGA_KERNELS", choice)
    src = Source(x)
    layer = make_layer(conf, [src])
    assert (layer.engine is not None) == (choice == "onednn")
    layer.grad[...] = np.random.default_rng(2).standard_normal(layer.grad.shape)
    with threads.limit(nthreads):
        layer.compute_feature(FORWARD, [src])
        layer.compute_gradient(BACKWARD, [src])
    return layer.data.copy(), layer.weight.grad.copy(), layer.bias.grad.copy(), src.grad.copy()


@pytest.mark.parametrize("shape, conf", [
    ((16, 20, 12, 12), dict(num_filters=50, kernel=5)),                       # LeNet's conv2
    ((10, 3, 32, 32), dict(num_filters=32, kernel=5, pad=2)),                 # cifar10's conv1
    ((8, 16, 15, 13), dict(num_filters=24, kernel=3, pad=1, stride=2)),
    ((8, 16, 9, 9), dict(num_filters=16, kernel=3, pad=1, group=16)),         # depthwise
    ((8, 12, 9, 9), dict(num_filters=24, kernel_x=3, kernel_y=1, pad_x=1, group=3)),
    ((8, 64, 7, 7), dict(num_filters=32, kernel=1))])                         # pointwise
def test_each_pass_matches_the_im2col_path_within_float32_rounding(loaded, monkeypatch, shape,
                                                                    conf):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    ours = passes(monkeypatch, "onednn", x, conv_conf(**conf))
    reference = passes(monkeypatch, "numpy", x, conv_conf(**conf))
    for name, a, b in zip(("y", "gW", "gb", "gx"), ours, reference):
        # a float32 sum of K products differs by a few ulps of its terms' magnitudes
        scale = np.abs(b).max()
        assert np.abs(a - b).max() <= 2e-6 * scale * np.sqrt(x[0].size), name


@pytest.mark.parametrize("conf", [dict(num_filters=6, kernel=3, pad=1),
                                  dict(num_filters=8, kernel=3, stride=2, group=2)])
def test_results_do_not_depend_on_the_thread_count(loaded, monkeypatch, conf):
    """Chunks of samples depend on the shapes only; each is one call at one OpenMP thread and
    gW sums the chunks' in chunk order: the same bits at 1, 2 and 3 compute threads."""
    monkeypatch.setattr(threads, "MIN_CHUNK_BYTES", 0)
    x = np.random.default_rng(0).standard_normal((20, 4, 9, 9)).astype(np.float32)
    results = [passes(monkeypatch, "onednn", x, conv_conf(**conf), n) for n in (1, 2, 3)]
    for other in results[1:]:
        for a, b in zip(results[0], other):
            assert np.array_equal(a, b)


def test_a_filter_of_few_inputs_stays_on_im2col(loaded, monkeypatch):
    """C/G·kh·kw <= GW_BY_SAMPLE without groups (LeNet's conv1: 25): oneDNN's weight gradient
    is slower there than the im2col path's products by sample."""
    monkeypatch.delenv("SINGA_KERNELS", raising=False)
    for channels, kernel, on_onednn in ((1, 5, False), (2, 4, False), (3, 5, True)):
        layer = make_layer(conv_conf(4, kernel=kernel),
                           [Source(np.zeros((2, channels, 9, 9), np.float32))])
        assert isinstance(layer.engine, onednn.Conv) == on_onednn, (channels, kernel)


def test_a_net_that_only_computes_forward_runs_every_convolution_on_onednn(loaded, monkeypatch):
    """A kTest or kVal net never asks for a weight gradient: its convolution of few inputs
    (MobileNet's conv1: 27) runs on oneDNN too, to the train net's values within float32
    rounding; the train net's stays on im2col."""
    monkeypatch.delenv("SINGA_KERNELS", raising=False)
    net_conf = text_format.Parse(
        'layer { name: "data" type: kDummy dummy_conf { input: true shape: 4 shape: 3 '
        'shape: 12 shape: 12 } } '
        'layer { name: "conv" type: kCConvolution srclayers: "data" convolution_conf { '
        'num_filters: 5 kernel: 3 stride: 2 pad: 1 } param { name: "w" } param { name: "b" } }',
        job_pb2.NetProto())
    x = np.random.default_rng(1).standard_normal((4, 3, 12, 12)).astype(np.float32)
    ys = {}
    for phase, on_onednn in ((job_pb2.kTrain, False), (job_pb2.kTest, True),
                             (job_pb2.kVal, True)):
        net = NeuralNet(net_conf, phase, np.random.default_rng(0))
        conv = net.by_name["0#conv"]
        assert isinstance(conv.engine, onednn.Conv) == on_onednn, phase
        net.by_name["0#data"].feed(x)
        net.forward(phase)
        ys[phase] = conv.data.copy()
    for phase in (job_pb2.kTest, job_pb2.kVal):
        np.testing.assert_allclose(ys[phase], ys[job_pb2.kTrain], rtol=1e-5, atol=1e-5)


def test_the_engine_is_chosen_once_and_logged(loaded, monkeypatch, caplog):
    monkeypatch.setattr(logging.getLogger("singa"), "propagate", True)
    monkeypatch.setattr(kernels, "_log_engine", kernels.functools.cache(
        kernels._log_engine.__wrapped__))
    monkeypatch.setattr(kernels, "_log_onednn", kernels.functools.cache(
        kernels._log_onednn.__wrapped__))
    monkeypatch.delenv("SINGA_KERNELS", raising=False)
    with caplog.at_level(logging.INFO, "singa"):
        assert kernels.convolution(CPU) is onednn and kernels.convolution(CPU) is onednn
        monkeypatch.setenv("SINGA_KERNELS", "numba")
        assert kernels.convolution(CPU) is None
    said = (f"convolution and products run on oneDNN {onednn.version()}" if kernels.intel() else
            f"convolution runs on oneDNN {onednn.version()}, products on BLAS (not an Intel CPU)")
    assert caplog.text.count(said) == 1
    assert "convolution and products run im2col + BLAS (SINGA_KERNELS=numba)" in caplog.text


def test_without_the_library_the_default_falls_back_and_asking_for_it_is_refused(monkeypatch):
    monkeypatch.setattr(onednn, "candidates", lambda: [])
    monkeypatch.setattr(onednn, "library", onednn.functools.cache(onednn.library.__wrapped__))
    monkeypatch.delenv("SINGA_KERNELS", raising=False)
    assert kernels.convolution(CPU) is None
    monkeypatch.setenv("SINGA_KERNELS", "onednn")
    with pytest.raises(ConfigError, match=r"SINGA_KERNELS=onednn: oneDNN 3 \(libdnnl.so.3\) is "
                                          r"not installed: pip install 'singa\[onednn\]'"):
        kernels.convolution(CPU)


def test_gemm_reads_transposed_views_and_pieces_and_refuses_what_it_cannot(loaded):
    rng = np.random.default_rng(0)
    a, b = rng.random((70, 50), np.float32), rng.random((50, 90), np.float32)
    want = a.astype(np.float64) @ b
    for x, y in ((a, b), (np.ascontiguousarray(a.T).T, b), (a, np.ascontiguousarray(b.T).T)):
        out = np.full((70, 90), np.nan, np.float32)
        assert onednn.gemm(x, y, out)
        np.testing.assert_allclose(out, want, rtol=1e-5)
    whole = np.full((70, 120), np.nan, np.float32)       # a piece of columns of a wider out
    assert onednn.gemm(a, b[:, 10:60], whole[:, 20:70])
    np.testing.assert_allclose(whole[:, 20:70], want[:, 10:60], rtol=1e-5)
    assert np.isnan(whole[:, :20]).all() and np.isnan(whole[:, 70:]).all()
    # neither rows nor columns contiguous; another dtype
    assert not onednn.gemm(a, b[:, ::2], np.empty((70, 45), np.float32))
    assert not onednn.gemm(a.astype(np.float64), b, np.empty((70, 90), np.float32))


def test_products_run_on_onednn_on_an_intel_cpu_only(loaded, monkeypatch):
    monkeypatch.delenv("SINGA_KERNELS", raising=False)
    monkeypatch.setattr(kernels, "intel", lambda: False)
    assert kernels.products() is None
    monkeypatch.setattr(kernels, "intel", lambda: True)
    assert kernels.products() is onednn
    monkeypatch.setenv("SINGA_KERNELS", "numba")
    assert kernels.products() is None


@pytest.mark.parametrize("shape", [(64, 784, 500), (500, 64, 784), (64, 1500, 10)])
def test_products_on_onednn_do_not_depend_on_the_thread_count(loaded, monkeypatch, shape):
    monkeypatch.delenv("SINGA_KERNELS", raising=False)
    monkeypatch.setattr(kernels, "intel", lambda: True)     # oneDNN's products on any CPU
    m, k, n = shape
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((k, m)).astype(np.float32).T, rng.standard_normal((k, n),
                                                                                np.float32)
    outs = []
    for nthreads in (1, 2, 3):
        out = np.empty((m, n), np.float32)
        with threads.limit(nthreads):
            threads.matmul(a, b, out)
        outs.append(out)
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    np.testing.assert_allclose(outs[0], a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)


def test_a_threads_stream_is_made_one_at_a_time_with_the_primitives(loaded, monkeypatch):
    """Streams made in several threads at once (two workers' first forwards, each thread's
    first call) made the W reorder of one of them fail now and then ("oneDNN reorder: status
    2", the cifar10 hybrid confs' test under a full CI run): 4 in 6,600 rounds of four new
    threads' first calls at once on a loaded machine, none in 9,200 with the streams made
    under `_MAKING`. Too rare to catch in a test's time, so this checks the lock is held."""
    import threading
    held = []
    make = onednn._Stream.__init__

    def init(self):
        held.append(onednn._MAKING._is_owned())
        make(self)
    monkeypatch.setattr(onednn._Stream, "__init__", init)
    t = threading.Thread(target=onednn.stream)
    t.start()
    t.join()
    assert held == [True]


def test_convolutions_made_and_run_in_several_threads_at_once_give_one_threads_results(loaded):
    """Two partitions' (or two workers') layers make their primitives at their first calls at
    the same time: made at once for a shape new to oneDNN, one of them failed now and then at
    its execution ("status 2", seen in the cifar10 hybrid conf's test). Threads do not share
    a stream either."""
    import threading
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 16, 3, 3), dtype=np.float32)
    b = rng.standard_normal(8, dtype=np.float32)
    x = rng.standard_normal((3, 16, 40, 40), dtype=np.float32)

    def forward(h, n):
        conv = onednn.Conv((16, h, h), 8, (3, 3), (1, 1), (1, 1), 1, True, [n])
        y = np.empty((n, 8, h, h), np.float32)
        conv.weights(w, "fwd")
        conv.forward(np.ascontiguousarray(x[:n, :, :h, :h]), w, b, y, 0)
        return y.tobytes()
    failures, got = [], {}

    def work(h, start):
        start.wait()
        try:
            for n in (1, 2, 3):
                got.setdefault((h, n), set()).add(forward(h, n))
        except Exception as e:      # the thread's failure, for the test's thread to report
            failures.append(repr(e))
    for h in range(9, 29):          # shapes new to the process: primitives made, not cached
        start = threading.Barrier(4)
        workers = [threading.Thread(target=work, args=(h, start)) for _ in range(4)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
    assert failures == []
    assert all(outs == {forward(h, n)} for (h, n), outs in got.items())
