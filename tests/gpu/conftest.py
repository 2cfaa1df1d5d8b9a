"""tests/gpu: the GPU path on a real CUDA device, skipped where CuPy sees none.

SINGA_GPU_STANDIN=1 runs them on tests/integration/strict_device.py instead (a machine without a
GPU), to try these tests' own code: its numbers are numpy's, so it proves nothing of a GPU's
(SINGA_GPU_STANDIN=2: a stand-in of two GPUs).
"""
import importlib.util
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
STANDIN = os.environ.get("SINGA_GPU_STANDIN", "0") != "0"


def _visible():
    """Why there is no GPU to test on, or None."""
    if STANDIN:
        return None
    if importlib.util.find_spec("cupy") is None:
        return "CuPy is not installed (pip install 'singa[gpu]')"
    import cupy
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as e:          # no driver
        return f"CUDA sees no GPU ({type(e).__name__})"
    return None if count else "CUDA sees no GPU"


WHY_NOT = _visible()


def pytest_collection_modifyitems(config, items):
    if WHY_NOT is None:
        return
    skip = pytest.mark.skip(reason=f"tests/gpu: {WHY_NOT}")
    for item in items:
        if str(item.fspath).startswith(HERE):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def standin(monkeypatch):
    """The CuPy stand-in in place of cupy, with SINGA_GPU_STANDIN=<its GPUs>."""
    if STANDIN:
        sys.path.insert(0, os.path.join(HERE, "..", "integration"))
        import strict_device
        strict_device.installed(monkeypatch, gpus=int(os.environ["SINGA_GPU_STANDIN"]))
