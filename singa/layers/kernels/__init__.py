"""The kernel seam: `choose(device)` is the module of kernels a layer runs, every one with the
same functions and signatures (im2col, col2im, group_conv, group_conv_wgrad,
group_conv_xgrad, ...): on a GPU our CUDA kernels (`kernels.cuda`, the C in cuda.cu); on
the CPU numba's compiled loops (`kernels.numba`, the `fast` extra) where numba is installed,
else numpy's calls (`kernels.numpy`). numba's module compiles convolution's copies and loops
only: pooling, the activations, SoftmaxLoss and LRN are numpy's calls there too, which are
fast on a CPU.

SINGA_KERNELS=numpy chooses numpy's on a CPU where numba is installed. All give the same
float32 bits (but for CUDA's exp and tanh in the activations), so a job may resume on any of
them. A layer chooses at its setup and keeps the module as `self.kernels`.
"""
import functools
import importlib
import importlib.util
import logging
import os

from singa.errors import ConfigError
from singa.layers.kernels import cuda, numpy
from singa.layers.kernels.numpy import RELU, SIGMOID, STANH, TANH

log = logging.getLogger("singa")

__all__ = ["choose", "RELU", "SIGMOID", "TANH", "STANH"]

CHOICES = ("numba", "numpy")


def choose(device):
    """singa.layers.kernels.cuda on a GPU; on the CPU .numba, or .numpy where
    SINGA_KERNELS=numpy or numba is not installed or does not load."""
    if device.gpu is not None:
        return cuda
    choice = os.environ.get("SINGA_KERNELS", "numba")
    if choice not in CHOICES:
        raise ConfigError(f"SINGA_KERNELS={choice}: must be one of {', '.join(CHOICES)}")
    if choice == "numpy" or importlib.util.find_spec("numba") is None:
        return numpy
    return _numba()


@functools.cache
def _numba():
    """singa.layers.kernels.numba, or .numpy (with one warning) where numba is installed but
    fails to load."""
    try:
        return importlib.import_module("singa.layers.kernels.numba")
    except ImportError as e:    # e.g. a numba too old for this numpy
        log.warning("numba does not load (%s): convolution runs numpy's copies", e)
        return numpy
