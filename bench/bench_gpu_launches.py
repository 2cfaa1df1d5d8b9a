"""Bench without a GPU: the device operations (kernel launches) and host waits of a training
step of ours on the GPU path, counted on the CuPy stand-in (tests/integration/strict_device.py,
which runs on the CPU). On a GPU each operation costs the host a CuPy call (some µs) and the
GPU a launch, so at SINGA's batch sizes their number is what a step's time follows.

    python bench/bench_gpu_launches.py [--batch 4] [--nets mlp,lenet,cifar10]
                                       [--nets resnet50,googlenet,vgg16,mobilenet --batch 1]

Counted: each numpy ufunc or array function on device arrays, each assignment into one and
each RawKernel launch (a view is free); waits: the stand-in's (a device value read on the
host, a copy from pageable memory). A step is `train_one_batch` then `collect_all`, as in
bench_gpu.py: one op by op (before `cuda_graphs.WARMUP`), and one after, its runs of
capturable passes launched as CUDA graphs (a launch counts one). The convolutions' kernels run
through g++, so keep the batch small. The zoo nets are bench_gpu_zoo's jobs (their deploy
prototxts imported, a SoftmaxLoss on top), their kDummy inputs fed once.
"""
import argparse
import collections
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, "..", "tests"), os.path.join(HERE, "..", "tests", "integration")]

import numpy as np  # noqa: E402

import strict_device as sd  # noqa: E402
from bench_gpu import job_of  # noqa: E402
from bench_gpu_zoo import LABELS, zoo_job  # noqa: E402
from bench_mlp_step import Runtime, print_table  # noqa: E402
from bench_zoo import NETS  # noqa: E402
from singa.device import cuda_graphs  # noqa: E402
from singa.proto import job_pb2  # noqa: E402


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
    wrap(sd.Graph, "launch", lambda a: "graph launches")


class Setter:
    """What `strict_device.installed` sets, set for the rest of this process (pytest's
    monkeypatch without the undo)."""

    setattr = staticmethod(setattr)

    @staticmethod
    def setitem(mapping, key, value):
        mapping[key] = value


def runtime(net, batch):
    """Our runtime of `net` (SINGA's or the zoo's) at `batch` on GPU 0."""
    workspace = tempfile.mkdtemp(prefix="singa-bench-launches-")
    if net not in NETS:
        return Runtime(job_of(net, workspace, batch, True))
    rt = Runtime(zoo_job(net, workspace, batch, True))
    for layer in rt.worker.train_net.layers:
        if layer.conf.type == job_pb2.kDummy:
            if layer.name.partition("#")[2] == LABELS:
                layer.feed(np.zeros((batch, 1), np.float32), np.zeros(batch, np.int64))
                layer.aux_mirror = rt.worker.device.put(layer.aux_data)     # as bench_gpu_zoo
            else:
                layer.feed(np.random.default_rng(1).random(layer.data.shape, np.float32))
    return rt


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
        rt = runtime(net, args.batch)
        try:
            steps = []      # (operations, host waits) of a step op by op, then as graphs
            for step in range(cuda_graphs.WARMUP + 2):      # WARMUP captures the graphs
                counts.clear()
                sd.waits.clear()
                rt.train_step()
                steps.append((collections.Counter(counts), sum(sd.waits.values())))
        finally:
            rt.close()
        (by_op, waits), (graphs, _) = steps[cuda_graphs.WARMUP - 1], steps[-1]
        ours = by_op.pop("our kernels", 0)
        top = ", ".join(f"{k} {v}" for k, v in by_op.most_common(4))
        rows.append([net, sum(by_op.values()) + ours, ours, waits, top,
                     sum(graphs.values()), graphs["graph launches"]])
    print_table(rows, ["net", "device operations", "of them our kernels", "host waits",
                       "most frequent others", "with CUDA graphs", "of them graphs"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
