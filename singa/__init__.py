"""singa: a Python re-implementation of Apache SINGA v0.x."""
import os
import sys

#: The SINGA home: the repository root; relative paths in confs resolve against it.
HOME = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def resolve(path):
    """`path` made absolute; relative paths are relative to the SINGA home (SINGA runs from
    there). A store URL (`memory://0`) is no file path and stays as it is."""
    if "://" in path:
        return path
    return os.path.normpath(os.path.join(HOME, os.path.expanduser(path)))


def _zen4():
    """Whether this is an AMD Zen 4 CPU (family 25 with AVX-512), by /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo") as f:
            first = f.read(1 << 16).split("\n\n", 1)[0]
    except OSError:
        return False
    fields = {k.strip(): v.strip() for k, _, v in
              (line.partition(":") for line in first.splitlines())}
    return fields.get("vendor_id") == "AuthenticAMD" and fields.get("cpu family") == "25" \
        and "avx512f" in fields.get("flags", "").split()


def _blas_kernels():
    """OPENBLAS_CORETYPE=Haswell on Zen 4, where OpenBLAS picks its SkylakeX kernels: Zen 4
    runs 512-bit instructions as two 256-bit halves, and the Haswell kernels run float32
    products 1.05-1.5x faster there (bench/README.md). Never over the user's own setting.
    Where numpy (so OpenBLAS) was loaded before singa, the process keeps its kernels and its
    children (a job's processes) are told to load the same, so that all compute alike."""
    if "OPENBLAS_CORETYPE" in os.environ or not _zen4():
        return
    core = "Haswell"
    if "numpy" in sys.modules:
        from threadpoolctl import threadpool_info
        core = next((i["architecture"] for i in threadpool_info()
                     if i.get("internal_api") == "openblas"), None)
    if core:
        os.environ["OPENBLAS_CORETYPE"] = core


_blas_kernels()
