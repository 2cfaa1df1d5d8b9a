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

`convolution(device)` is the engine of a device's convolutions: on the CPU oneDNN
(`kernels.onednn`, the `onednn` extra) where it loads, unless SINGA_KERNELS names numba or
numpy; on a GPU cuDNN (`kernels.cudnn`, in the `gpu` extras) where it loads and agrees with
numpy, unless SINGA_GPU_KERNELS=cuda; None: the im2col path on this module's kernels. Both
engines add in their own orders: a job resumes bit-exactly on the engine it ran on, within
float32 rounding on another. Which one runs is logged once.
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

CHOICES = ("onednn", "numba", "numpy")
GPU_CHOICES = ("cudnn", "cuda")


def _choice():
    choice = os.environ.get("SINGA_KERNELS", "onednn")
    if choice not in CHOICES:
        raise ConfigError(f"SINGA_KERNELS={choice}: must be one of {', '.join(CHOICES)}")
    return choice


def choose(device):
    """singa.layers.kernels.cuda on a GPU; on the CPU .numba, or .numpy where
    SINGA_KERNELS=numpy or numba is not installed or does not load."""
    if device.gpu is not None:
        return cuda
    if _choice() == "numpy" or importlib.util.find_spec("numba") is None:
        return numpy
    return _numba()


def convolution(device):
    """The engine of `device`'s convolutions: on the CPU singa.layers.kernels.onednn where
    SINGA_KERNELS is unset or onednn and oneDNN 3 loads, on a GPU `gpu_engine`'s; None: the
    im2col path. SINGA_KERNELS=onednn where it does not load is a ConfigError."""
    return onednn_engine() if device.gpu is None else gpu_engine(device.gpu)


def _gpu_choice():
    choice = os.environ.get("SINGA_GPU_KERNELS", "cudnn")
    if choice not in GPU_CHOICES:
        raise ConfigError(f"SINGA_GPU_KERNELS={choice}: must be one of {', '.join(GPU_CHOICES)}")
    return choice


def check_gpu_engine():
    """ConfigError where SINGA_GPU_KERNELS asks for cuDNN and it does not load (a job's check,
    before any process starts)."""
    if _gpu_choice() == "cudnn" and "SINGA_GPU_KERNELS" in os.environ:
        from singa.layers.kernels import cudnn
        try:
            cudnn.library()
        except OSError as e:
            raise ConfigError(f"SINGA_GPU_KERNELS=cudnn: {e}") from None


@functools.cache
def gpu_engine(gpu):
    """singa.layers.kernels.cudnn for GPU `gpu`'s convolutions (the current device) where
    SINGA_GPU_KERNELS is unset or cudnn, cuDNN 9 loads and its passes agree with numpy's
    there (`cudnn.disagreement`, once); else None, the im2col path on our CUDA kernels and
    cuBLAS (SINGA_GPU_KERNELS=cuda). Asked for by SINGA_GPU_KERNELS=cudnn, a cuDNN that does
    not load or disagrees is a ConfigError; unasked, it is logged and the im2col path runs."""
    if _gpu_choice() == "cuda":
        _log_engine("convolution on a GPU runs im2col + cuBLAS (SINGA_GPU_KERNELS=cuda)")
        return None
    from singa.layers.kernels import cudnn
    asked = "SINGA_GPU_KERNELS" in os.environ
    try:
        cudnn.library()
        wrong = cudnn.disagreement()
    except OSError as e:
        if asked:
            raise ConfigError(f"SINGA_GPU_KERNELS=cudnn: {e}") from None
        _log_engine(f"convolution on a GPU runs im2col + cuBLAS ({e})")
        return None
    except cudnn.CudnnError as e:
        wrong = str(e)
    if wrong:
        if asked:
            raise ConfigError(f"SINGA_GPU_KERNELS=cudnn: GPU {gpu}: {wrong}")
        log.warning("GPU %s: %s; its convolutions run im2col + cuBLAS", gpu, wrong)
        return None
    _log_engine(f"convolution on a GPU runs on cuDNN {cudnn.version()}"
                + (" (TF32 allowed: gpu_tf32)" if cudnn.tf32_allowed() else " (float32)"))
    return cudnn


def onednn_engine():
    """singa.layers.kernels.onednn where SINGA_KERNELS is unset or onednn and oneDNN 3 loads:
    the CPU's convolutions run on it, and on an Intel CPU its matrix products
    (`threads.matmul`, `products`); else None."""
    choice = _choice()
    if choice != "onednn":
        _log_engine("convolution and products run im2col + BLAS (SINGA_KERNELS=%s)" % choice)
        return None
    from singa.layers.kernels import onednn
    try:
        onednn.library()
    except OSError as e:
        if "SINGA_KERNELS" in os.environ:
            raise ConfigError(f"SINGA_KERNELS=onednn: {e}") from None
        _log_engine("convolution and products run im2col + BLAS (oneDNN is not installed: "
                    "pip install 'singa[onednn]')")
        return None
    _log_onednn()
    return onednn


def products():
    """The engine of `threads.matmul`'s pieces: oneDNN's sgemm on an Intel CPU where oneDNN is
    the engine; else None, BLAS (on AMD's Zen, OpenBLAS's products tie with oneDNN's on
    the MNIST MLP's and are 1.2-1.5x faster on a 784-128-10 MLP's: bench/README.md)."""
    engine = onednn_engine()
    return engine if engine is not None and intel() else None


@functools.cache
def intel():
    """Whether this CPU is Intel's (/proc/cpuinfo's vendor_id)."""
    try:
        with open("/proc/cpuinfo") as f:
            return any(line.split(":")[-1].strip() == "GenuineIntel"
                       for line in f if line.startswith("vendor_id"))
    except OSError:
        return False


@functools.cache
def _log_engine(line):
    log.info(line)


@functools.cache
def _log_onednn():
    """Says once what runs on oneDNN (its line made once: `threads.matmul` asks every call)."""
    from singa.layers.kernels import onednn
    version = onednn.version()
    _log_engine(f"convolution and products run on oneDNN {version}" if intel() else
                f"convolution runs on oneDNN {version}, products on BLAS (not an Intel CPU)")


@functools.cache
def _numba():
    """singa.layers.kernels.numba, or .numpy (with one warning) where numba is installed but
    fails to load."""
    try:
        return importlib.import_module("singa.layers.kernels.numba")
    except ImportError as e:    # e.g. a numba too old for this numpy
        log.warning("numba does not load (%s): convolution runs numpy's copies", e)
        return numpy
