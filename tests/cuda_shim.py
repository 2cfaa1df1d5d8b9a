"""CUDA kernel source run on the CPU, for tests without a GPU: g++ compiles the source itself
behind a header that defines CUDA's qualifiers away and its thread indices as (thread-local)
variables, plus one launcher per `extern "C" __global__` kernel that runs every (block,
thread) of a grid in turn. `RawKernel` is cupy.RawKernel on numpy arrays; both reach the
kernels through `library(source).launch(name, grid, block, args)`, args as CuPy takes them:
arrays for pointers, numpy scalars of the parameter's own type (CuPy passes a scalar by its
dtype). `source` reads one of singa's .cu files straight from the tree. Used by
tests/unit/test_cuda_kernels.py, test_updater.py and the CuPy stand-in
tests/integration/strict_device.py.

It runs the grid serially: it checks each kernel's arithmetic, indexing and grid-stride
partition, not what depends on threads running together (races, shared memory, warps).
"""
import ctypes
import functools
import hashlib
import os
import pathlib
import re
import shutil
import subprocess
import tempfile

import numpy as np

HEADER = r"""
#include <cmath>
#include <cstring>
using std::isnan;
struct uint3 { unsigned x, y, z; };
static thread_local uint3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, sizeof f); return f; }
"""

# -ffp-contract=off: no fused multiply-adds, as NVRTC's --fmad=false
FLAGS = ("-O1", "-std=c++17", "-shared", "-fPIC", "-ffp-contract=off", "-w")

KERNEL = re.compile(r'extern\s+"C"\s+__global__\s+void\s+(\w+)\s*\(([^)]*)\)')

SCALARS = {"long long": (ctypes.c_longlong, np.int64), "int": (ctypes.c_int, np.int32),
           "unsigned int": (ctypes.c_uint, np.uint32), "float": (ctypes.c_float, np.float32),
           "double": (ctypes.c_double, np.float64)}
POINTEES = {"float": np.float32, "double": np.float64, "int": np.int32, "long long": np.int64,
            "unsigned char": np.uint8, "bool": np.bool_}


SINGA = pathlib.Path(__file__).resolve().parent.parent / "singa"

#: the .cu files of the layers' kernels and of the update rules, package data of singa
LAYERS, UPDATER = "layers/kernels/cuda.cu", "train/updater_cuda.cu"


def source(path):
    """The text of singa/`path`, a .cu file (LAYERS or UPDATER)."""
    return (SINGA / path).read_text()


