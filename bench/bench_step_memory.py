"""Bench: the memory a training step of the Caffe zoo nets needs, ours (gradient blobs shared by
their lives, and apart) against PyTorch's, on the CPU.

    python bench/bench_step_memory.py [--nets resnet50,googlenet,vgg16,mobilenet] [--batch 8]

Each side in a child process of its own: the growth of the resident set to its high-water mark
(VmHWM, /proc/self/status; the pages written, what the machine must have) from just before the
net is built to the end of 2 training steps (forward, backward, SGD with momentum): params,
their gradients and momentum, the blobs, and the temporaries of a step.
Ours: bench_gpu_zoo's job of each net through the runtime (`Ours`: servers, updates), run
with the gradient blobs sharing memory by their lives (`singa.net.grad_memory`, the default)
and with each apart. Torch: bench_gpu_zoo's reference modules (float32, Dropout training),
their values copied from ours built at batch 1 and freed before the high-water mark is reset
(/proc/self/clear_refs) and torch's net is built.
On a GPU, bench_gpu_zoo measures both sides' device memory; these are the same bytes.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import singa  # noqa: F401  (first: it picks OpenBLAS's kernels before numpy loads it)
import numpy as np

from bench_mlp_step import print_table

MB = 1e6
HERE = os.path.dirname(os.path.abspath(__file__))


def inputs(batch):
    rng = np.random.default_rng(0)
    return rng.random((batch, 3, 224, 224), dtype=np.float32), rng.integers(0, 1000, batch)


def resident():
    """(VmRSS, VmHWM) of this process in bytes."""
    with open("/proc/self/status") as f:
        fields = dict(line.split(":", 1) for line in f)
    return tuple(int(fields[k].split()[0]) * 1024 for k in ("VmRSS", "VmHWM"))


def ours(name, batch, shared):
    """The resident growth of building `name` and training it 2 steps."""
    from bench_gpu_zoo import Ours
    from singa.train.worker import Worker
    Worker.shares_grad_memory = shared
    x, labels = inputs(batch)
    before = resident()[0]
    o = Ours(name, batch, False, tempfile.mkdtemp(prefix="singa-bench-memory-"), x, labels)
    for _ in range(2):
        o.rt.train_step()
    return resident()[1] - before


def torch_bytes(name, batch):
    """The resident growth of building torch's `name` and training it 2 steps."""
    import gc

    from bench_gpu_zoo import Ours, Torch
    x, labels = inputs(batch)
    with tempfile.TemporaryDirectory() as ws:
        o = Ours(name, 1, False, ws, x[:1], labels[:1])
        values = o.params()
        o.rt.close()
        del o
    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")        # VmHWM from here
    before = resident()[0]
    with tempfile.TemporaryDirectory() as folder:
        t = Torch(name, values, x, labels, "cpu", folder)
        step = t.step_fn()
        for _ in range(2):
            step()
    return resident()[1] - before


def child(args):
    """One measurement in this process: print its bytes as JSON."""
    side, name, batch = args.child
    batch = int(batch)
    value = torch_bytes(name, batch) if side == "torch" else ours(name, batch, side == "shared")
    print(json.dumps(value))


def measure(side, name, batch):
    out = subprocess.run([sys.executable, __file__, "--child", side, name, str(batch)],
                         capture_output=True, text=True, cwd=HERE)
    if out.returncode:
        raise SystemExit(f"{side} {name}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nets", default="resnet50,googlenet,vgg16,mobilenet")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        return child(args)
    try:
        import torch  # noqa: F401
        sides = ("shared", "apart", "torch")
    except ImportError:
        sides = ("shared", "apart")
    rows = []
    for name in args.nets.split(","):
        got = {side: measure(side, name, args.batch) for side in sides}
        row = [name, args.batch] + [f"{got[s] / MB:.0f}" for s in sides]
        row.append(f"{got['apart'] / got['shared']:.2f}")
        if "torch" in got:
            row.append(f"{got['shared'] / got['torch']:.2f}")
        rows.append(row)
        print_table([row], ["net", "batch"] + [f"{s} MB" for s in sides] + ["apart/shared"]
                    + ["shared/torch"] * ("torch" in got))
    print("\nsummary, resident growth to its high-water mark over a build and 2 steps:")
    print_table(rows, ["net", "batch", "ours MB", "ours, gradients apart, MB"]
                + ["torch MB"] * ("torch" in sides) + ["apart/shared"]
                + ["ours/torch"] * ("torch" in sides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
