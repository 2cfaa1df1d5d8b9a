"""Which copies convolution runs: numba's compiled loops (`singa.layers.loops`, the `fast`
extra) where numba is installed, else numpy's.

SINGA_KERNELS=numpy chooses numpy's where numba is installed. Both give the same float32
bits, so a job may resume on either. A layer chooses at its setup.
"""
import functools
import importlib.util
import logging
import os

from singa.errors import ConfigError

log = logging.getLogger("singa")

__all__ = ["compiled"]

CHOICES = ("numba", "numpy")


def compiled(device):
    """singa.layers.loops, or None for numpy's loops (always on a GPU, where numpy's calls run
    as CuPy's)."""
    if device.gpu is not None:
        return None
    choice = os.environ.get("SINGA_KERNELS", "numba")
    if choice not in CHOICES:
        raise ConfigError(f"SINGA_KERNELS={choice}: must be one of {', '.join(CHOICES)}")
    if choice == "numpy" or importlib.util.find_spec("numba") is None:
        return None
    return _loops()


@functools.cache
def _loops():
    """singa.layers.loops, or None (with one warning) where numba is installed but fails to
    load."""
    try:
        return importlib.import_module("singa.layers.loops")
    except ImportError as e:    # e.g. a numba too old for this numpy
        log.warning("numba does not load (%s): convolution runs numpy's copies", e)
        return None
