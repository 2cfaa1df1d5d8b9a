"""singa.layers.kernels: numba's compiled copies give numpy's bits, every kernel module has
numpy's functions, and the choice is checked."""
import functools
import inspect
import logging
import sys

import numpy as np
import pytest

from gradcheck import BACKWARD, FORWARD, Source, make_layer
from singa.device import CPU
from singa.device import threads
from singa.errors import ConfigError
from singa.layers import kernels
from singa.layers.kernels import cuda

numba = pytest.importorskip("singa.layers.kernels.numba")


def conv(num_filters, group=1, **window):
    fields = " ".join(f"{k}: {v}" for k, v in window.items())
    return (f'name: "conv" type: kCConvolution convolution_conf {{ num_filters: {num_filters} '
            f'group: {group} {fields} }} param {{ name: "w" }} param {{ name: "b" }}')


def step(monkeypatch, choice, conf, shape, nthreads):
    """A forward and a backward pass of the layer of `conf` on fixed random blobs: its output,
    the source's gradient and the params' gradients."""
    monkeypatch.setenv("SINGA_KERNELS", choice)
    rng = np.random.default_rng(0)
    src = Source(rng.standard_normal(shape))
    layer = make_layer(conf, [src])
    assert layer.kernels.__name__ == f"singa.layers.kernels.{choice}"
    layer.grad[...] = rng.standard_normal(layer.grad.shape)
    with threads.limit(nthreads):
        layer.compute_feature(FORWARD, [src])
        layer.compute_gradient(BACKWARD, [src])
    return [layer.data, src.grad] + [p.grad for p in layer.params]


@pytest.mark.parametrize("conf, shape", [
    (conv(32, kernel=5, pad=2), (12, 3, 16, 16)),           # cifar10's conv1: im2col, padded
    (conv(8, kernel=5, pad=2), (12, 16, 8, 8)),             # transposed convolution
    (conv(50, kernel=5), (12, 20, 12, 12)),                 # LeNet's conv2: col2im, stride 1
    (conv(6, kernel=3, pad=1, stride=2), (9, 4, 9, 9)),     # col2im, stride 2
    (conv(6, kernel_x=3, kernel_y=2, pad_x=2, pad_y=1, stride_x=3), (5, 2, 7, 9)),
    (conv(4, group=2, kernel=3, pad=1), (7, 6, 8, 8)),      # groups, transposed
    (conv(14, group=2, kernel=3, pad=1), (7, 6, 8, 8)),     # groups, col2im
    (conv(6, group=6, kernel=3, pad=1), (5, 6, 9, 8)),      # depthwise: direct, 3 × 3 pass
    (conv(6, group=6, kernel=3, pad=1, stride=2), (5, 6, 9, 8)),    # phase planes
    (conv(8, group=4, kernel_x=3, kernel_y=2, pad_x=2, stride_y=2), (3, 8, 6, 7)),
    (conv(8, group=4, kernel=5, pad=2, stride=3), (3, 4, 9, 9)),    # 2 filters per channel
])
@pytest.mark.parametrize("nthreads", [1, 2])
def test_compiled_copies_give_numpys_bits(monkeypatch, conf, shape, nthreads):
    compiled = step(monkeypatch, "numba", conf, shape, nthreads)
    plain = step(monkeypatch, "numpy", conf, shape, 1)
    for a, b in zip(compiled, plain):
        assert a.tobytes() == b.tobytes()


def test_every_kernel_module_has_numpys_functions_with_their_parameters():
    for name in kernels.numpy.__all__:
        ours = getattr(kernels.numpy, name)
        for other in (numba, cuda):
            if name == "taps":
                continue        # numpy's own helper, which pooling's layer does not call
            theirs = getattr(other, name)
            if callable(ours):
                plain = getattr(theirs, "py_func", theirs)      # numba's compiled function
                assert list(inspect.signature(plain).parameters) == \
                    list(inspect.signature(ours).parameters), (other.__name__, name)
            else:
                assert type(theirs) is type(ours), (other.__name__, name)


def test_with_numba_pooling_the_activations_and_lrn_stay_numpys_calls():
    for name in ("max_pool", "avg_pool", "max_pool_backward", "avg_pool_backward",
                 "activation", "activation_grad", "softmax_loss_grad", "lrn", "lrn_grad"):
        assert getattr(numba, name) is getattr(kernels.numpy, name)
    assert numba.im2col is not kernels.numpy.im2col


def test_numpy_is_chosen_by_the_environment(monkeypatch):
    monkeypatch.setenv("SINGA_KERNELS", "numpy")
    assert kernels.choose(CPU) is kernels.numpy
    monkeypatch.delenv("SINGA_KERNELS")
    assert kernels.choose(CPU) is numba


def test_a_numba_that_does_not_load_leaves_numpys_copies(monkeypatch, caplog):
    monkeypatch.delenv("SINGA_KERNELS", raising=False)       # numba's chosen, then
    monkeypatch.setitem(sys.modules, "singa.layers.kernels.numba", None)    # its import fails
    monkeypatch.setattr(kernels, "_numba", functools.cache(kernels._numba.__wrapped__))
    monkeypatch.setattr(logging.getLogger("singa"), "propagate", True)
    assert kernels.choose(CPU) is kernels.numpy and kernels.choose(CPU) is kernels.numpy
    assert caplog.text.count("numba does not load") == 1


def test_an_unknown_choice_is_refused(monkeypatch):
    monkeypatch.setenv("SINGA_KERNELS", "fortran")
    with pytest.raises(ConfigError, match="SINGA_KERNELS=fortran: must be one of onednn, numba, numpy"):
        kernels.choose(CPU)
