"""Bench without a GPU: the device operations (kernel launches) and host waits of a training
step of ours on the GPU path, counted on the CuPy stand-in (tests/integration/strict_device.py,
which runs on the CPU). On a GPU each operation costs the host a CuPy call (some µs) and the
GPU a launch, so at SINGA's batch sizes their number is what a step's time follows.

    python bench/bench_gpu_launches.py [--batch 4] [--nets mlp,lenet,cifar10]

Counted: each numpy ufunc or array function on device arrays, each assignment into one and
each RawKernel launch (a view is free); waits: the stand-in's (a device value read on the
host, a copy from pageable memory). A step is `train_one_batch` then `collect_all`, as in
bench_gpu.py. The convolutions' kernels run through g++, so keep the batch small.
"""
import argparse
import collections
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..", "tests", "integration")]

import strict_device as sd  # noqa: E402
from bench_gpu import job_of  # noqa: E402
from bench_mlp_step import Runtime, print_table  # noqa: E402


def counting(counts):
    """Wrap the stand-in's device operations so that each adds one to counts[kind]."""
    def wrap(cls, name, kind):
        inner = getattr(cls, name)

        def call(self, *args, **kwargs):
            counts[kind(args)] += 1
            return inner(self, *args, **kwargs)
        setattr(cls, name, call)
    wrap(sd.DevArray, "__array_ufunc__", lambda a: a[0].__name__)
    wrap(sd.DevArray, "__array_function__", lambda a: a[0].__name__)
    wrap(sd.DevArray, "__setitem__", lambda a: "assignment")
    wrap(sd.RawKernel, "__call__", lambda a: "our kernels")


class Setter:
    """What `strict_device.installed` sets, set for the rest of this process (pytest's
    monkeypatch without the undo)."""

    setattr = staticmethod(setattr)

    @staticmethod
    def setitem(mapping, key, value):
        mapping[key] = value


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--nets", default="mlp,lenet,cifar10")
    args = ap.parse_args(argv)
    counts = collections.Counter()
    counting(counts)
    sd.installed(Setter())
    rows = []
    for net in args.nets.split(","):
        rt = Runtime(job_of(net, tempfile.mkdtemp(prefix="singa-bench-launches-"), args.batch,
                            True))
        try:
            rt.train_step()
            counts.clear()
            sd.waits.clear()
            rt.train_step()
        finally:
            rt.close()
        ours = counts.pop("our kernels", 0)
        top = ", ".join(f"{k} {v}" for k, v in counts.most_common(4))
        rows.append([net, sum(counts.values()) + ours, ours, sum(sd.waits.values()), top])
    print_table(rows, ["net", "device operations", "of them our kernels", "host waits",
                       "most frequent others"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
