"""cuDNN's C API as singa.layers.kernels.cudnn declares it, against the real library where the
`gpu` extra installed it (skipped elsewhere): what needs no GPU (the version, descriptors, the
shapes cuDNN derives from them, the perf results' layout, error strings). The passes against
a fake library: tests/integration/test_gpu_cudnn.py; on a GPU: tests/gpu."""
import ctypes

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
