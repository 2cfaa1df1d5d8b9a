"""cuDNN's C API as singa.layers.kernels.cudnn declares it, against the real library where the
`gpu` extra installed it (skipped elsewhere): what needs no GPU (the version, descriptors, the
shapes cuDNN derives from them, the perf results' layout, error strings). The passes against
a fake library: tests/integration/test_gpu_cudnn.py; on a GPU: tests/gpu."""
import ctypes
import sys

import pytest

from singa.layers.kernels import cudnn


@pytest.fixture
def lib():
    try:
        return cudnn.library()
    except OSError as e:
        pytest.skip(str(e))


def test_the_library_is_cudnn_9_and_its_descriptors_take_our_arguments(lib):
    assert cudnn.version().startswith("9.")
    x = cudnn._made("Tensor", ("cudnnSetTensor4dDescriptor", (cudnn.NCHW, cudnn.FLOAT, 2, 6,
                                                              5, 7)))
    w = cudnn._made("Filter", ("cudnnSetFilter4dDescriptor", (cudnn.FLOAT, cudnn.NCHW, 4, 3,
                                                              3, 3)))
    conv = cudnn._made("Convolution",
                       ("cudnnSetConvolution2dDescriptor",
                        (1, 1, 2, 2, 1, 1, cudnn.CROSS_CORRELATION, cudnn.FLOAT)),
                       ("cudnnSetConvolutionGroupCount", (2,)),
                       ("cudnnSetConvolutionMathType", (cudnn.FMA_MATH,)))
    out = [ctypes.c_int() for _ in range(4)]
    lib.cudnnGetConvolution2dForwardOutputDim.argtypes = [ctypes.c_void_p] * 3 + \
        [ctypes.POINTER(ctypes.c_int)] * 4
    cudnn.check(lib.cudnnGetConvolution2dForwardOutputDim(conv, x, w, *map(ctypes.byref, out)),
                "output dims")
    assert [v.value for v in out] == list(cudnn.Conv((6, 5, 7), 4, (3, 3), (1, 1), (2, 2), 2,
                                                     True, [2]).yshape(2))


def test_a_refused_call_is_an_error_naming_cudnns_status(lib):
    with pytest.raises(cudnn.CudnnError, match="^cuDNN Tensor descriptor: CUDNN_STATUS_BAD_PARAM"):
        cudnn._made("Tensor", ("cudnnSetTensor4dDescriptor", (cudnn.NCHW, cudnn.FLOAT, -2, 3, 5,
                                                              7)))


def test_the_perf_results_have_cudnns_layout():
    """cudnnConvolutionFwdAlgoPerf_t: algo, status, time, (pad), memory (size_t),
    determinism, mathType, reserved[3]: 48 bytes on a 64-bit machine."""
    assert ctypes.sizeof(cudnn.Perf) == 48
    assert cudnn.Perf.memory.offset == 16 and cudnn.Perf.determinism.offset == 24


@pytest.mark.parametrize("folder", ["cudnn", "cu13"])
def test_the_library_is_looked_for_in_the_nvidia_wheels_folders(tmp_path, monkeypatch, folder):
    """nvidia-cudnn-cu12 puts it in nvidia/cudnn/lib, CUDA 13's wheels in nvidia/cu13/lib: a
    GPU machine's torch brings one or the other."""
    lib = tmp_path / "nvidia" / folder / "lib"
    lib.mkdir(parents=True)
    (lib / "libcudnn.so.9").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m.split(".")[0] == "nvidia"]:
        monkeypatch.delitem(sys.modules, name)
    found = cudnn.candidates()
    assert found[0] == str(lib / "libcudnn.so.9") and found[-1] == "libcudnn.so.9"
    assert len(found) == len(set(found))