@functools.cache
def compiler():
    """The C++ compiler's path ($CXX, else g++ or c++), or None."""
    for name in (os.environ.get("CXX"), "g++", "c++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def kernels(source):
    """{name: [(C type, parameter name)]} of the source's extern "C" __global__ kernels."""
    found = {}
    for name, params in KERNEL.findall(source):
        found[name] = [(" ".join(p.split()[:-1]).replace(" *", "*"), p.split()[-1])
                       for p in params.replace("*", " * ").split(",")]
    return found


def shim(source):
    """The C++ translation unit: HEADER, the source, a launcher `shim_NAME(dims, params)`
    per kernel, dims the grid's and the block's (x, y, z), blocks and threads in CUDA's
    order (x fastest)."""
    out = [HEADER, source]
    for name, params in kernels(source).items():
        decl = ", ".join(f"{t} {p}" for t, p in params)
        call = ", ".join(p for _, p in params)
        out.append(f"""
extern "C" void shim_{name}(const unsigned* shim_, {decl}) {{
    gridDim = {{shim_[0], shim_[1], shim_[2]}};
    blockDim = {{shim_[3], shim_[4], shim_[5]}};
    for (unsigned shim_b = 0; shim_b < shim_[0] * shim_[1] * shim_[2]; ++shim_b) {{
        blockIdx = {{shim_b % shim_[0], shim_b / shim_[0] % shim_[1],
                    shim_b / (shim_[0] * shim_[1])}};
        for (unsigned shim_t = 0; shim_t < shim_[3] * shim_[4] * shim_[5]; ++shim_t) {{
            threadIdx = {{shim_t % shim_[3], shim_t / shim_[3] % shim_[4],
                         shim_t / (shim_[3] * shim_[4])}};
            {name}({call});
        }}
    }}
}}""")
    return "\n".join(out)


@functools.cache
def library(source):
    """`source` built by the C++ compiler (once per source and process; the .so is kept in
    the temporary directory under its hash) and loaded."""
    cxx = compiler()
    if cxx is None:
        raise RuntimeError("no C++ compiler (g++, c++ or $CXX) to build CUDA kernels with")
    text = shim(source)
    digest = hashlib.sha256((text + " ".join(FLAGS) + cxx).encode()).hexdigest()[:16]
    folder = os.path.join(tempfile.gettempdir(), "singa-cuda-shim")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{digest}.so")
    if not os.path.exists(path):
        fd, part = tempfile.mkstemp(suffix=".so", dir=folder)
        os.close(fd)
        cpp = part[:-3] + ".cpp"
        with open(cpp, "w") as f:
            f.write(text)
        try:
            subprocess.run([cxx, *FLAGS, cpp, "-o", part], check=True, capture_output=True,
                           text=True)
        except subprocess.CalledProcessError as e:
            raise RuntimeError(f"{cxx} fails on the CUDA source:\n{e.stderr}") from None
        finally:
            os.unlink(cpp)
        os.replace(part, path)
    return Library(ctypes.CDLL(path), kernels(source))


class Library:
    """The kernels of one source, built by `library`."""

    def __init__(self, dll, params):
        self.dll, self.params = dll, params

    def launch(self, name, grid, block, args):
        """Runs kernel `name` over `grid` × `block` (tuples of up to 3) on `args`; TypeError
        for an argument the kernel would misread on a GPU (a scalar not of the parameter's
        type, an array of another dtype or not C-contiguous)."""
        params = self.params[name]
        if len(args) != len(params):
            raise TypeError(f"kernel {name} takes {len(params)} arguments, got {len(args)}")
        dims = [int(d) for d in tuple(grid) + (1,) * (3 - len(grid))] + \
            [int(d) for d in tuple(block) + (1,) * (3 - len(block))]
        if min(dims) < 1 or dims[3] * dims[4] * dims[5] > 1024:
            raise TypeError(f"kernel {name}: grid {grid}, block {block} is not a CUDA launch")
        values = [(ctypes.c_uint * 6)(*dims)]
        for (ctype, pname), a in zip(params, args):
            values.append(_value(name, ctype, pname, a))
        getattr(self.dll, f"shim_{name}")(*values)


def _value(kernel, ctype, pname, a):
    """The ctypes value of argument `a` for the parameter `ctype pname`."""
    what = f"kernel {kernel}, parameter {ctype} {pname}"
    if ctype.endswith("*"):
        want = POINTEES[ctype.removeprefix("const ").rstrip("*").strip()]
        if not isinstance(a, np.ndarray) or a.dtype != want or not a.flags.c_contiguous:
            raise TypeError(f"{what}: needs a C-contiguous array of {np.dtype(want)}, got "
                            f"{getattr(a, 'dtype', type(a).__name__)}"
                            f"{'' if not isinstance(a, np.ndarray) else ' ' + str(a.strides)}")
        return ctypes.c_void_p(a.ctypes.data)
    make, want = SCALARS[ctype]
    if type(a) is not want:
        raise TypeError(f"{what}: needs a numpy {np.dtype(want)} scalar, got "
                        f"{type(a).__name__}")
    return make(a)


class RawKernel:
    """cupy.RawKernel's interface on host arrays: `code`'s kernel `name`, built at its first
    launch."""

    def __init__(self, code, name, options=()):
        self.code, self.name, self.options = code, name, tuple(options)

    def __call__(self, grid, block, args, shared_mem=0):
        library(self.code).launch(self.name, grid, block, args)
