"""Which copies convolution runs: numba's compiled loops (`singa.layers.loops`, the `fast`
extra) where numba is installed, else numpy's.

SINGA_KERNELS=numpy chooses numpy's where numba is installed. Both give the same float32
bits, so a job may resume on either. A layer chooses at its setup.
"""
import importlib.util
import os

from singa.errors import ConfigError

__all__ = ["compiled"]

CHOICES = ("numba", "numpy")


def compiled():
    """singa.layers.loops, or None for numpy's loops."""
    choice = os.environ.get("SINGA_KERNELS", "numba")
    if choice not in CHOICES:
        raise ConfigError(f"SINGA_KERNELS={choice}: must be one of {', '.join(CHOICES)}")
    if choice == "numpy" or importlib.util.find_spec("numba") is None:
        return None
    from singa.layers import loops
    return loops
