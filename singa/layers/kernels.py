"""Which compiled kernels convolution, pooling, the activations and SoftmaxLoss run: on a GPU
our CUDA kernels (`singa.layers.cuda`); on the CPU numba's compiled loops for convolution
(`singa.layers.loops`, the `fast` extra) where numba is installed, else numpy's.

SINGA_KERNELS=numpy chooses numpy's on a CPU where numba is installed. All give the same
float32 bits (but for CUDA's exp and tanh in the activations), so a job may resume on any of
them. A layer chooses at its setup.
"""
import functools
import importlib
import importlib.util
import logging
import os

from singa.errors import ConfigError
from singa.layers import cuda

log = logging.getLogger("singa")

__all__ = ["compiled", "gpu"]

CHOICES = ("numba", "numpy")


def compiled(device):
    """Convolution's copies and direct loops: singa.layers.cuda on a GPU; on the CPU
    singa.layers.loops, or None for numpy's."""
    if device.gpu is not None:
        return cuda
    choice = os.environ.get("SINGA_KERNELS", "numba")
    if choice not in CHOICES:
        raise ConfigError(f"SINGA_KERNELS={choice}: must be one of {', '.join(CHOICES)}")
    if choice == "numpy" or importlib.util.find_spec("numba") is None:
        return None
    return _loops()


def gpu(device):
    """singa.layers.cuda on a GPU, None (numpy's calls) on the CPU: the kernels of pooling,
    the activations and SoftmaxLoss, whose numpy calls are fast on a CPU."""
    return cuda if device.gpu is not None else None


@functools.cache
def _loops():
    """singa.layers.loops, or None (with one warning) where numba is installed but fails to
    load."""
    try:
        return importlib.import_module("singa.layers.loops")
    except ImportError as e:    # e.g. a numba too old for this numpy
        log.warning("numba does not load (%s): convolution runs numpy's copies", e)
        return None
